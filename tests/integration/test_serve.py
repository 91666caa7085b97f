"""`python -m tasks serve` (what `make serve` runs): the registry's champion behind vLLM's OpenAI-compatible
server on loopback, and the `openai` client gets the model's call back as parsed `tool_calls`.

The champion here is a small model taught one call (tests/taught.py), so that greedy decoding makes it
deterministically; the loop's own champion after a REST-triggered promotion: tests/e2e/test_serve.py."""
from __future__ import annotations

import json
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tasks.net import free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_the_registry_champion_is_served_with_parsed_tool_calls(mlflow_server, tmp_path):
    import openai

    from tasks.promotion.registry import ModelRegistry
    from tasks.tracking import Tracker
    from tests.taught import taught_model

    model_dir, task, taught = taught_model(tmp_path / "taught")
    tracker = Tracker(mlflow_server.uri, experiment="evergreen-serve")
    with tracker.pipeline_run("serve"):
        tracker.log_artifacts(model_dir, "model")
        run_id = tracker.mlflow.active_run().info.run_id
    registry = ModelRegistry("evergreen-serve")
    registry.promote(registry.register(run_id, "model", run_key="serve-1"), run_key="serve-1")

    port = free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tasks", "--set", f"tracking.uri={mlflow_server.uri}", "--set",
         "promotion.model_name=evergreen-serve", "--set", f"run_dir={tmp_path / 'run'}", "--set",
         "rollout.kv_cache_mb=32", "serve", "--port", str(port)],
        cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, f"serve exited: {(tmp_path / 'serve.log').read_text()[-3000:]}"
                assert time.monotonic() < deadline, "vLLM's server did not come up within 300 s"
                time.sleep(1)
        assert (tmp_path / "run" / "serving" / "champion" / "checksums.json").exists()   # downloaded, checked
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        tools = [{"type": "function", "function": t["function"]} for t in task.tools]
        reply = client.chat.completions.create(
            model="evergreen-agent", messages=[{"role": "user", "content": task.question}], tools=tools,
            tool_choice="auto", max_tokens=64, temperature=0)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        assert call.function.name == taught["name"]
        assert json.loads(call.function.arguments) == taught["arguments"]
    finally:
        with contextlib.suppress(ProcessLookupError):  # the server may have exited on its own
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
