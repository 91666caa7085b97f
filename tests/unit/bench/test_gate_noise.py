"""bench/gate_noise.py's pairing and judging (pure parts; the bench evaluates real models)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))
spec = importlib.util.spec_from_file_location("gate_noise", BENCH / "gate_noise.py")
gate_noise = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gate_noise)


def _cmp(mean, low, high):
    side = {"mean": 0.5, "low": 0.4, "high": 0.6}
    return {
        "metric": "greedy_success",
        "challenger": side,
        "champion": side,
        "difference": {"mean": mean, "low": low, "high": high, "n": 150},
    }


def test_negated_swaps_the_interval():
    c = gate_noise.negated(_cmp(0.1, 0.02, 0.18))
    assert c["difference"] == {"mean": -0.1, "low": -0.18, "high": -0.02, "n": 150}


@pytest.mark.parametrize(
    "v2, v1, promoted",
    [
        ((0.2, 0.1, 0.3), (0, -0.05, 0.05), True),
        ((0.1, 0.0, 0.2), (0, -0.05, 0.05), False),
        ((0.2, 0.1, 0.3), (-0.1, -0.2, 0.0), False),
    ],
)
def test_judge_is_the_gate_with_its_defaults(v2, v1, promoted):
    from tasks.config import load_settings

    diff = {"2": {"greedy_success": _cmp(*v2)}, "1": {"greedy_success": _cmp(*v1)}}
    assert gate_noise.judge(diff, {"total_usd": 0.01}, load_settings()) is promoted


def test_pairs_within_a_champion_and_across_thread_counts(tmp_path):
    def model(p):
        (p / "model").mkdir(parents=True)
        (p / "model" / "config.json").write_text("{}")
        (p / "metrics.jsonl").write_text(json.dumps({"rollout_s": 1, "train_s": 1, "weight_sync_s": 0}) + "\n")

    for t in (1, 2):
        (tmp_path / f"t{t}-sft1" / "champion").mkdir(parents=True)
        for g in (0, 1, 2):
            model(tmp_path / f"t{t}-sft1" / f"grpo{g}")
    kinds = [k for k, *_ in gate_noise.pairs(tmp_path, twins=False)]
    # 3 seed pairs per champion; the two champions, and 3 challenger twins across thread counts
    assert kinds.count("seed") == 6 and kinds.count("float") == 4
