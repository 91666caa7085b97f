"""The promotion step (tasks/promotion/step.py): price_run and judge on hand-made comparisons, and
apply_decision on a server-less SQLite MLflow store: the challenger registered once per run key and
tagged, the aliases moved on promote and only then, a retried step moving nothing twice."""

from __future__ import annotations

import json

import pytest

from tasks.config import load_settings
from tasks.evals.harness import EvalResult, compare
from tasks.promotion.cost import ServingProjection, StageUsage, load_prices
from tasks.promotion.step import apply_decision, judge, price_run
from tasks.signals.toolset_hash import schema_hash

N = 30
VALID = {"data": True, "evals": True}


def _settings(model_name="unit-step", **promotion):
    return load_settings(
        environ={},
        overrides={
            "promotion": {
                "model_name": model_name,
                "metric": "greedy_success",
                "min_gain": 0.05,
                "guard_tolerance": 0.10,
                "min_gain_per_dollar": 1.0,
                **promotion,
            }
        },
    )


def _comparison(champion: int, challenger: int) -> dict:
    def table(k):
        return EvalResult([{"task_id": f"t{i}", "greedy_success": float(i < k)} for i in range(N)])

    return compare(table(challenger), table(champion), key="greedy_success", resamples=500)


def comparisons(target=(9, 24), guard=(27, 27)) -> dict:
    return {"2": _comparison(*target), "1": _comparison(*guard)}


STAGES = [StageUsage("grpo", wall_s=1800, cpus=3), StageUsage("evaluate", wall_s=200, cpus=1)]


def test_price_run_prices_the_stages_and_the_targets_gain():
    settings = _settings()
    report = price_run(settings, comparisons(), STAGES, ServingProjection(40, 40))
    cpu = load_prices(settings.cost.prices_file).choose("cpu", settings.cost.cpu_price).price
    assert report["run_usd"] == pytest.approx((1800 * 3 + 200) / 3600 * cpu)
    assert report["success_gain_points"] == pytest.approx(50.0), "the target's gain, not a guard's"
    assert report["usd_per_success_point"] == pytest.approx(report["total_usd"] / 50.0)
    guard_target = settings.model_copy(update={"env": settings.env.model_copy(update={"target_toolset": "1"})})
    assert price_run(guard_target, comparisons(), STAGES)["success_gain_points"] == pytest.approx(0.0)


def test_judge_makes_every_other_toolset_a_guard():
    settings = _settings()
    cost = price_run(settings, comparisons(), STAGES)
    decision = judge(settings, comparisons(), VALID, cost)
    assert decision.promote, decision.reasons
    assert [c["name"] for c in decision.checks if c["name"].startswith("guard:")] == ["guard:registry_v1"]
    three = {**comparisons(), "3": _comparison(20, 14)}  # a second guard that regressed
    refused = judge(settings, three, VALID, cost)
    assert not refused.promote and [c["name"] for c in refused.checks if not c["passed"]] == ["guard:registry_v3"]


@pytest.mark.parametrize(
    "change, failed",
    [
        ({"target": (9, 11)}, "target_gain"),
        ({"guard": (27, 18)}, "guard:registry_v1"),
    ],
)
def test_judge_refuses_a_small_gain_or_a_guard_regression(change, failed):
    settings = _settings()
    comps = comparisons(**change)
    decision = judge(settings, comps, VALID, price_run(settings, comps, STAGES))
    assert not decision.promote and [c["name"] for c in decision.checks if not c["passed"]] == [failed]


def test_judge_refuses_a_run_over_its_budget():
    cost = price_run(_settings(), comparisons(), STAGES)
    over = _settings(max_cost_usd=cost["total_usd"] / 2)
    decision = judge(over, comparisons(), VALID, cost)
    assert not decision.promote and [c["name"] for c in decision.checks if not c["passed"]] == ["budget"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One SQLite store for the module (its tables take seconds to create) and a run holding a `model`."""
    from tasks.tracking import Tracker

    home = tmp_path_factory.mktemp("mlflow")
    tracker = Tracker(f"sqlite:///{home / 'mlflow.db'}", "unit-step", artifact_location=home / "artifacts")
    (home / "model").mkdir()
    (home / "model" / "model.safetensors").write_bytes(b"weights")
    (home / "model" / "config.json").write_text("{}")
    with tracker.pipeline_run("bootstrap") as run:
        tracker.log_artifacts(home / "model", "model")
    tracker.model_run_id = run.info.run_id
    return tracker


def _with_champion(store, name):
    from tasks.promotion.registry import ModelRegistry

    registry = ModelRegistry(name)
    registry.promote(registry.register(store.model_run_id, "model", run_key="bootstrap"), run_key="bootstrap")
    return registry


def _version(name, version):
    from mlflow import MlflowClient

    return MlflowClient().get_model_version(name, version)


def test_a_promoted_challenger_is_registered_tagged_and_becomes_champion_once(store):
    settings = _settings("unit-step-promote")
    registry = _with_champion(store, settings.promotion.model_name)
    comps = comparisons()
    cost = price_run(settings, comps, STAGES)
    decision = judge(settings, comps, VALID, cost)
    assert decision.promote

    result = apply_decision(
        settings,
        decision,
        cost,
        comps,
        store.model_run_id,
        "manual__1",
        version_tags={"evergreen.policy_version": "40"},
    )
    assert result["version"] == "2" and result["model_name"] == "unit-step-promote"
    assert result["move"]["moved"] is True and (result["move"]["from"], result["move"]["to"]) == ("1", "2")
    assert result["aliases"] == registry.aliases() == {"champion": "2", "previous": "1"}
    assert result["decision"] == decision.to_dict() and result["cost"] == cost
    tags = _version(settings.promotion.model_name, "2").tags
    assert tags["evergreen.registry_hash"] == schema_hash("2") != schema_hash("1")
    assert tags["evergreen.eval_target"] == "0.8000" and tags["evergreen.gain_points"] == "50.00"
    assert tags["evergreen.cost_usd"] == f"{cost['total_usd']:.6f}" and tags["evergreen.policy_version"] == "40"
    assert tags["evergreen.run_key"] == "manual__1" and tags["evergreen.decision"] == "promoted"

    again = apply_decision(settings, decision, cost, comps, store.model_run_id, "manual__1")  # a retried task
    assert again["version"] == "2" and again["move"]["moved"] is False
    assert registry.aliases() == {"champion": "2", "previous": "1"}, "a retry moves nothing twice"
    from mlflow import MlflowClient

    assert len(MlflowClient().search_model_versions(f"name = '{settings.promotion.model_name}'")) == 2


def test_a_refused_challenger_is_registered_as_challenger_and_the_champion_stays(store):
    settings = _settings("unit-step-hold")
    registry = _with_champion(store, settings.promotion.model_name)
    comps = comparisons(guard=(27, 18))
    cost = price_run(settings, comps, STAGES)
    decision = judge(settings, comps, VALID, cost)
    assert not decision.promote

    result = apply_decision(settings, decision, cost, comps, store.model_run_id, "manual__2")
    assert result["move"] == {"moved": False, "kind": "not_promoted"}
    assert result["aliases"] == registry.aliases() == {"champion": "1", "challenger": "2"}
    tags = _version(settings.promotion.model_name, "2").tags
    assert tags["evergreen.decision"] == "not_promoted"
    assert json.loads(tags["evergreen.decision_detail"])["reasons"] == decision.reasons
    again = apply_decision(settings, decision, cost, comps, store.model_run_id, "manual__2")
    assert again["version"] == "2" and registry.aliases() == {"champion": "1", "challenger": "2"}


def test_the_decision_is_logged_on_the_pipeline_run(store):
    from mlflow import MlflowClient

    settings = _settings("unit-step-logged")
    _with_champion(store, settings.promotion.model_name)
    comps = comparisons()
    cost = price_run(settings, comps, STAGES)
    decision = judge(settings, comps, VALID, cost)
    with store.pipeline_run("promotion") as run:
        apply_decision(settings, decision, cost, comps, store.model_run_id, "manual__3", tracker=store)
    got = MlflowClient().get_run(run.info.run_id)
    assert got.data.tags["evergreen.decision"] == "promoted" and got.data.tags["evergreen.model_version"] == "2"
    assert got.data.metrics["promotion.promoted"] == 1.0
    assert got.data.metrics["promotion.gain_points"] == pytest.approx(50.0)
    assert got.data.metrics["cost.total_usd"] == pytest.approx(cost["total_usd"])
    assert "promotion/decision.json" in {a.path for a in MlflowClient().list_artifacts(run.info.run_id, "promotion")}
