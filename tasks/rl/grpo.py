"""GRPO maths in torch: group-relative advantages, the clipped surrogate, k3 KL, masking, padding.

Pure functions, tested against hand-computed cases in tests/unit/rl/test_grpo.py.

Departures from the GRPO paper (Shao et al., 2024), all by configuration:
- advantages are (r - mean) / (std + eps) per group ("std"), or r - mean as in Dr. GRPO ("mean");
- the ratio is clipped asymmetrically, [1 - eps_low, 1 + eps_high] (DAPO's clip-higher). With one
  optimizer step per rollout batch (`grpo.minibatches=1`, the default) the ratio is exactly 1 and the
  clip never binds: the update is on-policy REINFORCE with a group baseline, as TRL's at
  `num_iterations=1`; the clip acts only with several minibatches;
- the surrogate is aggregated per token over the whole batch (DAPO's token-level mean), not per
  sequence, over the sequences with a non-zero advantage;
- the KL term is the k3 estimator exp(ref - logp) - (ref - logp) - 1 against the initial policy (the
  champion), per token, with the log-ratio bounded to +-10, over *every* sequence whose KL weight is
  above zero (saturated groups too: GRPO and TRL keep them), its own token mean; off when kl_coef is 0;
  its weight may differ per sequence (the guard tasks, from the champion's own registry, can be held
  closer to the champion than the target tasks);
- log-probabilities are of logits / temperature, the distribution the engine sampled from; optionally
  the surrogate is reweighted by truncated importance sampling against the engine's log-probabilities;
- only the model's own tokens carry loss: prompts and tool results are masked out.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from tasks.policy.lora import BaseOf

KL_LOG_RATIO_BOUND = 10.0  # |ref - logp| beyond this gives no KL gradient (verl bounds the same log-ratio)
ADVANTAGE_EPS = 1e-8  # a sequence whose |advantage| is at most this has no policy-gradient signal


def has_signal(advantage: float) -> bool:
    """Whether a sequence enters the surrogate (its group's rewards were not all equal)."""
    return abs(advantage) > ADVANTAGE_EPS


def group_advantages(rewards: list[float], group_ids: list, mode: str = "std", eps: float = 1e-6) -> list[float]:
    """Advantage of each sample relative to the other samples of its group (same task)."""
    groups: dict = defaultdict(list)
    for i, g in enumerate(group_ids):
        groups[g].append(i)
    out = [0.0] * len(rewards)
    for idx in groups.values():
        r = torch.tensor([rewards[i] for i in idx], dtype=torch.float64)
        adv = r - r.mean()
        if mode == "std":
            # population std; a group whose rewards are all equal has zero advantage (no signal), not NaN
            adv = adv / (r.std(unbiased=False) + eps)
        elif mode != "mean":
            raise ValueError(f"advantage mode {mode!r}: use 'std' (GRPO) or 'mean' (Dr. GRPO)")
        for i, a in zip(idx, adv.tolist(), strict=True):
            out[i] = a
    return out


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(input_ids[:, t] | < t) for t >= 1, shape [B, T-1] (position t-1 predicts token t), under the
    distribution sampled from: logits / temperature, as vLLM's processed logprobs and TRL's trainer."""
    logits = logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = F.log_softmax(logits, dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float | torch.Tensor = 0.0,
    pg_tokens: float | None = None,
    kl_tokens: float | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """Token-level clipped surrogate plus the weighted k3 KL (to minimise), and diagnostics.

    logp, old_logp, ref_logp, mask, is_weights: [B, T]; advantages: [B] (one per sequence, broadcast over its
    tokens); kl_coef: one weight, or [B] (one per sequence: the guard tasks may be held closer to the
    reference).

    The two terms have their own token sets and means: the surrogate covers sequences with a non-zero
    advantage (a zero-advantage sequence has no policy-gradient signal, and counting its tokens would only
    dilute the others'), the KL every sequence whose weight is above zero, saturated groups included (they
    are what the KL must hold in place). `pg_tokens` / `kl_tokens` are those counts over the whole
    optimizer batch (micro-batches and workers); unset, this batch's. `is_weights` (detached) multiply the
    surrogate per token: the truncated importance-sampling correction of the engine/trainer gap.

    Returned stats: token *sums* (`pg_tokens`, `kl_tokens`, `ratio_sum`, `kl_sum`, `clip_low`, `clip_high`),
    which add across micro-batches and workers, and this batch's means (`clip_fraction`, `ratio_mean`, `kl`).
    A token is clipped as in TRL: low only where A < 0 and the ratio is under 1 - eps_low, high only where
    A > 0 and it is over 1 + eps_high (elsewhere the clip does not bind).
    """
    mask = mask.to(logp.dtype)
    valid = mask > 0
    pg_mask = mask * (advantages.abs() > ADVANTAGE_EPS).to(logp.dtype).unsqueeze(-1)
    n_pg = float(pg_mask.sum())
    # masked positions (padding, prompt, tool results) hold arbitrary values: zero them before exp, so that
    # a huge difference there cannot give inf * 0 = NaN
    ratio = torch.exp(torch.where(valid, logp - old_logp, torch.zeros_like(logp)))
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    loss = (per_token * pg_mask).sum() / max(pg_tokens if pg_tokens is not None else n_pg, 1.0)
    with torch.no_grad():
        low = ((ratio < 1.0 - eps_low) & (adv < 0)).to(mask.dtype) * pg_mask
        high = ((ratio > 1.0 + eps_high) & (adv > 0)).to(mask.dtype) * pg_mask
    stats = {
        "pg_tokens": n_pg,
        "kl_tokens": 0.0,
        "kl_sum": 0.0,
        "ratio_sum": float((ratio.detach() * pg_mask).sum()),
        "clip_low": float(low.sum()),
        "clip_high": float(high.sum()),
    }
    stats["clip_fraction"] = (stats["clip_low"] + stats["clip_high"]) / max(n_pg, 1.0)
    stats["ratio_mean"] = stats["ratio_sum"] / max(n_pg, 1.0)
    coef = torch.as_tensor(kl_coef, dtype=logp.dtype, device=logp.device)
    coef = coef.expand(logp.shape[0]) if coef.dim() == 0 else coef
    if ref_logp is not None and bool((coef > 0).any()):
        kl_mask = mask * (coef > 0).to(logp.dtype).unsqueeze(-1)
        # bounded log-ratio (as verl): a token at logp -15 under a reference near 0 would give k3 ~ 3e6 and
        # set the direction of the whole step; beyond +-10 the KL gives no gradient
        delta = torch.where(valid, ref_logp - logp, torch.zeros_like(logp)).clamp(
            -KL_LOG_RATIO_BOUND, KL_LOG_RATIO_BOUND
        )
        kl = torch.exp(delta) - delta - 1.0
        n_kl = float(kl_mask.sum())
        loss = loss + (coef.unsqueeze(-1) * kl * kl_mask).sum() / max(kl_tokens if kl_tokens is not None else n_kl, 1.0)
        kl_sum = float((kl.detach() * kl_mask).sum())
        stats.update(kl_tokens=n_kl, kl_sum=kl_sum, kl=kl_sum / max(n_kl, 1.0))
    return loss, stats


def engine_gap(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor) -> dict:
    """How far the engine's log-probabilities of the sampled tokens are from the trainer's, over generated
    tokens: token sums of |difference| and of k3 (KL(engine || trainer), the samples being the engine's),
    the max |difference| and the token count. Large values mean the two compute different policies
    (numerics, a stale weight sync, a temperature mismatch)."""
    # float64 and expm1: at gaps of 1e-7 (fp32 engine and trainer agree that well), exp(d) - d - 1 in fp32
    # is all rounding and comes out negative
    mask = mask.to(torch.float64)
    valid = mask > 0
    d = torch.where(valid, trainer_logp.detach().double() - engine_logp.double(), torch.zeros_like(mask))
    bounded = d.clamp(-KL_LOG_RATIO_BOUND, KL_LOG_RATIO_BOUND)
    k3 = torch.expm1(bounded) - bounded
    return {
        "tokens": float(mask.sum()),
        "abs_sum": float((d.abs() * mask).sum()),
        "k3_sum": float((k3 * mask).sum()),
        "abs_max": float(d.abs().max()) if bool(valid.any()) else 0.0,
    }


def truncated_is_weights(
    old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Per-token min(pi_trainer / pi_engine, cap) on the sampled tokens (truncated importance sampling, as
    TRL's `vllm_importance_sampling_cap` and verl's TIS): corrects the surrogate for sampling from the
    engine's slightly different policy, with the weight capped to bound its variance; 1 where masked."""
    log_w = torch.where(mask > 0, old_logp.detach() - engine_logp, torch.zeros_like(old_logp))
    return torch.exp(log_w.clamp(max=math.log(cap)))


def pad_batch(
    sequences: list[list[int]], masks: list[list[int]], pad_id: int, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input_ids, attention_mask and the loss mask shifted to align with token_logprobs,
    on `device` (the model's; built on the CPU, moved once)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(sequences), width), dtype=torch.long)
    loss_mask = torch.zeros((len(sequences), width), dtype=torch.float32)
    for i, (s, m) in enumerate(zip(sequences, masks, strict=True)):
        if len(s) != len(m):
            raise ValueError(f"sequence {i}: {len(s)} tokens but {len(m)} mask entries")
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        loss_mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
    if device is not None:
        ids, attn, loss_mask = ids.to(device), attn.to(device), loss_mask.to(device)
    return ids, attn, loss_mask[:, 1:]


def pad_values(rows: list[list[float]], width: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Per-token values (e.g. the engine's log-probabilities) right-padded with 0 and shifted like pad_batch's
    loss mask, so that column t belongs to token t + 1."""
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
    return (out if device is None else out.to(device))[:, 1:]


def sequence_token_logprobs(
    model: torch.nn.Module | BaseOf, ids: torch.Tensor, attn: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=attn).logits
    return token_logprobs(logits, ids, temperature)
