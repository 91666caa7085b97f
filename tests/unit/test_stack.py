"""scripts/stack.py: stopping the stack ends the processes that left its services' process groups."""

import os
import subprocess
import sys
import time

from scripts.stack import Stack


def _sleeper(marker: str) -> subprocess.Popen:
    # its own session, as the LocalExecutor's task processes have: a signal to the scheduler's group misses it
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        start_new_session=True,
        env=os.environ | {"EVERGREEN_STACK": marker},
    )


def test_stop_ends_the_stacks_strays_and_only_them(tmp_path):
    stack = Stack(home=tmp_path / "stack")
    stray, other = _sleeper(str(stack.home)), _sleeper(str(tmp_path / "another-stack"))
    try:
        time.sleep(0.5)  # the environment is readable once the interpreter runs
        lines = []
        stack.stop(progress=lines.append)
        assert stray.wait(timeout=20) is not None
        assert other.poll() is None  # another stack's process is not this stack's to end
        assert "ended 1 processes" in lines[-1]
        assert stack.env()["EVERGREEN_STACK"] == str(stack.home)
    finally:
        for proc in (stray, other):
            proc.kill()
            proc.wait()


def test_the_prod_stack_names_a_service_that_cannot_start_and_how_to_start_it(tmp_path, monkeypatch):
    import socket

    import pytest

    from scripts import services
    from tasks.net import free_port

    stack = Stack(home=tmp_path / "stack", kind="prod", api_port=free_port(), mlflow_port=free_port())
    (stack.home / "logs").mkdir(parents=True)
    monkeypatch.setattr(services.shutil, "which", lambda name: None)  # Redis not installed
    with pytest.raises(services.ServiceError, match=r"redis-server not found: install it \(apt-get install"):
        services.start_redis(stack)
    with pytest.raises(services.ServiceError, match=r"initdb not found: install Postgres"):
        services.start_postgres(stack)
    # a port of the stack already taken: which service, and what to do, before anything starts
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        stack.pg_port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=rf"port {stack.pg_port} for Postgres is taken"):
            stack.start(progress=lambda _: None)
    assert not (stack.home / "pids").exists() or not list((stack.home / "pids").iterdir())


def test_worker_name_is_the_workers_own(monkeypatch):
    from operators.hostname import worker_name

    monkeypatch.setenv("EVERGREEN_WORKER_NAME", "worker-b")
    assert worker_name() == "worker-b"
    monkeypatch.delenv("EVERGREEN_WORKER_NAME")
    assert worker_name()  # the machine's name
