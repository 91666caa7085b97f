"""Served after promotion: `python -m tasks serve` (what `make serve` runs) puts the registry's champion behind
vLLM's OpenAI-compatible server on loopback, and the `openai` client gets parsed tool calls back."""
from __future__ import annotations

import json
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
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()


def test_the_champion_answers_chat_completions_with_parsed_tool_calls(server):
    import openai

    from tasks.envs.desk import toolset_tasks

    url, tmp_path = server
    task = toolset_tasks("1", 1, 5)[0]
    tools = [{"type": "function", "function": t["function"]} for t in task.tools]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == ["evergreen-agent"]
    # the downloaded champion was checked: its checksums and its chat format
    assert (tmp_path / "run" / "serving" / "champion" / "checksums.json").exists()
    required = client.chat.completions.create(
        model="evergreen-agent", messages=[{"role": "user", "content": task.question}], tools=tools,
        tool_choice="required", max_tokens=64, temperature=0)
    (call,) = required.choices[0].message.tool_calls[:1]
    assert call.function.name == tools[0]["function"]["name"]
    assert isinstance(json.loads(call.function.arguments), dict)
    # automatic choice goes through the hermes parser: a call or an answer, either way a well-formed reply
    auto = client.chat.completions.create(
        model="evergreen-agent", messages=[{"role": "user", "content": task.question}], tools=tools,
        tool_choice="auto", max_tokens=48, temperature=0)
    choice = auto.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.tool_calls or isinstance(choice.message.content, str)
