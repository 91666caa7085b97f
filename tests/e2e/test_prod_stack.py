"""The production-shaped stack (`make up STACK=prod`, scripts/services.py): Airflow on Postgres with the
CeleryExecutor (Redis broker) and two Celery workers with separate scratch directories, the runs and MLflow's
artifacts on an S3 endpoint (moto server). A REST asset event's run goes event → run → promoted → no Ray
process left, with its tasks on both workers: the stages exchange their files through S3 only.

Its own stack on free ports, beside the session's local one; tiny budgets as in the other e2e tests.
"""

from __future__ import annotations

import json
import time

import pytest

from scripts.stack import Stack
from tasks.net import free_port
from tests.dags.test_dag_runs import TINY
from tests.e2e import drills
from tests.e2e.conftest import ARTIFACTS

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def prod_stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("prod")
    ports = {k: free_port() for k in ("api_port", "mlflow_port", "ray_head_port", "ray_dashboard_port")}
    ports |= {k: free_port() for k in ("pg_port", "redis_port", "s3_port")}
    stack = Stack(home=home, kind="prod", env_extra=TINY, **ports)
    stack.start()
    try:
        client = stack.client()
        client.wait_for_dags(["continuous_post_training", "bootstrap_champion", "simulate_production"])
        for dag_id in ("continuous_post_training", "bootstrap_champion", "simulate_production"):
            client.unpause(dag_id)
        yield stack
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        for log in (home / "logs").glob("*.log"):  # kept for a failed CI run
            (ARTIFACTS / f"prod-{log.name}").write_bytes(log.read_bytes()[-2_000_000:])
        stack.stop()


def test_a_rest_asset_event_run_is_promoted_across_two_celery_workers_through_s3(prod_stack):
    client = prod_stack.client()
    env = prod_stack.env()
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
    assert env["EVERGREEN_RUN_DIR"].startswith("s3://")
    for dag_id in ("bootstrap_champion", "simulate_production"):
        run = client.wait_for_run(dag_id, client.trigger(dag_id), timeout=900)
        assert run["state"] == "success", f"{dag_id} {run['state']}: see {prod_stack.home / 'logs'}"
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    client.post_asset_event("retrain_request", {"retrain": True, "summary": "e2e: the prod stack"})
    run_id = drills.next_run(client, since)
    run = client.wait_for_run("continuous_post_training", run_id=run_id, timeout=1500)
    assert run["state"] == "success", drills.states(client, run_id)

    where = drills.run_dir(prod_stack, run_id)  # pulled from the bucket (Stack.runs_root)
    assert where is not None, f"run {run_id} has no files on S3"
    summary = json.loads((where / "summary.json").read_text())
    assert summary["status"] == "promoted", summary.get("promotion", {}).get("decision")
    assert drills.ray_pids(run_id) == [], "the run's Ray head outlived its teardown"

    tis = client.get(f"/api/v2/dags/continuous_post_training/dagRuns/{run_id}/taskInstances?limit=100")
    hosts = {t["hostname"] for t in tis["task_instances"] if t["state"] == "success"}
    assert {"worker-a", "worker-b"} <= hosts, f"one run's tasks ran on {hosts}: expected both workers"
    for name in ("worker-a", "worker-b"):  # each worker worked in its own copy of the run
        copy = prod_stack.home / "scratch" / name / "continuous_post_training" / where.name
        assert (copy / ".mirror.json").exists(), f"{name} has no working copy of the run"
    # every object of the run carries the sha256 its readers check
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=env["EVERGREEN_S3_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
    prefix = f"runs/continuous_post_training/{where.name}/"
    keys = [
        o["Key"]
        for p in s3.get_paginator("list_objects_v2").paginate(Bucket="evergreen-runs", Prefix=prefix)
        for o in p.get("Contents", [])
    ]
    assert any(k.endswith("grpo/model/model.safetensors") for k in keys) and any(
        k.endswith("summary.json") for k in keys
    )
    assert all(s3.head_object(Bucket="evergreen-runs", Key=k)["Metadata"].get("sha256") for k in keys)
