"""The GRPO update as a Ray job, and what it leaves recorded.

    job = grpo_command(settings, rd)                       # {"entrypoint", "env_vars"} for the Ray job
    record_training(settings, rd, job={"job_id": ...})     # metrics, the challenger, MLflow

The job trains with exactly this run's settings: they go to the job as a file (`<rd>/settings.json`,
read with `python -m tasks --settings`), typed, not as `--set` strings, and no EVERGREEN_* variable of
the job's environment changes them.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.config import Settings
    from tasks.rundir import RunDir

log = logging.getLogger(__name__)


# what a failed run's GRPO leaves that a resumed one continues from (model/ and ray_train/ are rebuilt)
RESUMED_FILES = ("checkpoints", "metrics.jsonl", "validation.jsonl", "rollouts")


def resume_key(settings: Settings, rd: RunDir) -> str:
    """What a run's GRPO checkpoints depend on: the champion's version (and that of a fallback it starts from),
    the target toolset (its hash label, not its run-specific pinned path), the tasks from production it draws
    from (their content), and the settings of the model, environment, rollouts and GRPO. Two runs with one key
    train the same thing."""
    import hashlib
    import json

    from tasks.envs.toolset import toolset_label

    g = settings.grpo
    production = Path(g.production_tasks) if g.production_share and g.production_tasks else None
    doc = {
        "champion": (rd.read("champion.json") or {}).get("version"),
        "init": (rd.read("init.json") or {}).get("version"),  # a fallback's version when GRPO starts from one
        "toolsets": [
            toolset_label(t, settings.env.name) for t in (settings.env.target_toolset, settings.env.champion_toolset)
        ],
        "production": hashlib.sha256(production.read_bytes()).hexdigest()
        if production and production.exists()
        else None,
        "settings": settings.model_dump(
            mode="json",
            include={"model", "env", "rollout", "grpo"},
            exclude={"env": {"target_toolset", "champion_toolset"}, "grpo": {"production_tasks"}},
        ),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def adopt_checkpoints(settings: Settings, rd: RunDir) -> dict | None:
    """Continue a failed run: where this run has no checkpoint of its own, the newest checkpoint of an earlier
    run of this DAG with the same resume_key whose training did not finish is copied in (with its metrics,
    validation rows and rollout records), and the GRPO job resumes from it. Returns {run, step} or None."""
    import shutil

    from tasks.rl.checkpoint import latest_checkpoint

    grpo = rd.path / "grpo"
    key = resume_key(settings, rd)
    rd.write({"key": key}, "grpo", "resume_key.json")
    if latest_checkpoint(grpo / "checkpoints") is not None:
        return None  # this run's own (a retried task): the job resumes from it
    if rd.remote:
        _pull_failed_trainings(rd, key)
    candidates: list[tuple[int, float, Path]] = []
    for other in rd.path.parent.glob("*/grpo/resume_key.json"):
        run = other.parent.parent
        ckpt = latest_checkpoint(other.parent / "checkpoints")
        if run == rd.path or ckpt is None or (other.parent / "model" / "config.json").exists():
            continue  # itself, nothing to resume, or a training that finished
        try:
            same = json.loads(other.read_text()).get("key") == key
        except ValueError:
            continue
        if same:
            candidates.append((int(ckpt.name.split("-")[1]), ckpt.stat().st_mtime, run))
    if not candidates:
        return None
    step, _, run = max(candidates)
    for name in RESUMED_FILES:
        src = run / "grpo" / name
        if src.is_dir():
            shutil.copytree(src, grpo / name, dirs_exist_ok=True)
        elif src.exists():
            shutil.copy2(src, grpo / name)
    log.info(
        "GRPO resumes from run %s at step %d (same champion, toolsets and settings; its training failed)",
        run.name,
        step,
    )
    return {"run": run.name, "step": step}


def _pull_failed_trainings(rd: RunDir, key: str) -> None:
    """A run kept on S3: the GRPO directories of this DAG's other runs whose training stopped with the same
    resume_key, pulled beside this run's copy, where adopt_checkpoints looks for them."""
    from tasks.mirror import Mirror, children

    dag_uri = rd.uri.rsplit("/", 1)[0]
    for name in children(dag_uri):
        if name == rd.path.name:
            continue
        mirror = Mirror(f"{dag_uri}/{name}/grpo", rd.path.parent / name / "grpo")
        mirror.pull(prefixes=("resume_key.json", "model/config.json"))
        marker = mirror.local / "resume_key.json"
        if not marker.exists() or (mirror.local / "model" / "config.json").exists():
            continue  # no training there, or one that finished
        try:
            if json.loads(marker.read_text()).get("key") == key:
                mirror.pull(prefixes=RESUMED_FILES)
        except ValueError:
            continue


def grpo_command(settings: Settings, rd: RunDir, fail_training_at_step: int | None = None) -> dict:
    """The Ray job's entrypoint and environment: GRPO from this run's champion (or the grpo.init_fallback model
    the probes chose) against the target toolset.
    The driver gets the cluster's address in its settings and the auth token in its environment (a job
    driver does not inherit the head's environment). The run's
    `fail_training_at_step` param (a failure drill) makes the job raise at that step."""
    from tasks.stages.models import init_dir
    from tasks.stages.rollouts import cluster_of, engine_namespace

    info = cluster_of(rd)
    champ = init_dir(settings, rd)  # the champion, or the fallback the probes chose
    # `auto` inside a KubeRay job; a local head's own address (`auto` may resolve to another interface)
    address = info.address if info.backend == "local" else "auto"
    from tasks.stages.signals import with_production_tasks

    job_settings = with_production_tasks(settings, rd)
    from tasks.tracking import without_credentials

    # the job trains and logs nothing to MLflow: its settings file (on disk, in the run dir) carries no credential
    job_settings = job_settings.model_copy(
        update={
            "ray": settings.ray.model_copy(update={"address": address}),
            "tracking": settings.tracking.model_copy(update={"uri": without_credentials(settings.tracking.uri)}),
        }
    )
    settings_file = rd.write(job_settings.model_dump(mode="json"), "settings.json")
    # a local head runs jobs on this machine, with this interpreter; a KubeRay image has its own `python`
    args = [
        "python" if settings.ray.backend == "kuberay" else sys.executable,
        "-m",
        "tasks",
        "--settings",
        rd.uri_of(settings_file),  # s3:// where the run is kept there: the driver pulls its own copy
        "train",
        "--init",
        rd.uri_of(champ),
        "--run-dir",
        rd.uri_of(rd.path / "grpo"),
        "--engines",
        engine_namespace(settings, rd),
    ]
    if fail_training_at_step is not None:
        args += ["--fail-at-step", str(int(fail_training_at_step))]
    resumed = adopt_checkpoints(job_settings, rd)
    rd.write({"started": time.time(), "resumed_from": resumed}, "grpo_job.json")
    env = {"RAY_TRAIN_V2_ENABLED": "1", **info.env}
    return {"entrypoint": shlex.join(args), "env_vars": env}


def record_training(settings: Settings, rd: RunDir, job: dict | None = None) -> dict:
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
    prior = rd.read("grpo_job.json") or {}
    started = prior.get("started", time.time())
    rd.write({**prior, "started": started, "finished": time.time(), **(job or {})}, "grpo_job.json")
    actors = settings.rollout.num_workers * settings.rollout.cpus_per_worker
    rd.record_timing(
        "grpo",
        time.time() - started,
        cpus=actors + settings.grpo.num_train_workers,
        tokens_generated=int(sum(m.get("generated_tokens", 0) for m in metrics)),
        tokens_trained=int(sum(m.get("trained_tokens", 0) for m in metrics)),
    )
    tracker = tracker_of(settings)
    with stage_run(settings, rd, "training"):
        for m in metrics:
            tracker.log_metrics({k: v for k, v in m.items() if k != "step"}, step=m["step"])
        shards = sorted((grpo / "rollouts").glob("step-*/shard-0000.jsonl"))
        if shards:  # a sample of rollouts (the last step's first shard), not all of them
            tracker.log_artifact(shards[-1], "sample_rollouts")
        if (grpo / "selection.json").exists():  # the checkpoint choice: validation scores per step, the chosen one
            for row in rd.read("grpo", "selection.json")["rows"]:
                tracker.log_metrics(
                    {
                        f"validation_{toolset_label(t, settings.env.name)}_{k}": v
                        for t, d in row.items()
                        if t != "step"
                        for k, v in d.items()
                    },
                    step=row["step"],
                )
            tracker.log_artifact(grpo / "selection.json", "training")
        tracker.set_tags(
            {"evergreen.policy_version": str(challenger_step(grpo)), "ray.job_id": (job or {}).get("job_id", "")}
        )
    with tracker.within(rd.read("run.json")["mlflow_run_id"]):
        tracker.log_model(grpo / "model")
    last = metrics[-1] if metrics else {}
    return {"steps": len(metrics), "final_reward": last.get("reward_mean"), "job": job}
