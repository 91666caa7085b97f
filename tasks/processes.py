"""Ending processes this project started: SIGTERM, a grace period, then SIGKILL for the ones left.

Usage:

    from tasks.processes import end_processes
    end_processes([psutil.Process(pid) for pid in pids], grace=5.0)
"""

from __future__ import annotations

from contextlib import suppress


def end_processes(procs: list, grace: float) -> None:
    """Terminate `procs` (psutil.Process), wait up to `grace` seconds, kill what is left and reap it. A
    process that is already gone is skipped (it may end between listing and signalling)."""
    import psutil  # lazy: DAG files import modules that import this one

    for proc in procs:
        with suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        with suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)
