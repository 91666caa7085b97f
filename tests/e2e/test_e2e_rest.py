"""End to end on the real local stack: a REST asset event trains and promotes; an injected training
failure fails the run, still tears the Ray cluster down, and says why in the task log.

    python -m pytest -q tests/e2e          # about 10 minutes on 2 cores (stack, bootstrap, two runs)
"""
from __future__ import annotations

import ipaddress
import json
import time

import pytest

from tasks.rl.cluster import local_temp_dir
from tasks.rl.cluster import LocalHead

pytestmark = [pytest.mark.e2e, pytest.mark.integration]
DAG = "continuous_post_training"


def _states(client, run_id: str) -> dict:
    tis = client.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances?limit=100")["task_instances"]
    return {t["task_id"] + (f"[{t['map_index']}]" if t.get("map_index", -1) >= 0 else ""): t["state"] for t in tis}


def _ray_pids(run_id: str) -> list[int]:
    return LocalHead("", local_temp_dir(f"{DAG}/{run_id}"), None, {}).pids()


def test_rest_asset_event_trains_promotes_and_leaves_no_ray_process(airflow_stack, finished_run):
    client = airflow_stack.client()
    run_id = finished_run["dag_run_id"]
    assert finished_run["airflow_state"] == "success", _states(client, run_id)
    assert finished_run["trigger"]["kind"] == "asset"
    assert any(e["extra"].get("summary") == "e2e: REST asset event" for e in finished_run["trigger"]["asset_events"])
    assert finished_run["status"] == "promoted", finished_run["promotion"]

    from mlflow import MlflowClient

    model = MlflowClient(tracking_uri=airflow_stack.mlflow_url).get_registered_model("evergreen-agent")
    assert model.aliases["champion"] == finished_run["promotion"]["version"] != "1", model.aliases
    assert model.aliases["previous"] == "1"
    assert _ray_pids(run_id) == []
    states = _states(client, run_id)
    assert states["ray_cluster_teardown"] == "success" and states["grpo_update"] == "success", states
    assert states["signals.skip"] == "skipped", states
    assert finished_run["signals"]["retrain"] is True and set(finished_run["greedy"]) == {"1", "2"}
    assert finished_run["links"]["mlflow_run"]
    assert finished_run["signals"]["production_tasks"]["used"], finished_run["signals"]  # TINY's production_share


def test_the_run_builds_its_engines_once(finished_run):
    # probe 0 starts engine 0 (the run has one: TINY's rollout.num_workers), GRPO and the evals reuse it;
    # probe 1 has a temporary engine of its own
    timings = {p.stem: json.loads(p.read_text()) for p in (finished_run["run_dir"] / "timings").glob("*.json")}
    assert timings["probe_rollouts_0"]["engines_kept"] and not timings["probe_rollouts_1"]["engines_kept"]
    assert timings["evaluate"]["engine_pids"] == timings["probe_rollouts_0"]["engine_pids"], timings
    assert timings["probe_rollouts_1"]["engine_pids"] != timings["probe_rollouts_0"]["engine_pids"]


def _exposed(stack) -> list[tuple]:
    return [s for s in stack.listening() if not ipaddress.ip_address(s[2].removeprefix("::ffff:")).is_loopback]


def test_injected_training_failure_tears_down_and_says_why(airflow_stack, finished_run):
    """Also two faults of the matrix on the way: while the GRPO task is deferred, the scheduler and the
    triggerer are killed (SIGKILL) and started again: the trigger resumes watching the same Ray job, whose
    failure still fails the task with its reason. And while the run holds its cluster, no process the stack
    started (Airflow's services, MLflow, the run's Ray head, agents, client server, engines, trainer)
    listens beyond loopback."""
    client = airflow_stack.client()
    run_id = client.trigger(DAG, {"force": True, "fail_training_at_step": 1})
    seen, deadline, killed = set(), time.time() + 1200, None
    while (run := client.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}"))["state"] not in ("success", "failed"):
        assert time.time() < deadline, f"run {run_id} still {run['state']} after 1200 s"
        sockets = airflow_stack.listening()
        assert sockets and _exposed(airflow_stack) == [], _exposed(airflow_stack)
        seen |= {name for _, name, _, _ in sockets}
        if killed is None and _states(client, run_id).get("grpo_update") == "deferred":
            for service in ("triggerer", "scheduler"):
                airflow_stack.kill(service)
            killed = time.time()
            for service in ("scheduler", "triggerer"):
                airflow_stack.restart(service)
        time.sleep(3)
    assert killed is not None, "grpo_update was never seen deferred: the kill drill did not run"
    # the run's cluster was seen (Linux keeps 15 characters of a process name: no exact names beyond these)
    assert {"raylet", "gcs_server"} <= seen and any(name.startswith("ray::") for name in seen), seen
    states = _states(client, run_id)
    assert run["state"] == "failed", states
    assert states["grpo_update"] == "failed", states
    assert states["ray_cluster_teardown"] == "success", states
    assert states["summarize"] == "success", states
    assert _ray_pids(run_id) == []
    log = client.task_log(DAG, run_id, "grpo_update")
    assert "injected failure at GRPO step 1" in log, log[-3000:]
    model_aliases = __import__("mlflow").MlflowClient(tracking_uri=airflow_stack.mlflow_url) \
        .get_registered_model("evergreen-agent").aliases
    assert model_aliases["champion"] == finished_run["promotion"]["version"], "a failed run must not move the alias"
