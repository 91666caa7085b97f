"""
### continuous_post_training

Keeps the production agent current: validates the newest production traces, and when they show drift
or a breaking tool change (or an event asks, or `force`), runs GRPO from the champion against the new
tools on a Ray cluster made for this run, evaluates challenger against champion on the same held-out tasks,
prices the run, and moves the MLflow `champion` alias only when the gain clears the gate.

**Runs** nightly at 02:00 UTC, on every `retrain_request` asset event (drift_monitor, `POST
/api/v2/assets/events`, a file drop, or a queue message when configured), or when triggered (UI / REST).
`max_active_runs=1`: a second trigger queues behind the first, it is not lost.

**Stages**: open run → signals (validate_data with GX, should_train) → build_tasks (one per registry) →
ray_cluster_setup → probe_rollouts (shards) → grpo_update (a Ray job, deferred) → record_training →
evaluate (champion, then challenger by weight sync) → validate_evals (GX) → cost → gate → registry → ray_cluster_teardown
(always) → summarize (always). The skip path ends at `skip` when there is nothing to learn.

**Params**: `target_registry` (the workload's tool registry), `grpo_steps`, `eval_tasks`, `max_cost_usd`
(the budget: a costlier run is not promoted), `force`, `overrides` ({"section.field": value} for any
setting), `fail_training_at_step` (a failure drill: the GRPO job raises at that step).
Everything it produced is in `runs/airflow/continuous_post_training/<run_id>/` and in the run's MLflow run.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import AssetOrTimeSchedule, CronTriggerTimetable, Param, dag, task, task_group

from operators.assets import RETRAIN_REQUEST, retrain_file_drop, retrain_queue
from operators.ray_cluster import RayClusterOperator
from operators.ray_job import RayJobOperator
from operators.stages import run_stage

PROBE_SHARDS = [0, 1]
_queue = retrain_queue()
_assets = RETRAIN_REQUEST | retrain_file_drop()
if _queue is not None:
    _assets = _assets | _queue


@dag(
    dag_id="continuous_post_training",
    schedule=AssetOrTimeSchedule(timetable=CronTriggerTimetable("0 2 * * *", timezone="UTC"), assets=_assets),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["evergreen", "training", "ray", "mlflow"],
    default_args={"owner": "evergreen", "retries": 1, "retry_delay": timedelta(seconds=30)},
    params={
        "target_registry": Param(None, type=["null", "string"], description="tool registry the agent must serve (default: env.target_registry)"),
        "grpo_steps": Param(None, type=["null", "integer"], minimum=1, description="GRPO updates (default: grpo.steps)"),
        "eval_tasks": Param(None, type=["null", "integer"], minimum=8, description="held-out tasks per registry (default: eval.num_tasks)"),
        "max_cost_usd": Param(None, type=["null", "number"], minimum=0, description="budget: a run that costs more is not promoted"),
        "force": Param(False, type="boolean", description="train even without drift or new data"),
        "overrides": Param({}, type="object", description='any setting, e.g. {"grpo.tasks_per_step": 8}'),
        "fail_training_at_step": Param(None, type=["null", "integer"], description="failure drill: GRPO raises at this step"),
    },
)
def continuous_post_training():
    @task
    def open_run():
        return run_stage("open_run")

    @task_group
    def signals():
        @task
        def validate_data():
            return run_stage("validate_data")

        @task.branch
        def should_train(verdict: dict, run: dict, params=None):
            from tasks.loop import should_train as decide

            go, why = decide(verdict, run["trigger"], force=bool(params["force"]))
            print(f"should_train: {go}: {why}")
            return "registries" if go else "signals.skip"

        @task
        def skip(verdict: dict, run: dict, params=None):
            from tasks.loop import should_train as decide

            return run_stage("record_skip", reason=decide(verdict, run["trigger"], force=bool(params["force"]))[1])

        verdict = validate_data()
        run >> verdict  # its stage logs under the run's MLflow run, which open_run creates
        branch = should_train(verdict, run)
        skipped = skip(verdict, run)
        branch >> skipped
        return branch, skipped

    @task
    def registries(params=None):
        from operators.stages import settings_for
        from tasks.loop import registries as regs

        return regs(settings_for(params))

    @task
    def build_tasks(registry: str):
        return run_stage("build_tasks", registry=registry)

    @task
    def probe_rollouts(cluster: dict, shard: int):
        return run_stage("probe_rollouts", cluster=cluster, shard=shard, num_shards=len(PROBE_SHARDS))

    @task(multiple_outputs=True)
    def grpo_command(cluster: dict, params=None):
        from operators.stages import overrides_from_params

        return run_stage("grpo_command", cluster=cluster, overrides=overrides_from_params(params),
                         fail_at_step=params.get("fail_training_at_step"))

    @task
    def record_training(job: dict):
        return run_stage("record_training", job=job)

    @task
    def evaluate(cluster: dict):
        return run_stage("evaluate", cluster=cluster)

    @task
    def validate_evals():
        return run_stage("validate_evals")

    @task
    def cost():
        return run_stage("cost")

    @task
    def gate(params=None):
        return run_stage("gate", max_cost_usd=params.get("max_cost_usd"))

    @task
    def registry():
        return run_stage("update_registry")

    @task(trigger_rule="all_done", retries=0)
    def summarize(ti=None, dag_run=None):
        cluster = ti.xcom_pull(task_ids="ray_cluster_setup") or {}
        links = {"ray_dashboard": cluster.get("dashboard_url"),
                 "ray_job_id": ti.xcom_pull(task_ids="grpo_update", key="ray_job_id"),
                 "airflow_run": f"/dags/{dag_run.dag_id}/runs/{dag_run.run_id}"}
        return run_stage("summarize", links=links)

    run = open_run()
    go, skipped = signals()
    regs = registries()
    go >> regs
    built = build_tasks.expand(registry=regs)

    setup = RayClusterOperator(task_id="ray_cluster_setup", action="setup")
    teardown = RayClusterOperator(task_id="ray_cluster_teardown", action="teardown", trigger_rule="all_done")
    built >> setup
    probes = probe_rollouts.partial(cluster=setup.output).expand(shard=PROBE_SHARDS)
    command = grpo_command(setup.output)
    probes >> command
    grpo = RayJobOperator(task_id="grpo_update", entrypoint=command["entrypoint"], cluster=setup.output,
                          env_vars=command["env_vars"], timeout=timedelta(hours=2),
                          retries=0)  # a failed update is rerun by a new DAG run, resuming from its checkpoints
    trained = record_training(grpo.output)
    evals = evaluate(setup.output)
    trained >> evals
    evals >> validate_evals() >> cost() >> gate() >> registry() >> teardown.as_teardown(setups=setup)
    # not downstream of the branch itself: a branch skips its direct downstream tasks it did not choose
    [teardown, skipped] >> summarize()

continuous_post_training()
