"""Promotion gate (tasks/promotion/gate.py) on comparisons built by the real paired bootstrap.

Each condition alone blocks promotion; identical models and a +1 point change on 50 tasks are not promoted;
a real gain (30% -> 80% on 150 tasks) with non-inferior guards, a cheap run and passed validations is.
"""

import json

import numpy as np
import pytest

from tasks.config import load_settings
from tasks.evals.harness import EvalResult, compare
from tasks.promotion.cost import ServingProjection, StageUsage, ledger, load_prices
from tasks.promotion.gate import Decision, decide


def settings(**over):
    # thresholds pinned here so a change to pipeline.yaml does not silently change what these tests mean
    promotion = {
        "metric": "greedy_success",
        "min_gain": 0.05,
        "guard_tolerance": 0.10,
        "min_gain_per_dollar": 1.0,
        **over,
    }
    return load_settings(environ={}, overrides={"promotion": promotion}).promotion


def comparison(challenger, champion, key="greedy_success"):
    """Per-task scores of two models on the same tasks -> tasks.evals.harness.compare's dict."""

    def result(values):
        return EvalResult([{"task_id": f"task-{i}", key: float(v)} for i, v in enumerate(values)])

    return compare(result(challenger), result(champion), key=key, resamples=2000, seed=0)


def solved(n, first):
    """n tasks, the first `first` of them solved."""
    return [1.0] * first + [0.0] * (n - first)


def target_real_gain(key="greedy_success"):
    return comparison(solved(150, 120), solved(150, 45), key)  # 30% -> 80%, every old success kept


def guards_ok():
    return {
        "registry-2": comparison(solved(100, 60), solved(100, 60)),  # unchanged
        "registry-3": comparison(solved(100, 58), solved(100, 60)),
    }  # -2 pts: within the 10-pt margin


def cost_of(stages):
    cost = load_settings(environ={}).cost
    return ledger(stages, cost, load_prices(cost.prices_file), ServingProjection(300, 290), success_gain_points=None)


def cheap_cost():
    # 8 vCPU-hours at the shipped c7i price: about $0.36
    return cost_of([StageUsage("rollout", wall_s=1800, cpus=8), StageUsage("train", wall_s=3600, cpus=4)])


def passing_inputs():
    return dict(
        target=target_real_gain(),
        guards=guards_ok(),
        validations={"data": True, "evals": True},
        cost=cheap_cost(),
        settings=settings(),
    )


def failed(decision: Decision) -> list[str]:
    return [c["name"] for c in decision.checks if not c["passed"]]


def test_real_gain_is_promoted():
    d = decide(**passing_inputs())
    assert d.promote and failed(d) == []
    names = [c["name"] for c in d.checks]
    assert names == [
        "metric",
        "target_gain",
        "guard:registry-2",
        "guard:registry-3",
        "gain_per_dollar",
        "validation:data",
        "validation:evals",
    ]
    target = d.checks[1]
    assert target["details"]["mean"] == pytest.approx(0.5) and target["observed"] > 0.4
    assert target["threshold"] == 0.05
    gpd = d.checks[4]
    assert gpd["observed"] == pytest.approx(50 / cheap_cost()["total_usd"]) and gpd["observed"] > 100
    assert len(d.reasons) == 1 and d.reasons[0].startswith("promote:")
    assert d.summary.startswith("PROMOTE evergreen-agent") and "7/7 checks passed" in d.summary


def test_identical_models_are_not_promoted():
    same = solved(150, 70)
    d = decide(**{**passing_inputs(), "target": comparison(same, same)})
    assert not d.promote
    assert failed(d) == ["target_gain", "gain_per_dollar"]  # no gain shown, and none to pay for
    target = d.checks[1]
    assert target["observed"] == target["details"]["mean"] == target["details"]["high"] == 0.0
    assert d.summary.startswith("HOLD") and "failed: target_gain, gain_per_dollar" in d.summary


def test_one_point_on_fifty_tasks_is_not_promoted():
    # sampled success over 4 attempts per task: 4 tasks gain an attempt, 2 lose one -> +0.5/50 = +1 point
    champion = np.random.default_rng(7).integers(1, 4, size=50) / 4  # in [0.25, 0.75]: room both ways
    challenger = champion.copy()
    challenger[[3, 11, 19, 27]] += 0.25
    challenger[[5, 40]] -= 0.25
    d = decide(
        **{
            **passing_inputs(),
            "target": comparison(challenger, champion, "sampled_success"),
            "guards": {},
            "settings": settings(metric="sampled_success"),
        }
    )
    target = d.checks[1]
    assert target["details"]["mean"] == pytest.approx(0.01)
    assert target["observed"] < 0 < target["details"]["high"]  # the interval straddles zero
    assert not d.promote and failed(d) == ["target_gain"]  # cheap, so only the bound blocks it


def test_one_more_task_solved_of_fifty_is_not_promoted():
    d = decide(**{**passing_inputs(), "target": comparison(solved(50, 21), solved(50, 20))})  # +2 points
    assert not d.promote and failed(d) == ["target_gain"]


def _break_target(inputs):
    inputs["target"] = comparison(solved(50, 22), solved(50, 20))  # +4 pts: mean > 0, bound at 0


def _break_guard(inputs):
    inputs["guards"]["registry-3"] = comparison(solved(100, 30), solved(100, 60))  # -30 pts


def _break_cost(inputs):
    # 100 H200s for 10 hours: ~$7,900 for 50 points
    inputs["cost"] = cost_of([StageUsage("train", wall_s=36_000, cpus=8, gpus=100, gpu_type="NVIDIA H200")])


def _fail_validation(inputs):
    inputs["validations"]["data"] = False


def _miss_validation(inputs):
    del inputs["validations"]["evals"]


def _fail_extra_validation(inputs):
    inputs["validations"]["drift"] = False


def _wrong_metric(inputs):
    inputs["target"] = target_real_gain(key="sampled_success")


@pytest.mark.parametrize(
    "breaker, check",
    [
        (_break_target, "target_gain"),
        (_break_guard, "guard:registry-3"),
        (_break_cost, "gain_per_dollar"),
        (_fail_validation, "validation:data"),
        (_miss_validation, "validation:evals"),
        (_fail_extra_validation, "validation:drift"),
        (_wrong_metric, "metric"),
    ],
)
def test_each_condition_alone_blocks_promotion(breaker, check):
    inputs = passing_inputs()
    breaker(inputs)
    d = decide(**inputs)
    assert not d.promote
    assert failed(d) == [check]
    (reason,) = d.reasons
    assert reason == next(c["reason"] for c in d.checks if c["name"] == check)
    assert f"failed: {check}" in d.summary


def test_reasons_carry_the_numbers():
    inputs = passing_inputs()
    _break_guard(inputs)
    _break_cost(inputs)
    _miss_validation(inputs)
    d = decide(**inputs)
    guard, gpd, missing = d.reasons
    assert "guard 'registry-3'" in guard and "-30.0 pts" in guard and "< -10.0 pts" in guard
    assert "+50.00 pts for $" in gpd and "< min_gain_per_dollar 1" in gpd
    assert "'evals' missing" in missing


def test_guard_is_judged_by_its_interval_not_its_mean():
    # 10 tasks, 5 won and 5 lost: mean 0, but a large regression is not excluded
    guard = comparison([0.0, 1.0] * 5, [1.0, 0.0] * 5)
    d = decide(**{**passing_inputs(), "guards": {"tiny": guard}})
    check = next(c for c in d.checks if c["name"] == "guard:tiny")
    assert check["details"]["mean"] == 0 and check["observed"] < -0.1
    assert not d.promote and failed(d) == ["guard:tiny"]


def test_free_run_counts_as_infinite_gain_per_dollar():
    d = decide(**{**passing_inputs(), "cost": {"total_usd": 0.0}})
    check = next(c for c in d.checks if c["name"] == "gain_per_dollar")
    assert d.promote and check["observed"] is None and check["details"]["infinite"]
    assert "treated as infinite" in check["reason"] and "infinite (cost $0)" in d.reasons[0]
    json.dumps(d.to_dict(), allow_nan=False)


def test_thresholds_are_inclusive():
    def cmp(low, mean):
        return {
            "metric": "greedy_success",
            "difference": {"mean": mean, "low": low, "high": mean + 0.1, "n": 100, "confidence": 0.95},
        }

    # gain 10 points for $10 = exactly 1 point per dollar
    d = decide(cmp(0.05, 0.10), {"g": cmp(-0.10, 0.0)}, {"data": True, "evals": True}, {"total_usd": 10.0}, settings())
    assert d.promote, d.reasons


def test_decision_is_deterministic_and_json_serialisable():
    a, b = decide(**passing_inputs()).to_dict(), decide(**passing_inputs()).to_dict()  # inputs rebuilt from scratch
    assert a == b
    assert json.loads(json.dumps(a, allow_nan=False)) == a
    held = passing_inputs()
    _break_guard(held)
    _miss_validation(held)
    h = decide(**held).to_dict()
    assert json.loads(json.dumps(h, allow_nan=False)) == h and h["promote"] is False


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda i: i.update(target={"metric": "greedy_success"}), "comparison 'target' has no 'difference'"),
        (lambda i: i["guards"]["registry-2"]["difference"].update(low=float("nan")), "registry-2' difference.low"),
        (lambda i: i["validations"].update(data="false"), "validation 'data' must be True or False"),
        (lambda i: i.update(cost={"total_usd": -1.0}), "cannot be negative"),
        (lambda i: i.update(cost={}), r"cost\['total_usd'\] must be a finite number"),
    ],
)
def test_malformed_inputs_raise(change, match):
    inputs = passing_inputs()
    change(inputs)
    with pytest.raises(ValueError, match=match):
        decide(**inputs)


def test_non_inferiority_policy_ships_an_equal_challenger_only_when_configured():
    """min_gain < 0 with min_gain_per_dollar = 0: "ship what handles the new tools if it is no worse"."""
    same = comparison(solved(100, 60), solved(100, 60))
    inputs = {**passing_inputs(), "target": same}
    held = decide(**inputs)
    assert not held.promote and set(failed(held)) == {"target_gain", "gain_per_dollar"}
    lenient = decide(**{**inputs, "settings": settings(min_gain=-0.2, min_gain_per_dollar=0.0)})
    assert lenient.promote, lenient.reasons
    check = next(c for c in lenient.checks if c["name"] == "gain_per_dollar")
    assert "not required" in check["reason"]
    worse = comparison(solved(100, 30), solved(100, 60))  # -30 pts: beyond a 20-pt margin
    assert not decide(
        **{**inputs, "target": worse, "settings": settings(min_gain=-0.2, min_gain_per_dollar=0.0)}
    ).promote


def test_a_run_over_its_budget_is_not_promoted_however_good():
    total = cheap_cost()["total_usd"]
    over = decide(**{**passing_inputs(), "settings": settings(max_cost_usd=total / 2)})
    assert not over.promote and failed(over) == ["budget"]
    budget = next(c for c in over.checks if c["name"] == "budget")
    assert budget["observed"] == pytest.approx(total) and budget["threshold"] == pytest.approx(total / 2)
    assert "over the budget" in over.reasons[0] and "failed: budget" in over.summary
    within = decide(**{**passing_inputs(), "settings": settings(max_cost_usd=total)})  # inclusive
    assert within.promote and "budget" in [c["name"] for c in within.checks]
    assert "budget" not in [c["name"] for c in decide(**passing_inputs()).checks]  # no budget, no check


def test_a_decision_is_held_when_the_champion_moved_since_it_was_measured():
    from tasks.promotion.gate import champion_unchanged
    from tasks.stages.contracts import Decision

    won = Decision(
        promote=True,
        checks=[{"name": "target_gain", "passed": True}],
        reasons=["promote: ..."],
        summary="PROMOTE m: ...; 1/1 checks passed",
    )
    assert champion_unchanged(won, "3", "3") is won and champion_unchanged(won, None, "4") is won
    held = champion_unchanged(won, "3", "4")
    assert not held.promote and held.checks[-1]["name"] == "champion_unchanged" and not held.checks[-1]["passed"]
    assert "moved from version 3 to 4" in held.reasons[0] and held.summary.startswith("HOLD")
    lost = Decision(promote=False, checks=[], reasons=["x"], summary="HOLD")
    assert champion_unchanged(lost, "3", "4") is lost
