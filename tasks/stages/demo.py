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
from pathlib import Path
from typing import TYPE_CHECKING

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
    root = Path(settings.run_dir).resolve()
    return settings.model_copy(
        update={
            "drift": settings.drift.model_copy(update={"reference_days": DEMO_REFERENCE_DAYS}),
            "monitor": settings.monitor.model_copy(update={"traces": str(root / "production" / "traces")}),
        }
    )


def run_demo(settings: Settings, fresh: bool = True) -> RunSummary:
    """The whole loop; returns the run's RunSummary (also in <run_dir>/continuous_post_training/<run>/)."""
    from tasks.rundir import RunDir
    from tasks.stages import models, report, rollouts, signals
    from tasks.stages.contracts import RunSummary
    from tasks.stages.simulate import simulate_production

    settings = demo_settings(settings)
    root = Path(settings.run_dir).resolve()
    if fresh and root.exists():
        shutil.rmtree(root)
    run_id = f"cli__{time.strftime('%Y%m%dT%H%M%S')}"
    models.bootstrap(settings, RunDir.for_run(settings, "bootstrap_champion", run_id))
    simulate_production(settings, days=2, tool_change=True)
    verdict = signals.monitor(settings)
    events = (
        [{"extra": signals.retrain_request_extra(verdict), "source_dag_id": "drift_monitor"}] if verdict["new"] else []
    )
    trigger = {"kind": "cli", "asset_events": events, "params": {}}

    rd = RunDir.for_run(settings, "continuous_post_training", run_id)
    settings = rollouts.pin_toolsets(settings, rd)
    report.open_run(settings, rd, trigger)
    try:
        _train_or_skip(settings, rd, trigger)
    finally:  # like the DAG's summarize (trigger rule all_done): a failed run is summarized as failed
        report.summarize(settings, rd)
    summary = RunSummary.model_validate_json((rd.path / "summary.json").read_text())
    print(report.format_summary(summary), flush=True)
    return summary


def _train_or_skip(settings: Settings, rd: RunDir, trigger: dict) -> None:
    from tasks.rl.cluster import setup_local_cluster, teardown_local_cluster
    from tasks.stages import evaluation, promotion, rollouts, signals, training
    from tasks.stages.simulate import child_env, stream

    signals.validate_data(settings, rd)
    if not signals.should_train(settings, rd, trigger)["train"]:
        signals.skip(settings, rd)
    else:
        for toolset in rollouts.toolsets(settings):
            rollouts.build_tasks(settings, rd, toolset)
        run_key = f"{rd.dag_id}/{rd.run_id}"
        rd.write(setup_local_cluster(settings, run_key), "cluster.json")
        try:
            for shard in rollouts.PROBE_SHARDS:
                rollouts.probe_rollouts(settings, rd, shard, len(rollouts.PROBE_SHARDS))
            job = training.grpo_command(settings, rd)
            stream(shlex.split(job["entrypoint"]), child_env() | job["env_vars"], "grpo")
            training.record_training(settings, rd, job={"job_id": "local-process"})
            evaluation.evaluate(settings, rd)
            evaluation.validate_evals(settings, rd)
            promotion.cost(settings, rd)
            promotion.gate(settings, rd)
            promotion.move_aliases(settings, rd)
        finally:
            teardown_local_cluster(run_key)
