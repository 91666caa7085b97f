"""End to end on the real local stack. A REST asset event starts a run whose Ray head is SIGKILLed after GRPO's
first checkpoint (the scheduler and the triggerer SIGKILLed and restarted while GRPO is deferred, on the way): the
run fails, tears its cluster down and says why in the task log. The next REST asset event starts a run that
resumes from that checkpoint, trains, promotes and leaves no Ray process. A rollback and a cleared alias move
then wait for the closed registry pool together and take turns. Fixtures and the drill: tests/e2e/conftest.py,
tests/e2e/drills.py.

    python -m pytest -q tests/e2e          # about 13 minutes on 2 cores (stack, bootstrap, two runs)
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.drills import DAG, ray_pids, run_dir, states

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def test_the_ray_head_killed_mid_grpo_fails_the_run_and_tears_down(airflow_stack, head_killed_run):
    client = airflow_stack.client()
    run_id, run, head = head_killed_run["run_id"], head_killed_run["run"], head_killed_run["head"]
    assert head_killed_run["restarted"], (
        "grpo_update was never seen deferred: the scheduler/triggerer drill did not run"
    )
    assert head is not None and head[1], f"the head was not killed mid-GRPO ({head}); run {run['state']}"
    # the run's cluster was seen (Linux keeps 15 characters of a process name: no exact names beyond these)
    seen = head_killed_run["seen"]
    assert {"raylet", "gcs_server"} <= seen and any(name.startswith("ray::") for name in seen), seen
    now = states(client, run_id)
    assert run["state"] == "failed", now
    assert now["grpo_update"] == "failed" and now["ray_cluster_teardown"] == "success", now
    assert now["summarize"] == "success", now
    assert ray_pids(run_id) == []
    log = client.task_log(DAG, run_id, "grpo_update")
    assert "could not read the job's status" in log, log[-3000:]
    assert not (head_killed_run["run_dir"] / "grpo" / "model" / "config.json").exists()
    assert head_killed_run["aliases"]["champion"] == "1", "a failed run must not move the alias"
    print(f"head killed after {head[0]}; the run ended {head_killed_run['ended_at'] - head[2]:.0f} s later")


def test_the_next_run_resumes_from_the_checkpoint_promotes_and_leaves_no_ray_process(
    airflow_stack, head_killed_run, finished_run
):
    client = airflow_stack.client()
    run_id = finished_run["dag_run_id"]
    assert finished_run["airflow_state"] == "success", states(client, run_id)
    assert finished_run["trigger"]["kind"] == "asset"
    assert any(e["extra"].get("summary") == "e2e: REST asset event" for e in finished_run["trigger"]["asset_events"])
    job = json.loads((finished_run["run_dir"] / "grpo_job.json").read_text())
    # the last checkpoint the failed run saved: the first one, or a later one saved while the kill landed (the
    # drill sees a checkpoint once it is on S3, and the trainer may save the next before the head is gone)
    from tasks.rl.checkpoint import latest_checkpoint

    killed_after = int(head_killed_run["head"][0].split("-")[1])
    last = latest_checkpoint(run_dir(airflow_stack, head_killed_run["run_id"]) / "grpo" / "checkpoints")
    step = int(last.name.split("-")[1])
    assert step >= killed_after
    assert job["resumed_from"] == {"run": head_killed_run["run_dir"].name, "step": step}, job
    lines = (finished_run["run_dir"] / "grpo" / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines]
    assert sorted(steps) == sorted(set(steps)), f"a step recorded twice: {steps}"
    assert finished_run["status"] == "promoted", finished_run["promotion"]

    from mlflow import MlflowClient

    model = MlflowClient(tracking_uri=airflow_stack.mlflow_url).get_registered_model("evergreen-agent")
    assert model.aliases["champion"] == finished_run["promotion"]["version"] != "1", model.aliases
    assert model.aliases["previous"] == "1"
    assert ray_pids(run_id) == []
    now = states(client, run_id)
    assert now["ray_cluster_teardown"] == "success" and now["grpo_update"] == "success", now
    assert now["signals.skip"] == "skipped", now
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


def _set_slots(client, slots: int) -> None:
    # Airflow 3.3 validates a pool patch as a whole pool (name, slots, include_deferred): send all of it
    pool = client.get("/api/v2/pools/evergreen_registry")
    body = {
        "pool": pool["name"],
        "slots": slots,
        "include_deferred": pool["include_deferred"],
        "description": pool.get("description"),
    }
    assert client.patch("/api/v2/pools/evergreen_registry", body)["slots"] == slots


def test_two_dags_move_the_aliases_one_at_a_time(airflow_stack, finished_run):
    """Two alias moves ready at once across DAGs: with the `evergreen_registry` pool closed (0 slots), a
    rollback run is triggered and a finished run's move_aliases cleared; both wait for the pool, neither
    starts. The pool reopened with its one slot, both run, one after the other, and the aliases end a pair."""
    client = airflow_stack.client()
    run_id = finished_run["dag_run_id"]
    _set_slots(client, 0)
    try:
        rollback = client.trigger("rollback", {"confirm": True, "reason": "e2e: raced with move_aliases"})
        client.post(
            f"/api/v2/dags/{DAG}/clearTaskInstances",
            {
                "dry_run": False,
                "dag_run_id": run_id,
                "task_ids": ["move_aliases"],
                "only_failed": False,
                "reset_dag_runs": True,
                "include_downstream": False,
                "include_upstream": False,
            },
        )
        paths = (
            f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/move_aliases",
            f"/api/v2/dags/rollback/dagRuns/{rollback}/taskInstances/rollback",
        )
        deadline = time.time() + 300
        while (states := [client.get(p)["state"] for p in paths]) != ["scheduled", "scheduled"]:
            assert time.time() < deadline and not {"running", "success", "failed"} & set(states), states
            time.sleep(2)
        time.sleep(10)  # a few scheduler loops: a closed pool keeps both waiting
        # (a cleared task instance keeps its earlier try's start_date until it runs again: the state says it all)
        assert [client.get(p)["state"] for p in paths] == ["scheduled", "scheduled"]
    finally:
        _set_slots(client, 1)
    deadline = time.time() + 600
    while (done := [client.get(p) for p in paths]) and not all(t["state"] in ("success", "failed") for t in done):
        assert time.time() < deadline, done
        time.sleep(2)
    move, back = done
    assert move["state"] == "success" and back["state"] == "success", (move, back)
    # clearing move_aliases cleared its setup and teardown too (Airflow's setup/teardown scope): the run ends,
    # its cluster started again and stopped again, only once the teardown has run
    while (state := client.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}")["state"]) not in ("success", "failed"):
        assert time.time() < deadline, state
        time.sleep(2)
    assert state == "success" and ray_pids(run_id) == []
    assert move["pool"] == back["pool"] == "evergreen_registry"
    first, second = sorted([move, back], key=lambda t: t["start_date"])
    assert first["end_date"] <= second["start_date"], f"alias moves overlapped: {first} {second}"
    from mlflow import MlflowClient

    model = MlflowClient(tracking_uri=airflow_stack.mlflow_url).get_registered_model("evergreen-agent")
    versions = {
        v.version
        for v in MlflowClient(tracking_uri=airflow_stack.mlflow_url).search_model_versions("name='evergreen-agent'")
    }
    assert model.aliases["champion"] != model.aliases["previous"], model.aliases
    assert {model.aliases["champion"], model.aliases["previous"]} <= versions, model.aliases
