"""GRPO training on Ray Train: the RL loop runs inside a TorchTrainer worker (gloo on CPU; on a GPU with
`grpo.gpus_per_train_worker` > 0, NCCL between workers).

    python -m tasks train --init runs/local/champion --out runs/local/challenger

Each step: sample tasks (target registry, plus a guard share from the champion's registry) → rollouts
on the pool's engines (G samples per task) → one GRPO update → the new weights go into every engine
(`policy_version` + 1). Every `checkpoint_every` steps a checkpoint (weights, optimizer, RNG, step) is
written and reported to Ray Train; a restarted run resumes from the newest one and stops at the same
final step. Metrics per step go to `<run>/metrics.jsonl` and the Ray Train result.

Departures: groups whose rewards are all equal carry no GRPO signal and are dropped from the update (as in
DAPO's dynamic sampling, without resampling); the "old" log-probabilities are the trainer's, not the
engine's, so engine/trainer numeric differences do not leak into the ratio (the engine's logprobs stay in
the records for diagnosis); with one minibatch per batch (the default) they are the training forward's
own, detached, which saves a forward pass; with several, a pass before the first optimizer step computes
them. With several workers, each normalises the token-level loss over its own slice of the batch.
Optionally (`grpo.demo_coef`), every update also takes an SFT step on expert demonstrations of the
champion's registry, as InstructGPT's PPO-ptx mixes pretraining gradients into PPO to keep what RL would
erode; and the KL weight may differ between target and guard episodes (`grpo.guard_kl_coef`).
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import torch

from tasks.envs import get_env
from tasks.policy.sft import demonstration_batch, demonstration_loss
from tasks.rl.grpo import clipped_policy_loss, group_advantages, pad_batch, sequence_token_logprobs

log = logging.getLogger(__name__)


def guard_count(grpo_settings) -> int:
    """Guard tasks per step; they come last in `training_tasks`."""
    return round(grpo_settings.tasks_per_step * grpo_settings.guard_share)


def training_tasks(settings, step: int) -> list:
    """The tasks of one step: deterministic in (seed, step), disjoint from the eval seeds. The target
    registry's tasks first, then `guard_count` from the champion's registry."""
    env, g = get_env(settings.env.name), settings.grpo
    n_guard = guard_count(g)
    seed = 1_000_000 + g.seed * 10_000 + step
    target = env.generate_tasks(g.tasks_per_step - n_guard, seed, env.load_registry(settings.env.target_registry))
    guard = env.generate_tasks(n_guard, seed + 500_000, env.load_registry(settings.env.champion_registry)) if n_guard else []
    return target + guard


def _micro_batches(indices: list[int], records: list[dict], max_tokens: int) -> list[list[int]]:
    """Consecutive (length-sorted) indices grouped so that padded size stays under max_tokens."""
    out, cur, width = [], [], 0
    for i in indices:
        n = len(records[i]["prompt_ids"]) + len(records[i]["completion_ids"])
        if cur and max(width, n) * (len(cur) + 1) > max_tokens:
            out.append(cur)
            cur, width = [], 0
        cur.append(i)
        width = max(width, n)
    return out + ([cur] if cur else [])


def grpo_update(model, optimizer, records: list[dict], settings, pad_id: int, ref_model=None,
                demos: list | None = None) -> dict:
    """One GRPO update from a batch of rollout records; returns its metrics.

    `demos`: expert demonstrations ((ids, loss mask) pairs); with `grpo.demo_coef` > 0 their NLL joins
    every optimizer step's loss, weighted by it (PPO-ptx)."""
    g = settings.grpo
    rewards = [r["reward"] for r in records]
    adv = group_advantages(rewards, [(r["task_index"], r["policy_version"]) for r in records], g.advantage)
    keep = [i for i, a in enumerate(adv) if abs(a) > 1e-8]
    metrics = {"reward_mean": sum(rewards) / len(rewards),
               "success_rate": sum(r["success"] for r in records) / len(records),
               "episodes": len(records), "episodes_trained": len(keep),
               "completion_tokens": sum(r["completion_tokens"] for r in records)}
    if not keep:
        metrics.update(loss=0.0, grad_norm=0.0, clip_fraction=0.0, trained_tokens=0)
        return metrics
    # length-sorted micro-batches: little padding, bounded memory; gradients accumulate over them and
    # the token-level mean is taken over the whole mini-batch, as if it were one tensor
    keep.sort(key=lambda i: len(records[i]["prompt_ids"]) + len(records[i]["completion_ids"]))
    first_guard = g.tasks_per_step - guard_count(g)

    def kl_coef_of(record: dict) -> float:
        return g.guard_kl if record["task_index"] >= first_guard else g.kl_coef

    micro = _micro_batches(keep, records, g.micro_batch_tokens)
    device = next(model.parameters()).device
    batches = []
    for mb in micro:
        seqs = [records[i]["prompt_ids"] + records[i]["completion_ids"] for i in mb]
        masks = [[0] * len(records[i]["prompt_ids"]) + records[i]["completion_mask"] for i in mb]
        ids, attn, loss_mask = pad_batch(seqs, masks, pad_id, device)
        with torch.no_grad():
            # one optimizer step per batch: the policy that sampled is the one being trained, so the "old"
            # log-probabilities are the training forward's own, detached (ratio 1, the gradient of the
            # surrogate unchanged); a separate pass is needed only when earlier minibatches move the weights
            old = sequence_token_logprobs(model, ids, attn) if g.minibatches > 1 else None
            ref = sequence_token_logprobs(ref_model, ids, attn) if ref_model is not None and g.uses_reference else None
        kl = torch.tensor([kl_coef_of(records[i]) for i in mb], dtype=torch.float32, device=device)
        a = torch.tensor([adv[i] for i in mb], dtype=torch.float32, device=device)
        batches.append((ids, attn, loss_mask, old, ref, a, kl))
    model.train()
    losses, norms, clip, trained, demo_nll = [], [], 0.0, 0, []
    for group in [batches[k::g.minibatches] for k in range(g.minibatches)]:
        n_tokens = sum(float(b[2].sum()) for b in group)
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for ids, attn, loss_mask, old, ref, a, kl in group:
            logp = sequence_token_logprobs(model, ids, attn)
            old = logp.detach() if old is None else old
            loss, stats = clipped_policy_loss(logp, old, a, loss_mask, g.eps_low, g.eps_high, ref, kl)
            share = float(loss_mask.sum()) / n_tokens
            (loss * share).backward()
            total += loss.item() * share
            clip += stats["clip_fraction"] * float(loss_mask.sum())
        if demos and g.demo_coef > 0:
            demo_loss = demonstration_loss(model, demos, pad_id)
            (g.demo_coef * demo_loss).backward()
            demo_nll.append(demo_loss.item())
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), g.max_grad_norm)))
        optimizer.step()
        losses.append(total)
        trained += int(n_tokens)
    model.eval()
    metrics.update(loss=sum(losses) / len(losses), grad_norm=max(norms), trained_tokens=trained,
                   clip_fraction=clip / max(trained, 1), micro_batches=len(batches))
    if demo_nll:
        metrics["demo_nll"] = sum(demo_nll) / len(demo_nll)
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

    settings = Settings.model_validate(config["settings"])
    g = settings.grpo
    # Ray 2.60's train context logs every report at INFO on the root logger; keep ours, drop that
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("tasks").setLevel(logging.INFO)
    # Ray sets OMP_NUM_THREADS=1 for a 1-CPU worker; rollouts and updates alternate, so while this
    # worker trains the engines are idle and it may use every core of the node
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // settings.grpo.num_train_workers))
    run_dir = Path(config["run_dir"])
    ckpt_dir = run_dir / "checkpoints"
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.manual_seed(g.seed)
    # on GPUs Ray Train gives each worker its device (CUDA_VISIBLE_DEVICES and the local rank)
    device = ray.train.torch.get_device() if g.device == "cuda" else torch.device("cpu")
    model, tokenizer, _ = load_model(config["init_model"])
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=g.lr, weight_decay=0.0, betas=(0.9, 0.99))
    start = 0
    if (ckpt := latest_checkpoint(ckpt_dir)) is not None:
        start = restore_checkpoint(ckpt, model, optimizer)["step"]
        log.info("resuming GRPO from %s (step %d of %d)", ckpt, start, g.steps)
    ref_model = load_model(config["init_model"])[0].to(device) if g.uses_reference else None
    if world > 1:
        model = ray.train.torch.prepare_model(model)
    pool = None
    if rank == 0:
        pool = RolloutPool(config["init_model"], settings, actors=config.get("actors"))
        # the engines may hold other weights (another model's eval): always start from the trainer's
        pool.sync_weights(state_dict_snapshot(model), version=start)
    metrics_path = run_dir / "metrics.jsonl"
    champion_registry = get_env(settings.env.name).load_registry(settings.env.champion_registry)
    for step in range(start, g.steps):
        t0 = time.time()
        records = None
        if rank == 0:
            records = pool.run_batch(training_tasks(settings, step), settings.rollout.group_size,
                                     run_dir / "rollouts", seed=g.seed * 7919 + step)
        t_roll = time.time() - t0
        if world > 1:
            box = [records]
            torch.distributed.broadcast_object_list(box, src=0)
            records = box[0][rank::world]
        if config.get("fail_at_step") == step:
            raise RuntimeError(f"injected failure at GRPO step {step} (fail_at_step)")
        demos = None
        if g.demo_coef > 0:  # seeds disjoint from the bootstrap's and the tasks'
            demos = demonstration_batch(settings.env.name, tokenizer, g.demo_batch, 3_000_000 + g.seed * 10_000 + step,
                                        settings.model.max_len, registry=champion_registry)
        m = grpo_update(model, optimizer, records, settings, tokenizer.pad_id, ref_model, demos)
        t_train = time.time() - t0 - t_roll
        version = step + 1
        sync_s = pool.sync_weights(state_dict_snapshot(model), version) if rank == 0 else 0.0
        m.update(step=version, rollout_s=t_roll, train_s=t_train, weight_sync_s=sync_s,
                 generated_tokens=sum(r["completion_tokens"] for r in records))
        report_kwargs = {}
        if rank == 0:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(m) + "\n")
            log.info("grpo step %d/%d reward %.3f success %.3f loss %.4f trained %d/%d (roll %.1fs, train %.1fs)",
                     version, g.steps, m["reward_mean"], m["success_rate"], m["loss"], m["episodes_trained"],
                     m["episodes"], t_roll, t_train)
            if version % g.checkpoint_every == 0 or version == g.steps:
                path = save_checkpoint(ckpt_dir, version, model, tokenizer, optimizer, {"policy_version": version})
                report_kwargs["checkpoint"] = ray.train.Checkpoint.from_directory(str(path))
        ray.train.report(m, **report_kwargs)
    if rank == 0:
        save_model(getattr(model, "module", model), tokenizer, run_dir / "model",
                   registry=get_env(settings.env.name).load_registry(settings.env.target_registry))
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
