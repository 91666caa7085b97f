"""Params -> settings (operators/stages.py): what a DAG run's Params change, and bad overrides named."""
import pytest

from operators.stages import overrides_from_params, settings_for


def test_params_map_onto_settings_fields():
    params = {"target_registry": "2", "grpo_steps": 3, "eval_tasks": 16, "sft_steps": None, "force": True,
              "overrides": {"grpo.tasks_per_step": 4, "promotion.min_gain": 0.1}}
    assert overrides_from_params(params) == {"env.target_registry": "2", "grpo.steps": 3, "eval.num_tasks": 16,
                                             "grpo.tasks_per_step": 4, "promotion.min_gain": 0.1}
    s = settings_for(params)
    assert (s.grpo.steps, s.eval.num_tasks, s.grpo.tasks_per_step, s.promotion.min_gain) == (3, 16, 4, 0.1)
    assert settings_for({}).grpo.steps == settings_for(None).grpo.steps


def test_bad_overrides_name_the_field():
    from tasks.config import SettingsError

    with pytest.raises(ValueError, match="SECTION.FIELD"):
        overrides_from_params({"overrides": {"steps": 3}})
    with pytest.raises(SettingsError, match="grpo.steps"):
        settings_for({"grpo_steps": -1})
