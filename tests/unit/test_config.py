"""Typed settings (tasks/config.py): the shipped YAML, EVERGREEN_ overrides, errors that name the fix."""

from pathlib import Path

import pytest
import yaml

from tasks.config import DEFAULT_CONFIG, PROJECT_ROOT, Settings, SettingsError, load_settings


@pytest.fixture(autouse=True)
def _no_config_env(monkeypatch):
    # load_settings reads EVERGREEN_CONFIG from the real environment to find the file
    monkeypatch.delenv("EVERGREEN_CONFIG", raising=False)


def test_defaults_load_from_the_shipped_yaml():
    assert DEFAULT_CONFIG == PROJECT_ROOT / "include" / "config" / "pipeline.yaml"
    assert DEFAULT_CONFIG.exists()
    s = load_settings(environ={})
    assert isinstance(s, Settings)
    # values the YAML sets differently from the code defaults prove the file was read
    shipped = yaml.safe_load(DEFAULT_CONFIG.read_text())
    assert s.bootstrap.steps == shipped["bootstrap"]["steps"] and s.bootstrap.batch_size == 32
    assert s.grpo.tasks_per_step == 16
    # values from the YAML equal to the code defaults
    assert (s.model.hidden_size, s.model.num_heads, s.model.max_len) == (128, 4, 512)
    assert (s.grpo.eps_low, s.grpo.eps_high, s.grpo.advantage) == (0.2, 0.28, "std")
    assert s.grpo.kl_coef == shipped["grpo"]["kl_coef"]
    assert (s.env.champion_toolset, s.env.target_toolset) == ("1", "2")
    assert s.rollout.backend == "vllm" and s.rollout.group_size == 8
    # fields the YAML leaves out keep their code defaults
    assert s.eval.seed == 1000 and s.ray.address is None


def test_env_override_is_typed():
    s = load_settings(
        environ={
            "EVERGREEN_GRPO__STEPS": "3",
            "EVERGREEN_ROLLOUT__TEMPERATURE": "0.5",
            "OTHER_GRPO__STEPS": "9",
            "EVERGREEN_CONFIG_HINT": "x",
        }
    )
    assert s.grpo.steps == 3 and isinstance(s.grpo.steps, int)
    assert s.rollout.temperature == 0.5
    assert s.grpo.tasks_per_step == 16  # the rest of the section still comes from the file


def test_explicit_overrides_win_over_env():
    s = load_settings(environ={"EVERGREEN_GRPO__STEPS": "3"}, overrides={"grpo": {"steps": 4}})
    assert s.grpo.steps == 4


def test_environ_argument_replaces_os_environ(monkeypatch):
    monkeypatch.setenv("EVERGREEN_GRPO__STEPS", "11")
    assert load_settings(environ={}).grpo.steps == yaml.safe_load(DEFAULT_CONFIG.read_text())["grpo"]["steps"]
    assert load_settings().grpo.steps == 11


def _error(environ):
    with pytest.raises(SettingsError) as e:
        load_settings(environ=environ)
    return str(e.value)


def test_settings_error_is_a_value_error():
    assert issubclass(SettingsError, ValueError)


def test_eps_high_below_eps_low_raises_naming_the_field():
    msg = _error({"EVERGREEN_GRPO__EPS_HIGH": "0.1"})
    assert "grpo.eps_high=0.1 < grpo.eps_low=0.2" in msg
    assert "EVERGREEN_GRPO" in msg and "pipeline.yaml" in msg


def test_hidden_size_not_divisible_by_heads_raises_naming_the_field():
    msg = _error({"EVERGREEN_MODEL__NUM_HEADS": "3"})
    assert "model.hidden_size=128 is not divisible by model.num_heads=3" in msg
    assert "EVERGREEN_MODEL" in msg


@pytest.mark.parametrize(
    "environ, variable",
    [
        ({"EVERGREEN_GRPO__EPS_HIGH": "0.1"}, "EVERGREEN_GRPO__EPS_HIGH"),
        ({"EVERGREEN_MODEL__NUM_HEADS": "3"}, "EVERGREEN_MODEL__NUM_HEADS"),
    ],
)
def test_cross_field_error_names_a_real_override_variable(environ, variable):
    assert variable in _error(environ)


@pytest.mark.parametrize("backend", ["nccl", "ipc"])
def test_gpu_weight_transfer_needs_gpu_training_and_engines(backend):
    msg = _error({"EVERGREEN_ROLLOUT__WEIGHT_TRANSFER_BACKEND": backend})
    assert f"weight_transfer_backend={backend} moves weights GPU to GPU" in msg
    assert "grpo.gpus_per_train_worker and rollout.gpus_per_worker" in msg and "weight_transfer_backend=gloo" in msg
    on_gpus = {
        "EVERGREEN_ROLLOUT__WEIGHT_TRANSFER_BACKEND": backend,
        "EVERGREEN_ROLLOUT__GPUS_PER_WORKER": "0.25",
        "EVERGREEN_GRPO__GPUS_PER_TRAIN_WORKER": "0.5",
    }
    s = load_settings(environ=on_gpus)
    assert s.grpo.device == "cuda" and s.rollout.gpus_per_worker == 0.25
    # the object-store path never sends GPU tensors: no GPUs needed whatever the backend field says
    load_settings(
        environ={
            "EVERGREEN_ROLLOUT__WEIGHT_TRANSFER_BACKEND": backend,
            "EVERGREEN_ROLLOUT__WEIGHT_SYNC": "object_store",
        }
    )


def test_ipc_weight_transfer_serves_one_trainer_worker():
    msg = _error(
        {
            "EVERGREEN_ROLLOUT__WEIGHT_TRANSFER_BACKEND": "ipc",
            "EVERGREEN_ROLLOUT__GPUS_PER_WORKER": "0.25",
            "EVERGREEN_GRPO__GPUS_PER_TRAIN_WORKER": "0.5",
            "EVERGREEN_GRPO__NUM_TRAIN_WORKERS": "2",
        }
    )
    assert "grpo.num_train_workers=1" in msg


def test_cpu_is_the_default_device():
    s = load_settings(environ={})
    assert s.grpo.device == "cpu" and s.rollout.gpus_per_worker == 0 and s.rollout.weight_transfer_backend == "gloo"


def test_negative_steps_raises_naming_field_and_variable():
    msg = _error({"EVERGREEN_GRPO__STEPS": "-1"})
    assert "grpo.steps" in msg and "EVERGREEN_GRPO__STEPS" in msg and "'-1'" in msg


def test_unknown_field_raises_naming_field_and_variable():
    msg = _error({"EVERGREEN_GRPO__BOGUS": "1"})
    assert "grpo.bogus" in msg and "EVERGREEN_GRPO__BOGUS" in msg and "Extra inputs" in msg


def test_unknown_section_raises():
    msg = _error({"EVERGREEN_NOPE__X": "1"})
    assert "nope" in msg and "EVERGREEN_NOPE" in msg


def test_bad_literal_raises():
    msg = _error({"EVERGREEN_GRPO__ADVANTAGE": "median"})
    assert "grpo.advantage" in msg and "EVERGREEN_GRPO__ADVANTAGE" in msg


def test_bad_value_in_yaml_names_the_file(tmp_path):
    cfg = tmp_path / "mine.yaml"
    cfg.write_text("grpo:\n  steps: 0\n")
    with pytest.raises(SettingsError, match=r"grpo\.steps: .*fix it in mine\.yaml or EVERGREEN_GRPO__STEPS"):
        load_settings(cfg, environ={})


def test_config_path_from_evergreen_config(monkeypatch, tmp_path):
    cfg = tmp_path / "alt.yaml"
    cfg.write_text("grpo:\n  steps: 2\n")
    monkeypatch.setenv("EVERGREEN_CONFIG", str(cfg))
    assert load_settings(environ={}).grpo.steps == 2


def test_shipped_run_dir_does_not_depend_on_cwd(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    s = load_settings(environ={})
    assert Path(s.run_dir).resolve() == PROJECT_ROOT / "runs" / "local"
