"""The drift monitor's one call: ingest a window, test drift against a reference, diff the toolsets.

    from tasks.signals.monitor import check_production
    verdict = check_production(settings, "s3://bucket/traces/", "runs/x/monitor", Window.parse("2026-12-01"),
                               champion="runs/local/champion", toolset="http://tools/openapi.json")
    verdict["retrain"], verdict["reasons"]      # what a retraining trigger carries
    # or: python -m tasks monitor --input PATH --window 2026-12-01 --champion DIR --toolset SRC --output DIR

The reference window is the `drift.reference_days` days before the current one (same input), unless
`reference` names another input or an ingest output. Retraining is requested when any drift test
fires or the toolset in production has a breaking change against the one the champion was trained
for. Everything lands under OUTPUT: current/ and reference/ (ingest outputs with quarantine and GX
data docs), drift_report.json, tooldiff.json and signals.json (this function's result).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from tasks import storage
from tasks.signals.drift import compare
from tasks.signals.ingest import ingest
from tasks.signals.traces import Window
from tasks.signals.windowstats import WindowStats

if TYPE_CHECKING:
    from tasks.config import Settings

log = logging.getLogger(__name__)


def window_stats(
    source: str | Path, out: Path, settings: Settings, window: Window, docs: bool = True
) -> tuple[WindowStats, dict]:
    """Drift statistics (and the ingest summary) of an ingest output directory, or of a trace input
    ingested into `out` first."""
    if (Path(str(source)) / "stats.json").exists():  # an ingest output already
        stats_dir = Path(str(source))
        summary = json.loads((stats_dir / "summary.json").read_text()) if (stats_dir / "summary.json").exists() else {}
    else:
        summary = ingest(source, out, settings.ingest, window, docs=docs)
        stats_dir = out
    return WindowStats.from_dict(json.loads((stats_dir / "stats.json").read_text())), summary


def check_production(
    settings: Settings,
    source: str | Path,
    output_dir: str | Path,
    window: Window,
    champion: str | Path | None = None,
    toolset: dict | list | str | Path | None = None,
    reference: str | Path | None = None,
) -> dict:
    """Ingest + drift + tool diff for one window; returns (and writes) the verdict with its reasons.

    `toolset`: the one in production now, any source of tasks.envs.toolset.load_toolset (a version is one
    of `settings.env.name`'s shipped toolsets)."""
    out = Path(output_dir)
    if window.start is None and reference is None:
        raise ValueError(
            "the current window needs a start (the reference is the days before it), or pass an explicit reference"
        )
    ref_window = window.days_before(settings.drift.reference_days) if window.start else Window()
    current, current_summary = window_stats(source, out / "current", settings, window)
    ref, ref_summary = window_stats(reference or source, out / "reference", settings, ref_window)
    report = compare(ref, current, settings.drift)
    storage.write_bytes(out / "drift_report.json", json.dumps(report.to_dict(), indent=1).encode())
    reasons = list(report.reasons)
    diff = None
    if champion is not None and toolset is not None:
        from tasks.envs.toolset import toolset_of_model
        from tasks.signals.tooldiff import diff_toolsets

        # new_hash is the schema hash the model-version tag carries (tasks.promotion.step), same loader
        diff = diff_toolsets(toolset_of_model(champion), toolset, settings.env.name)
        storage.write_bytes(out / "tooldiff.json", json.dumps(diff.to_dict(), indent=1).encode())
        if diff.breaking:
            reasons.insert(0, f"tool change: {diff.summary}")
    verdict = {
        "retrain": bool(report.drifted or (diff is not None and diff.breaking)),
        "reasons": reasons,
        "summary": "; ".join(reasons[:3]) or "no drift, no breaking tool change",
        "window": str(window),
        "reference_window": str(ref_window) if reference is None else str(reference),
        "drifted": report.drifted,
        "tool_change_breaking": bool(diff and diff.breaking),
        # key kept from before the toolset rename: stages, announcements and MLflow tags read it
        "registry_hash": diff.new_hash if diff else None,
        "rows": {"current": current_summary.get("rows_accepted"), "reference": ref_summary.get("rows_accepted")},
        # a failed window raises inside ingest; an ingest output given as input carries its own verdict
        "data_validation": current_summary.get("verdict", "passed"),
        "artifacts": {
            "drift_report": str(out / "drift_report.json"),
            "tooldiff": str(out / "tooldiff.json") if diff else None,
            "data_docs": current_summary.get("data_docs"),
        },
    }
    storage.write_bytes(out / "signals.json", json.dumps(verdict, indent=1).encode())
    log.info("monitor %s: retrain=%s (%s)", window, verdict["retrain"], verdict["summary"])
    return verdict
