"""The GRPO update as a Ray job, and what it leaves recorded.

    job = grpo_command(settings, rd)                       # {"entrypoint", "env_vars"} for the Ray job
    record_training(settings, rd, job={"job_id": ...})     # metrics, the challenger, MLflow

The job trains with exactly this run's settings: they go to the job as a file (`<rd>/settings.json`,
read with `python -m tasks --settings`), typed, not as `--set` strings, and no EVERGREEN_* variable of
the job's environment changes them.
"""
from __future__ import annotations

import logging
import shlex
import sys
import time

log = logging.getLogger(__name__)


def grpo_command(settings, rd, fail_training_at_step: int | None = None) -> dict:
    """The Ray job's entrypoint and environment: GRPO from this run's champion against the target toolset.
    The driver gets the cluster's address in its settings and the auth token in its environment (a job
    driver does not inherit the head's environment). The run's
    `fail_training_at_step` param (a failure drill) makes the job raise at that step."""
    from tasks.stages.models import champion_dir
    from tasks.stages.rollouts import cluster_of, engine_namespace

    info = cluster_of(rd)
    champ = champion_dir(settings, rd)
    # `auto` inside a KubeRay job; a local head's own address (`auto` may resolve to another interface)
    address = info.address if info.backend == "local" else "auto"
    from tasks.stages.signals import with_production_tasks

    job_settings = with_production_tasks(settings, rd)
    from tasks.tracking import without_credentials

    # the job trains and logs nothing to MLflow: its settings file (on disk, in the run dir) carries no credential
    job_settings = job_settings.model_copy(update={
        "ray": settings.ray.model_copy(update={"address": address}),
        "tracking": settings.tracking.model_copy(update={"uri": without_credentials(settings.tracking.uri)})})
    settings_file = rd.write(job_settings.model_dump(mode="json"), "settings.json")
    # a local head runs jobs on this machine, with this interpreter; a KubeRay image has its own `python`
    args = ["python" if settings.ray.backend == "kuberay" else sys.executable, "-m", "tasks",
            "--settings", str(settings_file), "train", "--init", str(champ), "--run-dir", str(rd.path / "grpo"),
            "--engines", engine_namespace(rd)]
    if fail_training_at_step is not None:
        args += ["--fail-at-step", str(int(fail_training_at_step))]
    rd.write({"started": time.time()}, "grpo_job.json")
    env = {"RAY_TRAIN_V2_ENABLED": "1", **info.env}
    return {"entrypoint": shlex.join(args), "env_vars": env}


def record_training(settings, rd, job: dict | None = None) -> dict:
    """After the Ray job: its metrics and the challenger go to MLflow (the model under the pipeline run's
    `model` path, which move_aliases registers)."""
    from tasks.envs.toolset import toolset_label
    from tasks.rl.metrics import read_metrics
    from tasks.rl.selection import challenger_step
    from tasks.stages.report import stage_run, tracker_of

    grpo = rd.path / "grpo"
    if not (grpo / "model" / "config.json").exists():
        raise FileNotFoundError(f"the GRPO job finished but {grpo / 'model'} has no model: read the job's log")
    metrics = read_metrics(grpo / "metrics.jsonl")
    started = (rd.read("grpo_job.json") or {}).get("started", time.time())
    rd.write({"started": started, "finished": time.time(), **(job or {})}, "grpo_job.json")
    actors = settings.rollout.num_workers * settings.rollout.cpus_per_worker
    rd.record_timing("grpo", time.time() - started, cpus=actors + settings.grpo.num_train_workers,
                     tokens_generated=int(sum(m.get("generated_tokens", 0) for m in metrics)),
                     tokens_trained=int(sum(m.get("trained_tokens", 0) for m in metrics)))
    tracker = tracker_of(settings)
    with stage_run(settings, rd, "training"):
        for m in metrics:
            tracker.log_metrics({k: v for k, v in m.items() if k != "step"}, step=m["step"])
        shards = sorted((grpo / "rollouts").glob("step-*/shard-0000.jsonl"))
        if shards:  # a sample of rollouts (the last step's first shard), not all of them
            tracker.log_artifact(shards[-1], "sample_rollouts")
        if (grpo / "selection.json").exists():  # the checkpoint choice: validation scores per step, the chosen one
            for row in rd.read("grpo", "selection.json")["rows"]:
                tracker.log_metrics({f"validation_{toolset_label(t, settings.env.name)}_{k}": v
                                     for t, d in row.items() if t != "step" for k, v in d.items()}, step=row["step"])
            tracker.log_artifact(grpo / "selection.json", "training")
        tracker.set_tags({"evergreen.policy_version": str(challenger_step(grpo)),
                          "ray.job_id": (job or {}).get("job_id", "")})
    with tracker.within(rd.read("run.json")["mlflow_run_id"]):
        tracker.log_model(grpo / "model")
    last = metrics[-1] if metrics else {}
    return {"steps": len(metrics), "final_reward": last.get("reward_mean"), "job": job}
