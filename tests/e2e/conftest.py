"""One real local stack for the end-to-end tests (scripts/stack.py on free ports, its own home), started
once per test run, with tiny budgets and a non-inferiority gate so that a minutes-long run promotes. It is
the production-shaped stack (`make up STACK=prod`): Airflow on Postgres, the CeleryExecutor on Redis with two
workers that share no scratch directory, runs and MLflow artifacts on an S3 endpoint; `.runs_root` is a copy
pulled from the bucket.

Fixtures:
- `airflow_stack`: the running Stack (`.api_url`, `.username`, `.password`, `.runs_root`, `.client()`)
- `head_killed_run`: a continuous_post_training run started by a REST asset event, its Ray head SIGKILLed
  after GRPO's first checkpoint (and the scheduler and triggerer killed and restarted on the way): what happened.
- `finished_run`: the next run, started by another REST asset event, resumed from that checkpoint and finished,
  the Celery worker of its validate_evals task SIGKILLed on the way; the summary dict it wrote, with `airflow_state`
  (the DAG run's state), `dag_run_id`, `run_dir` (a Path) and `killed_worker`.
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
from tests.e2e import drills

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
    # the production shape (make up STACK=prod): Postgres, Celery with two workers, runs on S3; `make demo` and
    # tests/dags keep the LocalExecutor on SQLite and a local run dir
    stack = Stack(
        home=home,
        kind="prod",
        api_port=free_port(),
        mlflow_port=free_port(),
        ray_head_port=free_port(),
        ray_dashboard_port=free_port(),
        pg_port=free_port(),
        redis_port=free_port(),
        s3_port=free_port(),
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
def head_killed_run(airflow_stack):
    """The champion bootstrapped and production simulated; then a continuous_post_training run started by a REST
    asset event, with the head-kill drill (tests/e2e/drills.py): the scheduler and the triggerer SIGKILLed and
    restarted while GRPO is deferred, the run's Ray head SIGKILLed after GRPO's first checkpoint. Its outcome."""
    client = airflow_stack.client()
    for dag_id in ("bootstrap_champion", "simulate_production"):
        run = client.wait_for_run(dag_id, client.trigger(dag_id), timeout=900)
        assert run["state"] == "success", f"{dag_id} {run['state']}: see {airflow_stack.home / 'logs'}"
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    client.post_asset_event("retrain_request", {"retrain": True, "summary": "e2e: REST asset event, head killed"})
    outcome = drills.head_kill_drill(airflow_stack, drills.next_run(client, since))
    from mlflow import MlflowClient

    # the aliases as the failed run left them (the next run moves them)
    model = MlflowClient(tracking_uri=airflow_stack.mlflow_url).get_registered_model("evergreen-agent")
    return {**outcome, "aliases": dict(model.aliases)}


@pytest.fixture(scope="session")
def finished_run(airflow_stack, head_killed_run):
    """The next run, started by another REST asset event: it resumes from the failed run's checkpoint and finishes.
    The summary dict it wrote, with `airflow_state` (the DAG run's state), `dag_run_id` and `run_dir` (a Path)."""
    client = airflow_stack.client()
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    client.post_asset_event("retrain_request", {"retrain": True, "summary": "e2e: REST asset event"})
    # the Celery worker running its validate_evals task is killed: the task is retried on the other worker (not
    # evaluate: a retried evaluate may build its engine again, which test_the_run_builds_its_engines_once forbids)
    drill = drills.worker_kill_drill(airflow_stack, drills.next_run(client, since), task=drills.KILLED_TASK)
    run = drill["run"]
    where = drills.run_dir(airflow_stack, run["dag_run_id"])
    assert where is not None and (where / "summary.json").exists(), f"no summary.json for {run['dag_run_id']}"
    summary = json.loads((where / "summary.json").read_text())
    return {
        **summary,
        "airflow_state": run["state"],
        "dag_run_id": run["dag_run_id"],
        "run_dir": where,
        "killed_worker": drill["killed"],
    }
