"""
### continuous_post_training

Keeps the production agent current: validates the newest production traces, and when they show drift
or a breaking tool change (or an event asks, or `force`), runs GRPO from the champion against the new
tools on a Ray cluster made for this run, evaluates challenger against champion on the same held-out tasks,
prices the run, and moves the MLflow `champion` alias only when the gain clears the gate.

**Runs** nightly at 02:00 UTC, on every `retrain_request` asset event (drift_monitor, `POST
/api/v2/assets/events`, a file drop, a queue message or a breaking change of the watched tools when
configured: operators/assets.py), or when triggered (UI / REST).
`max_active_runs=1`: a second trigger queues behind the first, it is not lost.

**Stages** (each task runs the function of `tasks/stages/` it is named after): open_run → signals
(validate_data with GX, should_train) → toolsets → build_tasks (one per toolset) → ray_cluster_setup →
probe_rollouts (shards) → grpo_command → grpo_update (a Ray job, deferred) → record_training → evaluate
(champion, then challenger by weight sync) → validate_evals (GX) → cost → gate → move_aliases →
ray_cluster_teardown (always) → summarize (always). The skip path ends at `signals.skip` when there is
nothing to learn.

**Params**: `target_toolset` (the workload's tool registry), `grpo_steps`, `eval_tasks`, `max_cost_usd`
(the budget: a costlier run is not promoted), `force`, `overrides` ({"section.field": value} for any
setting), `fail_training_at_step` (a failure drill: the GRPO job raises at that step).
Everything it produced is in `runs/airflow/continuous_post_training/<run_id>/` and in the run's MLflow run.
"""

from __future__ import annotations

from airflow.sdk import AssetOrTimeSchedule, CronTriggerTimetable, Param, TaskGroup

from operators.assets import RETRAIN_REQUEST, retrain_file_drop, retrain_queue, tool_change
from operators.defaults import evergreen_dag, job_timeout
from operators.pools import REGISTRY_POOL
from operators.ray_cluster import RayClusterOperator
from operators.ray_job import RayJobOperator
from operators.stages import StageBranchOperator, StageOperator
from tasks.stages import evaluation, promotion, report, rollouts, signals, training

_assets = RETRAIN_REQUEST | retrain_file_drop()
for _watched in (retrain_queue(), tool_change()):  # configured by environment variables (operators/assets.py)
    if _watched is not None:
        _assets = _assets | _watched


def _toolset_kwargs(toolset: str) -> dict:
    return {"toolset": toolset}


@evergreen_dag(
    __doc__,
    schedule=AssetOrTimeSchedule(timetable=CronTriggerTimetable("0 2 * * *", timezone="UTC"), assets=_assets),
    tags=["training", "ray", "mlflow"],
    params={
        "target_toolset": Param(
            None, type=["null", "string"], description="toolset the agent must serve (default: env.target_toolset)"
        ),
        "grpo_steps": Param(
            None, type=["null", "integer"], minimum=1, description="GRPO updates (default: grpo.steps)"
        ),
        "eval_tasks": Param(
            None,
            type=["null", "integer"],
            minimum=8,
            description="held-out tasks per toolset (default: eval.num_tasks)",
        ),
        "max_cost_usd": Param(
            None,
            type=["null", "number"],
            minimum=0,
            description="budget (promotion.max_cost_usd): a run that costs more is not promoted",
        ),
        "force": Param(False, type="boolean", description="train even without drift or new data"),
        "overrides": Param({}, type="object", description='any setting, e.g. {"grpo.tasks_per_step": 8}'),
        "fail_training_at_step": Param(
            None, type=["null", "integer"], description="failure drill: GRPO raises at this step"
        ),
    },
)
def continuous_post_training():
    run = StageOperator(python_callable=report.open_run)
    with TaskGroup("signals"):
        verdict = StageOperator(python_callable=signals.validate_data)
        branch = StageBranchOperator(
            python_callable=signals.should_train, follow={True: "toolsets", False: "signals.skip"}
        )
        skipped = StageOperator(python_callable=signals.skip)
        run >> verdict >> branch >> skipped  # validate_data logs under the run's MLflow run, which open_run creates
    toolsets = StageOperator(python_callable=rollouts.toolsets)
    branch >> toolsets
    built = StageOperator.partial(task_id="build_tasks", python_callable=rollouts.build_tasks).expand(
        op_kwargs=toolsets.output.map(_toolset_kwargs)
    )

    setup = RayClusterOperator(task_id="ray_cluster_setup", action="setup")
    teardown = RayClusterOperator(task_id="ray_cluster_teardown", action="teardown", trigger_rule="all_done")
    # the stages find the cluster in the run directory (cluster.json); the Ray job operator gets it as XCom
    probes = StageOperator.partial(task_id="probe_rollouts", python_callable=rollouts.probe_rollouts).expand(
        op_kwargs=[{"shard": shard, "num_shards": len(rollouts.PROBE_SHARDS)} for shard in rollouts.PROBE_SHARDS]
    )
    command = StageOperator(python_callable=training.grpo_command, multiple_outputs=True)
    built >> setup >> probes >> command
    grpo = RayJobOperator(
        task_id="grpo_update",
        entrypoint=command.output["entrypoint"],
        cluster=setup.output,
        env_vars=command.output["env_vars"],
        timeout=job_timeout(),
        retries=0,
    )  # a failed update is rerun by a new DAG run, resuming from its checkpoints
    trained = StageOperator(python_callable=training.record_training, op_kwargs={"job": grpo.output})
    evals = StageOperator(python_callable=evaluation.evaluate)
    trained >> evals
    (
        evals
        >> StageOperator(python_callable=evaluation.validate_evals)
        >> StageOperator(python_callable=promotion.cost)
        >> StageOperator(python_callable=promotion.gate)
        >> StageOperator(python_callable=promotion.move_aliases, pool=REGISTRY_POOL)  # one alias move at a time
        >> teardown.as_teardown(setups=setup)
    )
    # not downstream of the branch itself: a branch skips its direct downstream tasks it did not choose
    [teardown, skipped] >> StageOperator(python_callable=report.summarize, trigger_rule="all_done", retries=0)


continuous_post_training()
