"""Every DAG loads, parses fast, imports nothing heavy at top level, and carries docs, tags, an owner and
retries (the conventions in ../shared/ARCHITECTURE.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dags.conftest import DAGS, PROJECT

EXPECTED = {
    "continuous_post_training",
    "drift_monitor",
    "bootstrap_champion",
    "rollback",
    "simulate_production",
    "timeline",
}
HEAVY = ("torch", "ray", "vllm", "mlflow", "great_expectations", "transformers", "pandas")


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_every_dag_loads_without_import_errors(dagbag):
    assert dagbag.import_errors == {}, dagbag.import_errors
    assert set(dagbag.dag_ids) == EXPECTED
    for path in DAGS.glob("*.py"):  # one DAG per file, DAG id = file name
        assert path.stem in dagbag.dag_ids, f"{path.name} defines no DAG named {path.stem}"


def test_every_dag_has_docs_tags_owner_and_retries(dagbag):
    for dag_id in EXPECTED:
        dag = dagbag.dags[dag_id]
        assert dag.doc_md and len(dag.doc_md) > 200, f"{dag_id}: doc_md missing or thin"
        assert "evergreen" in dag.tags and len(dag.tags) >= 2, dag_id
        for t in dag.tasks:
            assert t.owner == "evergreen", f"{dag_id}.{t.task_id} owner {t.owner!r}"
            assert t.retries is not None, f"{dag_id}.{t.task_id} has no retries setting"
            # a hung stage fails instead of holding its slot (and the registry pool) forever, and says why
            assert t.execution_timeout is not None and t.execution_timeout.total_seconds() >= 60, t.task_id
            callbacks = t.on_failure_callback if isinstance(t.on_failure_callback, list) else [t.on_failure_callback]
            assert any(getattr(c, "__name__", "") == "log_failure" for c in callbacks), t.task_id
        assert any(t.retries > 0 for t in dag.tasks), f"{dag_id}: no task retries at all"
        assert dag.max_active_runs == 1, dag_id


@pytest.mark.parametrize("dag_file", sorted(p.name for p in DAGS.glob("*.py")))
def test_dag_file_imports_nothing_heavy_at_top_level(dag_file):
    code = (
        "import runpy, sys, json; runpy.run_path(sys.argv[1]); "
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(DAGS / dag_file)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    heavy = json.loads(proc.stdout.strip().splitlines()[-1])
    assert heavy == [], f"{dag_file} imports {heavy} at parse time: move the import into the task body"


def test_each_dag_file_parses_within_300ms(airflow_db):
    """`airflow dags report` is Airflow's own parse timing (the dag-processor's figure)."""
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), "dags", "report", "-o", "json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout[proc.stdout.index("[{") :])  # warnings may precede the JSON
    seen = {}
    for row in rows:
        duration = row["duration"]
        seconds = (
            float(duration)
            if not isinstance(duration, str) or ":" not in duration
            else sum(float(x) * 60**i for i, x in enumerate(reversed(duration.split(":"))))
        )
        seen[os.path.basename(row["file"]).removesuffix(".py")] = seconds
    assert set(seen) == EXPECTED, seen
    slow = {k: v for k, v in seen.items() if v > 0.3}
    assert not slow, f"DAG files slower than 0.3 s to parse: {slow} (all: {seen})"


def test_continuous_post_training_listens_to_the_retrain_events(dagbag):
    """Cron or any of the retrain assets (one schedule); the file-drop asset carries its watcher."""
    from airflow.sdk import AssetOrTimeSchedule

    from operators.assets import retrain_file

    dag = dagbag.dags["continuous_post_training"]
    assert isinstance(dag.timetable, AssetOrTimeSchedule) or "AssetOrTime" in type(dag.timetable).__name__

    def leaves(condition):  # AssetAny / AssetAll nest their members in .objects
        for obj in getattr(condition, "objects", None) or [condition]:
            yield from (leaves(obj) if hasattr(obj, "objects") else [obj])

    assets = {a.name: a for a in leaves(dag.timetable.asset_condition)}
    assert {"retrain_request", "retrain_file_drop"} <= set(assets), assets
    watcher = assets["retrain_file_drop"].watchers[0]
    assert type(watcher.trigger).__name__ == "FileDeleteTrigger" and watcher.trigger.filepath == str(retrain_file())
    producer = dagbag.dags["drift_monitor"].get_task("request_retrain")
    assert [o.name for o in producer.outlets] == ["retrain_request"]


# tasks that are not stages, and why: Airflow-only steps (an operator of the Ray provider layer, a short
# circuit, an asset event with metadata) that orchestrate but compute nothing of the loop
NOT_STAGES = {"ray_cluster_setup", "ray_cluster_teardown", "grpo_update", "production_moved", "request_retrain"}


def test_each_python_task_runs_the_stage_function_it_is_named_after(dagbag):
    """One hop from a task to its code: the task's callable is a function of tasks/stages/ named like the
    task (the task group prefix aside); no string dispatch."""
    from operators.stages import StageOperator

    seen = set()
    for dag_id in EXPECTED:
        for t in dagbag.dags[dag_id].tasks:
            name = t.task_id.split(".")[-1]
            if name in NOT_STAGES:
                continue
            assert (
                t.operator_class is StageOperator
                or issubclass(t.operator_class, StageOperator)
                or isinstance(t, StageOperator)
            ), f"{dag_id}.{t.task_id} is a {t.operator_class}, not a StageOperator"
            fn = t.partial_kwargs["python_callable"] if hasattr(t, "partial_kwargs") else t.python_callable
            assert fn.__module__.startswith("tasks.stages."), f"{dag_id}.{t.task_id} runs {fn.__module__}.{fn.__name__}"
            assert fn.__name__ == name, f"{dag_id}.{t.task_id} runs {fn.__name__}"
            seen.add(name)
    assert {
        "validate_data",
        "should_train",
        "build_tasks",
        "probe_rollouts",
        "gate",
        "move_aliases",
        "summarize",
        "bootstrap",
        "monitor",
        "rollback",
        "simulate_production",
        "timeline_day",
    } <= seen, seen
