"""The bootstrap's SFT step (tasks/policy/sft.py): length-sorted micro-batches, the learning-rate schedule."""

import copy
import itertools

import pytest
import torch

from tasks.config import ModelSettings
from tasks.policy.model import build_model
from tasks.policy.sft import demonstration_backward, demonstration_batch, demonstration_loss, lr_factor


def _gradients(model) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("micro_batches", [2, 3, 7])
def test_micro_batches_give_the_one_tensor_loss_and_gradient(micro_batches):
    model, tok = build_model(ModelSettings(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
    batch = demonstration_batch("desk", tok, 7, seed=3, max_len=512)
    assert len({len(ids) for ids, _ in batch}) > 2  # lengths differ, so slices pad differently

    whole = copy.deepcopy(model)
    loss = demonstration_loss(whole, batch, tok.pad_id)
    loss.backward()
    sliced = copy.deepcopy(model)
    sliced_loss = demonstration_backward(sliced, batch, tok.pad_id, micro_batches)

    assert sliced_loss == pytest.approx(loss.item(), rel=1e-5)
    for g_whole, g_sliced in zip(_gradients(whole), _gradients(sliced), strict=True):
        torch.testing.assert_close(g_sliced, g_whole, rtol=1e-4, atol=1e-6)


def test_more_micro_batches_than_samples_is_one_sample_each():
    model, tok = build_model(ModelSettings(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
    batch = demonstration_batch("desk", tok, 3, seed=4, max_len=512)
    assert demonstration_backward(model, batch, tok.pad_id, micro_batches=10) == pytest.approx(
        demonstration_loss(copy.deepcopy(model), batch, tok.pad_id).item(), rel=1e-5
    )


def test_lr_schedule_warms_up_holds_then_decays_to_a_tenth():
    total = 1000
    assert lr_factor(0, total) == pytest.approx(1 / 50)  # 5 % warmup
    assert lr_factor(49, total) == 1.0
    assert all(lr_factor(s, total) == 1.0 for s in range(50, 700))  # held until 70 %
    tail = [lr_factor(s, total) for s in range(700, total)]
    assert all(a >= b for a, b in itertools.pairwise(tail))  # then only down
    assert tail[-1] == pytest.approx(0.1, abs=1e-4)


def test_recovery_demonstrations_show_a_refused_slip_then_the_trained_correction():
    from tasks.policy.tokenizer import default_chat

    chat = default_chat()
    plain = demonstration_batch("desk", chat, 40, seed=3, max_len=512)
    assert demonstration_batch("desk", chat, 40, seed=3, max_len=512, recovery=0.0) == plain  # 0: as before
    mixed = demonstration_batch("desk", chat, 40, seed=3, max_len=512, recovery=0.5)
    recovered = [(ids, mask, p) for (ids, mask), p in zip(mixed, plain, strict=True) if ids != p[0]]
    assert 10 <= len(recovered) <= 30  # about half
    for ids, mask, (plain_ids, plain_mask) in recovered:
        text = chat.decode(ids)
        assert text.count("<tool_call>") == 2 and "<|tool|>error: " in text
        trained = chat.decode([i for i, m in zip(ids, mask, strict=True) if m])
        # the slipped call is out of the loss: what is trained is what the plain demonstration trains
        assert trained == chat.decode([i for i, m in zip(plain_ids, plain_mask, strict=True) if m])


def flaky_environment():
    """desk whose tool service fails every other call (a tool server timing out under load)."""
    from dataclasses import replace

    from tasks.envs import get_env
    from tasks.envs.backends import InProcessSession
    from tasks.envs.base import ToolError
    from tasks.envs.desk import make_service

    desk, calls = get_env("desk"), iter(range(10**6))

    def open_session(task):
        service = make_service(task)

        def flaky(name, arguments):
            if next(calls) % 2:
                raise TimeoutError("tool server too slow")
            return service(name, arguments)

        return InProcessSession(flaky, (ToolError,))

    def generate_tasks(*args, **kwargs):
        return [replace(t, env=__name__ + ":flaky_environment") for t in desk.generate_tasks(*args, **kwargs)]

    return replace(desk, name=__name__ + ":flaky_environment", generate_tasks=generate_tasks, open_session=open_session)


def test_demonstrations_whose_tool_backend_faulted_are_skipped_not_fatal():
    from tasks.policy.tokenizer import default_chat

    batch = demonstration_batch(__name__ + ":flaky_environment", default_chat(), 10, seed=3, max_len=512)
    assert len(batch) == 5  # every other call failed: those demonstrations teach nothing and are left out
