"""One DAG run's directory: every stage of the loop reads and writes its files here.

    rd = RunDir.for_run(settings, "continuous_post_training", "manual__2026-12-03T04:00:00+00:00")
    rd.write({"retrain": True}, "signals.json")        # atomic (tasks.storage.write_atomic)
    rd.read("signals.json")                             # None when the file is not there

Stages hand each other files (`<run_dir>/<dag_id>/<run_id>/`), never large XComs, so a retried or
rerun task finds what its upstream left. Where run_dir is `s3://bucket/prefix`, `path` is this worker's
working copy under scratch_dir and `uri` the run's prefix: a task pulls before its stage and pushes after
(`with rd.synced(): ...`, tasks.mirror), so tasks on different machines never need to share a disk.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.mirror import Mirror
from tasks.storage import is_s3, write_atomic

if TYPE_CHECKING:
    from tasks.config import Settings


@dataclass(frozen=True)
class RunDir:
    """One DAG run's directory; every stage reads and writes here."""

    path: Path  # where this process reads and writes the run's files
    dag_id: str
    run_id: str
    uri: str = ""  # the run's home: s3://... where run_dir is on S3, else str(path)

    @classmethod
    def for_run(cls, settings: Settings, dag_id: str, run_id: str) -> RunDir:
        safe = re.sub(r"\.\.+", "_", re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id)).strip("_.") or "run"
        path = settings.local_root / dag_id / safe
        path.mkdir(parents=True, exist_ok=True)
        uri = settings.run_uri(dag_id, safe) if is_s3(settings.run_dir) else str(path)
        return cls(path, dag_id, run_id, uri)

    @property
    def remote(self) -> bool:
        return is_s3(self.uri)

    def pull(self) -> dict[str, int]:
        """The working copy becomes what the run's prefix holds (nothing to do for a local run dir)."""
        return Mirror(self.uri, self.path).pull()

    def push(self) -> dict[str, int]:
        """What this task wrote goes to the run's prefix (nothing to do for a local run dir)."""
        return Mirror(self.uri, self.path).push()

    def uri_of(self, local: Path) -> str:
        """Where a file or directory of the working copy lives for another machine (a Ray job's driver)."""
        return f"{self.uri}/{local.relative_to(self.path).as_posix()}" if self.remote else str(local)

    @contextlib.contextmanager
    def synced(self) -> Iterator[RunDir]:
        """Pull, run the body, push: also when the body fails (its checkpoints and logs are the next try's)."""
        self.pull()
        try:
            yield self
        finally:
            self.push()

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


def working_copy(settings: Settings, uri: str) -> Path:
    """A local path for `uri`, a file tree of a run kept on S3 (below run_dir): the whole run is pulled to where
    RunDir keeps it, so the paths its settings name (pinned toolsets) resolve, and a job driver on the worker
    that submitted it finds the files already there. A local `uri` is itself."""
    if not is_s3(uri):
        return Path(uri)
    root = settings.run_uri()
    parts = uri[len(root) + 1 :].split("/") if uri.startswith(root + "/") else []
    if len(parts) < 2 or not all(parts):
        raise ValueError(f"{uri} is not inside a run under run_dir={root}: a job reads and writes its own run")
    Mirror(settings.run_uri(*parts[:2]), settings.local_root.joinpath(*parts[:2])).pull()
    return settings.local_root.joinpath(*parts)
