"""One GRPO update from a batch of rollout records (`grpo_step`): group advantages, the policy-gradient and
KL token sets, PPO-ptx demonstrations, micro-batches under a token budget, and with several Ray Train
workers one all-reduce of the summed gradients per optimizer step. Called by the training loop
(tasks/rl/train.py) once per step, and directly by tests/unit/rl/test_update.py and bench/rl_step.py.

    metrics = grpo_step(model, optimizer, records, settings, chat.pad_id, ref_model, demos)

The departures from the textbook are in tasks/rl/train.py's docstring (the loop and its update are one design).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from tasks.policy.sft import demonstration_loss
from tasks.rl.grpo import (
    clipped_policy_loss,
    engine_gap,
    group_advantages,
    has_signal,
    pad_batch,
    pad_values,
    sequence_token_logprobs,
    truncated_is_weights,
)

if TYPE_CHECKING:
    from tasks.config import Settings
    from tasks.config_grpo import GRPOSettings
    from tasks.policy.lora import BaseOf


def guard_count(grpo_settings: GRPOSettings) -> int:
    """Guard tasks per step; they come last in `training_tasks`."""
    return round(grpo_settings.tasks_per_step * grpo_settings.guard_share)


def _length(record: dict) -> int:
    """The episode's tokens as the trainer sees them: prompt and completion."""
    return len(record["prompt_ids"]) + len(record["completion_ids"])


def _micro_batches(indices: list[int], records: list[dict], max_tokens: int) -> list[list[int]]:
    """Consecutive (length-sorted) indices grouped so that padded size stays under max_tokens."""
    out: list[list[int]] = []
    cur: list[int] = []
    width = 0
    for i in indices:
        n = _length(records[i])
        if cur and max(width, n) * (len(cur) + 1) > max_tokens:
            out.append(cur)
            cur, width = [], 0
        cur.append(i)
        width = max(width, n)
    return out + ([cur] if cur else [])


def _group_key(record: dict) -> tuple[int, int]:
    return (record["task_index"], record["policy_version"])


def rank_groups(records: list[dict], indices: list[int], world: int) -> list[list[int]]:
    """`indices` split over `world` ranks by whole group (task, policy version), balancing tokens: the
    biggest group first to the least loaded rank. Deterministic, the same on every rank."""
    groups: dict = {}
    for i in indices:
        groups.setdefault(_group_key(records[i]), []).append(i)
    size = {k: sum(_length(records[i]) for i in v) for k, v in groups.items()}
    load = [0] * world
    out: list[list[int]] = [[] for _ in range(world)]
    for k in sorted(groups, key=lambda k: (-size[k], k)):
        r = min(range(world), key=lambda r: (load[r], r))
        out[r] += groups[k]
        load[r] += size[k]
    return [sorted(o) for o in out]


@contextmanager
def _phase(seconds: defaultdict[str, float], name: str, device: torch.device) -> Iterator[None]:
    """Adds the block's wall time to seconds[name]; on a GPU its queued kernels are finished first, so each
    phase is charged its own work (the synchronisation costs a little on a GPU, nothing on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    yield
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds[name] += time.perf_counter() - t0


def _completion_tokens(record: dict) -> int:
    """Tokens that carry loss: the model's own, as pad_batch's shifted mask counts them (never the first)."""
    return sum(([0] * len(record["prompt_ids"]) + record["completion_mask"])[1:])


def _all_reduce(tensors: list[torch.Tensor]) -> None:
    """Sum `tensors` over all workers in place, through one flat buffer (one collective)."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    torch.distributed.all_reduce(flat)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def grpo_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    records: list[dict],
    settings: Settings,
    pad_id: int,
    ref_model: torch.nn.Module | BaseOf | None = None,
    demos: list[tuple[list[int], list[int]]] | None = None,
    rank: int = 0,
    world: int = 1,
) -> dict:
    """One GRPO update from a batch of rollout records; returns its metrics.

    Every worker gets the whole batch: advantages and the set of episodes in the loss are computed on
    whole groups, then each rank trains whole groups of it (`rank_groups`). Each optimizer step does the
    same collectives on every rank whatever its share (one all-reduce of the summed gradients, one of the
    metrics), and both token means are over the whole batch, so W workers make the same update as one.

    `demos`: expert demonstrations ((ids, loss mask) pairs); with `grpo.demo_coef` > 0 their NLL joins
    every optimizer step's loss, weighted by it (PPO-ptx), split over the ranks the same way."""
    g = settings.grpo
    temperature = settings.rollout.temperature
    distributed = world > 1
    rewards = [r["reward"] for r in records]
    adv = group_advantages(rewards, [_group_key(r) for r in records], g.advantage)
    first_guard = g.tasks_per_step - guard_count(g)

    def kl_coef_of(record: dict) -> float:
        return g.guard_kl if record["task_index"] >= first_guard else g.kl_coef

    kl_on = ref_model is not None and g.uses_reference
    # the policy gradient needs a non-zero advantage; the KL acts on every episode it weighs
    signal = [has_signal(a) for a in adv]
    in_loss = [i for i in range(len(records)) if signal[i] or (kl_on and kl_coef_of(records[i]) > 0)]
    metrics = {
        "reward_mean": sum(rewards) / len(rewards),
        "success_rate": sum(r["success"] for r in records) / len(records),
        "episodes": len(records),
        "episodes_trained": sum(signal),
        "episodes_in_loss": len(in_loss),
        "completion_tokens": sum(r["completion_tokens"] for r in records),
    }
    if not in_loss:
        metrics.update(loss=0.0, grad_norm=0.0, trained_tokens=0)
        return metrics
    # minibatch k takes every minibatches-th group, so each is a set of whole groups on every rank
    groups = sorted({_group_key(records[i]) for i in in_loss})
    minibatch_of = {k: n % g.minibatches for n, k in enumerate(groups)}
    device = next(model.parameters()).device
    # where the update's time goes (update_<phase>_s): the batch's tensors, the no-grad log-probabilities (old and
    # reference), the policy forward with its loss, backward, demonstrations, and the optimizer step with the
    # gradient all-reduce and clipping
    seconds: defaultdict[str, float] = defaultdict(float)
    plan = []  # per minibatch: its global token counts and this rank's micro-batches
    for k in range(g.minibatches):
        members = [i for i in in_loss if minibatch_of[_group_key(records[i])] == k]
        pg_tokens = float(sum(_completion_tokens(records[i]) for i in members if signal[i]))
        kl_tokens = float(sum(_completion_tokens(records[i]) for i in members if kl_on and kl_coef_of(records[i]) > 0))
        mine = sorted(rank_groups(records, members, world)[rank], key=lambda i: _length(records[i]))
        batches = []
        # length-sorted micro-batches: little padding, bounded memory; gradients accumulate over them
        for mb in _micro_batches(mine, records, g.micro_batch_tokens):
            seqs = [records[i]["prompt_ids"] + records[i]["completion_ids"] for i in mb]
            masks = [[0] * len(records[i]["prompt_ids"]) + records[i]["completion_mask"] for i in mb]
            with _phase(seconds, "batch", device):
                ids, attn, loss_mask = pad_batch(seqs, masks, pad_id, device)
                engine = pad_values(
                    [[0.0] * len(records[i]["prompt_ids"]) + records[i]["logprobs"] for i in mb], ids.shape[1], device
                )
            with torch.no_grad(), _phase(seconds, "logprobs", device):
                # one optimizer step per batch: the policy that sampled is the one being trained, so the "old"
                # log-probabilities are the training forward's own, detached (ratio 1, the gradient of the
                # surrogate unchanged); a separate pass is needed only when earlier minibatches move the weights
                old = sequence_token_logprobs(model, ids, attn, temperature) if g.minibatches > 1 else None
                ref = sequence_token_logprobs(ref_model, ids, attn, temperature) if kl_on else None
            kl = torch.tensor(
                [kl_coef_of(records[i]) if kl_on else 0.0 for i in mb], dtype=torch.float32, device=device
            )
            a = torch.tensor([adv[i] for i in mb], dtype=torch.float32, device=device)
            batches.append((ids, attn, loss_mask, old, ref, a, kl, engine))
        plan.append((pg_tokens, kl_tokens, batches))
    my_demos, demo_share = None, 0.0
    if demos and g.demo_coef > 0:
        tokens = [sum(m[1:]) for _, m in demos]
        my_demos = [d for n, d in enumerate(demos) if n % world == rank]
        demo_share = sum(t for n, t in enumerate(tokens) if n % world == rank) / max(sum(tokens), 1)
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    # token sums over the whole update: loss, kl, ratio, clips, engine gap, demo NLL
    names = [
        "loss",
        "pg_tokens",
        "kl_tokens",
        "kl_sum",
        "ratio_sum",
        "clip_low",
        "clip_high",
        "gap_tokens",
        "gap_abs_sum",
        "gap_k3_sum",
        "gap_abs_max",
        "demo_nll",
    ]
    sums = dict.fromkeys(names, 0.0)
    norms = []
    for pg_tokens, kl_tokens, batches in plan:
        optimizer.zero_grad(set_to_none=True)
        for ids, attn, loss_mask, old, ref, a, kl, engine in batches:
            with _phase(seconds, "forward", device):
                logp = sequence_token_logprobs(model, ids, attn, temperature)
                old = logp.detach() if old is None else old
                # the loss mask is exactly the tokens the engine sampled, whose log-probabilities it reported
                weights = truncated_is_weights(old, engine, loss_mask, g.engine_is_cap) if g.engine_is_cap else None
                loss, stats = clipped_policy_loss(
                    logp,
                    old,
                    a,
                    loss_mask,
                    g.eps_low,
                    g.eps_high,
                    ref,
                    kl,
                    pg_tokens=pg_tokens,
                    kl_tokens=kl_tokens,
                    is_weights=weights,
                )
            with _phase(seconds, "backward", device):
                loss.backward()
            gap = engine_gap(old, engine, loss_mask)
            sums["loss"] += loss.item()
            for key in ("pg_tokens", "kl_tokens", "kl_sum", "ratio_sum", "clip_low", "clip_high"):
                sums[key] += stats[key]
            sums["gap_tokens"] += gap["tokens"]
            sums["gap_abs_sum"] += gap["abs_sum"]
            sums["gap_k3_sum"] += gap["k3_sum"]
            sums["gap_abs_max"] = max(sums["gap_abs_max"], gap["abs_max"])
        if my_demos:
            with _phase(seconds, "demos", device):
                demo_loss = demonstration_loss(model, my_demos, pad_id) * demo_share
                (g.demo_coef * demo_loss).backward()
            sums["demo_nll"] += demo_loss.item() / g.minibatches
        with _phase(seconds, "optimizer", device):
            if distributed:
                for p in params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                _all_reduce([p.grad for p in params])
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, g.max_grad_norm)))
            optimizer.step()
    model.eval()
    if distributed:
        totals = torch.tensor([sums[k] for k in names], dtype=torch.float64)
        peak = torch.tensor([sums["gap_abs_max"]], dtype=torch.float64)
        torch.distributed.all_reduce(totals)
        torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
        sums = dict(zip(names, totals.tolist(), strict=True)) | {"gap_abs_max": float(peak)}
    n_pg, n_kl, n_gap = max(sums["pg_tokens"], 1.0), max(sums["kl_tokens"], 1.0), max(sums["gap_tokens"], 1.0)
    one_step = g.minibatches == 1  # the ratio is exactly 1: the clip cannot bind, its counts mean nothing
    metrics.update(
        loss=sums["loss"] / g.minibatches,
        grad_norm=max(norms),
        micro_batches=sum(len(b) for _, _, b in plan),
        trained_tokens=int(sum(_completion_tokens(records[i]) for i in in_loss)),
        kl=sums["kl_sum"] / n_kl if kl_on else None,
        ratio_mean=sums["ratio_sum"] / n_pg,
        clip_low_fraction=None if one_step else sums["clip_low"] / n_pg,
        clip_high_fraction=None if one_step else sums["clip_high"] / n_pg,
        engine_logp_gap_mean=sums["gap_abs_sum"] / n_gap,
        engine_logp_gap_max=sums["gap_abs_max"],
        engine_k3=sums["gap_k3_sum"] / n_gap,
        pg_tokens=int(sums["pg_tokens"]),
        kl_tokens=int(sums["kl_tokens"]),
        engine_tokens=int(sums["gap_tokens"]),
    )
    if my_demos is not None:
        metrics["demo_nll"] = sums["demo_nll"]
    metrics.update({f"update_{phase}_s": t for phase, t in seconds.items()})  # this rank's, not reduced
    return metrics
