"""Helpers for tests that start servers or use a registry: wait for an HTTP endpoint, run `python -m tasks
serve` for the length of a `with` block, register a model directory as a registry's champion."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tasks.net import free_port

ROOT = Path(__file__).resolve().parents[1]


def wait_for_http(url: str, proc: subprocess.Popen, log_path: Path, timeout: float, interval: float = 0.5) -> None:
    """Return once `url` answers; RuntimeError (with the log's tail) if `proc` exits or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = Path(log_path).read_text()[-3000:]
                raise RuntimeError(
                    f"{url} did not answer within {timeout:.0f} s (exit {proc.poll()}); see {log_path}:\n{tail}"
                ) from None
            time.sleep(interval)


@contextlib.contextmanager
def served(tracking_uri: str, work_dir: Path, *sets: str) -> Iterator[str]:
    """`python -m tasks serve` on the registry at `tracking_uri` (run_dir under `work_dir`, extra `--set`
    pairs); yields the server's base URL and stops its process group on exit."""
    port = free_port()
    log_path = work_dir / "serve.log"
    sets = ("tracking.uri=" + tracking_uri, f"run_dir={work_dir / 'run'}", "rollout.kv_cache_mb=32", *sets)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tasks", *(x for s in sets for x in ("--set", s)), "serve", "--port", str(port)],
            cwd=ROOT,
            env=os.environ | {"PYTHONPATH": str(ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for_http(f"{url}/v1/models", proc, log_path, timeout=300, interval=1)
            yield url
        finally:
            with contextlib.suppress(ProcessLookupError):  # the server may have exited on its own
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)


def register_champion(tracking_uri: str, name: str, model_dir: Path, run_key: str) -> None:
    """Log `model_dir` as a run's `model` artifact, register it under `name` and make it the champion."""
    from tasks.promotion.registry import ModelRegistry
    from tasks.tracking import Tracker

    tracker = Tracker(tracking_uri, experiment=name)
    with tracker.pipeline_run(run_key):
        tracker.log_model(model_dir)
        run_id = tracker.mlflow.active_run().info.run_id
    registry = ModelRegistry(name)
    registry.promote(registry.register(run_id, "model", run_key=run_key), run_key=run_key)
