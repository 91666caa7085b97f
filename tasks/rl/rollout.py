"""Rollouts on Ray: actors that each own one engine (tasks/rl/rollout_worker.py), a pool that shards a batch over them.

    pool = RolloutPool(model_dir, settings)          # starts settings.rollout.num_workers actors
    records = pool.run_batch(tasks, group_size=8, out_dir=run_dir / "rollouts", seed=0)   # at pool.policy_version
    pool.sync_weights(state_dict, version=1)          # every engine holds the new weights, policy_version 1

A batch is `len(tasks) * group_size` episodes, cut into shards (two per actor, so a lost actor costs
half its share). New weights reach the engines by a broadcast from the trainer through vLLM's weight-
transfer API (`rollout.weight_sync: collective`, backend `rollout.weight_transfer_backend`: gloo, nccl or ipc;
tasks/rl/weight_transfer.py) or through the Ray object store (`object_store`: one ray.put, every engine
reloads it). Each shard's records go to `step-{version}/shard-{k}.jsonl` atomically. If an actor
dies mid-batch, the pool starts a replacement, loads the current weights into it and reruns the lost
shards; per-episode seeds make the rerun produce the same records, and `read_step` checks that the
result is exactly the expected set.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from tasks.envs.base import Task
from tasks.rl.records import clear_stale_shards, read_step
from tasks.rl.rollout_worker import RolloutWorker

if TYPE_CHECKING:
    from tasks.config import Settings
    from tasks.evals.harness import EvalResult
    from tasks.rl.weight_transfer import CollectiveWeightSync

log = logging.getLogger(__name__)


def start_rollout_actors(
    model_dir: str | Path,
    settings: Settings,
    first_core: int = 0,
    indices: list[int] | None = None,
    namespace: str | None = None,
) -> list[Any]:
    """Start rollout actors without waiting for their engines (a build takes 10-45 s here), so a caller can
    overlap that with its own start-up; `RolloutPool(actors=...)` waits for them.

    With `namespace`, actor i is the named, detached `rollout-<i>` of that namespace: the one already up
    (whatever weights it holds: load the ones you need) or a new one. A DAG run's stages share their
    engines this way instead of each building its own; whoever uses them last kills them."""
    r = settings.rollout
    actor_cls = ray.remote(num_cpus=r.cpus_per_worker, num_gpus=r.gpus_per_worker, max_restarts=0)(RolloutWorker)
    # set before the actor process imports torch/vllm: thread counts cannot be changed afterwards
    env_vars = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "OMP_NUM_THREADS": "1",
        "VLLM_LOGGING_LEVEL": "ERROR",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONWARNINGS": "ignore",
    }
    transfer = r.weight_transfer_backend if settings.collective_sync else None
    lora_rank = None
    if settings.grpo.lora is not None:
        from tasks.policy.lora import engine_rank

        lora_rank = engine_rank(settings.grpo.lora.rank)

    def options(i: int) -> dict[str, Any]:
        opts: dict[str, Any] = {"runtime_env": {"env_vars": env_vars}}
        if r.node_resource:  # only the nodes that offer it (rollout nodes of a multi-node cluster)
            opts["resources"] = {r.node_resource: 1}
        if namespace:
            opts |= {"name": f"rollout-{i}", "namespace": namespace, "lifetime": "detached", "get_if_exists": True}
        return opts

    return [
        actor_cls.options(**options(i)).remote(
            str(model_dir),
            r.backend,
            settings.model.max_len,
            r.kv_cache_mb,
            settings.env.max_turns,
            settings.env.max_tokens_per_turn,
            core=first_core + i,
            weight_transfer=transfer,
            tool_call_parser=settings.model.tool_call_parser,
            dtype=settings.model.dtype,
            lora_rank=lora_rank,
        )
        for i in (range(r.num_workers) if indices is None else indices)
    ]


class RolloutPool:
    """Driver-side handle on the rollout actors: start, sync weights, run batches, replace lost actors."""

    def __init__(
        self, model_dir: str | Path, settings: Settings, actors: list[Any] | None = None, first_core: int = 0
    ) -> None:
        # first_core: pools started side by side (one per probe shard) pin their engines to different cores
        self.model_dir, self.settings, self.first_core = str(model_dir), settings, first_core
        self.last_faults: dict = {}  # tool faults of the last batch, by kind (episodes that saw one)
        r = settings.rollout
        self.actors = actors or start_rollout_actors(self.model_dir, settings, first_core)
        self.policy_version = 0
        self._weights: dict | None = None  # the current weights, for a replacement actor
        self._adapter: dict | None = None  # the current LoRA adapter on top of them, if any
        self._transfer: CollectiveWeightSync | None = None  # the open collective group, if that path is used
        infos = ray.get([a.info.remote() for a in self.actors])
        log.info(
            "rollout pool: %d %s workers up (engine build %.1fs max)",
            len(infos),
            r.backend,
            max(i["build_seconds"] for i in infos),
        )

    def engine_pids(self) -> list[int]:
        """The engines' process ids (which engines served a stage: a DAG run's stages share theirs)."""
        return [info["pid"] for info in ray.get([a.info.remote() for a in self.actors])]

    @property
    def collective(self) -> bool:
        return self.settings.collective_sync

    def sync_weights(self, state_dict: dict, version: int) -> float:
        """Every engine gets `state_dict` (a snapshot on the trainer's device, `state_dict_snapshot`) as policy
        `version`; it is copied to the CPU unless the path moves GPU tensors. Returns seconds."""
        t0 = time.time()
        if not self.settings.rollout.gpu_weight_transfer:  # settings guarantee vLLM engines on GPUs otherwise
            state_dict = {k: v.to("cpu") for k, v in state_dict.items()}
        if not self.collective:
            self.load_weights(state_dict, version)
            return time.time() - t0
        if self._transfer is None:
            from tasks.rl.weight_transfer import CollectiveWeightSync

            self._transfer = CollectiveWeightSync(
                self.actors, self.settings.rollout.weight_transfer_backend, host=ray.util.get_node_ip_address()
            )
        self._weights, self._adapter = state_dict, None
        self._transfer.send(state_dict, version)
        self.policy_version = version
        return time.time() - t0

    def load_weights(self, state_dict: dict, version: int) -> float:
        """A one-off load of another model's weights (a CPU state dict, e.g. the challenger's for its eval)
        through the object store, whatever `rollout.weight_sync` says: a weight-transfer group pays off over
        many syncs, while opening one for a single load imports vLLM's transfer engine into the caller (about
        15 s in an Airflow task here). Returns seconds."""
        t0 = time.time()
        self._weights, self._adapter = state_dict, None
        ref = ray.put(state_dict)  # once, whatever the number of engines
        ray.get([a.load_weights.remote(ref, version) for a in self.actors])
        self.policy_version = version
        return time.time() - t0

    def sync_adapter(self, adapter: dict, version: int) -> float:
        """Every engine applies the LoRA `adapter` ({"config", "tensors"}, tasks/policy/lora.py) on top of the
        weights it holds, as policy `version`: one ray.put of the adapter's tensors. Returns seconds."""
        t0 = time.time()
        self._adapter = adapter
        ref = ray.put(adapter)
        ray.get([a.load_adapter.remote(ref, version) for a in self.actors])
        self.policy_version = version
        return time.time() - t0

    def close_transfer(self) -> None:
        """Release the collective group (the engines keep serving). Call it before another pool takes the
        actors over: each engine belongs to one group at a time, and the newest init wins."""
        if self._transfer is not None:
            transfer, self._transfer = self._transfer, None
            try:
                transfer.close()
            except Exception as e:  # a dead member cannot release its side; the group is dropped anyway
                log.warning("closing the weight-transfer group: %s", e)

    def _replace(self, index: int) -> None:
        log.warning("rollout worker %d died; starting a replacement at policy v%d", index, self.policy_version)
        # a collective group includes the dead engine: drop it, the next sync opens one with the new set
        self.close_transfer()
        self.actors[index] = start_rollout_actors(self.model_dir, self.settings, self.first_core, [index])[0]
        adapter = self._adapter
        if self._weights is not None:
            self.sync_weights(self._weights, self.policy_version)
        if adapter is not None:
            self.sync_adapter(adapter, self.policy_version)

    def _replace_dead(self, passes: int = 3) -> None:
        """Replace every actor that is gone; again while a replacement itself died (placed on a node that was
        already lost but not yet declared dead)."""
        for _ in range(passes):
            dead = []
            for i, actor in enumerate(self.actors):
                try:
                    ray.get(actor.info.remote())  # every actor is idle between batches: answers at once or is gone
                except ray.exceptions.RayActorError:
                    dead.append(i)
            for i in dead:
                self._replace(i)
            if not dead:
                return

    def run_batch(
        self,
        tasks: list[Task],
        group_size: int,
        out_dir: str | Path,
        seed: int,
        temperature: float | None = None,
        max_attempts: int = 3,
        name: str | None = None,
    ) -> list[dict]:
        """The batch's records (every task `group_size` times), its shards written under out_dir/`name` (default
        step-<policy version>: asynchronous GRPO samples two batches at one version, so it names them by step)."""
        temperature = self.settings.rollout.temperature if temperature is None else temperature
        step_dir = Path(out_dir) / (name or f"step-{self.policy_version:05d}")
        items: list[dict[str, Any]] = [
            {"task": t.to_dict(), "task_index": ti, "rollout_index": ri}
            for ti, t in enumerate(tasks)
            for ri in range(group_size)
        ]
        n_shards = min(len(items), 2 * len(self.actors))
        shards: list[dict[str, Any]] = [
            {
                "shard_id": k,
                "items": items[k::n_shards],
                "policy_version": self.policy_version,
                "temperature": temperature,
                "seed": seed,
                "path": str(step_dir / f"shard-{k:04d}.jsonl"),
                "attempt": 0,
            }
            for k in range(n_shards)
        ]
        if stale := clear_stale_shards(step_dir, {Path(sh["path"]).name for sh in shards}):
            log.warning(
                "rollouts v%d: removed %d shards of an earlier run with another worker count (%s)",
                self.policy_version,
                len(stale),
                ", ".join(p.name for p in stale),
            )
        running: dict[Any, tuple[int, dict[str, Any]]] = {}  # object ref -> (worker index, shard)
        faults: Counter[str] = Counter()
        pending, t0, tokens, replaced = list(shards), time.time(), 0, False
        idle = list(range(len(self.actors)))
        while pending or running:
            while pending and idle:
                w = idle.pop(0)
                shard = pending.pop(0)
                running[self.actors[w].run_shard.remote(shard)] = (w, shard)
            done, _ = ray.wait(list(running), num_returns=1)
            ref = done[0]
            w, shard = running.pop(ref)
            try:
                summary = ray.get(ref)
                tokens += summary["generated_tokens"]
                faults.update(summary.get("faults", {}))
                idle.append(w)
            except ray.exceptions.RayActorError:
                shard["attempt"] += 1
                if shard["attempt"] >= max_attempts:
                    raise RuntimeError(f"shard {shard['shard_id']} failed {max_attempts} times; giving up") from None
                self._replace(w)
                replaced = True
                idle.append(w)
                pending.insert(0, shard)
        if replaced:  # a lost node takes every actor it held: the idle ones are replaced now, not at their next use
            self._replace_dead()
        expected = {(it["task_index"], it["rollout_index"], self.policy_version) for it in items}
        records = read_step(step_dir, expected)
        secs = time.time() - t0
        log.info(
            "rollouts v%d: %d episodes, %d tokens in %.1fs (%.0f tok/s), success %.3f",
            self.policy_version,
            len(records),
            tokens,
            secs,
            tokens / max(secs, 1e-9),
            sum(r["success"] for r in records) / len(records),
        )
        if faults:  # what the tool backend did to the batch (a rerun shard's episodes count again)
            log.warning("rollouts v%d: tool faults (episodes): %s", self.policy_version, dict(faults))
        self.last_faults = dict(faults)
        return records

    def score_attempts(self, tasks: list[Task], samples: int, temperature: float, seed: int) -> EvalResult:
        """Held-out evaluation of the pool's current weights, split over the actors (same result for any split)."""
        from tasks.evals.harness import EvalResult

        n = len(self.actors)
        bounds = [round(i * len(tasks) / n) for i in range(n + 1)]
        refs = [
            a.score_attempts.remote([t.to_dict() for t in tasks[lo:hi]], samples, temperature, seed, lo)
            for a, (lo, hi) in zip(self.actors, itertools.pairwise(bounds), strict=True)
            if hi > lo
        ]
        return EvalResult([row for part in ray.get(refs) for row in part])

    def shutdown(self) -> None:
        self.close_transfer()
        for a in self.actors:
            ray.kill(a)
        self.actors = []
