"""Bootstrap: supervised fine-tuning of the tiny model into a competent registry-v1 agent.

    python -m tasks bootstrap --out runs/local/champion

Demonstrations are the environment's expert episodes on tasks without a toolset (the embedded
default's have random tool and argument names, operand types and tool order), so the policy learns to
read the tool listing in its prompt rather than memorise names;
only the assistant's own tokens carry loss (prompts and tool results are masked out). A share of the
episodes (`bootstrap.recovery_share`) shows a refused call and the corrected one, so that the champion
calls again after a tool error, as an agent must.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from tasks.envs import get_env, new_episode
from tasks.rl.grpo import pad_batch

if TYPE_CHECKING:
    from tasks.config import Settings
    from tasks.policy.chat import ChatFormat

log = logging.getLogger(__name__)


def demonstration_batch(
    env_name: str,
    chat: ChatFormat,
    n: int,
    seed: int,
    max_len: int,
    toolset: dict | None = None,
    split: str = "train",
    recovery: float = 0.0,
) -> list[tuple[list[int], list[int]]]:
    """(token ids, loss mask) of `n` expert episodes, built through the real episode loop; random tool
    schemas (the bootstrap's), or a toolset's tools. Training content only: demonstrations of eval
    content would let the gate measure recall.

    With `recovery` > 0 that share of the episodes opens with a slip (`slip`): the service's error comes
    back and the expert calls again, correctly. The slip is out of the loss; the recovery is in it."""
    env = get_env(env_name)
    if env.demonstration is None:
        raise ValueError(
            f"environment {env.name!r} has no demonstrations to learn from: set bootstrap.steps=0 and "
            f"model.name_or_path to a model that already calls tools (or grpo.demo_coef=0)"
        )
    rng = random.Random(seed)
    slips = random.Random(seed + 7_919) if recovery else None  # own stream: recovery=0 leaves the batch as it was
    out = []
    for task in env.generate_tasks(n, seed, toolset, split=split):
        ep = new_episode(task, chat, max_len=max_len)
        messages = env.demonstration(task, rng)
        if slips is not None and slips.random() < recovery:
            ep.add_message(slip(messages[0], slips), trained=False)
            if not ep.messages[-1]["content"].startswith("error"):
                raise AssertionError(f"the slip in {task.task_id} was not refused: {ep.messages[-2]}")
        for message in messages:
            ep.add_message(message)
            if ep.done:
                break
        if faults := set(ep.faults) - {"refused"}:  # the tool server failed the expert (slow, down): not a lesson
            log.warning("demonstration %s skipped: its tool backend faulted (%s)", task.task_id, ", ".join(faults))
            continue
        if not ep.score()["success"]:
            raise AssertionError(f"demonstration for {task.task_id} failed: {ep.score()['reason']}")
        out.append((ep.token_ids, ep.loss_mask))
    if not out:
        raise RuntimeError(f"no demonstration of {n} survived its tool backend's faults: is the tool server up?")
    return out


def slip(call: dict, rng: random.Random) -> dict:
    """The expert's call message with one character of the tool's name or of one argument's name changed:
    the copy slip a small model makes (`convert_utits` for `convert_units`), which the service refuses
    with an error that names what it offers. A champion that never saw a refused call followed by a
    corrected one answers after the error instead of calling again, and then RL has no successful
    episode to learn the new tool from (docs/experiments.md, 2026-12-06)."""
    function = dict(call["tool_calls"][0]["function"])
    arguments = dict(function["arguments"])
    if arguments and rng.random() < 0.5:
        wrong = rng.choice(list(arguments))
        function["arguments"] = {(_typo(k, rng) if k == wrong else k): v for k, v in arguments.items()}
    else:
        function["name"] = _typo(function["name"], rng)
    return {"role": "assistant", "content": "", "tool_calls": [{**call["tool_calls"][0], "function": function}]}


def _typo(name: str, rng: random.Random) -> str:
    i = rng.randrange(len(name))
    return name[:i] + rng.choice([c for c in "abcdefghijklmnopqrstuvwxyz" if c != name[i]]) + name[i + 1 :]


def demonstration_loss(model: torch.nn.Module, batch: list[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    """Mean next-token NLL over the assistant's own tokens of a demonstration batch."""
    device = next(model.parameters()).device
    ids, attn, mask = pad_batch([s for s, _ in batch], [m for _, m in batch], pad_id, device)
    return _summed_nll(model, ids, attn, mask) / mask.sum()


def demonstration_backward(
    model: torch.nn.Module, batch: list[tuple[list[int], list[int]]], pad_id: int, micro_batches: int = 1
) -> float:
    """Backpropagate `demonstration_loss` of `batch` through `micro_batches` length-sorted slices; returns it.

    Each slice is padded only to its own longest episode (one tensor pads all to the batch's longest:
    19 % of the bootstrap's tokens were padding, 10 % in two slices), and every slice's sum is divided by
    the whole batch's token count, so the gradient is the one-tensor gradient up to float rounding."""
    device = next(model.parameters()).device
    # one slice keeps the batch's order: the summation order, hence the floats, of the unsliced loss
    ordered = batch if micro_batches == 1 else sorted(batch, key=lambda sample: len(sample[0]))
    size = math.ceil(len(ordered) / micro_batches)
    slices = [
        pad_batch([s for s, _ in part], [m for _, m in part], pad_id, device)
        for part in (ordered[k : k + size] for k in range(0, len(ordered), size))
    ]
    n_tokens = sum(mask.sum() for _, _, mask in slices)
    total = 0.0
    for ids, attn, mask in slices:
        loss = _summed_nll(model, ids, attn, mask) / n_tokens
        loss.backward()
        total += loss.item()
    return total


def _summed_nll(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1), reduction="none")
    return (nll * mask.reshape(-1)).sum()


def lr_factor(step: int, total: int, warmup: float = 0.05, hold: float = 0.7) -> float:
    """Linear warmup, then the full rate until `hold` of the run, then cosine down to 10%.

    Copying names out of the schema emerges late (an induction-head transition after a few hundred
    steps); decaying the rate from the start slowed it a lot in our runs."""
    w, h = max(1, int(total * warmup)), int(total * hold)
    if step < w:
        return (step + 1) / w
    if step < h:
        return 1.0
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - h) / max(1, total - h)))


def sft_train(
    model: torch.nn.Module,
    chat: ChatFormat,
    settings: Settings,
    progress: Callable[[int, int, float], object] | None = None,
) -> list[float]:
    """Train in place; returns the loss per step. `progress(step, total, loss)` is called every step."""
    b = settings.bootstrap
    if b.threads:
        torch.set_num_threads(b.threads)
    torch.manual_seed(b.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=b.lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, b.steps))
    model.train()
    losses, t0 = [], time.time()
    for step in range(b.steps):
        batch = demonstration_batch(
            settings.env.name,
            chat,
            b.batch_size,
            seed=b.seed * 1_000_003 + step,
            max_len=settings.model.max_len,
            recovery=b.recovery_share,
        )
        opt.zero_grad(set_to_none=True)
        loss = demonstration_backward(model, batch, chat.pad_id, b.micro_batches)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss)
        if progress:
            progress(step + 1, b.steps, losses[-1])
        elif (step + 1) % 25 == 0 or step + 1 == b.steps:
            log.info("sft step %d/%d loss %.4f (%.1fs)", step + 1, b.steps, losses[-1], time.time() - t0)
    model.eval()
    return losses
