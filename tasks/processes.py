"""Ending processes this project started: SIGTERM, a grace period, then SIGKILL for the ones left.

Usage:

    from tasks.processes import end_processes
    end_processes([psutil.Process(pid) for pid in pids], grace=5.0)
"""

from __future__ import annotations


def end_processes(procs: list, grace: float) -> None:
    """Terminate `procs` (psutil.Process), wait up to `grace` seconds, kill what is left and reap it. A
    process that is already gone is skipped (it may end between listing and signalling)."""
    import psutil  # lazy: DAG files import modules that import this one

    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
