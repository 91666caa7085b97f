"""`python -m tasks demo` (`make demo-cli`): the DAGs' stage functions, in the DAGs' order, in one process
on a local run directory, without Airflow.

    python -m tasks demo
    python -m tasks --set grpo.steps=5 demo

bootstrap_champion → simulate_production → drift_monitor's check (its `retrain_request` extra becomes the
run's trigger) → continuous_post_training: open_run, validate_data, should_train, build_tasks, a local
Ray head, probe_rollouts, the GRPO job (its entrypoint run as a child process with the job's
environment, where the DAG submits it to the Ray Jobs API), record_training, evaluate, validate_evals,
cost, gate, move_aliases, teardown, summarize. Same functions, same seeds, so the same figures and
decision as `make demo`; what differs is the cost of the stages (the probes run one after the other
here, side by side in the DAG).
"""

from __future__ import annotations

import logging
import shlex
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks.config import Settings
    from tasks.rundir import RunDir
    from tasks.stages.contracts import RunSummary

log = logging.getLogger(__name__)

# the simulation writes two days: compare the day after the tool change with the one day before it
# (scripts/demo.py gives the Airflow stack the same setting)
DEMO_REFERENCE_DAYS = 1


def demo_settings(settings: Settings) -> Settings:
    """The demo's settings: one reference day, and production traces inside the run directory."""
    return settings.model_copy(
        update={
            "drift": settings.drift.model_copy(update={"reference_days": DEMO_REFERENCE_DAYS}),
            "monitor": settings.monitor.model_copy(update={"traces": settings.run_uri("production", "traces")}),
        }
    )


class Workers:
    """Where the demo runs each stage of a run. On a local run_dir: in it. On S3: in turn on two "workers",
    scratch directories that share nothing (`<scratch_dir>/worker-0`, `-1`), each stage pulling the run
    before and pushing after, as Celery workers on two machines do (tasks.mirror): the demo then shows
    that no stage needs another's disk."""

    def __init__(self, settings: Settings, dag_id: str, run_id: str) -> None:
        from tasks.storage import is_s3

        self.settings, self.dag_id, self.run_id = settings, dag_id, run_id
        self.remote, self.turn = is_s3(settings.run_dir), 0

    def rd(self) -> RunDir:
        from tasks.rundir import RunDir

        return RunDir.for_run(self._next(), self.dag_id, self.run_id)

    def _next(self) -> Settings:
        if not self.remote:
            return self.settings
        self.turn += 1
        return self.settings.model_copy(update={"scratch_dir": self.settings.scratch_dir / f"worker-{self.turn % 2}"})

    def run(self, stage: Callable[..., Any], *args: Any) -> Any:
        """stage(settings, rd, *args) on the next worker, with the run's toolsets pinned as a task pins them."""
        from tasks.rundir import RunDir
        from tasks.stages.rollouts import pin_toolsets

        settings = self._next()
        rd = RunDir.for_run(settings, self.dag_id, self.run_id)
        with rd.synced():
            return stage(pin_toolsets(settings, rd), rd, *args)


def run_demo(settings: Settings, fresh: bool = True) -> RunSummary:
    """The whole loop; returns the run's RunSummary (also in <run_dir>/continuous_post_training/<run>/)."""
    from tasks.stages import models, report, signals
    from tasks.stages.simulate import simulate_production
    from tasks.storage import is_s3

    settings = demo_settings(settings)
    root = Path(settings.local_root)
    if fresh and root.exists():  # a run_dir on S3 is never emptied: give the demo a prefix of its own
        shutil.rmtree(root)
    run_id = f"cli__{time.strftime('%Y%m%dT%H%M%S')}"
    if is_s3(settings.run_dir):
        log.info("run_dir %s is on S3: the stages run in turn in %s/worker-0 and -1", settings.run_dir, root)
    Workers(settings, "bootstrap_champion", run_id).run(models.bootstrap)
    simulate_production(settings, days=2, tool_change=True)
    verdict = signals.monitor(settings)
    events = (
        [{"extra": signals.retrain_request_extra(verdict), "source_dag_id": "drift_monitor"}] if verdict["new"] else []
    )
    trigger = {"kind": "cli", "asset_events": events, "params": {}}

    summary = post_training_run(Workers(settings, "continuous_post_training", run_id), trigger)
    print(report.format_summary(summary), flush=True)
    return summary


def post_training_run(
    workers: Workers,
    trigger: dict,
    force: bool = False,
    window: str | None = None,
    forced_promotion: str = "",
    cluster: Callable[[], dict] | None = None,
) -> RunSummary:
    """One continuous_post_training run, its stages in the DAG's order; its RunSummary. `force`: train even
    without drift (the DAG's param); `window`: the production window validate_data reads (default: yesterday);
    `forced_promotion`: promote whatever the gate says, with this reason (a policy without a gate); `cluster`:
    returns a running local head (ClusterInfo) to use and leave running (the timeline's head of the day),
    instead of one started for the run and stopped after it; called only when the run trains."""
    from tasks.stages import report
    from tasks.stages.contracts import RunSummary

    workers.run(report.open_run, trigger)
    try:
        _train_or_skip(workers, trigger, force, window, forced_promotion, cluster)
    finally:  # like the DAG's summarize (trigger rule all_done): a failed run is summarized as failed
        workers.run(report.summarize)
    rd = workers.rd()
    rd.pull()
    return RunSummary.model_validate_json((rd.path / "summary.json").read_text())


def _train_or_skip(
    workers: Workers,
    trigger: dict,
    force: bool,
    window: str | None,
    forced_promotion: str,
    cluster: Callable[[], dict] | None,
) -> None:
    from tasks.rl.cluster import setup_local_cluster, teardown_local_cluster
    from tasks.stages import evaluation, promotion, rollouts, signals, training
    from tasks.stages.simulate import child_env, stream

    workers.run(signals.validate_data, window)
    if not workers.run(signals.should_train, trigger, force)["train"]:
        workers.run(signals.skip)
        return
    for toolset in rollouts.toolsets(workers.settings):
        workers.run(rollouts.build_tasks, toolset)
    run_key = f"{workers.dag_id}/{workers.run_id}"
    workers.run(lambda s, rd: rd.write(cluster() if cluster else setup_local_cluster(s, run_key), "cluster.json"))
    try:
        for shard in rollouts.PROBE_SHARDS:
            workers.run(rollouts.probe_rollouts, shard, len(rollouts.PROBE_SHARDS))
        job = workers.run(training.grpo_command)
        stream(shlex.split(job["entrypoint"]), child_env() | job["env_vars"], "grpo")
        workers.run(training.record_training, {"job_id": "local-process"})
        for stage in (evaluation.evaluate, evaluation.validate_evals):
            workers.run(stage)
        workers.run(promotion.cost)
        workers.run(promotion.gate)
        if forced_promotion:
            workers.run(promotion.force_promotion, forced_promotion)
        workers.run(promotion.move_aliases)
    finally:
        if cluster is None:
            teardown_local_cluster(run_key)
