"""One DAG run's directory: every stage of the loop reads and writes its files here.

    rd = RunDir.for_run(settings, "continuous_post_training", "manual__2026-12-03T04:00:00+00:00")
    rd.write({"retrain": True}, "signals.json")        # atomic (tasks.storage.write_atomic)
    rd.read("signals.json")                             # None when the file is not there

Stages hand each other files (`<run_dir>/<dag_id>/<run_id>/`), never large XComs, so a retried or
rerun task finds what its upstream left.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.storage import write_atomic

if TYPE_CHECKING:
    from tasks.config import Settings


@dataclass(frozen=True)
class RunDir:
    """One DAG run's directory; every stage reads and writes here."""

    path: Path
    dag_id: str
    run_id: str

    @classmethod
    def for_run(cls, settings: Settings, dag_id: str, run_id: str) -> RunDir:
        safe = re.sub(r"\.\.+", "_", re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id)).strip("_.") or "run"
        path = Path(settings.run_dir).resolve() / dag_id / safe
        path.mkdir(parents=True, exist_ok=True)
        return cls(path, dag_id, run_id)

    def file(self, *parts: str) -> Path:
        p = self.path.joinpath(*parts)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def read(self, *parts: str, default: Any = None) -> Any:
        p = self.path.joinpath(*parts)
        return json.loads(p.read_text()) if p.exists() else default

    def write(self, data: Any, *parts: str) -> Path:
        """JSON of `data` at `parts` (a pydantic model is dumped in JSON mode)."""
        if hasattr(data, "model_dump_json"):
            text = data.model_dump_json(indent=1)
        else:
            text = json.dumps(data, indent=1, default=str)
        return write_atomic(self.file(*parts), text)

    def write_lines(self, rows: Iterable[Any], *parts: str) -> Path:
        """JSON lines, one per row (eval tables, task lists)."""
        return write_atomic(self.file(*parts), "".join(json.dumps(r) + "\n" for r in rows))

    def read_lines(self, *parts: str) -> list[dict]:
        return [json.loads(line) for line in self.path.joinpath(*parts).read_text().splitlines() if line.strip()]

    def record_timing(self, stage: str, seconds: float, cpus: float, **extra: Any) -> None:
        """What a stage held (wall seconds, CPUs, tokens): the cost stage prices these files."""
        self.write({"stage": stage, "wall_s": seconds, "cpus": cpus, **extra}, "timings", f"{stage}.json")
