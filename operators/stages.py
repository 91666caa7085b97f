"""The one bridge from an Airflow task to tasks.loop: settings from the DAG's params, the run's directory
from its run id, then one call.

    @task
    def validate_data():
        return run_stage("validate_data")

Params map onto settings (the same fields as include/config/pipeline.yaml and EVERGREEN_* variables):
  target_registry -> env.target_registry   grpo_steps -> grpo.steps   eval_tasks -> eval.num_tasks
  sft_steps -> bootstrap.steps
  overrides       -> any field, as {"section.field": value}
Everything heavy is imported inside the functions: DAG files import this module at parse time.
"""
from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

PARAM_FIELDS = {"target_registry": "env.target_registry", "grpo_steps": "grpo.steps", "eval_tasks": "eval.num_tasks",
                "sft_steps": "bootstrap.steps"}


def overrides_from_params(params: dict) -> dict[str, object]:
    """{"section.field": value} from the run's params (unset params change nothing)."""
    out: dict[str, object] = {}
    for param, field in PARAM_FIELDS.items():
        if params.get(param) not in (None, ""):
            out[field] = params[param]
    for key, value in (params.get("overrides") or {}).items():
        if "." not in key:
            raise ValueError(f"overrides key {key!r}: expected SECTION.FIELD, e.g. grpo.tasks_per_step")
        out[key] = value
    return out


def _nest(flat: dict[str, object]) -> dict:
    nested: dict = {}
    for key, value in flat.items():
        node = nested
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return nested


def settings_for(params: dict | None):
    from tasks.config import load_settings

    return load_settings(overrides=_nest(overrides_from_params(params or {})))


def trigger_of(context) -> dict:
    """Why this run exists: schedule, an asset event (with its extra), or a person (UI / REST)."""
    dag_run = context["dag_run"]
    run_type = str(getattr(dag_run, "run_type", "") or "").split(".")[-1].lower()
    events = []
    for ev in getattr(dag_run, "consumed_asset_events", None) or []:
        asset = getattr(ev, "asset", None)
        events.append({"uri": getattr(asset, "uri", None), "name": getattr(asset, "name", None),
                       "extra": dict(getattr(ev, "extra", None) or {}), "source_dag_id": getattr(ev, "source_dag_id", None),
                       "timestamp": str(getattr(ev, "timestamp", ""))})
    kind = {"scheduled": "schedule", "asset_triggered": "asset", "manual": "manual"}.get(run_type, run_type or "manual")
    if kind == "manual" and getattr(dag_run, "triggering_user_name", None):
        kind = "rest"  # the UI triggers through the same REST API; the user is recorded beside it
    return {"kind": kind, "run_type": run_type, "user": getattr(dag_run, "triggering_user_name", None),
            "asset_events": events, "params": dict(context["params"] or {}), "conf": dict(dag_run.conf or {})}


def run_stage(stage: str, **kwargs):
    """Call tasks.loop.<stage>(settings, run_dir, **kwargs) for the current task's DAG run."""
    from airflow.sdk import get_current_context

    from tasks import loop

    context = get_current_context()
    params = dict(context["params"] or {})
    settings = settings_for(params)
    rd = loop.RunDir.for_run(settings, context["dag"].dag_id, context["run_id"])
    if stage == "open_run":
        kwargs.setdefault("trigger", trigger_of(context))
    log.info("stage %s of %s (run dir %s)", stage, context["run_id"], rd.path)
    started = time.time()
    try:
        return getattr(loop, stage)(settings, rd, **kwargs)
    finally:
        record_task_time(context, rd, started)


def record_task_time(context, rd, started: float) -> None:
    """When this task's body ran (task_times/<task>.json): the run's orchestration overhead is its wall time
    minus the union of these intervals (scripts/demo.py)."""
    ti = context["ti"]
    name = ti.task_id + (f"-{ti.map_index}" if getattr(ti, "map_index", -1) >= 0 else "")
    rd.write({"task_id": ti.task_id, "start": started, "end": time.time()}, "task_times", f"{name}.json")
