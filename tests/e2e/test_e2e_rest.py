"""End to end on the real local stack: a REST asset event trains and promotes; with the scheduler and the
triggerer SIGKILLed while GRPO is deferred and the Ray head SIGKILLed after GRPO's first checkpoint, the run
fails, still tears the Ray cluster down and says why in the task log; the next run resumes from that
checkpoint; a rollback and a cleared alias move race across two DAGs and take turns.

    python -m pytest -q tests/e2e          # about 14 minutes on 2 cores (stack, bootstrap, three runs)
"""

from __future__ import annotations

import ipaddress
import json
import time

import pytest

from tasks.rl.cluster import LocalHead, local_temp_dir

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


def _run_dir(stack, run_id: str):
    for path in (stack.runs_root / DAG).glob("*/run.json"):
        if json.loads(path.read_text())["run_id"] == run_id:
            return path.parent
    return None


def _kill_head(run_id: str) -> list[str]:
    """SIGKILL the run's Ray head node (its GCS and raylet), as a lost head machine would; the dashboard,
    the workers, the engines and the job's driver are left to notice (teardown must end what remains)."""
    import psutil

    killed = []
    for pid in _ray_pids(run_id):
        try:
            proc = psutil.Process(pid)
            if proc.name() in ("gcs_server", "raylet"):
                proc.kill()
                killed.append(proc.name())
        except psutil.NoSuchProcess:
            continue
    return killed


@pytest.fixture(scope="module")
def head_killed_run(airflow_stack, finished_run):
    """A run whose Ray head is SIGKILLed once GRPO has saved its first checkpoint; on the way, while the GRPO
    task is deferred, the scheduler and the triggerer are SIGKILLed and started again (the trigger resumes
    watching the same Ray job); and while the run holds its cluster, no process the stack started (Airflow's
    services, MLflow, the run's Ray head, agents, client server, engines, trainer) listens beyond loopback."""
    from tasks.rl.checkpoint import latest_checkpoint

    client = airflow_stack.client()
    run_id = client.trigger(DAG, {"force": True})
    seen, deadline, restarted, head, run_dir = set(), time.time() + 1200, None, None, None
    while (run := client.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}"))["state"] not in ("success", "failed"):
        assert time.time() < deadline, f"run {run_id} still {run['state']} after 1200 s"
        if head is None:  # the sockets while the cluster is whole
            sockets = airflow_stack.listening()
            assert sockets and _exposed(airflow_stack) == [], _exposed(airflow_stack)
            seen |= {name for _, name, _, _ in sockets}
        if restarted is None and _states(client, run_id).get("grpo_update") == "deferred":
            for service in ("triggerer", "scheduler"):
                airflow_stack.kill(service)
            restarted = time.time()
            for service in ("scheduler", "triggerer"):
                airflow_stack.restart(service)
        run_dir = run_dir or _run_dir(airflow_stack, run_id)
        if head is None and run_dir and latest_checkpoint(run_dir / "grpo" / "checkpoints") is not None:
            head = (latest_checkpoint(run_dir / "grpo" / "checkpoints").name, _kill_head(run_id), time.time())
        time.sleep(0.5)
    assert restarted is not None, "grpo_update was never seen deferred: the scheduler/triggerer drill did not run"
    assert head is not None and head[1], f"the head was not killed mid-GRPO ({head}); run {run['state']}"
    # the run's cluster was seen (Linux keeps 15 characters of a process name: no exact names beyond these)
    assert {"raylet", "gcs_server"} <= seen and any(name.startswith("ray::") for name in seen), seen
    return {
        "run_id": run_id,
        "run": run,
        "run_dir": run_dir,
        "checkpoint": head[0],
        "killed_at": head[2],
        "ended_at": time.time(),
    }


def test_the_ray_head_killed_mid_grpo_fails_the_run_and_tears_down(airflow_stack, finished_run, head_killed_run):
    client = airflow_stack.client()
    run_id = head_killed_run["run_id"]
    states = _states(client, run_id)
    assert head_killed_run["run"]["state"] == "failed", states
    assert states["grpo_update"] == "failed", states
    assert states["ray_cluster_teardown"] == "success", states
    assert states["summarize"] == "success", states
    assert _ray_pids(run_id) == []
    log = client.task_log(DAG, run_id, "grpo_update")
    assert "could not read the job's status" in log or "Ray job" in log and "FAILED" in log, log[-3000:]
    assert not (head_killed_run["run_dir"] / "grpo" / "model" / "config.json").exists()
    model_aliases = (
        __import__("mlflow")
        .MlflowClient(tracking_uri=airflow_stack.mlflow_url)
        .get_registered_model("evergreen-agent")
        .aliases
    )
    assert model_aliases["champion"] == finished_run["promotion"]["version"], "a failed run must not move the alias"
    print(
        f"head killed after {head_killed_run['checkpoint']}; run failed "
        f"{head_killed_run['ended_at'] - head_killed_run['killed_at']:.0f} s later"
    )


@pytest.fixture(scope="module")
def resumed_run(airflow_stack, head_killed_run):
    client = airflow_stack.client()
    t0 = time.time()
    run = client.wait_for_run(DAG, client.trigger(DAG, {"force": True}), timeout=1200)
    return {"run": run, "run_dir": _run_dir(airflow_stack, run["dag_run_id"]), "seconds": time.time() - t0}


def test_the_next_run_resumes_from_the_failed_runs_checkpoint(airflow_stack, head_killed_run, resumed_run):
    assert resumed_run["run"]["state"] == "success", _states(airflow_stack.client(), resumed_run["run"]["dag_run_id"])
    job = json.loads((resumed_run["run_dir"] / "grpo_job.json").read_text())
    step = int(head_killed_run["checkpoint"].split("-")[1])
    assert job["resumed_from"] == {"run": head_killed_run["run_dir"].name, "step": step}, job
    metrics = [
        json.loads(line) for line in (resumed_run["run_dir"] / "grpo" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [m["step"] for m in metrics if "step" in m]
    assert sorted(steps) == sorted(set(steps)), f"a step recorded twice: {steps}"
    print(f"resumed at step {step}; the run took {resumed_run['seconds']:.0f} s")


def test_two_dags_move_the_aliases_one_at_a_time(airflow_stack, resumed_run):
    """Two alias moves ready at once across DAGs: with the `evergreen_registry` pool closed (0 slots), a
    rollback run is triggered and a finished run's move_aliases cleared; both wait for the pool, neither
    starts. The pool reopened with its one slot, both run, one after the other, and the aliases end a pair."""
    client = airflow_stack.client()
    run_id = resumed_run["run"]["dag_run_id"]
    client.patch("/api/v2/pools/evergreen_registry", {"slots": 0})
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
        waiting = [client.get(p) for p in paths]
        assert [t["state"] for t in waiting] == ["scheduled", "scheduled"] and not any(t["start_date"] for t in waiting)
    finally:
        client.patch("/api/v2/pools/evergreen_registry", {"slots": 1})
    deadline = time.time() + 600
    while (done := [client.get(p) for p in paths]) and not all(t["state"] in ("success", "failed") for t in done):
        assert time.time() < deadline, done
        time.sleep(2)
    move, back = done
    assert move["state"] == "success" and back["state"] == "success", (move, back)
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
