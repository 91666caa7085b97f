"""StageOperator: one DAG task = one stage function of tasks/stages/, called with the run's settings and
run directory. The task id is the function's name, so the Airflow UI names the code it runs.

    from operators.stages import StageOperator, StageBranchOperator
    from tasks.stages import signals
    StageOperator(python_callable=signals.validate_data)                     # task id validate_data
    StageBranchOperator(python_callable=signals.should_train, follow={True: "toolsets", False: "signals.skip"})
    StageOperator.partial(task_id="build_tasks", python_callable=rollouts.build_tasks).expand(
        op_kwargs=toolsets.output.map(lambda t: {"toolset": t}))

A stage function takes `(settings, rd, ...)`; the operator fills, by name, whichever of these the
function asks for:
  settings  the run's settings: pipeline.yaml, EVERGREEN_* variables, then the run's params
            (tasks/run_params.py PARAM_FIELDS, and `overrides` {"section.field": value} for the fields a run may
            change: tasks/run_params.py)
  rd        the run's directory (tasks.rundir.RunDir, from the DAG id and run id)
  trigger   why the run exists (trigger_of: schedule, asset events with their extra, a person; its params)
then `op_kwargs` (XComArgs resolved), then, for a parameter named like one of the DAG's params (`force`,
`days`, `fail_training_at_step`), the run's value of that param. Module import is light: DAG files import it at
parse time.
"""

from __future__ import annotations

import inspect
import logging
import time
from typing import Any

from airflow.providers.standard.operators.python import BranchPythonOperator, PythonOperator

from tasks.run_params import overrides_from_params  # no heavy import: DAG files import this module

log = logging.getLogger(__name__)


def settings_for(params: dict | None, trigger: dict | None = None):
    """The run's settings: the file, EVERGREEN_* variables, then the run's params, where the deployment lets
    a run's params change them (tasks/run_params.py; SettingsError names every refused field). A run started
    by a breaking tool change (triggers/tool_change.py) trains for the watched tools unless a param names
    others; an event naming a source this deployment does not watch is refused (anyone who may post an asset
    event could otherwise point a run at a command or a file)."""
    import os

    from tasks.config import SettingsError, load_settings, nest
    from tasks.run_params import check_overrides
    from tasks.stages.signals import tool_change_of

    overrides = overrides_from_params(dict(params or {}))
    if overrides:
        nest(overrides)  # a key that is no section.field is named as such first
        check_overrides(overrides, load_settings())
    changed = tool_change_of(trigger or {})
    if changed and "env.target_toolset" not in overrides:
        watched = os.environ.get("EVERGREEN_TOOL_SOURCE")
        if changed["source"] != watched:
            raise SettingsError(
                f"a tool_change event names the source {changed['source']!r}, but this deployment "
                f"watches {watched!r} (EVERGREEN_TOOL_SOURCE): only the deployment's tool watch "
                "may choose a served toolset"
            )
        overrides["env.target_toolset"] = changed["source"]
    return load_settings(overrides=nest(overrides))


def trigger_of(context) -> dict:
    """Why this run exists: schedule, an asset event (with its extra), or a person (UI / REST)."""
    dag_run = context["dag_run"]
    run_type = str(getattr(dag_run, "run_type", "") or "").split(".")[-1].lower()
    events = []
    for ev in getattr(dag_run, "consumed_asset_events", None) or []:
        asset = getattr(ev, "asset", None)
        events.append(
            {
                "uri": getattr(asset, "uri", None),
                "name": getattr(asset, "name", None),
                "extra": dict(getattr(ev, "extra", None) or {}),
                "source_dag_id": getattr(ev, "source_dag_id", None),
                "timestamp": str(getattr(ev, "timestamp", "")),
            }
        )
    kind = {"scheduled": "schedule", "asset_triggered": "asset", "manual": "manual"}.get(run_type, run_type or "manual")
    if kind == "manual" and getattr(dag_run, "triggering_user_name", None):
        kind = "rest"  # the UI triggers through the same REST API; the user is recorded beside it
    return {
        "kind": kind,
        "run_type": run_type,
        "user": getattr(dag_run, "triggering_user_name", None),
        "asset_events": events,
        "params": dict(context["params"] or {}),
        "conf": dict(dag_run.conf or {}),
    }


def run_dir_of(context, settings):
    from tasks.rundir import RunDir

    return RunDir.for_run(settings, context["dag"].dag_id, context["run_id"])


def record_task_time(context, rd, started: float) -> None:
    """When this task's body ran (task_times/<task>.json): the run's orchestration overhead is its wall time
    minus the union of these intervals (scripts/demo.py)."""
    ti = context["ti"]
    name = ti.task_id + (f"-{ti.map_index}" if getattr(ti, "map_index", -1) >= 0 else "")
    rd.write({"task_id": ti.task_id, "start": started, "end": time.time()}, "task_times", f"{name}.json")


class StageOperator(PythonOperator):
    """Run one stage function of tasks/stages/ for the current DAG run (see the module docstring)."""

    ui_color = "#e3f4e1"

    def __init__(self, *, python_callable, task_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(python_callable=python_callable, task_id=task_id or python_callable.__name__, **kwargs)

    def execute(self, context) -> Any:
        import os

        from hooks.credentials import stage_credentials

        os.environ.update(stage_credentials())  # this task's process only: S3 and MLflow from Connections
        self._trigger = trigger_of(context)
        self._settings = settings_for(context["params"], self._trigger)
        self._rd = run_dir_of(context, self._settings)
        self._rd.pull()  # a run kept on S3: this worker's copy of what earlier tasks pushed (tasks.mirror)
        from hooks.kuberay import driver_environment

        # a KubeRay cluster's token for the stages that attach to it as drivers (this task's process only)
        os.environ.update(driver_environment(self._rd.read("cluster.json")))
        from tasks.stages.rollouts import pin_toolsets

        self._settings = pin_toolsets(self._settings, self._rd)  # the tools this run read first, for every stage
        log.info(
            "stage %s.%s of %s (run dir %s)",
            self.python_callable.__module__,
            self.python_callable.__name__,
            context["run_id"],
            self._rd.path,
        )
        started = time.time()
        try:
            return PythonOperator.execute(self, context)  # not super(): the branch subclass's MRO
        finally:
            record_task_time(context, self._rd, started)
            self._rd.push()  # failed or not: what the stage wrote is the next try's, on whichever worker

    def determine_kwargs(self, context) -> dict:
        wanted = inspect.signature(self.python_callable).parameters
        given = {"settings": self._settings, "rd": self._rd, "trigger": self._trigger}
        kwargs = {k: v for k, v in given.items() if k in wanted}
        kwargs.update({k: v for k, v in self.op_kwargs.items() if k in wanted})
        params = context["params"] or {}
        kwargs.update({k: params[k] for k in wanted if k not in kwargs and k in params})
        return kwargs


class StageBranchOperator(StageOperator, BranchPythonOperator):
    """A stage whose answer picks the path: `follow` maps its returned `train` (or the value of `key`) to
    the task ids to run; the others are skipped."""

    def __init__(self, *, follow: dict, key: str = "train", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.follow, self.key = follow, key

    def choose_branch(self, context):
        answer = StageOperator.execute(self, context)
        return self.follow[bool(answer[self.key])]

    def execute(self, context):
        return BranchPythonOperator.execute(self, context)
