"""GRPO training on Ray Train: the RL loop runs inside a TorchTrainer worker (gloo on CPU; on a GPU with
`grpo.gpus_per_train_worker` > 0, NCCL between workers).

    python -m tasks train --init runs/local/champion --run-dir runs/local/grpo    # challenger: <run-dir>/model

Each step: sample tasks (target registry, plus a guard share from the champion's registry) → rollouts
on the pool's engines (G samples per task) → one GRPO update → the new weights go into every engine
(`policy_version` + 1). Every `checkpoint_every` steps a checkpoint (weights, optimizer, RNG, step) is
written and reported to Ray Train; a restarted run resumes from the newest one and stops at the same
final step. Metrics per step go to `<run>/metrics.jsonl` and the Ray Train result.

Departures: groups whose rewards are all equal carry no policy-gradient signal and leave the surrogate
(as in DAPO's dynamic sampling, without resampling), but stay in the KL term while their KL weight is
above zero: a guard group the champion solves 8 of 8 times is exactly what the KL must hold in place.
The "old" log-probabilities are the trainer's, not the engine's, so engine/trainer numeric differences do
not leak into the ratio; the gap is measured every step (`engine_logp_gap_mean/max`, `engine_k3`) and
can be corrected by truncated importance sampling (`grpo.engine_is_cap`). With one minibatch per batch
(the default) the old log-probabilities are the training forward's own, detached (ratio 1: the clip is
inert and the update is REINFORCE with a group baseline); with several, a pass before the first
optimizer step computes them. With several workers every rank sees the whole batch and trains whole
groups of it; gradients are summed in one all-reduce per optimizer step and the token means are over
the whole batch, so the update equals one worker's. Optionally (`grpo.demo_coef`), every update also
takes an SFT step on expert demonstrations of the champion's registry, as InstructGPT's PPO-ptx mixes
pretraining gradients into PPO to keep what RL would erode; and the KL weight may differ between
target and guard episodes (`grpo.guard_kl_coef`).
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import torch

from tasks.envs import get_env
from tasks.rl.metrics import keep_metrics
from tasks.policy.sft import demonstration_batch, demonstration_loss
from tasks.rl.grpo import (clipped_policy_loss, engine_gap, group_advantages, has_signal, pad_batch, pad_values,
                           sequence_token_logprobs, truncated_is_weights)

log = logging.getLogger(__name__)


def guard_count(grpo_settings) -> int:
    """Guard tasks per step; they come last in `training_tasks`."""
    return round(grpo_settings.tasks_per_step * grpo_settings.guard_share)


def training_tasks(settings, step: int) -> list:
    """The tasks of one step: deterministic in (seed, step), drawn from the training split of the task
    content (disjoint from the eval and dev splits by construction). The target registry's tasks first,
    then `guard_count` from the champion's registry."""
    env, g = get_env(settings.env.name), settings.grpo
    n_guard = guard_count(g)
    seed = 1_000_000 + g.seed * 10_000 + step
    target = env.generate_tasks(g.tasks_per_step - n_guard, seed, env.load_toolset(settings.env.target_toolset),
                                split="train")
    guard = env.generate_tasks(n_guard, seed + 500_000, env.load_toolset(settings.env.champion_toolset),
                               split="train") if n_guard else []
    return target + guard


def _length(record: dict) -> int:
    """The episode's tokens as the trainer sees them: prompt and completion."""
    return len(record["prompt_ids"]) + len(record["completion_ids"])


def _micro_batches(indices: list[int], records: list[dict], max_tokens: int) -> list[list[int]]:
    """Consecutive (length-sorted) indices grouped so that padded size stays under max_tokens."""
    out, cur, width = [], [], 0
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
    load, out = [0] * world, [[] for _ in range(world)]
    for k in sorted(groups, key=lambda k: (-size[k], k)):
        r = min(range(world), key=lambda r: (load[r], r))
        out[r] += groups[k]
        load[r] += size[k]
    return [sorted(o) for o in out]


def _completion_tokens(record: dict) -> int:
    """Tokens that carry loss: the model's own, as pad_batch's shifted mask counts them (never the first)."""
    return sum(([0] * len(record["prompt_ids"]) + record["completion_mask"])[1:])


def _all_reduce(tensors: list[torch.Tensor]) -> None:
    """Sum `tensors` over all workers in place, through one flat buffer (one collective)."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    torch.distributed.all_reduce(flat)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def grpo_step(model, optimizer, records: list[dict], settings, pad_id: int, ref_model=None,
              demos: list | None = None, rank: int = 0, world: int = 1) -> dict:
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
    metrics = {"reward_mean": sum(rewards) / len(rewards),
               "success_rate": sum(r["success"] for r in records) / len(records),
               "episodes": len(records), "episodes_trained": sum(signal),
               "episodes_in_loss": len(in_loss),
               "completion_tokens": sum(r["completion_tokens"] for r in records)}
    if not in_loss:
        metrics.update(loss=0.0, grad_norm=0.0, trained_tokens=0)
        return metrics
    # minibatch k takes every minibatches-th group, so each is a set of whole groups on every rank
    groups = sorted({_group_key(records[i]) for i in in_loss})
    minibatch_of = {k: n % g.minibatches for n, k in enumerate(groups)}
    device = next(model.parameters()).device
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
            ids, attn, loss_mask = pad_batch(seqs, masks, pad_id, device)
            engine = pad_values([[0.0] * len(records[i]["prompt_ids"]) + records[i]["logprobs"] for i in mb],
                                ids.shape[1], device)
            with torch.no_grad():
                # one optimizer step per batch: the policy that sampled is the one being trained, so the "old"
                # log-probabilities are the training forward's own, detached (ratio 1, the gradient of the
                # surrogate unchanged); a separate pass is needed only when earlier minibatches move the weights
                old = sequence_token_logprobs(model, ids, attn, temperature) if g.minibatches > 1 else None
                ref = sequence_token_logprobs(ref_model, ids, attn, temperature) if kl_on else None
            kl = torch.tensor([kl_coef_of(records[i]) if kl_on else 0.0 for i in mb], dtype=torch.float32, device=device)
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
    names = ["loss", "pg_tokens", "kl_tokens", "kl_sum", "ratio_sum", "clip_low", "clip_high",
             "gap_tokens", "gap_abs_sum", "gap_k3_sum", "gap_abs_max", "demo_nll"]
    sums = dict.fromkeys(names, 0.0)
    norms = []
    for pg_tokens, kl_tokens, batches in plan:
        optimizer.zero_grad(set_to_none=True)
        for ids, attn, loss_mask, old, ref, a, kl, engine in batches:
            logp = sequence_token_logprobs(model, ids, attn, temperature)
            old = logp.detach() if old is None else old
            # the loss mask is exactly the tokens the engine sampled, whose log-probabilities it reported
            weights = truncated_is_weights(old, engine, loss_mask, g.engine_is_cap) if g.engine_is_cap else None
            loss, stats = clipped_policy_loss(logp, old, a, loss_mask, g.eps_low, g.eps_high, ref, kl,
                                              pg_tokens=pg_tokens, kl_tokens=kl_tokens, is_weights=weights)
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
            demo_loss = demonstration_loss(model, my_demos, pad_id) * demo_share
            (g.demo_coef * demo_loss).backward()
            sums["demo_nll"] += demo_loss.item() / g.minibatches
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
        sums = dict(zip(names, totals.tolist())) | {"gap_abs_max": float(peak)}
    n_pg, n_kl, n_gap = max(sums["pg_tokens"], 1.0), max(sums["kl_tokens"], 1.0), max(sums["gap_tokens"], 1.0)
    one_step = g.minibatches == 1  # the ratio is exactly 1: the clip cannot bind, its counts mean nothing
    metrics.update(
        loss=sums["loss"] / g.minibatches, grad_norm=max(norms), micro_batches=sum(len(b) for _, _, b in plan),
        trained_tokens=int(sum(_completion_tokens(records[i]) for i in in_loss)),
        kl=sums["kl_sum"] / n_kl if kl_on else None, ratio_mean=sums["ratio_sum"] / n_pg,
        clip_low_fraction=None if one_step else sums["clip_low"] / n_pg,
        clip_high_fraction=None if one_step else sums["clip_high"] / n_pg,
        engine_logp_gap_mean=sums["gap_abs_sum"] / n_gap, engine_logp_gap_max=sums["gap_abs_max"],
        engine_k3=sums["gap_k3_sum"] / n_gap, pg_tokens=int(sums["pg_tokens"]), kl_tokens=int(sums["kl_tokens"]), engine_tokens=int(sums["gap_tokens"]))
    if my_demos is not None:
        metrics["demo_nll"] = sums["demo_nll"]
    return metrics


def grpo_loop(config: dict) -> None:
    """The per-worker training function (Ray Train `train_loop_per_worker`, or called directly).

    config: settings (dict), init_model (dir), run_dir, and optionally `actors` (rollout actors that already
    hold engines, e.g. the ones that ran the champion's eval; they are left running) and `fail_at_step`
    (tests inject a crash).
    """
    import ray.train
    import ray.train.torch

    from tasks.config import Settings
    from tasks.policy.model import load_model, save_model, state_dict_snapshot
    from tasks.rl.checkpoint import latest_checkpoint, restore_checkpoint, save_checkpoint
    from tasks.rl.rollout import RolloutPool
    from tasks.rl.selection import open_choice

    settings = Settings.model_validate(config["settings"])
    g = settings.grpo
    # Ray 2.60's train context logs every report at INFO on the root logger; keep ours, drop that
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("tasks").setLevel(logging.INFO)
    # Ray sets OMP_NUM_THREADS=1 for a 1-CPU worker; rollouts and updates alternate, so while this
    # worker trains the engines are idle and it may use every core of the node
    torch.set_num_threads(settings.grpo.threads or max(1, (os.cpu_count() or 1) // settings.grpo.num_train_workers))
    run_dir = Path(config["run_dir"])
    ckpt_dir = run_dir / "checkpoints"
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.manual_seed(g.seed)
    # on GPUs Ray Train gives each worker its device (CUDA_VISIBLE_DEVICES and the local rank)
    device = ray.train.torch.get_device() if g.device == "cuda" else torch.device("cpu")
    model, chat, _ = load_model(config["init_model"], model_settings=settings.model)
    model.to(device)
    base = None
    if g.lora is not None:
        from tasks.policy import lora

        # the engines may hold other weights (another model's eval): they get the base once, then adapters
        base = state_dict_snapshot(model) if rank == 0 else None
        model = lora.wrap(model, g.lora)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=g.lr, weight_decay=0.0, betas=(0.9, 0.99))
    start = 0
    if (ckpt := latest_checkpoint(ckpt_dir)) is not None:
        start = restore_checkpoint(ckpt, model, optimizer)["step"]
        log.info("resuming GRPO from %s (step %d of %d)", ckpt, start, g.steps)
    ref_model = None
    if g.uses_reference:  # with LoRA the reference is the frozen base under the adapter, not a second copy
        ref_model = (lora.BaseOf(model) if g.lora is not None else
                     load_model(config["init_model"], model_settings=settings.model)[0].to(device))
    # no DDP wrapper: grpo_step all-reduces the summed gradients itself, once per optimizer step, so that
    # ranks with different numbers of micro-batches still pair their collectives; every rank loaded the
    # same weights, and the same reduced gradient keeps them equal
    pool = None
    if rank == 0:
        pool = RolloutPool(config["init_model"], settings, actors=config.get("actors"))
        # the engines may hold other weights (another model's eval): always start from the trainer's
        if g.lora is None:
            pool.sync_weights(state_dict_snapshot(model), version=start)
        else:
            pool.load_weights(base, version=start)
            del base
            if start:
                pool.sync_adapter(lora.adapter_state(model), version=start)
    metrics_path = run_dir / "metrics.jsonl"
    if rank == 0:
        keep_metrics(metrics_path, start)
    champion_toolset = get_env(settings.env.name).load_toolset(settings.env.champion_toolset)
    choice = open_choice(settings, run_dir, pool, start) if rank == 0 else None
    for step in range(start, g.steps):
        t0 = time.time()
        records = None
        if rank == 0:
            records = pool.run_batch(training_tasks(settings, step), settings.rollout.group_size,
                                     run_dir / "rollouts", seed=g.seed * 7919 + step)
        t_roll = time.time() - t0
        if world > 1:  # every rank gets the whole batch: advantages need whole groups
            box = [records]
            torch.distributed.broadcast_object_list(box, src=0)
            records = box[0]
        if config.get("fail_at_step") == step:
            raise RuntimeError(f"injected failure at GRPO step {step} (fail_at_step)")
        demos = None
        if g.demo_coef > 0:  # seeds disjoint from the bootstrap's and the tasks'
            demos = demonstration_batch(settings.env.name, chat, g.demo_batch, 3_000_000 + g.seed * 10_000 + step,
                                        settings.model.max_len, toolset=champion_toolset)
        m = grpo_step(model, optimizer, records, settings, chat.pad_id, ref_model, demos, rank, world)
        t_train = time.time() - t0 - t_roll
        version = step + 1
        sync_s, sync_bytes = 0.0, 0
        if rank == 0:
            if g.lora is None:
                weights = state_dict_snapshot(model)
                sync_s = pool.sync_weights(weights, version)
                sync_bytes = sum(t.numel() * t.element_size() for t in weights.values())
            else:
                adapter = lora.adapter_state(model)
                sync_s = pool.sync_adapter(adapter, version)
                sync_bytes = lora.adapter_bytes(adapter)
        m.update(step=version, rollout_s=t_roll, train_s=t_train, weight_sync_s=sync_s, weight_sync_bytes=sync_bytes,
                 generated_tokens=sum(r["completion_tokens"] for r in records))
        report_kwargs = {}
        if rank == 0:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(m) + "\n")
            log.info("grpo step %d/%d reward %.3f success %.3f loss %.4f trained %d/%d (roll %.1fs, train %.1fs)",
                     version, g.steps, m["reward_mean"], m["success_rate"], m["loss"], m["episodes_trained"],
                     m["episodes"], t_roll, t_train)
            if version % g.checkpoint_every == 0 or version == g.steps:
                path = save_checkpoint(ckpt_dir, version, model, chat, optimizer, {"policy_version": version},
                                       protected=choice.protected() if choice else ())
                report_kwargs["checkpoint"] = ray.train.Checkpoint.from_directory(str(path))
                if choice:
                    choice.score(pool, version)
        ray.train.report(m, **report_kwargs)
    if rank == 0:
        if choice:
            choice.finish(model, g.steps, ckpt_dir)
        adapter_dir = None
        if g.lora is not None:
            # the challenger is the merged model (what the eval engines, the registry's next cycle and
            # `make serve` load), with the adapter and its base beside it
            adapter_dir = lora.save_adapter(model, run_dir / "adapter", config["init_model"])
            model = model.merge_and_unload()
        save_model(getattr(model, "module", model), chat, run_dir / "model",
                   toolset=get_env(settings.env.name).load_toolset(settings.env.target_toolset), adapter=adapter_dir)
        if config.get("actors"):
            pool.close_transfer()  # the engines go back to their owner, who opens its own group
        else:
            pool.shutdown()


def run_grpo(settings, init_model: str | Path, run_dir: str | Path, fail_at_step: int | None = None,
             run_name: str = "grpo", actors: list | None = None):
    """Fit GRPO with a Ray Train TorchTrainer (gloo on CPU, NCCL on GPUs); resumes from `run_dir/checkpoints`
    if present.

    The trainer's own controller takes no CPU (on 2 cores it would starve the workers); each worker
    holds one CPU, and the rollout actors it starts hold `rollout.cpus_per_worker` each.
    """
    import ray.train
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from tasks.rl.rollout import start_rollout_actors

    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    init_model = str(Path(init_model).resolve())
    # Start the engines here, before fit(): their build (process start, vLLM import, engine: 30-45 s in the
    # demo) then overlaps Ray Train's own start-up (controller, placement group, worker: about a minute)
    # instead of following it. The rank-0 worker takes them over and hands them back at the end.
    own_actors = actors is None
    if own_actors:
        actors = start_rollout_actors(init_model, settings)
    config = {"settings": settings.model_dump(mode="json"), "init_model": init_model,
              "run_dir": str(run_dir), "fail_at_step": fail_at_step, "actors": actors}
    g = settings.grpo
    on_gpu = g.device == "cuda"
    trainer = TorchTrainer(
        grpo_loop, train_loop_config=config,
        torch_config=TorchConfig(backend="nccl" if on_gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=g.num_train_workers, use_gpu=on_gpu, resources_per_worker={
            "CPU": 1, **({"GPU": g.gpus_per_train_worker} if on_gpu else {})}),
        run_config=RunConfig(name=run_name, storage_path=str(run_dir / "ray_train"),
                             failure_config=FailureConfig(max_failures=0),
                             logging_config=ray.train.LoggingConfig(log_level="WARNING")),
    )
    try:
        return trainer.fit()
    except ray.train.TrainingFailedError as e:
        failures = getattr(e, "worker_failures", {}) or {}
        first = next(iter(failures.values()), e)
        raise RuntimeError(f"GRPO training failed on {len(failures) or 1} worker(s): {first!r}; "
                           f"checkpoints kept in {run_dir / 'checkpoints'} (rerun to resume)") from e
    finally:
        if own_actors:
            for actor in actors:
                ray.kill(actor)
