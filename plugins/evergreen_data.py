"""The Evergreen page's data: one `summary.json` per continuous_post_training run, each validated as
tasks.stages.contracts.RunSummary (written by tasks.stages.report.summarize).

    <runs_root>/continuous_post_training/<run_dir>/summary.json

runs_root is $EVERGREEN_RUN_DIR when set (relative to the project), else `run_dir` of tasks.config.
Every file is read on every request, so a new run shows up without a restart. A file that is not JSON,
is too big, or does not validate as a RunSummary becomes an error ("unreadable summary"), never a crash.
The typed fields (signals, greedy, sampled, links, timings) come checked; the free-form dicts (trigger,
promotion, training, drift tests) are still read defensively, through `dig` and `num`.

Plain Python, no HTML: plugins/evergreen_page.py renders what this returns through Jinja2 templates.
Nothing here runs at import; the project's `tasks` package is imported on the first request.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DAG_ID = "continuous_post_training"
PROJECT_ROOT = Path(__file__).resolve().parents[1]
MAX_SUMMARY_BYTES = 4 << 20  # a summary is a few KiB; a huge file is a bug, not something to parse per request
MAX_ERRORS_SHOWN = 6  # validation errors listed per unreadable summary
STATUS_LABEL = {"promoted": "PROMOTED", "not_promoted": "not promoted", "skipped": "skipped", "failed": "failed"}


@dataclass
class Run:
    run_dir: str  # the directory name under <runs_root>/continuous_post_training/
    summary: Any  # a tasks.stages.contracts.RunSummary
    sort_ts: float  # started_at (else finished_at, else the file's mtime) as a POSIX timestamp

    @property
    def status(self) -> str:
        return self.summary.status

    @property
    def run_id(self) -> str:
        return self.summary.run_id

    def as_json(self) -> dict:
        return {
            "run_dir": self.run_dir,
            "gain_per_dollar": gain_per_dollar(self.summary),
            "summary": json_safe(self.summary.model_dump(mode="json")),
        }


@dataclass
class Runs:
    root: Path | None
    runs: list[Run] = field(default_factory=list)  # newest first
    errors: list[dict] = field(default_factory=list)  # {"path", "error"}: the unreadable summaries


def json_safe(v: Any) -> Any:
    """NaN/Infinity (Python's json writes them, e.g. an undefined drift effect) become null: strict JSON
    encoders, Starlette's included, refuse them."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, list):
        return [json_safe(x) for x in v]
    return v


def _tasks_module(name: str):
    """A module of the project's `tasks` package; an api-server started without the project on
    PYTHONPATH still finds it."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "tasks":
            raise
        sys.path.append(str(PROJECT_ROOT))
        return importlib.import_module(name)


def text_summary(summary: Any) -> str:
    """The run as the summarize task's log and `make demo` print it: the one text formatter."""
    return _tasks_module("tasks.stages.report").format_summary(summary)


def runs_root() -> Path:
    """$EVERGREEN_RUN_DIR, else tasks.config's run_dir; resolved the way tasks.rundir.RunDir resolves it. A
    run_dir on S3: the runs' summaries pulled into <scratch_dir>/page (only the summaries: tasks.mirror)."""
    where = os.environ.get("EVERGREEN_RUN_DIR") or str(_tasks_module("tasks.config").load_settings().run_dir)
    if where.startswith("s3://"):
        settings = _tasks_module("tasks.config").load_settings()
        view = settings.scratch_dir / "page"
        _tasks_module("tasks.mirror").Mirror(f"{where.rstrip('/')}/{DAG_ID}", view / DAG_ID).pull(
            suffixes=("/summary.json",)
        )
        return view
    p = Path(where)
    return (p if p.is_absolute() else PROJECT_ROOT / p).resolve()


def parse_ts(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:  # our writers use UTC; a naive stamp is read as UTC rather than server-local time
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _read_summary(path: Path, contract: type):
    size = path.stat().st_size
    if size > MAX_SUMMARY_BYTES:
        raise ValueError(f"{size} bytes, more than the {MAX_SUMMARY_BYTES} a summary may have")
    data = json.loads(path.read_text(encoding="utf-8"))  # Python's parser: NaN, as summaries may hold
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {type(data).__name__}, not an object")
    summary = contract.model_validate(data)
    if not summary.dag_id or not summary.run_id:
        raise ValueError("dag_id and run_id must not be empty")
    return summary


def describe_error(exc: BaseException) -> str:
    """One line for an unreadable summary: the fields that failed validation, else the exception."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return f"{type(exc).__name__}: {exc}"
    errors = exc.errors(include_url=False, include_input=False)
    text = "; ".join(
        f"{'.'.join(map(str, err['loc'])) or 'summary'}: {err['msg']}" for err in errors[:MAX_ERRORS_SHOWN]
    )
    more = f" (and {len(errors) - MAX_ERRORS_SHOWN} more)" if len(errors) > MAX_ERRORS_SHOWN else ""
    return f"not a valid RunSummary: {text}{more}"


def load_runs(root: Path | None = None) -> Runs:
    """Every summary under root (default: runs_root()), newest first; unreadable files become errors."""
    try:
        contract = _tasks_module("tasks.stages.contracts").RunSummary
        root = runs_root() if root is None else root
    except Exception as e:
        return Runs(None, errors=[{"path": "settings", "error": f"{type(e).__name__}: {e}"}])
    out = Runs(root)
    base = root / DAG_ID
    if not base.is_dir():
        return out
    for path in sorted(base.glob("*/summary.json")):
        rel = str(path.relative_to(root))
        try:
            summary = _read_summary(path, contract)
            ts = parse_ts(summary.started_at) or parse_ts(summary.finished_at) or path.stat().st_mtime
        except (OSError, ValueError, RecursionError) as e:  # JSON, Unicode and validation errors are ValueErrors
            out.errors.append({"path": rel, "error": describe_error(e)})
            continue
        out.runs.append(Run(path.parent.name, summary, ts))
    out.runs.sort(key=lambda r: (r.sort_ts, r.run_id), reverse=True)
    return out


def latest_timeline(root: Path | None) -> dict | None:
    """The newest timeline report under root (`python -m tasks timeline`'s <root>/timeline/, or a timeline DAG
    run's <root>/timeline/<run>/timeline/): {"report", "chart" (a path or None), "where"}; None when there is
    none or it cannot be read (the page is about runs; a broken report leaves it as it is)."""
    if root is None:
        return None
    found = [root / "timeline" / "report.json", *(root / "timeline").glob("*/timeline/report.json")]
    found = [f for f in found if f.is_file()]
    if not found:
        return None
    newest = max(found, key=lambda f: f.stat().st_mtime)
    try:
        report = json.loads(newest.read_text(encoding="utf-8"))
        policies = [p for p in report["policies"] if isinstance(p, dict)]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    chart = newest.with_name("timeline.png")
    return {
        "report": report,
        "policies": policies,
        "chart": chart if chart.is_file() else None,
        "where": str(newest.parent.relative_to(root)),
    }


# --------------------------------------------------------------------------- reading the loose parts


def dig(d: Any, *keys: str) -> Any:
    """d[k1][k2]... or None when any level is missing or not a dict (promotion, trigger and training are
    free-form dicts in a RunSummary)."""
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def num(v: Any) -> float | None:
    """A finite number as float, else None (a bool, a string, NaN or infinity is no measurement)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def as_list(v: Any) -> list:
    return v if isinstance(v, list) else []


def dicts(v: Any) -> list[dict]:
    return [x for x in as_list(v) if isinstance(x, dict)]


def target_comparison(summary: Any, mode: str = "greedy") -> Any:
    """The champion/challenger Comparison on the target toolset, or None when it was not measured."""
    return (getattr(summary, mode) or {}).get(summary.target_toolset)


def gain_per_dollar(summary: Any) -> float | None:
    """Success points gained on the target toolset (greedy, point estimate) per dollar of total cost."""
    cmp_ = target_comparison(summary)
    diff = num(cmp_.difference.mean) if cmp_ is not None else None
    total = num(dig(summary.promotion, "cost", "total_usd"))
    if diff is None or total is None or total <= 0:
        return None
    return 100.0 * diff / total


def registries(summary: Any) -> list[tuple[str, str]]:
    """(toolset, role) for the target, the guards, then any other toolset the evals measured."""
    out = [(summary.target_toolset, "target")]
    out += [(g, "guard") for g in dict.fromkeys(summary.guard_toolsets) if g != summary.target_toolset]
    for mode in ("greedy", "sampled"):
        seen = {r for r, _ in out}
        out += [(r, "other") for r in getattr(summary, mode) or {} if r not in seen]
    return out
