"""SFT pieces: length-sorted chunks and the chunked backward, which must give the one-tensor gradient."""
from __future__ import annotations

import copy

import torch

from tasks.config import load_settings
from tasks.policy.model import build_model
from tasks.policy.sft import demonstration_backward, demonstration_batch, demonstration_loss
from tasks.rl.grpo import length_chunks


def test_length_chunks_sort_cover_and_respect_the_budget():
    lengths = [50, 10, 40, 10, 30, 200]
    chunks = length_chunks(lengths, 80)
    assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
    assert [lengths[i] for c in chunks for i in c] == sorted(lengths)  # length order
    for c in chunks:
        assert len(c) == 1 or max(lengths[i] for i in c) * len(c) <= 80
    assert chunks[-1] == [5]  # longer than the budget: alone
    assert length_chunks(lengths, 10_000) == [sorted(range(6), key=lambda i: lengths[i])]


def test_chunked_backward_gives_the_gradient_of_the_whole_batch():
    s = load_settings(environ={}, overrides={"model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                                                       "intermediate_size": 64}})
    model, tok = build_model(s.model)
    other = copy.deepcopy(model)
    batch = demonstration_batch("desk", tok, 6, seed=3, max_len=512)
    loss = demonstration_loss(model, batch, tok.pad_id)
    (0.5 * loss).backward()
    nll = demonstration_backward(other, batch, tok.pad_id, max_tokens=400, weight=0.5)
    assert len(length_chunks([len(ids) for ids, _ in batch], 400)) > 1  # really chunked
    assert abs(nll - loss.item()) < 1e-5
    for p, q in zip(model.parameters(), other.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)
