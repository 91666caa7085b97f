"""bench/seeds.py's floor and summary (pure functions; the bench itself runs the real loop)."""

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("seeds", Path(__file__).resolve().parents[3] / "bench" / "seeds.py")
seeds = importlib.util.module_from_spec(spec)
spec.loader.exec_module(seeds)


def _draw(v2, v2_low, v1):
    side = lambda mean, low: {k: {"difference": {"mean": mean, "low": low}} for k in seeds.KEYS}  # noqa: E731
    return {"2": side(v2, v2_low), "1": side(v1, v1 - 0.05)}


@pytest.mark.parametrize(
    "draw, ok",
    [
        (_draw(0.30, 0.20, 0.0), True),
        (_draw(0.25, 0.01, -0.05), True),  # on the floor
        (_draw(0.24, 0.10, 0.0), False),  # gain short of 25 pts
        (_draw(0.30, 0.0, 0.0), False),  # interval touches zero
        (_draw(0.40, 0.30, -0.06), False),  # forgot too much of v1
    ],
)
def test_floor(draw, ok):
    assert seeds.passes(draw) is ok


def test_summary_counts_passing_draws_and_spreads():
    s = seeds.summarize([_draw(0.30, 0.2, 0.0), _draw(0.40, 0.3, -0.02), _draw(0.10, 0.05, -0.16)])
    assert s["draws"] == 3 and s["passing"] == 2
    assert s["v2_greedy_mean"] == pytest.approx(0.2667, abs=1e-4) and s["v2_greedy_sd"] == pytest.approx(
        0.1528, abs=1e-4
    )
    assert s["mean_passes"] is False and seeds.summarize([])["draws"] == 0
