"""Production signals: is there new data, is it valid, did production move, should this run train?

    verdict = validate_data(settings, rd)                  # GX on the window; drift and tool diff
    choice = should_train(settings, rd, trigger)           # the branch: train or skip, and why
    skip(settings, rd)                                     # the skip path's record
    monitor(settings)                                      # drift_monitor's hourly check
    retrain_request_extra(verdict)                         # the asset event's `extra`

`decide_training` is the pure rule behind should_train.
"""

from __future__ import annotations

import json
import logging
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks.config import Settings
    from tasks.rundir import RunDir
    from tasks.signals.traces import Window
    from tasks.stages.contracts import DataVerdict
    from tasks.tracking import Tracker

log = logging.getLogger(__name__)


def last_full_days(days: int, end: datetime | None = None) -> Window:
    """The window of the `days` whole UTC days before `end` (default now)."""
    from tasks.signals.traces import Window

    end = (end or datetime.now(UTC)).astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return Window(end - timedelta(days=days), end)


def _window(settings: Settings, window: str | None) -> Window:
    from tasks.signals.traces import Window

    return Window.parse(window) if window else last_full_days(settings.monitor.window_days)


def _traces(settings: Settings, out: Path, win: Window) -> str:
    """monitor.traces as ingest reads it: an mlflow:EXPERIMENT or otel:FILE source is exported to `out` for
    the current window and the reference days before it (tasks/signals/trace_sources.py); files stay as
    they are."""
    from tasks.signals.trace_sources import materialize
    from tasks.signals.traces import Window

    span = Window(win.start - timedelta(days=settings.drift.reference_days), win.end) if win.start else win
    return materialize(settings.monitor.traces, out, span, tracking_uri=settings.tracking.uri)


def _has_traces(source: str, window: Window) -> bool:
    """Whether the window has trace files. A source that does not exist (a typo in monitor.traces, a missing
    bucket) raises, naming the setting: only an existing source with nothing in the window is "no data".
    Refused credentials and S3 outages raise as they are (tasks.storage.s3_error)."""
    from tasks.signals.traces import select_files

    try:
        return bool(select_files(source, window))
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"monitor.traces={source}: {e}; fix the setting (pipeline.yaml or "
            "EVERGREEN_MONITOR__TRACES), or create the directory if traces have yet to land"
        ) from None


def validate_data(settings: Settings, rd: RunDir, window: str | None = None) -> dict:
    """Ingest the production window (GX; bad rows quarantined) and test it for drift and tool changes.

    A window that fails validation raises (bad data never trains a model); the verdict is returned."""
    from tasks.signals.monitor import check_production
    from tasks.stages.contracts import DataVerdict
    from tasks.stages.models import champion_dir
    from tasks.stages.report import stage_run, tracker_of

    t0 = time.time()
    win = _window(settings, window)
    try:
        champion = champion_dir(settings, rd)
    except RuntimeError as e:  # nothing to train from: the skip path says so (a scheduled run before bootstrap)
        return _nothing_to_do(rd, win, str(e), no_champion=True)
    source = _traces(settings, rd.path / "signals" / "source", win)
    if not _has_traces(source, win):
        return _nothing_to_do(rd, win, f"no production traces for {win} under {settings.monitor.traces}")
    verdict = DataVerdict.model_validate(
        check_production(
            settings,
            source,
            rd.path / "signals" / "monitor",
            win,
            champion=champion,
            toolset=settings.env.target_toolset,
        )
    )
    verdict.production_tasks = production_tasks(settings, rd)
    rd.write(verdict, "signals.json")
    with stage_run(settings, rd, "signals"):
        track_signals(tracker_of(settings), rd.path / "signals", verdict)
    rd.record_timing("validate_data", time.time() - t0, cpus=1)
    return verdict.model_dump(
        include={"retrain", "reasons", "summary", "window", "rows", "data_validation", "production_tasks"}
    )


def production_tasks(settings: Settings, rd: RunDir) -> dict:
    """Training and held-out tasks from the window's accepted traces, on the target toolset
    (tasks/signals/production_tasks.py, under <rd>/production_tasks). Their counts and whether the run
    trains on them (`used`: the environment verifies traces, the GX suite passed, there is a train split);
    a failed suite is recorded, not raised: the traces passed ingest, and the run trains on generated tasks."""
    from tasks.data.validation import BatchValidationError
    from tasks.envs import get_env
    from tasks.signals.production_tasks import tasks_from_traces

    if get_env(settings.env.name).task_from_trace is None:
        return {"used": False, "reason": f"environment {settings.env.name!r} has no task_from_trace"}
    out = rd.path / "production_tasks"
    try:
        summary = tasks_from_traces(
            rd.path / "signals" / "monitor" / "current", settings.env.name, settings.env.target_toolset, out
        )
    except BatchValidationError as e:
        log.warning("tasks from production failed their GX suite; training on generated tasks only: %s", e)
        return {"used": False, "reason": f"GX suite failed: {e}"}
    used = summary["train"] > 0 and settings.grpo.production_share > 0
    reason = (
        ""
        if used
        else ("no verifiable training task in the window" if not summary["train"] else "grpo.production_share is 0")
    )
    return {
        "used": used,
        "reason": reason,
        "train": summary["train"],
        "eval": summary["eval"],
        "traces": summary["traces"],
        "unverifiable": summary["unverifiable"],
        "path": str(out / "train.jsonl"),
    }


def with_production_tasks(settings: Settings, rd: RunDir) -> Settings:
    """`settings` with grpo.production_tasks set to this run's tasks from production where it trains on them
    (validate_data's verdict says so), else unchanged: the probes and the GRPO job draw the same batches."""
    used = (rd.read("signals.json") or {}).get("production_tasks") or {}
    if not used.get("used"):
        return settings
    return settings.model_copy(update={"grpo": settings.grpo.model_copy(update={"production_tasks": used["path"]})})


def _nothing_to_do(rd: RunDir, window: Window, why: str, no_champion: bool = False) -> dict:
    from tasks.stages.contracts import DataVerdict

    verdict = DataVerdict(
        retrain=False,
        summary=why,
        window=str(window),
        rows={"current": 0},
        data_validation="no data",
        no_champion=no_champion,
    )
    rd.write(verdict, "signals.json")
    log.warning("validate_data: %s", why)
    return verdict.model_dump()


def tool_change_of(trigger: dict) -> dict | None:
    """The payload of the newest tool-change event (triggers/tool_change.py) among a run's asset events."""
    payloads = [(e.get("extra") or {}).get("payload") or {} for e in trigger.get("asset_events", [])]
    changes = [p for p in payloads if p.get("kind") == "tool_change" and p.get("source")]
    return changes[-1] if changes else None


def decide_training(verdict: dict, trigger: dict, force: bool = False) -> tuple[bool, str]:
    """Train when forced, when the data shows drift or a breaking tool change, or when an event asked for it
    and there is data to learn from. Pure."""
    if verdict.get("no_champion"):
        return False, verdict["summary"]
    if force:
        return True, "forced by the `force` param"
    if changed := tool_change_of(trigger):
        return True, f"{changed.get('summary', 'tool change')} (watched at {changed['source']})"
    if verdict.get("retrain"):
        return True, "production moved: " + verdict.get("summary", "")
    asked = [e for e in trigger.get("asset_events", []) if (e.get("extra") or {}).get("retrain", True)]
    rows = (verdict.get("rows") or {}).get("current") or 0
    if asked and rows:
        return True, f"retrain requested by {len(asked)} asset event(s) with {rows} new rows"
    if not rows:
        return False, "no new production data in the window, no drift"
    return False, "no drift and no breaking tool change: " + verdict.get("summary", "")


def should_train(settings: Settings, rd: RunDir, trigger: dict, force: bool = False) -> dict:
    """decide_training on this run's verdict and trigger, written once to should_train.json: the branch
    follows it and the skip path records it."""
    from tasks.stages.contracts import TrainingChoice

    train, reason = decide_training(rd.read("signals.json"), trigger, force=bool(force))
    choice = TrainingChoice(train=train, reason=reason)
    rd.write(choice, "should_train.json")
    log.info("should_train: %s: %s", train, reason)
    return choice.model_dump()


def skip(settings: Settings, rd: RunDir) -> dict:
    """The skip path: nothing to learn this run, and why (from should_train.json)."""
    reason = rd.read("should_train.json")["reason"]
    rd.write({"skipped": True, "reason": reason}, "skip.json")
    log.info("skipping training: %s", reason)
    return {"skipped": True, "reason": reason}


def track_signals(tracker: Tracker, out: Path, verdict: DataVerdict) -> None:
    """The signals stage in MLflow: verdict metrics, drift statistics, the reports, the accepted rows."""
    import pandas as pd

    tracker.log_metrics(
        {
            "retrain": float(verdict.retrain),
            "rows_current": verdict.rows.get("current") or 0,
            "rows_reference": verdict.rows.get("reference") or 0,
        }
    )
    monitor = out / "monitor"
    report = json.loads((monitor / "drift_report.json").read_text())
    tracker.log_metrics(
        {
            f"drift.{t['workload']}.{t['statistic']}.{k}": t[k]
            for t in report["tests"]
            for k in ("effect", "p_adjusted")
            if isinstance(t.get(k), (int, float))
        }
    )
    tracker.set_tags(
        {
            "evergreen.registry_hash": getattr(verdict, "registry_hash", None) or "",
            "evergreen.retrain_reason": verdict.summary[:250],
        }
    )
    for name, where in (
        ("signals.json", "signals"),
        ("drift_report.json", "signals"),
        ("tooldiff.json", "signals"),
        ("current/summary.json", "signals/ingest"),
        ("current/validation.json", "signals/ingest"),
    ):
        if (monitor / name).exists():
            tracker.log_artifact(monitor / name, where)
    tracker.log_artifacts(monitor / "current" / "gx_docs", "signals/gx_docs")
    rows = [
        json.loads(line) for line in (monitor / "current" / "accepted" / "part-00000.jsonl").read_text().splitlines()
    ]
    frame = pd.DataFrame(
        {
            "trace_id": [r["trace_id"] for r in rows],
            "workload": [r["workload"] for r in rows],
            "timestamp": [r["timestamp"] for r in rows],
            "success": [r["outcome"]["success"] for r in rows],
        }
    )
    tracker.log_dataset(frame, name="production-traces", source=str(out / "traces"), context="drift-current")


def monitor(settings: Settings, window: str | None = None, reference_days: int | None = None) -> dict[str, Any]:
    """drift_monitor's check of one window (default the last `monitor.window_days` whole days) against the
    `reference_days` before it, in <run_dir>/drift_monitor/; returns the verdict plus whether it is new (not
    yet announced): an hourly monitor sees the same finished day many times and must ask for retraining once."""
    from tasks import storage
    from tasks.signals.monitor import check_production
    from tasks.stages.models import fetch_champion

    win = _window(settings, window)
    s = settings
    if reference_days:
        s = settings.model_copy(
            update={"drift": settings.drift.model_copy(update={"reference_days": int(reference_days)})}
        )
    out = settings.local_root / "drift_monitor"  # this check's working files
    key = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(win))
    source = _traces(s, out / "source" / key, win)
    if not _has_traces(source, win):
        summary = f"no production traces for {win} under {settings.monitor.traces}: nothing to compare"
        log.warning(summary)
        return {"retrain": False, "new": False, "summary": summary, "reasons": [], "window": str(win), "rows": {}}
    try:
        champion = fetch_champion(settings, out / "champion" / key)
    except RuntimeError as e:  # no champion yet: drift only, no tool diff
        log.warning("%s: checking drift without the tool diff", e)
        champion = None
    verdict = check_production(
        s,
        source,
        out / "windows" / key,
        win,
        champion=champion,
        toolset=settings.env.target_toolset if champion else None,
    )
    # what was announced is shared by every worker that runs the check: kept under run_dir (S3 or local)
    name = f"{key}_{verdict.get('registry_hash') or 'none'}.json"
    announced = settings.run_uri("drift_monitor", "announced", name)
    verdict["new"] = verdict["retrain"] and not storage.exists(announced)
    if verdict["new"]:
        storage.write_bytes(announced, json.dumps({"window": str(win), "summary": verdict["summary"]}).encode())
    return verdict


def retrain_request_extra(verdict: dict) -> dict:
    """The asset event's `extra`: why retraining is asked for, small enough for the metadata DB."""
    return {
        "retrain": bool(verdict["retrain"]),
        "window": verdict["window"],
        "summary": verdict["summary"][:500],
        "reasons": [r[:300] for r in verdict["reasons"][:10]],
        "registry_hash": verdict.get("registry_hash"),
        "rows": verdict.get("rows"),
        "tool_change_breaking": verdict.get("tool_change_breaking"),
        "drifted": verdict.get("drifted"),
    }
