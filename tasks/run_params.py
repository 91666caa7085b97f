"""What a run's params may change, and what they did change.

    from tasks.run_params import check_overrides
    check_overrides({"grpo.steps": 10}, deployed)          # fine: a training knob
    check_overrides({"promotion.min_gain": -0.99}, deployed)  # SettingsError: loosens the gate

A run's params come from whoever may trigger the DAG (the UI, the REST API, an asset event). They may
change how a run trains; they may not change what the deployment decides: gate thresholds and prices
(except to make them stricter), URIs, paths, the environment's code, the model's source. Those come
from the deployment's config (pipeline.yaml, EVERGREEN_* variables). A refused override fails the run's
first task with one error naming every refused field and why; an accepted one is recorded on the run
(run.json, an MLflow tag per field, the Evergreen page).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks.config import Settings

# DAG param -> setting; any other setting a run may change through the `overrides` param
PARAM_FIELDS = {
    "target_toolset": "env.target_toolset",
    "grpo_steps": "grpo.steps",
    "eval_tasks": "eval.num_tasks",
    "sft_steps": "bootstrap.steps",
    "max_cost_usd": "promotion.max_cost_usd",
}

# prefixes and fields a run may set freely: how it trains and how much it evaluates
TRAINING_KNOBS = (
    "bootstrap.",
    "rollout.",
    "grpo.",
    "eval.num_tasks",
    "eval.samples",
    "eval.seed",
    "eval.split",
    "env.max_turns",
    "env.max_tokens_per_turn",
    "simulate.",
    "timeline.",  # the timeline DAG's month: its days, events and traffic (timeline.retrain is checked inside)
)
# inside those, fields that are paths (a trigger must not point a run at files of its choosing)
PATHS = ("grpo.production_tasks", "timeline.champion")
# gate fields a run may only make stricter: field -> the direction that is stricter
STRICTER = {
    "promotion.min_gain": "higher",
    "promotion.min_gain_per_dollar": "higher",
    "promotion.guard_tolerance": "lower",
    "promotion.max_cost_usd": "lower",
}
# toolset fields take a shipped version only: a source (mcp:<command>, a URL, a path) would let a
# trigger start a command or read a file; served tools reach a run through the deployment's tool watch
TOOLSETS = ("env.target_toolset", "env.champion_toolset")


def _get(settings: Settings, field: str) -> Any:
    value = settings
    for part in field.split("."):
        value = getattr(value, part)
    return value


def refusal(field: str, value: Any, deployed: Settings) -> str | None:
    """Why a run's params may not set `field` to `value` (None: they may). `deployed` is the settings
    without the run's params."""
    if field in TOOLSETS:
        from tasks.envs.toolset import shipped_version  # at run time: DAG files import this module at parse

        return (
            None
            if shipped_version(value)
            else (
                "a shipped toolset version only (e.g. 2); a served toolset comes "
                "from the deployment's tool watch (EVERGREEN_TOOL_SOURCE)"
            )
        )
    if field in STRICTER:
        current = _get(deployed, field)
        if value is None or current is None:
            return None if value is not None or current is None else "may not lift the deployment's budget"
        try:
            stricter = float(value) >= current if STRICTER[field] == "higher" else float(value) <= current
        except (TypeError, ValueError):
            return f"not a number: {value!r}"
        return (
            None
            if stricter
            else (f"a run may only make the gate stricter: {STRICTER[field]} than the deployment's {current}")
        )
    if field == "timeline.retrain":  # overrides of every retrain: each one as if a run's params set it
        bad = [f"{k} ({why})" for k, v in dict(value or {}).items() if (why := refusal(k, v, deployed))]
        return None if not bad else "its overrides may not set " + "; ".join(bad)
    if field in PATHS:
        return "a path: set it in the deployment's config"
    if field.startswith(TRAINING_KNOBS):
        return None
    return "set by the deployment's config (pipeline.yaml or EVERGREEN_* variables), not by a run's params"


def check_overrides(overrides: dict, deployed: Settings) -> None:
    """Raise SettingsError naming every override the run's params may not make (see the module docstring)."""
    from tasks.config import SettingsError  # DAG files import this module at parse time: keep it light

    refused = [
        f"  {field}={value!r}: {why}"
        for field, value in sorted(overrides.items())
        if (why := refusal(field, value, deployed))
    ]
    if refused:
        raise SettingsError("the run's params may not change these settings:\n" + "\n".join(refused))


def overrides_from_params(params: dict) -> dict[str, object]:
    """{"section.field": value} from the run's params (unset params change nothing), typed as given."""
    out: dict[str, object] = {}
    for param, field in PARAM_FIELDS.items():
        if params.get(param) not in (None, ""):
            out[field] = params[param]
    out.update(params.get("overrides") or {})
    return out
