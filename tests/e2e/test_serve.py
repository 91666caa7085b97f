"""Served after promotion: `python -m tasks serve` (what `make serve` runs) puts the registry's champion behind
vLLM's OpenAI-compatible server on loopback, and the `openai` client gets parsed tool calls back."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from scripts.stack import free_port

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(airflow_stack, finished_run, tmp_path):
    assert finished_run["status"] == "promoted", finished_run["status"]
    port = free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tasks", "--set", f"tracking.uri={airflow_stack.mlflow_url}", "--set",
         f"run_dir={tmp_path / 'run'}", "--set", "rollout.kv_cache_mb=32", "serve", "--port", str(port)],
        cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"{url}/v1/models", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, f"serve exited: {(tmp_path / 'serve.log').read_text()[-3000:]}"
                assert time.monotonic() < deadline, "vLLM's server did not come up within 300 s"
                time.sleep(1)
        yield url, tmp_path
    finally:
        with contextlib.suppress(ProcessLookupError):  # the server may have exited on its own
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()


def test_the_loops_champion_is_served_after_promotion(server):
    """The champion the REST-triggered run promoted, downloaded from the registry and checked; the e2e
    stack's champion is a 30-step SFT, so it may answer or call: either way a well-formed reply through the
    hermes parser. That a served model's calls come back parsed: tests/integration/test_serve.py."""
    import openai

    from tasks.envs.desk import toolset_tasks

    url, tmp_path = server
    task = toolset_tasks("2", 1, 5)[0]
    tools = [{"type": "function", "function": t["function"]} for t in task.tools]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == ["evergreen-agent"]
    assert (tmp_path / "run" / "serving" / "champion" / "checksums.json").exists()
    reply = client.chat.completions.create(
        model="evergreen-agent", messages=[{"role": "user", "content": task.question}], tools=tools,
        tool_choice="auto", max_tokens=48, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.tool_calls or isinstance(choice.message.content, str)
