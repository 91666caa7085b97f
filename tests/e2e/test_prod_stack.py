"""The e2e stack is production-shaped (`make up STACK=prod`, scripts/services.py): Airflow on Postgres with the
CeleryExecutor (Redis broker) and two Celery workers with separate scratch directories, the runs and MLflow's
artifacts on an S3 endpoint (moto server). The REST asset event's run that the other e2e tests read (event →
run → promoted → no Ray process left) ran its tasks on both workers: its stages exchanged files through S3 only,
and the worker that ran its validate_evals task was SIGKILLed: the task was retried on the other one.
"""

from __future__ import annotations

import pytest

from tests.e2e import drills

pytestmark = pytest.mark.e2e


def test_the_promoted_run_ran_on_two_celery_workers_and_kept_its_files_on_s3(airflow_stack, finished_run):
    env = airflow_stack.env()
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
    assert env["EVERGREEN_RUN_DIR"].startswith("s3://")
    run_id, where = finished_run["dag_run_id"], finished_run["run_dir"]
    assert finished_run["airflow_state"] == "success" and finished_run["status"] == "promoted"
    left = drills.ray_pids(run_id)
    assert left == [], f"the run's Ray head outlived its teardown: {drills.described(left)}"

    client = airflow_stack.client()
    tis = client.get(f"/api/v2/dags/continuous_post_training/dagRuns/{run_id}/taskInstances?limit=100")
    hosts = {t["hostname"] for t in tis["task_instances"] if t["state"] == "success"}
    assert {"worker-a", "worker-b"} <= hosts, f"one run's tasks ran on {hosts}: expected both workers"
    for name in ("worker-a", "worker-b"):  # each worker worked in its own copy of the run
        copy = airflow_stack.home / "scratch" / name / "continuous_post_training" / where.name
        assert (copy / ".mirror.json").exists(), f"{name} has no working copy of the run"

    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=env["EVERGREEN_S3_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
    prefix = f"runs/continuous_post_training/{where.name}/"
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket="evergreen-runs", Prefix=prefix)
    keys = [o["Key"] for p in pages for o in p.get("Contents", [])]
    assert any(k.endswith("grpo/model/model.safetensors") for k in keys), "the challenger is not on S3"
    assert any(k.endswith("summary.json") for k in keys)
    # every object of the run is whole: its bytes hash to the sha256 it was written with
    import hashlib

    for k in keys:
        got = s3.get_object(Bucket="evergreen-runs", Key=k)
        assert hashlib.sha256(got["Body"].read()).hexdigest() == got["Metadata"]["sha256"], k


def test_a_task_whose_worker_died_is_retried_on_the_other_worker(airflow_stack, finished_run):
    """The fixture SIGKILLed the Celery worker running the run's validate_evals task (the worker, its pool, the
    task's processes): the task stopped heartbeating, was failed after the stack's one-minute timeout and
    retried on the other worker, and the run went on to promote (its files whole: the test above)."""
    killed = finished_run["killed_worker"]
    assert killed in ("worker-a", "worker-b"), killed
    run = finished_run["dag_run_id"]
    path = f"/api/v2/dags/continuous_post_training/dagRuns/{run}/taskInstances/{drills.KILLED_TASK}/tries"
    tries = {t["try_number"]: t for t in airflow_stack.client().get(path)["task_instances"]}
    assert tries[1]["hostname"] == killed and tries[1]["state"] == "failed", tries[1]
    assert tries[2]["state"] == "success" and tries[2]["hostname"] not in ("", None, killed), tries[2]
