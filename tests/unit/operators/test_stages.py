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
    params = {"target_toolset": "2", "grpo_steps": 3, "eval_tasks": 16, "sft_steps": None, "force": True,
              "max_cost_usd": 0.5, "overrides": {"grpo.tasks_per_step": 4, "promotion.min_gain": 0.1}}
    assert overrides_from_params(params) == {"env.target_toolset": "2", "grpo.steps": 3, "eval.num_tasks": 16,
                                             "promotion.max_cost_usd": 0.5, "grpo.tasks_per_step": 4,
                                             "promotion.min_gain": 0.1}
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
    proc = subprocess.run([sys.executable, "-m", "tasks", *args], capture_output=True, text=True, timeout=120,
                          cwd=PROJECT_ROOT, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT), **(env or {})})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_set_and_environment_take_lists_and_null_as_json():
    got = _cli("--set", 'ingest.required_workloads=["lookup", "booking"]', "--set", "grpo.guard_kl_coef=null",
               "settings", env={"EVERGREEN_GRPO__GUARD_KL_COEF": "0.5"})
    assert got["ingest"]["required_workloads"] == ["lookup", "booking"] and got["grpo"]["guard_kl_coef"] is None
    got = _cli("settings", env={"EVERGREEN_INGEST__REQUIRED_WORKLOADS": '["lookup"]', "EVERGREEN_GRPO__GUARD_KL_COEF": "null"})
    assert got["ingest"]["required_workloads"] == ["lookup"] and got["grpo"]["guard_kl_coef"] is None


def test_a_dag_param_of_a_list_or_null_reaches_the_ray_job_typed(tmp_path):
    from tasks.rundir import RunDir
    from tasks.stages.training import grpo_command

    params = {"grpo_steps": 2, "overrides": {"ingest.required_workloads": ["lookup"], "grpo.guard_kl_coef": None,
                                             "run_dir": str(tmp_path)}}
    settings = settings_for(params)
    rd = RunDir.for_run(settings, "continuous_post_training", "manual__1")
    (rd.path / "champion").mkdir()
    (rd.path / "champion" / "config.json").write_text("{}")  # the run's champion, already fetched
    rd.write({"backend": "local", "address": "127.0.0.1:6390", "env": {"RAY_AUTH_MODE": "token"}}, "cluster.json")
    job = grpo_command(settings, rd, fail_training_at_step=3)
    args = shlex.split(job["entrypoint"])
    assert args[args.index("train") + 1:args.index("train") + 3] == ["--init", str(rd.path / "champion")]
    assert args[-2:] == ["--fail-at-step", "3"] and job["env_vars"]["RAY_AUTH_MODE"] == "token"
    # what the job's driver loads: the settings file as it is; the job's environment does not change it
    settings_file = args[args.index("--settings") + 1]
    seen = _cli("--settings", settings_file, "settings",
                env={"EVERGREEN_GRPO__GUARD_KL_COEF": "0.5", "EVERGREEN_GRPO__STEPS": "9"})
    assert seen["ingest"]["required_workloads"] == ["lookup"] and seen["grpo"]["guard_kl_coef"] is None
    assert seen["grpo"]["steps"] == 2 and seen["ray"]["address"] == "127.0.0.1:6390"
