"""The challenger's checkpoint choice (tasks/rl/selection.py): the pure rule, and what it leaves on disk."""

from __future__ import annotations

import json

import pytest

from tasks.rl.selection import challenger_step, choose_checkpoint, choose_init, validation_score


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


def test_finish_puts_the_chosen_checkpoints_weights_into_the_model(tmp_path):
    """The scores as a run leaves them in validation.jsonl; the checkpoints as GRPO writes them (the chosen
    one protected from rotation); the model ends with the chosen step's weights, not the last step's."""
    import torch

    from tasks.config import load_settings
    from tasks.policy.model import build_model
    from tasks.rl.checkpoint import save_checkpoint
    from tasks.rl.selection import CheckpointChoice

    settings = load_settings(
        environ={},
        overrides={
            "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 1, "intermediate_size": 64, "max_len": 128},
            "grpo": {"validation_tasks": 4},
        },
    )
    rows = [_row(0, 0.1, 0.8), _row(2, 0.5, 0.79), _row(4, 0.7, 0.6), _row(6, 0.4, 0.8)]
    (tmp_path / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model, tok = build_model(settings.model)
    opt = torch.optim.AdamW(model.parameters())
    choice = CheckpointChoice(settings, tmp_path)
    weights = {}
    for step in (2, 4, 6):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * step)
        weights[step] = {k: v.clone() for k, v in model.state_dict().items()}
        choice.rows = [r for r in rows if r["step"] <= step]  # what the run knew when it saved this step
        save_checkpoint(tmp_path / "checkpoints", step, model, tok, opt, keep=1, protected=choice.protected())

    assert choice.finish(model, 6, tmp_path / "checkpoints") == 2  # step 4 lost 20 points of guard
    assert all(torch.equal(v, weights[2][k]) for k, v in model.state_dict().items())
    saved = json.loads((tmp_path / "selection.json").read_text())
    assert (saved["step"], saved["last_step"]) == (2, 6) and [r["step"] for r in saved["rows"]] == [0, 2, 4, 6]


def _probe(successes, episodes=32, **fallbacks):
    """One probe shard: the champion's target successes, and {alias: successes} of the fallbacks it ran."""
    return {
        "target_successes": successes,
        "target_episodes": episodes,
        "fallbacks": {a: {"version": "1", "target_successes": n} for a, n in fallbacks.items()},
    }


def test_init_is_the_champion_while_it_solves_enough_to_learn_from():
    choice = choose_init([_probe(2, previous=20), _probe(2, previous=20)], below=0.05)
    assert choice["alias"] == "champion" and choice["success_rate"] == pytest.approx(4 / 64)


def test_init_falls_back_to_the_model_that_solves_most_below_the_bar():
    choice = choose_init([_probe(0, previous=5, older=10), _probe(1, previous=6, older=2)], below=0.05)
    assert choice["alias"] == "older" and choice["version"] == "1"
    assert choice["success_rate"] == pytest.approx(12 / 64) and choice["champion_success_rate"] == pytest.approx(1 / 64)


def test_init_keeps_the_champion_when_no_fallback_solves_more_or_ran_everywhere():
    assert choose_init([_probe(1, previous=1), _probe(0, previous=0)], below=0.05)["alias"] == "champion"
    # a fallback probed on one shard only (the other shard's champion was above the bar there) is not compared
    assert choose_init([_probe(0, previous=30), _probe(3)], below=0.05)["alias"] == "champion"
    assert choose_init([], below=0.05)["alias"] == "champion"
    # ties between fallbacks go to the first listed
    assert choose_init([_probe(0, a=4, b=4)], below=0.05)["alias"] == "a"
