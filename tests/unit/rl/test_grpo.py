"""GRPO maths (tasks/rl/grpo.py) against hand-computed cases."""

import math

import pytest
import torch

from tasks.rl.grpo import clipped_policy_loss, group_advantages, pad_batch, token_logprobs


def _t(rows, requires_grad=False):
    return torch.tensor(rows, dtype=torch.float64, requires_grad=requires_grad)


def _ratio_logp(ratios, requires_grad=True):
    """logp such that exp(logp - 0) equals each ratio (old_logp is zero)."""
    return torch.tensor(
        [[math.log(r) for r in row] for row in ratios], dtype=torch.float64, requires_grad=requires_grad
    )


# ---------------------------------------------------------------- group_advantages


def test_group_advantages_std_mode_hand_computed():
    # mean 0.5, population std 0.5 -> (r - 0.5) / 0.5
    adv = group_advantages([1, 0, 0, 1], ["g"] * 4, mode="std")
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0], rel=1e-5)


def test_group_advantages_std_mode_uses_population_std():
    # mean 0.25; population std sqrt(3/16) = 0.4330127; (1 - .25)/.4330127 = 1.7320508
    adv = group_advantages([1, 0, 0, 0], [0, 0, 0, 0], mode="std")
    assert adv == pytest.approx([math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)], rel=1e-5)


def test_group_advantages_mean_mode_dr_grpo():
    adv = group_advantages([1, 0, 0, 0], ["g"] * 4, mode="mean")
    assert adv == pytest.approx([0.75, -0.25, -0.25, -0.25], abs=1e-12)


def test_group_advantages_interleaved_groups_keep_input_order():
    # group a at positions 0,2,4,5 with rewards 1,0,0,1 -> +1,-1,-1,+1
    # group b at positions 1,3 with rewards 2,4 (mean 3, std 1) -> -1,+1
    adv = group_advantages([1, 2, 0, 4, 0, 1], ["a", "b", "a", "b", "a", "a"], mode="std")
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0, -1.0, 1.0], rel=1e-5)
    adv_mean = group_advantages([1, 2, 0, 4, 0, 1], ["a", "b", "a", "b", "a", "a"], mode="mean")
    assert adv_mean == pytest.approx([0.5, -1.0, -0.5, 1.0, -0.5, 0.5], abs=1e-12)


@pytest.mark.parametrize("mode", ["std", "mean"])
def test_group_advantages_equal_rewards_give_zeros_not_nan(mode):
    adv = group_advantages([0.7, 0.7, 0.7, 1.0], [1, 1, 1, 2], mode=mode)
    assert all(not math.isnan(a) for a in adv)
    # 0.7 is not exact in binary: the mean may differ from it by one ulp, so allow rounding noise
    assert adv == pytest.approx([0.0, 0.0, 0.0, 0.0], abs=1e-9)
    assert group_advantages([1, 1, 1], [0, 0, 0], mode=mode) == [0.0, 0.0, 0.0]


def test_group_advantages_invalid_mode_raises():
    with pytest.raises(ValueError, match="advantage mode"):
        group_advantages([1, 0], [0, 0], mode="rloo")


# ---------------------------------------------------------------- clipped_policy_loss


def test_loss_ratio_inside_clip_range_is_unclipped():
    logp = _ratio_logp([[1.1]])
    loss, stats = clipped_policy_loss(logp, _t([[0.0]]), _t([2.0]), _t([[1.0]]), eps_low=0.2, eps_high=0.28)
    assert loss.item() == pytest.approx(-2.2)
    assert stats["clip_fraction"] == 0.0
    assert stats["ratio_mean"] == pytest.approx(1.1)
    loss.backward()
    # d(-A * exp(logp)) / dlogp = -A * ratio
    assert logp.grad[0, 0].item() == pytest.approx(-2.2)


def test_loss_positive_advantage_above_upper_clip_has_zero_gradient():
    # token 0: ratio 1.5 > 1.28 (clipped); token 1: ratio 1.1 (inside)
    logp = _ratio_logp([[1.5, 1.1]])
    loss, stats = clipped_policy_loss(logp, _t([[0.0, 0.0]]), _t([1.0]), _t([[1.0, 1.0]]), eps_low=0.2, eps_high=0.28)
    assert loss.item() == pytest.approx(-(1.28 + 1.1) / 2)
    assert stats["clip_fraction"] == pytest.approx(0.5)
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(-1.1 / 2)


def test_loss_negative_advantage_below_lower_clip_has_zero_gradient():
    # A = -1, ratio 0.5 < 0.8: unclipped -0.5, clipped -0.8, min -> -0.8, loss 0.8
    logp = _ratio_logp([[0.5]])
    loss, stats = clipped_policy_loss(logp, _t([[0.0]]), _t([-1.0]), _t([[1.0]]), eps_low=0.2, eps_high=0.28)
    assert loss.item() == pytest.approx(0.8)
    assert stats["clip_fraction"] == 1.0
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0


def test_loss_negative_advantage_above_upper_clip_is_not_clipped():
    # pessimistic bound: A = -1, ratio 1.5: unclipped -1.5 < clipped -1.28 -> loss 1.5, gradient flows
    logp = _ratio_logp([[1.5]])
    loss, _ = clipped_policy_loss(logp, _t([[0.0]]), _t([-1.0]), _t([[1.0]]), eps_low=0.2, eps_high=0.28)
    assert loss.item() == pytest.approx(1.5)
    loss.backward()
    assert logp.grad[0, 0].item() == pytest.approx(1.5)


def test_loss_asymmetric_clip_high_distinct_from_low():
    # ratio 1.25, A = 1: eps_high .28 leaves it alone; eps_high .2 (symmetric) clips it to 1.2
    logp = _ratio_logp([[1.25]])
    loss, stats = clipped_policy_loss(logp, _t([[0.0]]), _t([1.0]), _t([[1.0]]), eps_low=0.2, eps_high=0.28)
    assert loss.item() == pytest.approx(-1.25)
    assert stats["clip_fraction"] == 0.0
    loss.backward()
    assert logp.grad[0, 0].item() == pytest.approx(-1.25)

    logp2 = _ratio_logp([[1.25]])
    loss2, stats2 = clipped_policy_loss(logp2, _t([[0.0]]), _t([1.0]), _t([[1.0]]), eps_low=0.2, eps_high=0.2)
    assert loss2.item() == pytest.approx(-1.2)
    assert stats2["clip_fraction"] == 1.0
    loss2.backward()
    assert logp2.grad[0, 0].item() == 0.0


def test_loss_eps_low_only_affects_lower_side():
    # ratio 0.75 with A = -1: eps_low .2 clips (0.8), eps_low .3 does not (0.7 bound)
    for eps_low, expected in [(0.2, 0.8), (0.3, 0.75)]:
        logp = _ratio_logp([[0.75]])
        loss, _ = clipped_policy_loss(logp, _t([[0.0]]), _t([-1.0]), _t([[1.0]]), eps_low=eps_low, eps_high=0.28)
        assert loss.item() == pytest.approx(expected)


def test_masked_tokens_contribute_nothing():
    old = _t([[0.0, 0.0, 0.0]])
    mask = _t([[1.0, 1.0, 0.0]])
    adv = _t([1.0])
    logp_a = _t([[0.05, -0.05, 0.0]], requires_grad=True)
    logp_b = _t([[0.05, -0.05, 0.9]], requires_grad=True)  # only the masked token differs
    loss_a, stats_a = clipped_policy_loss(logp_a, old, adv, mask, eps_low=0.2, eps_high=0.28)
    loss_b, stats_b = clipped_policy_loss(logp_b, old, adv, mask, eps_low=0.2, eps_high=0.28)
    assert loss_a.item() == pytest.approx(loss_b.item(), abs=1e-15)
    assert loss_a.item() == pytest.approx(-(math.exp(0.05) + math.exp(-0.05)) / 2)
    assert stats_b["clip_fraction"] == 0.0  # the masked token (ratio 2.46) is not counted as clipped
    loss_b.backward()
    assert logp_b.grad[0, 2].item() == 0.0
    assert logp_b.grad[0, 0].item() != 0.0


def test_token_level_aggregation_weighs_long_sequences_more():
    # seq 0: 3 tokens, A = +1; seq 1: 1 token (2 padded), A = -1; ratio 1 everywhere
    # per-token loss: -1 on each of seq 0's tokens, +1 on seq 1's token
    # token-level mean: (-3 + 1) / 4 = -0.5   (a per-sequence mean would give (-1 + 1) / 2 = 0)
    logp = _t([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], requires_grad=True)
    mask = _t([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    loss, _ = clipped_policy_loss(logp, logp.detach().clone(), _t([1.0, -1.0]), mask, eps_low=0.2, eps_high=0.28)
    assert loss.item() == pytest.approx(-0.5)
    loss.backward()
    # every unmasked token gets -A / n_tokens, n_tokens = 4 across the whole batch
    assert logp.grad.flatten().tolist() == pytest.approx([-0.25, -0.25, -0.25, 0.25, 0.0, 0.0])


def test_all_masked_batch_gives_zero_loss_not_nan():
    logp = _t([[0.3, 0.1]], requires_grad=True)
    loss, stats = clipped_policy_loss(logp, _t([[0.0, 0.0]]), _t([1.0]), _t([[0.0, 0.0]]), eps_low=0.2, eps_high=0.28)
    assert loss.item() == 0.0
    assert not math.isnan(stats["ratio_mean"])


@pytest.mark.parametrize("d", [0.5, -0.3])
def test_k3_kl_value(d):
    # ratio 1 and A = 0: the surrogate is zero, the loss is kl_coef * (exp(d) - d - 1), d = ref - logp
    kl = math.exp(d) - d - 1.0
    logp = _t([[0.0]], requires_grad=True)
    loss, stats = clipped_policy_loss(
        logp, _t([[0.0]]), _t([0.0]), _t([[1.0]]), eps_low=0.2, eps_high=0.28, ref_logp=_t([[d]]), kl_coef=0.1
    )
    assert stats["kl"] == pytest.approx(kl)
    assert loss.item() == pytest.approx(0.1 * kl)
    loss.backward()
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = -exp(d) + 1
    assert logp.grad[0, 0].item() == pytest.approx(0.1 * (1.0 - math.exp(d)))


def test_k3_kl_hand_value_and_off_when_coef_zero():
    # exp(0.5) - 0.5 - 1 = 0.1487212707
    _, stats = clipped_policy_loss(
        _t([[0.0]]), _t([[0.0]]), _t([0.0]), _t([[1.0]]), eps_low=0.2, eps_high=0.28, ref_logp=_t([[0.5]]), kl_coef=1.0
    )
    assert stats["kl"] == pytest.approx(0.1487212707)
    loss, stats = clipped_policy_loss(
        _t([[0.0]]), _t([[0.0]]), _t([0.0]), _t([[1.0]]), eps_low=0.2, eps_high=0.28, ref_logp=_t([[0.5]]), kl_coef=0.0
    )
    assert loss.item() == 0.0
    assert "kl" not in stats


def test_kl_is_masked_and_token_averaged():
    # two tokens, the second masked: kl averaged over the one unmasked token
    kl0 = math.exp(0.5) - 0.5 - 1.0
    loss, stats = clipped_policy_loss(
        _t([[0.0, 0.0]]),
        _t([[0.0, 0.0]]),
        _t([0.0]),
        _t([[1.0, 0.0]]),
        eps_low=0.2,
        eps_high=0.28,
        ref_logp=_t([[0.5, 3.0]]),
        kl_coef=0.5,
    )
    assert stats["kl"] == pytest.approx(kl0)
    assert loss.item() == pytest.approx(0.5 * kl0)


def test_kl_weight_per_sequence():
    # two one-token sequences with the same KL: weights 0.1 and 0.5 -> token mean of (0.1 + 0.5) * kl / 2
    kl0 = math.exp(0.5) - 0.5 - 1.0
    args = (_t([[0.0], [0.0]]), _t([[0.0], [0.0]]), _t([0.0, 0.0]), _t([[1.0], [1.0]]))
    loss, _ = clipped_policy_loss(
        *args, eps_low=0.2, eps_high=0.28, ref_logp=_t([[0.5], [0.5]]), kl_coef=torch.tensor([0.1, 0.5])
    )
    assert loss.item() == pytest.approx(0.3 * kl0)
    # one weight zero, the other not: the KL is the token mean over the weighted sequence only
    loss, stats = clipped_policy_loss(
        *args, eps_low=0.2, eps_high=0.28, ref_logp=_t([[0.5], [0.5]]), kl_coef=torch.tensor([0.0, 0.4])
    )
    assert loss.item() == pytest.approx(0.4 * kl0) and stats["kl"] == pytest.approx(kl0)
    assert stats["kl_tokens"] == 1.0


def test_kl_acts_on_zero_advantage_sequences_with_its_own_token_mean():
    # seq 0: A = 0 (a saturated group), KL 0.5 away from the reference; seq 1: A = 1, on the reference.
    # The surrogate is the mean over seq 1's two tokens; the KL the mean over all three weighted tokens.
    kl0 = math.exp(0.5) - 0.5 - 1.0
    logp = _t([[0.0, 0.0], [0.0, 0.0]], requires_grad=True)
    mask = _t([[1.0, 0.0], [1.0, 1.0]])
    loss, stats = clipped_policy_loss(
        logp,
        logp.detach().clone(),
        _t([0.0, 1.0]),
        mask,
        eps_low=0.2,
        eps_high=0.28,
        ref_logp=_t([[0.5, 0.0], [0.0, 0.0]]),
        kl_coef=1.0,
    )
    assert stats["pg_tokens"] == 2.0 and stats["kl_tokens"] == 3.0
    assert loss.item() == pytest.approx(-1.0 + kl0 / 3)
    loss.backward()
    assert logp.grad[0, 0].item() == pytest.approx((1.0 - math.exp(0.5)) / 3)  # restoring force on seq 0


def test_global_token_counts_scale_each_term():
    logp = _t([[0.0]], requires_grad=True)
    loss, _ = clipped_policy_loss(
        logp,
        _t([[0.0]]),
        _t([1.0]),
        _t([[1.0]]),
        eps_low=0.2,
        eps_high=0.28,
        ref_logp=_t([[0.5]]),
        kl_coef=1.0,
        pg_tokens=4.0,
        kl_tokens=10.0,
    )
    assert loss.item() == pytest.approx(-1.0 / 4 + (math.exp(0.5) - 1.5) / 10)


def test_clipping_is_counted_only_where_the_clip_binds():
    # A > 0 with a ratio under 1 - eps_low: min() picks the unclipped term, nothing is clipped (TRL's count);
    # A < 0 with a ratio over 1 + eps_high: the same on the other side
    for r, a in [(0.5, 1.0), (1.5, -1.0)]:
        _, stats = clipped_policy_loss(
            _ratio_logp([[r]]), _t([[0.0]]), _t([a]), _t([[1.0]]), eps_low=0.2, eps_high=0.28
        )
        assert stats["clip_fraction"] == 0.0 and stats["clip_low"] == stats["clip_high"] == 0.0
    _, low = clipped_policy_loss(_ratio_logp([[0.5]]), _t([[0.0]]), _t([-1.0]), _t([[1.0]]), eps_low=0.2, eps_high=0.28)
    _, high = clipped_policy_loss(_ratio_logp([[1.5]]), _t([[0.0]]), _t([1.0]), _t([[1.0]]), eps_low=0.2, eps_high=0.28)
    assert (low["clip_low"], low["clip_high"], high["clip_low"], high["clip_high"]) == (1.0, 0.0, 0.0, 1.0)


def test_k3_is_bounded_and_masked_positions_cannot_give_nan():
    # a token at log-prob -15 under a reference at 0: the log-ratio is bounded at 10
    logp = _t([[-15.0, 0.0]], requires_grad=True)
    loss, stats = clipped_policy_loss(
        logp,
        logp.detach().clone(),
        _t([0.0]),
        _t([[1.0, 0.0]]),
        eps_low=0.2,
        eps_high=0.28,
        ref_logp=_t([[0.0, float("inf")]]),
        kl_coef=1.0,
    )
    assert stats["kl"] == pytest.approx(math.exp(10.0) - 11.0)
    assert math.isfinite(loss.item())
    loss.backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 1].item() == 0.0
    # the surrogate's ratio at a masked position with -inf log-probs does not poison the loss either
    logp2 = _t([[0.0, float("-inf")]], requires_grad=True)
    loss2, _ = clipped_policy_loss(logp2, _t([[0.0, 0.0]]), _t([1.0]), _t([[1.0, 0.0]]), eps_low=0.2, eps_high=0.28)
    assert loss2.item() == pytest.approx(-1.0)


def test_token_logprobs_divide_logits_by_the_temperature():
    logits = torch.tensor([[[2.0, 0.0, 1.0], [0.0, 0.0, 0.0]]])
    ids = torch.tensor([[0, 2]])
    assert token_logprobs(logits, ids, temperature=0.5).item() == pytest.approx(
        torch.log_softmax(logits[0, 0] / 0.5, -1)[2].item()
    )
    assert token_logprobs(logits, ids).item() == pytest.approx(torch.log_softmax(logits[0, 0], -1)[2].item())


def test_engine_gap_and_truncated_importance_weights():
    from tasks.rl.grpo import engine_gap, truncated_is_weights

    trainer, engine = _t([[-1.0, -2.0, -3.0]]), _t([[-1.1, -1.0, 0.0]])
    mask = _t([[1.0, 1.0, 0.0]])  # the third token is a tool result: not the engine's
    gap = engine_gap(trainer, engine, mask)
    assert gap["tokens"] == 2.0 and gap["abs_sum"] == pytest.approx(1.1) and gap["abs_max"] == pytest.approx(1.0)
    assert gap["k3_sum"] == pytest.approx((math.exp(0.1) - 1.1) + (math.exp(-1.0) + 1.0 - 1.0))
    tiny = engine_gap(_t([[-1.0]]), _t([[-1.0 + 1e-7]]), _t([[1.0]]))
    assert 0.0 <= tiny["k3_sum"] == pytest.approx(0.5e-14, rel=1e-2)  # not fp32 rounding noise
    w = truncated_is_weights(trainer, engine, mask, cap=2.0)
    assert w.tolist()[0] == pytest.approx([math.exp(0.1), math.exp(-1.0), 1.0])
    assert truncated_is_weights(_t([[0.0]]), _t([[-5.0]]), _t([[1.0]]), cap=2.0).item() == pytest.approx(2.0)
    # the weights multiply the surrogate per token
    loss, _ = clipped_policy_loss(
        _t([[0.0]]), _t([[0.0]]), _t([1.0]), _t([[1.0]]), eps_low=0.2, eps_high=0.28, is_weights=_t([[0.5]])
    )
    assert loss.item() == pytest.approx(-0.5)


# ---------------------------------------------------------------- token_logprobs


def test_token_logprobs_position_t_minus_1_predicts_token_t():
    p0 = [0.5, 0.25, 0.25]  # distribution at position 0 (predicts token 1)
    p1 = [0.1, 0.2, 0.7]  # distribution at position 1 (predicts token 2)
    logits = torch.tensor([[[math.log(p) for p in p0], [math.log(p) + 3.0 for p in p1], [9.0, -9.0, 0.0]]])
    ids = torch.tensor([[0, 1, 2]])
    out = token_logprobs(logits, ids)
    assert out.shape == (1, 2)
    assert out[0].tolist() == pytest.approx([math.log(0.25), math.log(0.7)], rel=1e-5)
    # the last position's logits predict nothing inside the sequence
    logits2 = logits.clone()
    logits2[0, 2] = torch.tensor([0.0, 50.0, 0.0])
    assert torch.equal(token_logprobs(logits2, ids), out)
    # the first token is never scored: changing it changes nothing
    assert torch.equal(token_logprobs(logits, torch.tensor([[2, 1, 2]])), out)


def test_token_logprobs_batch_and_dtype():
    logits = torch.zeros(2, 4, 5, dtype=torch.bfloat16)
    out = token_logprobs(logits, torch.tensor([[0, 1, 2, 3], [4, 4, 4, 4]]))
    assert out.shape == (2, 3)
    assert out.dtype == torch.float32
    assert out.flatten().tolist() == pytest.approx([-math.log(5)] * 6, rel=1e-6)


# ---------------------------------------------------------------- pad_batch


def test_pad_batch_right_pads_and_shifts_loss_mask():
    ids, attn, loss_mask = pad_batch([[5, 6, 7, 8], [9, 10]], [[0, 0, 1, 1], [0, 1]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 8], [9, 10, 0, 0]]
    assert attn.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert ids.dtype == torch.long and attn.dtype == torch.long
    # loss_mask[:, t] is for token t + 1, aligned with token_logprobs[:, t]
    assert loss_mask.shape == (2, 3)
    assert loss_mask.tolist() == [[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]


def test_pad_batch_uses_pad_id_and_aligns_with_token_logprobs():
    ids, attn, loss_mask = pad_batch([[1, 2, 3], [4]], [[0, 1, 1], [1]], pad_id=99)
    assert ids.tolist() == [[1, 2, 3], [4, 99, 99]]
    logp = token_logprobs(torch.zeros(2, 3, 100), ids)
    assert logp.shape == loss_mask.shape
    # a lone first token is never predicted, so it carries no loss even if masked in
    assert loss_mask[1].tolist() == [0.0, 0.0]


def test_pad_batch_mismatched_mask_raises():
    with pytest.raises(ValueError, match="sequence 1: 2 tokens but 3 mask entries"):
        pad_batch([[1, 2, 3], [4, 5]], [[0, 1, 1], [0, 1, 1]], pad_id=0)
