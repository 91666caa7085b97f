"""tasks/stages/training.py without a cluster: the Ray job's command line, the settings file it trains
with, and the refusal to record a job that left no model."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from tasks.config import Settings, load_settings
from tasks.rundir import RunDir
from tasks.stages.contracts import ClusterInfo
from tasks.stages.rollouts import engine_namespace
from tasks.stages.training import grpo_command, record_training


def _run(tmp_path, cluster: ClusterInfo, **overrides):
    settings = load_settings(
        environ={}, overrides={"run_dir": str(tmp_path), "grpo": {"steps": 3, "lr": 5e-4}, **overrides}
    )
    rd = RunDir.for_run(settings, "continuous_post_training", "manual__2026-12-03T04:00:00+00:00")
    (rd.path / "champion").mkdir()
    (rd.path / "champion" / "config.json").write_text("{}")  # the run's champion, already fetched
    rd.write(cluster, "cluster.json")
    return settings, rd


def _arg(args, flag):
    return args[args.index(flag) + 1]


def test_the_job_trains_from_the_champion_into_the_run_dir_on_the_run_engines(tmp_path):
    settings, rd = _run(
        tmp_path,
        ClusterInfo(
            backend="local", address="10.0.0.5:6390", env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/tmp/t"}
        ),
    )
    job = grpo_command(settings, rd)
    args = shlex.split(job["entrypoint"])
    assert args[:3] == [sys.executable, "-m", "tasks"], "a local head runs the job with this interpreter"
    assert args[args.index("train") - 2] == "--settings", "--settings is a global option: before the subcommand"
    assert _arg(args, "--init") == str(rd.path / "champion")
    assert _arg(args, "--run-dir") == str(rd.path / "grpo")
    assert _arg(args, "--engines") == engine_namespace(settings, rd)
    assert "--fail-at-step" not in args
    # the job's driver does not inherit the head's environment: auth comes with the job
    assert job["env_vars"] == {"RAY_TRAIN_V2_ENABLED": "1", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/tmp/t"}
    assert rd.read("grpo_job.json")["started"] > 0


def test_the_settings_file_is_this_runs_settings_with_the_clusters_address(tmp_path):
    settings, rd = _run(tmp_path, ClusterInfo(backend="local", address="10.0.0.5:6390"))
    args = shlex.split(grpo_command(settings, rd)["entrypoint"])
    path = _arg(args, "--settings")
    assert path == str(rd.path / "settings.json")
    written = Settings.model_validate(json.loads(Path(path).read_text()))
    assert written.ray.address == "10.0.0.5:6390"
    assert written.grpo.steps == 3 and written.grpo.lr == 5e-4
    assert (written.model, written.rollout, written.grpo, written.eval, written.env, written.promotion) == (
        settings.model,
        settings.rollout,
        settings.grpo,
        settings.eval,
        settings.env,
        settings.promotion,
    )
    assert written.run_dir == settings.run_dir
    assert settings.ray.address is None, "the caller's settings are not modified"


def test_the_job_trains_with_exactly_this_runs_settings(tmp_path):
    settings, rd = _run(tmp_path, ClusterInfo(backend="local", address="10.0.0.5:6390"))
    path = _arg(shlex.split(grpo_command(settings, rd)["entrypoint"]), "--settings")
    written = Settings.model_validate(json.loads(Path(path).read_text()))
    assert written.model_copy(update={"ray": written.ray.model_copy(update={"address": None})}) == settings


def test_a_kuberay_job_uses_the_images_python_and_ray_auto(tmp_path):
    settings, rd = _run(
        tmp_path, ClusterInfo(backend="kuberay", address="ray-head.evergreen:6379"), ray={"backend": "kuberay"}
    )
    args = shlex.split(grpo_command(settings, rd)["entrypoint"])
    assert args[:3] == ["python", "-m", "tasks"]
    assert json.loads((rd.path / "settings.json").read_text())["ray"]["address"] == "auto"


def test_the_failure_drill_reaches_the_job(tmp_path):
    settings, rd = _run(tmp_path, ClusterInfo(backend="local", address="127.0.0.1:6390"))
    args = shlex.split(grpo_command(settings, rd, fail_training_at_step=2)["entrypoint"])
    assert args[-2:] == ["--fail-at-step", "2"]


def test_no_job_without_the_clusters_file(tmp_path):
    settings = load_settings(environ={}, overrides={"run_dir": str(tmp_path)})
    rd = RunDir.for_run(settings, "continuous_post_training", "r")
    with pytest.raises(FileNotFoundError, match="ray_cluster_setup"):
        grpo_command(settings, rd)


def test_record_training_refuses_a_job_that_left_no_model(tmp_path):
    settings, rd = _run(tmp_path, ClusterInfo(backend="local", address="127.0.0.1:6390"))
    (rd.path / "grpo").mkdir()
    (rd.path / "grpo" / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n")
    with pytest.raises(FileNotFoundError, match="job's log"):
        record_training(settings, rd, job={"job_id": "raysubmit_1"})
    assert not (rd.path / "timings" / "grpo.json").exists(), "nothing priced for a job that produced nothing"


def _failed_run(settings, run_id: str, step: int, champion: str = "3", finished: bool = False):
    """A run whose GRPO wrote checkpoints up to `step` (and, finished, its model)."""
    from tasks.stages.training import resume_key

    rd = RunDir.for_run(settings, "continuous_post_training", run_id)
    rd.write({"version": champion}, "champion.json")
    rd.write({"key": resume_key(settings, rd)}, "grpo", "resume_key.json")
    for s in range(1, step + 1):
        rd.write({"step": s}, "grpo", "checkpoints", f"step-{s:06d}", "state.json")
    rd.write_lines([{"step": s, "reward": 0.1 * s} for s in range(1, step + 1)], "grpo", "metrics.jsonl")
    if finished:
        rd.write({}, "grpo", "model", "config.json")
    return rd


def test_a_new_run_resumes_from_the_newest_checkpoint_of_a_failed_run_with_the_same_key(tmp_path):
    from tasks.stages.training import adopt_checkpoints

    settings = load_settings(environ={}, overrides={"run_dir": str(tmp_path), "grpo": {"steps": 6}})
    _failed_run(settings, "manual__a", step=2)
    _failed_run(settings, "manual__b", step=4)  # the newest failed one
    _failed_run(settings, "manual__c", step=5, finished=True)  # trained to the end: nothing to resume
    _failed_run(settings, "manual__d", step=5, champion="4")  # another champion: another key
    other = settings.model_copy(update={"grpo": settings.grpo.model_copy(update={"lr": 5e-4})})
    _failed_run(other, "manual__e", step=5)  # other settings: another key

    rd = RunDir.for_run(settings, "continuous_post_training", "manual__new")
    rd.write({"version": "3"}, "champion.json")
    assert adopt_checkpoints(settings, rd) == {"run": "manual__b", "step": 4}
    assert (rd.path / "grpo" / "checkpoints" / "step-000004" / "state.json").exists()
    assert [r["step"] for r in rd.read_lines("grpo", "metrics.jsonl")] == [1, 2, 3, 4]
    assert adopt_checkpoints(settings, rd) is None  # its own checkpoints now: a retried task resumes from them
    fresh = RunDir.for_run(settings, "continuous_post_training", "manual__fresh")
    fresh.write({"version": "5"}, "champion.json")
    assert adopt_checkpoints(settings, fresh) is None and not (fresh.path / "grpo" / "checkpoints").exists()


def test_grpo_starts_from_the_previous_champion_only_when_the_champion_gives_nothing_to_learn(tmp_path):
    from tasks.promotion.registry import ModelRegistry
    from tasks.stages.report import tracker_of

    settings, rd = _run(tmp_path, ClusterInfo(backend="local", address="10.0.0.5:6390"))
    tracker, registry = tracker_of(settings), ModelRegistry(settings.promotion.model_name)
    for version in ("v1", "v2"):  # v1 champion, then v2 promoted over it: previous = v1
        model = tmp_path / version
        model.mkdir()
        (model / "config.json").write_text(json.dumps({"marker": version}))
        with tracker.pipeline_run(version) as run:
            tracker.log_artifacts(model, "model")
        registry.promote(registry.register(run.info.run_id, "model", run_key=version), run_key=version)

    def probes(champion, previous):
        for shard in (0, 1):
            fallbacks = {"previous": {"version": "1", "target_successes": previous}} if previous is not None else {}
            probe = {"target_episodes": 32, "target_successes": champion, "fallbacks": fallbacks}
            rd.write(probe, "probe", f"shard-{shard}.json")
        return Path(_arg(shlex.split(grpo_command(settings, rd)["entrypoint"]), "--init"))

    # the champion solves 2 in 64 of its first batch (< grpo.init_fallback_below) and previous 10: previous
    init = probes(1, 5)
    assert init == rd.path / "init" / "previous"
    assert json.loads((init / "config.json").read_text()) == {"marker": "v1"}
    assert rd.read("init.json")["alias"] == "previous" and rd.read("init.json")["version"] == "1"
    # above the bar the champion stays, whatever the fallbacks would solve
    assert probes(4, None) == rd.path / "champion" and rd.read("init.json")["alias"] == "champion"
