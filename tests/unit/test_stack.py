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
