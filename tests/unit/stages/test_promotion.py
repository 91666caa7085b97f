"""tasks/stages/promotion.py's cost and gate on a hand-made run directory (timings, eval tables,
comparisons): what the run cost, and each reason not to promote on its own (a budget under the cost, a
gain under the threshold, a regression on the guard, a failed validation)."""

from __future__ import annotations

import pytest

from tasks.config import load_settings
from tasks.evals.harness import EvalResult, compare
from tasks.promotion.cost import load_prices
from tasks.rundir import RunDir
from tasks.stages.contracts import Comparisons
from tasks.stages.promotion import cost, gate

N = 30
TIMINGS = {"probe_rollouts_0": (100.0, 0.5), "grpo": (1800.0, 3.0), "evaluate": (200.0, 1.0)}  # wall_s, cpus


def _settings(tmp_path, **promotion):
    # thresholds pinned here so that a change to pipeline.yaml does not change what these tests mean
    return load_settings(
        environ={},
        overrides={
            "run_dir": str(tmp_path),
            "promotion": {
                "metric": "greedy_success",
                "min_gain": 0.05,
                "guard_tolerance": 0.10,
                "min_gain_per_dollar": 1.0,
                "max_cost_usd": None,
                **promotion,
            },
        },
    )


def _rows(solved: int, tokens: int, toolset: str, key: str) -> list[dict]:
    # the first `solved` tasks solved: a challenger that solves more keeps every success of the champion
    return [
        {
            "task_id": f"desk-r{toolset}-{i}",
            "family": "calc",
            key: float(i < solved),
            "greedy_completion_tokens": tokens,
        }
        for i in range(N)
    ]


def make_run(
    tmp_path,
    target=(9, 24),
    guard=(27, 27),
    sampled=None,
    tokens=(40, 40),
    data="passed",
    evals_valid=True,
    **promotion,
):
    """A run directory as the stages before `cost` leave it. target/guard/sampled: (champion, challenger)
    tasks solved out of N; sampled (target's) defaults to target."""
    settings = _settings(tmp_path, **promotion)
    rd = RunDir.for_run(settings, "continuous_post_training", "manual__1")
    for stage, (wall, cpus) in TIMINGS.items():
        rd.record_timing(stage, wall, cpus=cpus, tokens_generated=1000)
    for who, i in (("champion", 0), ("challenger", 1)):
        rd.write_lines(
            [
                {**g, "sampled_success": s["sampled_success"]}
                for g, s in zip(
                    _rows(target[i], tokens[i], "2", "greedy_success"),
                    _rows((sampled or target)[i], tokens[i], "2", "sampled_success"),
                    strict=True,
                )
            ],
            f"eval_{who}_v2.jsonl",
        )

    def comparison(pair, toolset, key):
        champ, chall = (EvalResult(_rows(k, 40, toolset, key)) for k in pair)
        return compare(chall, champ, key=key, resamples=500)

    rd.write(
        Comparisons(
            evals_valid=evals_valid,
            greedy={"2": comparison(target, "2", "greedy_success"), "1": comparison(guard, "1", "greedy_success")},
            sampled={
                "2": comparison(sampled or target, "2", "sampled_success"),
                "1": comparison(guard, "1", "sampled_success"),
            },
        ),
        "comparisons.json",
    )
    if data is not None:
        rd.write({"retrain": True, "summary": "tool change", "window": "w", "data_validation": data}, "signals.json")
    return settings, rd


def _run_usd(settings) -> float:
    price = load_prices(settings.cost.prices_file).choose("cpu", settings.cost.cpu_price).price
    return sum(wall * cpus / 3600 for wall, cpus in TIMINGS.values()) * price


def failed(rd) -> list[str]:
    return [c["name"] for c in rd.read("decision.json")["checks"] if not c["passed"]]


def test_cost_prices_every_stage_of_the_run(tmp_path):
    settings, rd = make_run(tmp_path)
    out = cost(settings, rd)
    report = rd.read("cost.json")
    assert sorted(r["stage"] for r in report["stages"]) == sorted(TIMINGS)
    assert report["run_usd"] == pytest.approx(_run_usd(settings)) == pytest.approx(out["run_usd"])
    assert report["tokens"]["generated"] == 3000
    # same tokens per episode for both models: no serving change, the total is the run
    assert report["serving_delta_usd"] == pytest.approx(0.0) and out["total_usd"] == pytest.approx(out["run_usd"])
    assert report["success_gain_points"] == pytest.approx(50.0)
    assert out["usd_per_success_point"] == pytest.approx(out["total_usd"] / 50.0)


def test_a_challenger_dearer_to_serve_is_charged_for_it(tmp_path):
    settings, rd = make_run(tmp_path, tokens=(40, 42))
    out = cost(settings, rd)
    price = load_prices(settings.cost.prices_file).choose("serving", settings.cost.serving_price).price
    delta = 2 * settings.cost.traffic_episodes_per_day * settings.cost.horizon_days * price / 1e6
    assert rd.read("cost.json")["serving_delta_usd"] == pytest.approx(delta)
    assert out["total_usd"] == pytest.approx(_run_usd(settings) + delta)


def test_a_challenger_cheaper_to_serve_is_not_credited(tmp_path):
    settings, rd = make_run(tmp_path, tokens=(42, 40))
    out = cost(settings, rd)
    assert rd.read("cost.json")["serving_delta_usd"] < 0
    assert out["total_usd"] == pytest.approx(out["run_usd"])


def test_a_real_gain_with_a_steady_guard_is_promoted(tmp_path):
    settings, rd = make_run(tmp_path)
    cost(settings, rd)
    out = gate(settings, rd)
    assert out["promote"] is True and failed(rd) == []
    names = [c["name"] for c in rd.read("decision.json")["checks"]]
    assert names == [
        "metric",
        "target_gain",
        "guard:registry_v1",
        "gain_per_dollar",
        "validation:data",
        "validation:evals",
    ], "no budget set: no budget check"


def test_a_budget_under_the_cost_refuses(tmp_path):
    settings, rd = make_run(tmp_path)
    cost(settings, rd)
    settings = _settings(tmp_path, max_cost_usd=_run_usd(settings) / 2)
    out = gate(settings, rd)
    assert out["promote"] is False and failed(rd) == ["budget"]
    assert "over the budget" in out["reasons"][0]
    settings = _settings(tmp_path, max_cost_usd=_run_usd(settings) * 2)
    assert gate(settings, rd)["promote"] is True


@pytest.mark.parametrize(
    "run, check, reason",
    [
        ({"target": (9, 11)}, "target_gain", "target gain not shown"),  # a gain under the threshold
        ({"guard": (27, 18)}, "guard:registry_v1", "may have regressed"),  # a regression on the guard
    ],
)
def test_one_failed_check_refuses_and_says_why(tmp_path, run, check, reason):
    settings, rd = make_run(tmp_path, **run)
    cost(settings, rd)
    out = gate(settings, rd)
    assert out["promote"] is False and failed(rd) == [check]
    assert reason in out["reasons"][0]


def test_a_gain_that_does_not_pay_for_the_run_refuses(tmp_path):
    settings, rd = make_run(tmp_path, min_gain_per_dollar=1e6)
    cost(settings, rd)
    assert gate(settings, rd)["promote"] is False and failed(rd) == ["gain_per_dollar"]


@pytest.mark.parametrize(
    "data, evals_valid, expected",
    [
        ("failed", True, ["validation:data"]),
        (None, True, ["validation:data"]),  # no signals.json: the data validation was not seen
        ("passed", False, ["validation:evals"]),
    ],
)
def test_a_failed_or_missing_validation_refuses(tmp_path, data, evals_valid, expected):
    settings, rd = make_run(tmp_path, data=data, evals_valid=evals_valid)
    cost(settings, rd)
    assert gate(settings, rd)["promote"] is False and failed(rd) == expected


def test_the_gate_judges_the_configured_decoding(tmp_path):
    # greedy gains, sampled does not: promoted on greedy, refused on sampled
    settings, rd = make_run(tmp_path, sampled=(9, 10))
    cost(settings, rd)
    assert gate(settings, rd)["promote"] is True
    sampled = _settings(tmp_path, metric="sampled_success")
    cost(sampled, rd)
    assert rd.read("cost.json")["success_gain_points"] == pytest.approx(100 / N)
    assert gate(sampled, rd)["promote"] is False and failed(rd) == ["target_gain"]
    assert rd.read("decision.json")["checks"][0]["observed"] == "sampled_success"
