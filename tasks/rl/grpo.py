"""GRPO maths in torch: group-relative advantages, the clipped surrogate, k3 KL, masking, padding.

Pure functions, tested against hand-computed cases in tests/unit/rl/test_grpo.py.

Departures from the GRPO paper (Shao et al., 2024), all by configuration:
- advantages are (r - mean) / (std + eps) per group ("std"), or r - mean as in Dr. GRPO ("mean");
- the ratio is clipped asymmetrically, [1 - eps_low, 1 + eps_high] (DAPO's clip-higher);
- the loss is aggregated per token over the whole batch (DAPO's token-level mean), not per sequence;
- the KL term is the k3 estimator exp(ref - logp) - (ref - logp) - 1 against the initial policy (the
  champion), per token, off when kl_coef is 0; its weight may differ per sequence (the guard tasks,
  from the champion's own registry, can be held closer to the champion than the target tasks);
- only the model's own tokens carry loss: prompts and tool results are masked out.
"""
from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn.functional as F


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
        for i, a in zip(idx, adv.tolist()):
            out[i] = a
    return out


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(input_ids[:, t] | < t) for t >= 1, shape [B, T-1] (position t-1 predicts token t)."""
    logp = F.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def clipped_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                        eps_low: float, eps_high: float, ref_logp: torch.Tensor | None = None,
                        kl_coef: float | torch.Tensor = 0.0) -> tuple[torch.Tensor, dict]:
    """Token-level clipped surrogate (to minimise) and diagnostics.

    logp, old_logp, ref_logp, mask: [B, T]; advantages: [B] (one per sequence, broadcast over its tokens);
    kl_coef: one weight, or [B] (one per sequence: the guard tasks may be held closer to the reference).
    """
    mask = mask.to(logp.dtype)
    n_tokens = mask.sum().clamp(min=1.0)
    ratio = torch.exp(logp - old_logp)
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    stats = {"clip_fraction": float(((unclipped != clipped).to(mask.dtype) * mask).sum() / n_tokens)}
    coef = torch.as_tensor(kl_coef, dtype=logp.dtype, device=logp.device)
    if ref_logp is not None and bool((coef > 0).any()):
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + (coef.unsqueeze(-1) if coef.dim() else coef) * kl
        stats["kl"] = float((kl.detach() * mask).sum() / n_tokens)
    loss = (per_token * mask).sum() / n_tokens
    stats["ratio_mean"] = float((ratio.detach() * mask).sum() / n_tokens)
    return loss, stats


def pad_batch(sequences: list[list[int]], masks: list[list[int]], pad_id: int,
              device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input_ids, attention_mask and the loss mask shifted to align with token_logprobs,
    on `device` (the model's; built on the CPU, moved once)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(sequences), width), dtype=torch.long)
    loss_mask = torch.zeros((len(sequences), width), dtype=torch.float32)
    for i, (s, m) in enumerate(zip(sequences, masks)):
        if len(s) != len(m):
            raise ValueError(f"sequence {i}: {len(s)} tokens but {len(m)} mask entries")
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        loss_mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
    if device is not None:
        ids, attn, loss_mask = ids.to(device), attn.to(device), loss_mask.to(device)
    return ids, attn, loss_mask[:, 1:]


def sequence_token_logprobs(model, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=attn).logits
    return token_logprobs(logits, ids)
