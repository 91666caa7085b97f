"""Training checkpoints (tasks/rl/checkpoint.py) on a tiny model built from settings: weights, optimizer
state, RNG states and the step come back exactly; the newest complete checkpoint is the one resumed; a
checkpoint killed mid-write is never chosen; a corrupt one is refused, not half-loaded into the model."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from tasks.config import load_settings
from tasks.policy.model import build_model
from tasks.rl.checkpoint import latest_checkpoint, restore_checkpoint, save_checkpoint


def _model(seed=0):
    s = load_settings(
        environ={},
        overrides={
            "model": {
                "hidden_size": 32,
                "num_layers": 1,
                "num_heads": 2,
                "intermediate_size": 64,
                "max_len": 128,
                "seed": seed,
            }
        },
    )
    model, tok = build_model(s.model)
    return model, tok, torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.99))


def _train_step(model, optimizer, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(9, model.config.vocab_size, (2, 12), generator=g)
    loss = model(input_ids=ids, labels=ids).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _draws():
    return torch.rand(4).tolist(), random.random(), np.random.rand(3).tolist()


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_weights_optimizer_rng_and_step_round_trip(tmp_path):
    model, tok, opt = _model()
    _train_step(model, opt, 1)
    _train_step(model, opt, 2)  # Adam moments and step counts that differ from a fresh optimizer's
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    path = save_checkpoint(tmp_path, 7, model, tok, opt, {"policy_version": 7})
    saved_weights, saved_opt = _weights(model), opt.state_dict()
    after_save = _draws()  # what the run would have drawn next

    assert path == tmp_path / "step-000007"
    assert {
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "chat_template.jinja",
        "optimizer.pt",
        "rng.pt",
        "rng.json",
        "state.json",
    } <= {p.name for p in path.iterdir()}
    for pt in ("optimizer.pt", "rng.pt"):  # tensors and plain containers only: loadable without unpickling
        torch.load(path / pt, weights_only=True)

    fresh, _, fresh_opt = _model(seed=1)  # other weights, an optimizer that has never stepped
    assert any(not torch.equal(fresh.state_dict()[k], v) for k, v in saved_weights.items())
    _draws()  # the generators move on
    state = restore_checkpoint(path, fresh, fresh_opt)

    assert state == {"step": 7, "policy_version": 7}
    for k, v in saved_weights.items():
        assert torch.equal(fresh.state_dict()[k], v), k
    got = fresh_opt.state_dict()
    assert len(got["state"]) == len(saved_opt["state"]) > 0
    for i, s in saved_opt["state"].items():
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(torch.as_tensor(got["state"][i][key]), torch.as_tensor(s[key])), (i, key)
    assert got["param_groups"] == saved_opt["param_groups"]
    assert _draws() == after_save, "torch, python and numpy draw what the run would have drawn next"

    # and the resumed run's next update is the uninterrupted run's next update
    _train_step(model, opt, 3)
    _train_step(fresh, fresh_opt, 3)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k


def test_the_newest_checkpoint_is_chosen_and_only_keep_are_kept(tmp_path):
    model, tok, opt = _model()
    assert latest_checkpoint(tmp_path) is None and latest_checkpoint(tmp_path / "missing") is None
    for step in (2, 4, 10):
        save_checkpoint(tmp_path, step, model, tok, opt, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000004", "step-000010"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000010", "by step, not by the text of the name"


def test_saving_a_step_again_replaces_it(tmp_path):
    model, tok, opt = _model()
    save_checkpoint(tmp_path, 4, model, tok, opt, {"attempt": 1})
    save_checkpoint(tmp_path, 4, model, tok, opt, {"attempt": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000004"]
    assert json.loads((tmp_path / "step-000004" / "state.json").read_text()) == {"step": 4, "attempt": 2}


def test_a_checkpoint_killed_mid_write_is_never_chosen(tmp_path):
    model, tok, opt = _model()
    save_checkpoint(tmp_path, 4, model, tok, opt)
    # a save killed before its rename: the temporary directory, weights written, no state yet
    half = tmp_path / ".step-000006.abc123"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"partial")
    # a step directory without its state.json (not written by save_checkpoint, e.g. a partial copy)
    (tmp_path / "step-000008").mkdir()
    (tmp_path / "step-000008" / "model.safetensors").write_bytes(b"partial")
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000004"
    fresh, _, fresh_opt = _model(seed=1)
    assert restore_checkpoint(latest_checkpoint(tmp_path), fresh, fresh_opt)["step"] == 4


def test_a_corrupt_checkpoint_is_refused_and_the_model_left_as_it_was(tmp_path):
    model, tok, opt = _model()
    path = save_checkpoint(tmp_path, 4, model, tok, opt)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: len(weights.read_bytes()) // 2])  # truncated on disk
    fresh, _, fresh_opt = _model(seed=1)
    before = _weights(fresh)
    with pytest.raises(Exception):
        restore_checkpoint(path, fresh, fresh_opt)
    for k, v in before.items():
        assert torch.equal(fresh.state_dict()[k], v), "nothing of a corrupt checkpoint is loaded"
    assert fresh_opt.state_dict()["state"] == {}


def test_rotation_keeps_the_newest_and_the_protected_steps(tmp_path):
    model, tok, opt = _model()
    for step in (5, 10, 15):
        save_checkpoint(tmp_path, step, model, tok, opt, keep=2, protected=(5,))
    save_checkpoint(tmp_path, 20, model, tok, opt, keep=2, protected=(5,))
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000005", "step-000015", "step-000020"]
    save_checkpoint(tmp_path, 25, model, tok, opt, keep=2)  # no longer protected: rotated away
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000020", "step-000025"]


def test_a_checkpoint_with_a_pickled_object_is_refused_not_unpickled(tmp_path):
    model, tok, opt = _model()
    path = save_checkpoint(tmp_path, 1, model, tok, opt)

    class Payload:  # what a tampered checkpoint could carry: unpickling it would run its __reduce__
        def __reduce__(self):
            return (print, ("unpickled",))

    torch.save({"torch": torch.get_rng_state(), "x": Payload()}, path / "rng.pt")
    with pytest.raises(Exception, match="(?i)weights.only|unsupported"):
        restore_checkpoint(path, _model(seed=1)[0], _model(seed=1)[2])
    (path / "rng.json").unlink()  # written before rng.json: refused with what to do
    with pytest.raises(ValueError, match="remove its checkpoints directory"):
        restore_checkpoint(path, _model(seed=1)[0], _model(seed=1)[2])
