"""One real local stack for the end-to-end tests (scripts/stack.py on free ports, its own home), started
once per test run, with tiny budgets and a non-inferiority gate so that a minutes-long run promotes.

Fixtures:
- `airflow_stack`: the running Stack (`.api_url`, `.username`, `.password`, `.runs_root`, `.client()`)
- `finished_run`: a continuous_post_training run started by a REST asset event and finished; the summary
  dict it wrote, with `airflow_state` (the DAG run's state), `dag_run_id` and `run_dir` (a Path) added.
- `tool_server`: the desk MCP server over HTTP that the stack's tool watch (EVERGREEN_TOOL_SOURCE) reads.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from scripts.stack import Stack
from tasks.net import free_port, port_busy
from tests.dags.test_dag_runs import TINY

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "include" / "tools"


@pytest.fixture(scope="session")
def tool_server(tmp_path_factory):
    """The desk tools as an MCP server over HTTP, serving a file the tool-change test rewrites (v1 first:
    the champion's tools, nothing to report); the stack's tool watch points at it."""
    served = tmp_path_factory.mktemp("tools") / "served.json"
    shutil.copy(TOOLS / "registry_v1.json", served)
    port = free_port()
    log = open(served.with_suffix(".log"), "w")  # noqa: SIM115 (the server's log, open while it runs)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "include/tools/desk_mcp_server.py"),
            "--toolset",
            str(served),
            "--transport",
            "http",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 60
    while not port_busy(port):
        if time.time() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"MCP server did not start: see {log.name}")
        time.sleep(0.3)
    yield SimpleNamespace(file=served, url=f"http://127.0.0.1:{port}/mcp")
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def airflow_stack(tmp_path_factory, tool_server):
    home = tmp_path_factory.mktemp("stack")
    watch = {"EVERGREEN_TOOL_SOURCE": f"mcp:{tool_server.url}", "EVERGREEN_TOOL_POLL_S": "20"}
    stack = Stack(
        home=home,
        api_port=free_port(),
        mlflow_port=free_port(),
        ray_head_port=free_port(),
        ray_dashboard_port=free_port(),
        env_extra={**TINY, **watch},
    )
    stack.start()
    try:
        client = stack.client()
        client.wait_for_dags(
            ["continuous_post_training", "drift_monitor", "bootstrap_champion", "rollback", "simulate_production"]
        )
        for dag_id in ("continuous_post_training", "bootstrap_champion", "simulate_production", "rollback"):
            client.unpause(dag_id)
        yield stack
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        for log in (home / "logs").glob("*.log"):  # kept for a failed CI run
            (ARTIFACTS / f"stack-{log.name}").write_bytes(log.read_bytes()[-2_000_000:])
        stack.stop()


@pytest.fixture(scope="session")
def finished_run(airflow_stack):
    client = airflow_stack.client()
    for dag_id in ("bootstrap_champion", "simulate_production"):
        run = client.wait_for_run(dag_id, client.trigger(dag_id), timeout=900)
        assert run["state"] == "success", f"{dag_id} {run['state']}: see {airflow_stack.home / 'logs'}"
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    client.post_asset_event("retrain_request", {"retrain": True, "summary": "e2e: REST asset event"})
    run = client.wait_for_run("continuous_post_training", after=since, timeout=1500)
    summaries = sorted(
        (airflow_stack.runs_root / "continuous_post_training").glob("*/summary.json"), key=lambda p: p.stat().st_mtime
    )
    assert summaries, f"no summary.json under {airflow_stack.runs_root}"
    summary = json.loads(summaries[-1].read_text())
    return {**summary, "airflow_state": run["state"], "dag_run_id": run["dag_run_id"], "run_dir": summaries[-1].parent}
