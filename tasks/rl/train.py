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

import functools
import json
import logging
import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tasks.envs import get_env
from tasks.policy.sft import demonstration_batch
from tasks.rl.lookahead import Lookahead
from tasks.rl.metrics import keep_metrics
from tasks.rl.update import grpo_step, guard_count

if TYPE_CHECKING:
    from tasks.config import Settings
    from tasks.config_grpo import GRPOSettings
    from tasks.envs import Environment
    from tasks.envs.base import Task
    from tasks.rl.rollout import RolloutPool

log = logging.getLogger(__name__)


def training_tasks(settings: Settings, step: int) -> list[Task]:
    """The tasks of one step: deterministic in (seed, step), drawn from the training split of the task
    content (disjoint from the eval and dev splits by construction). The target toolset's tasks first
    (a `grpo.production_share` of them from tasks from production, the rest generated), then
    `guard_count` from the champion's toolset."""
    env, g = get_env(settings.env.name), settings.grpo
    n_guard = guard_count(g)
    n_target = g.tasks_per_step - n_guard
    seed = 1_000_000 + g.seed * 10_000 + step
    target_toolset = env.load_toolset(settings.env.target_toolset)
    produced, held_out = production_draw(g, n_target, seed)
    target = produced + generated_tasks(env, n_target - len(produced), seed, target_toolset, held_out)
    guard = (
        env.generate_tasks(n_guard, seed + 500_000, env.load_toolset(settings.env.champion_toolset), split="train")
        if n_guard
        else []
    )
    return target + guard


@functools.lru_cache(maxsize=4)
def _production_rows(path: str) -> tuple[tuple[dict, ...], frozenset[str]]:
    """(train rows, content keys of the held-out eval.jsonl beside them) of a production_tasks file."""
    from tasks.envs.base import Task
    from tasks.signals.production_tasks import content_of

    def rows(f: Path) -> list[dict]:
        return [json.loads(line) for line in f.read_text().splitlines() if line.strip()] if f.exists() else []

    train_file = Path(path)
    if not train_file.exists():
        raise FileNotFoundError(
            f"grpo.production_tasks={path} does not exist: point it at a train.jsonl that "
            "tasks/signals/production_tasks.py wrote, or set grpo.production_share=0"
        )
    held_out = frozenset(content_of(Task.from_dict(r)) for r in rows(train_file.with_name("eval.jsonl")))
    return tuple(rows(train_file)), held_out


def production_draw(g: GRPOSettings, n_target: int, seed: int) -> tuple[list[Task], frozenset[str]]:
    """round(production_share * n_target) tasks from production (without replacement within a step; all of
    them when there are fewer), and the held-out content that generated tasks must avoid."""
    from tasks.envs.base import Task

    if not g.production_share or not g.production_tasks:
        return [], frozenset()
    rows, held_out = _production_rows(str(g.production_tasks))
    n = min(round(g.production_share * n_target), len(rows))
    picked = random.Random(seed).sample(range(len(rows)), n)
    return [Task.from_dict(rows[i]) for i in picked], held_out


def generated_tasks(env: Environment, n: int, seed: int, toolset: dict, held_out: frozenset[str]) -> list[Task]:
    """`n` of the environment's training tasks, none with content that production holds out (production's
    eval split is content the environment may count as training: desk's production *is* its generator's
    distribution). Redraws with further seeds until `n` remain."""
    from tasks.signals.production_tasks import content_of

    tasks = env.generate_tasks(n, seed, toolset, split="train")
    if not held_out:
        return tasks
    kept = [t for t in tasks if content_of(t) not in held_out]
    for extra in range(1, 33):
        if len(kept) >= n:
            break
        kept += [
            t
            for t in env.generate_tasks(n, seed + 7_919 * extra, toolset, split="train")
            if content_of(t) not in held_out
        ]
    if len(kept) < n:
        raise ValueError(
            f"{env.name}: {n} training tasks without production's held-out content not found in 33 "
            f"draws; the environment's training content is nearly all held out by production"
        )
    return kept[:n]


def grpo_loop(config: dict) -> None:
    """The per-worker training function (Ray Train `train_loop_per_worker`, or called directly).

    config: settings (dict), init_model (dir), run_dir, and optionally `actors` (rollout actors that already
    hold engines, e.g. the ones that ran the champion's eval; they are left running) and `fail_at_step`
    (tests inject a crash).
    """
    import ray.train
    import ray.train.torch

    from tasks.config import Settings
    from tasks.mirror import Mirror
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
    mirror = Mirror(config.get("run_uri") or str(run_dir), run_dir)  # a run kept on S3 (tasks.mirror)
    if mirror.remote and not run_dir.exists():
        mirror.pull()  # a worker on another node than the driver, which pulled its own copy
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
        ref_model = (
            lora.BaseOf(model)
            if g.lora is not None
            else load_model(config["init_model"], model_settings=settings.model)[0].to(device)
        )
    # no DDP wrapper: grpo_step all-reduces the summed gradients itself, once per optimizer step, so that
    # ranks with different numbers of micro-batches still pair their collectives; every rank loaded the
    # same weights, and the same reduced gradient keeps them equal
    pool: RolloutPool | None = None
    if rank == 0:
        pool = RolloutPool(config["init_model"], settings, actors=config.get("actors"))
        # the engines may hold other weights (another model's eval): always start from the trainer's
        if g.lora is None:
            pool.sync_weights(state_dict_snapshot(model), version=start)
        else:
            assert base is not None  # snapshot on rank 0
            pool.load_weights(base, version=start)
            del base
            if start:
                pool.sync_adapter(lora.adapter_state(model), version=start)
    metrics_path = run_dir / "metrics.jsonl"
    if rank == 0:
        keep_metrics(metrics_path, start)
    champion_toolset = get_env(settings.env.name).load_toolset(settings.env.champion_toolset)
    choice = open_choice(settings, run_dir, pool, start) if pool is not None else None  # rank 0

    def batch(step: int) -> list[dict]:
        assert pool is not None  # rank 0's
        seed, group = g.seed * 7919 + step, settings.rollout.group_size
        return pool.run_batch(
            training_tasks(settings, step), group, run_dir / "rollouts", seed, name=f"step-{step:05d}"
        )

    # grpo.async: a batch is one version stale; the update weighs it by the truncated importance ratio
    batches = Lookahead(batch, g.steps, g.async_ is not None, g.async_.timeout_s if g.async_ else 0)
    if g.async_:
        settings = settings.model_copy(update={"grpo": g.model_copy(update={"engine_is_cap": g.async_.is_cap})})
    for step in range(start, g.steps):
        t0 = time.time()
        records = batches.take(step) if rank == 0 else None
        t_roll = time.time() - t0
        if world > 1:  # every rank gets the whole batch: advantages need whole groups
            box = [records]
            torch.distributed.broadcast_object_list(box, src=0)
            records = box[0]
        assert records is not None  # rank 0 ran the batch; the other ranks got it by broadcast
        if config.get("fail_at_step") == step:
            raise RuntimeError(f"injected failure at GRPO step {step} (fail_at_step)")
        demos = None
        if g.demo_coef > 0:  # seeds disjoint from the bootstrap's and the tasks'
            demos = demonstration_batch(
                settings.env.name,
                chat,
                g.demo_batch,
                3_000_000 + g.seed * 10_000 + step,
                settings.model.max_len,
                toolset=champion_toolset,
            )
        m = grpo_step(model, optimizer, records, settings, chat.pad_id, ref_model, demos, rank, world)
        t_train = time.time() - t0 - t_roll
        version = step + 1
        sync_s, sync_bytes, t_wait = 0.0, 0, time.time()
        if rank == 0:
            assert pool is not None
            batches.settle()  # the batch sampling ahead keeps its weights until it is done
            t_wait = time.time() - t_wait
            if g.lora is None:
                weights = state_dict_snapshot(model)
                sync_s = pool.sync_weights(weights, version)
                sync_bytes = sum(t.numel() * t.element_size() for t in weights.values())
            else:
                adapter = lora.adapter_state(model)
                sync_s = pool.sync_adapter(adapter, version)
                sync_bytes = lora.adapter_bytes(adapter)
        m.update(
            step=version,
            staleness=step - min(r["policy_version"] for r in records),
            ahead_wait_s=t_wait if rank == 0 else 0.0,
            rollout_s=t_roll,
            train_s=t_train,
            weight_sync_s=sync_s,
            weight_sync_bytes=sync_bytes,
            generated_tokens=sum(r["completion_tokens"] for r in records),
        )
        report_kwargs: dict[str, Any] = {}
        if rank == 0:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(m) + "\n")
            log.info(
                "grpo step %d/%d reward %.3f success %.3f loss %.4f trained %d/%d (roll %.1fs, train %.1fs)",
                version,
                g.steps,
                m["reward_mean"],
                m["success_rate"],
                m["loss"],
                m["episodes_trained"],
                m["episodes"],
                t_roll,
                t_train,
            )
            if version % g.checkpoint_every == 0 or version == g.steps:
                path = save_checkpoint(
                    ckpt_dir,
                    version,
                    model,
                    chat,
                    optimizer,
                    {"policy_version": version},
                    protected=choice.protected() if choice else (),
                )
                report_kwargs["checkpoint"] = ray.train.Checkpoint.from_directory(str(path))
                if choice:
                    assert pool is not None  # both are rank 0's
                    choice.score(pool, version)
                mirror.push()  # the checkpoint, metrics and records so far: what a resumed run starts from
        ray.train.report(m, **report_kwargs)
    batches.close()
    if rank == 0:
        assert pool is not None
        if choice:
            choice.finish(model, g.steps, ckpt_dir)
        adapter_dir = None
        if g.lora is not None:
            # the challenger is the merged model (what the eval engines, the registry's next cycle and
            # `make serve` load), with the adapter and its base beside it
            adapter_dir = lora.save_adapter(model, run_dir / "adapter", config["init_model"])
            model = model.merge_and_unload()
        save_model(
            getattr(model, "module", model),
            chat,
            run_dir / "model",
            toolset=get_env(settings.env.name).load_toolset(settings.env.target_toolset),
            adapter=adapter_dir,
        )
        mirror.push()
        if config.get("actors"):
            pool.close_transfer()  # the engines go back to their owner, who opens its own group
        else:
            pool.shutdown()


def run_grpo(
    settings: Settings,
    init_model: str | Path,
    run_dir: str | Path,
    fail_at_step: int | None = None,
    run_name: str = "grpo",
    actors: list[Any] | None = None,
    run_uri: str | None = None,
) -> Any:
    """Fit GRPO with a Ray Train TorchTrainer (gloo on CPU, NCCL on GPUs); resumes from `run_dir/checkpoints`
    if present. With `run_uri` (the run's GRPO directory on S3, pulled into `run_dir`), the rank-0 worker
    pushes each checkpoint and the model there.

    The trainer's own controller takes no CPU (on 2 cores it would starve the workers); each worker
    holds one CPU, and the rollout actors it starts hold `rollout.cpus_per_worker` each.
    """
    import ray.train
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from tasks.rl.rollout import start_rollout_actors
    from tasks.rl.torch_group import torch_config

    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    init_model = str(Path(init_model).resolve())
    # Start the engines here, before fit(): their build (process start, vLLM import, engine: 30-45 s in the
    # demo) then overlaps Ray Train's own start-up (controller, placement group, worker: about a minute)
    # instead of following it. The rank-0 worker takes them over and hands them back at the end.
    own_actors = actors is None
    if actors is None:
        actors = start_rollout_actors(init_model, settings)
    config = {
        "settings": settings.model_dump(mode="json"),
        "init_model": init_model,
        "run_dir": str(run_dir),
        "run_uri": run_uri,
        "fail_at_step": fail_at_step,
        "actors": actors,
    }
    g = settings.grpo
    on_gpu = g.device == "cuda"
    trainer = TorchTrainer(
        grpo_loop,
        train_loop_config=config,
        torch_config=torch_config(settings, run_dir),
        scaling_config=ScalingConfig(
            num_workers=g.num_train_workers,
            use_gpu=on_gpu,
            resources_per_worker={
                "CPU": 1,
                **({"GPU": g.gpus_per_train_worker} if on_gpu else {}),
                **({g.node_resource: 1} if g.node_resource else {}),  # the training nodes, apart from rollouts
            },
        ),
        run_config=RunConfig(
            name=run_name,
            storage_path=str(run_dir / "ray_train"),
            failure_config=FailureConfig(max_failures=0),
            # Ray Train's copies of the reported checkpoints: bounded like ours (save_checkpoint)
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            logging_config=ray.train.LoggingConfig(log_level="WARNING"),
        ),
    )
    try:
        return trainer.fit()
    except ray.train.TrainingFailedError as e:
        failures = getattr(e, "worker_failures", {}) or {}
        first = next(iter(failures.values()), e)
        raise RuntimeError(
            f"GRPO training failed on {len(failures) or 1} worker(s): {first!r}; "
            f"checkpoints kept in {run_dir / 'checkpoints'} (rerun to resume)"
        ) from e
    finally:
        if own_actors:
            for actor in actors:
                ray.kill(actor)
