"""Bootstrap intervals (tasks/evals/intervals.py)."""

import numpy as np
import pytest

from tasks.evals.intervals import mean_ci, paired_bootstrap


def test_mean_ci_contains_the_mean():
    values = [0, 1, 1, 0, 1, 1, 1, 0, 1, 1]
    ci = mean_ci(values, resamples=1000, seed=3)
    assert ci["mean"] == pytest.approx(0.7)
    assert ci["low"] <= 0.7 <= ci["high"]
    assert ci["low"] < ci["high"]
    assert ci["n"] == 10 and ci["confidence"] == 0.95


def test_mean_ci_is_deterministic_in_the_seed():
    values = np.random.default_rng(1).random(40)
    assert mean_ci(values, seed=5) == mean_ci(values, seed=5)
    assert mean_ci(values, seed=5) != mean_ci(values, seed=6)


def test_mean_ci_narrows_with_n():
    small = mean_ci([0, 1] * 10, seed=0)  # n = 20
    large = mean_ci([0, 1] * 500, seed=0)  # n = 1000
    assert small["mean"] == large["mean"] == 0.5
    w_small, w_large = small["high"] - small["low"], large["high"] - large["low"]
    # the standard error shrinks as 1/sqrt(n): sqrt(1000/20) ~ 7 times narrower
    assert w_large < w_small / 4


def test_mean_ci_wider_at_higher_confidence():
    values = [0, 1] * 30
    assert (
        mean_ci(values, confidence=0.99)["high"] - mean_ci(values, confidence=0.99)["low"]
        > mean_ci(values, confidence=0.8)["high"] - mean_ci(values, confidence=0.8)["low"]
    )


def test_mean_ci_empty_raises():
    with pytest.raises(ValueError):
        mean_ci([])


def test_paired_identical_inputs_give_zero_interval():
    a = [0.2, 0.9, 0.4, 1.0, 0.0]
    r = paired_bootstrap(a, list(a))
    assert r["mean"] == 0.0
    assert (r["low"], r["high"]) == (0.0, 0.0)
    assert r["excludes_zero"] is False
    assert r["n"] == 5


def test_paired_clear_improvement_excludes_zero():
    b = [0.0] * 100
    a = [1.0, 0.0] * 50  # challenger solves half of the tasks the champion fails: +0.5
    r = paired_bootstrap(a, b, seed=0)
    assert r["mean"] == pytest.approx(0.5)
    assert 0.3 < r["low"] < 0.5 < r["high"] < 0.7
    assert r["excludes_zero"] is True


def test_paired_clear_regression_excludes_zero_below():
    r = paired_bootstrap([0.0] * 100, [1.0, 0.0] * 50)
    assert r["mean"] == pytest.approx(-0.5)
    assert r["high"] < 0
    assert r["excludes_zero"] is True


@pytest.mark.parametrize("n, diff", [(50, 0.02), (100, 0.01)])
def test_paired_one_task_flipped_does_not_exclude_zero(n, diff):
    b = [1.0] * (n // 2) + [0.0] * (n - n // 2)
    a = list(b)
    a[-1] = 1.0  # one task flipped from fail to success
    r = paired_bootstrap(a, b, seed=0)
    assert r["mean"] == pytest.approx(diff)
    # a resample misses the flipped task with probability (1 - 1/n)^n ~ 0.37 > 0.025: low is 0
    assert r["low"] == 0.0
    assert r["excludes_zero"] is False


def test_paired_detects_small_shift_that_unpaired_intervals_miss():
    a = np.random.default_rng(2).random(60)  # task difficulty varies widely
    b = a - 0.02  # challenger slightly worse on every task
    ca, cb = mean_ci(a), mean_ci(b)
    assert ca["low"] < cb["high"]  # unpaired intervals overlap heavily
    r = paired_bootstrap(a, b)
    assert r["mean"] == pytest.approx(0.02)
    assert r["low"] > 0
    assert r["excludes_zero"] is True


def test_paired_is_deterministic_in_the_seed():
    rng = np.random.default_rng(0)
    a, b = rng.random(30), rng.random(30)
    assert paired_bootstrap(a, b, seed=1) == paired_bootstrap(a, b, seed=1)


@pytest.mark.parametrize("a, b", [([1, 0, 1], [1, 0]), ([], []), ([[1, 0]], [1, 0])])
def test_paired_shape_mismatch_or_empty_raises(a, b):
    with pytest.raises(ValueError, match="paired_bootstrap needs two equal, non-empty samples"):
        paired_bootstrap(a, b)
