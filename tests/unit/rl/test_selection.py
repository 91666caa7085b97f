"""The challenger's checkpoint choice (tasks/rl/selection.py): the pure rule, and what it leaves on disk."""
from __future__ import annotations

import json

import pytest

from tasks.rl.selection import challenger_step, choose_checkpoint, validation_score


def _row(step, target, guard):
    """A validation row whose greedy and sampled scores are both the given ones."""
    return {"step": step, "2": {"greedy": target, "sampled": target}, "1": {"greedy": guard, "sampled": guard}}


def _choose(rows, loss=0.05):
    return choose_checkpoint(rows, "2", "1", loss)["step"]


def test_score_is_the_mean_of_greedy_and_sampled():
    assert validation_score({"2": {"greedy": 0.6, "sampled": 0.2}}, "2") == pytest.approx(0.4)


def test_best_target_among_checkpoints_that_hold_the_guard():
    rows = [_row(0, 0.1, 0.80), _row(5, 0.4, 0.78), _row(10, 0.6, 0.70), _row(15, 0.5, 0.76)]
    # step 10 has the best target but lost 10 points of guard; 15 is the best that lost at most 5
    assert _choose(rows) == 15
    assert _choose(rows, loss=0.10) == 10


def test_the_champion_is_never_chosen_even_when_it_scores_best():
    assert _choose([_row(0, 0.9, 0.9), _row(5, 0.1, 0.9)]) == 5


def test_ties_go_to_the_better_guard_then_the_later_step():
    assert _choose([_row(0, 0.1, 0.8), _row(5, 0.5, 0.80), _row(10, 0.5, 0.78)]) == 5
    assert _choose([_row(0, 0.1, 0.8), _row(5, 0.5, 0.8), _row(10, 0.5, 0.8)]) == 10
    assert _choose([_row(0, 0.0, 0.0), _row(2, 0.0, 0.0), _row(4, 0.0, 0.0)]) == 4  # a model that solves nothing


def test_when_no_checkpoint_holds_the_guard_the_least_forgetful_is_chosen():
    rows = [_row(0, 0.1, 0.9), _row(5, 0.7, 0.5), _row(10, 0.3, 0.7)]
    assert _choose(rows) == 10


def test_rows_without_the_champion_or_without_a_trained_step_are_refused():
    with pytest.raises(ValueError, match="step 0"):
        _choose([_row(5, 0.5, 0.5)])
    with pytest.raises(ValueError, match="trained row"):
        _choose([_row(0, 0.5, 0.5)])


def test_challenger_step_is_the_chosen_one_else_the_last_trained(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps({"step": s}) for s in (1, 2, 3, 4)) + "\n")
    assert challenger_step(tmp_path) == 4
    (tmp_path / "selection.json").write_text(json.dumps({"step": 2, "last_step": 4}))
    assert challenger_step(tmp_path) == 2
    assert challenger_step(tmp_path / "missing") == 0
