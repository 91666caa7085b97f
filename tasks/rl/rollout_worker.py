"""The rollout actor: one generation engine (vLLM, or HF `generate`) and the episode loop, used as a Ray actor by
tasks/rl/rollout.py's RolloutPool, or directly (tests, bench/rl_step.py).

    worker = RolloutWorker(model_dir, "vllm", max_len, kv_cache_mb, max_turns, max_tokens_per_turn)
    worker.run_shard({"shard_id": 0, "items": [...], "policy_version": 0, ...})   # writes the shard's records
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from typing import TYPE_CHECKING, cast

import ray

from tasks.envs import new_episode
from tasks.envs.base import Task
from tasks.policy.backends import Sampling
from tasks.rl.records import episode_record, write_shard

if TYPE_CHECKING:
    from tasks.policy.backends import HFBackend, VLLMBackend

log = logging.getLogger(__name__)


class RolloutWorker:
    """One engine plus the episode loop; used as a Ray actor (see `RolloutPool`) or directly in tests."""

    def __init__(
        self,
        model_dir: str,
        backend: str = "vllm",
        max_len: int = 512,
        kv_cache_mb: int = 256,
        max_turns: int = 4,
        max_tokens_per_turn: int = 96,
        threads: int = 1,
        core: int | None = None,
        weight_transfer: str | None = None,
        tool_call_parser: str = "hermes",
        dtype: str = "float32",
        lora_rank: int | None = None,
    ) -> None:
        if core is not None and hasattr(os, "sched_setaffinity"):
            # two engines on two cores must not fight over one; vLLM's own binding is off in-process
            os.sched_setaffinity(0, {core % (os.cpu_count() or 1)})
        import torch

        from tasks.policy.chat import ChatFormat

        torch.set_num_threads(threads)
        self.chat = ChatFormat.load(model_dir, tool_call_parser)
        self.limits = {"max_turns": max_turns, "max_tokens_per_turn": max_tokens_per_turn, "max_len": max_len}
        self.policy_version = 0
        t0 = time.time()
        self.backend: VLLMBackend | HFBackend
        if backend == "vllm":
            from tasks.policy.backends import VLLMBackend

            self.backend = VLLMBackend(
                model_dir,
                max_len=max_len,
                kv_cache_mb=kv_cache_mb,
                weight_transfer=weight_transfer,
                dtype=dtype,
                lora_rank=lora_rank,
            )
        else:
            from tasks.config import ModelSettings
            from tasks.policy.backends import HFBackend
            from tasks.policy.model import load_model

            model_settings = ModelSettings(tool_call_parser=tool_call_parser, dtype=dtype)
            self.backend = HFBackend(load_model(model_dir, model_settings=model_settings)[0], self.chat)
        self.build_seconds = time.time() - t0

    def info(self) -> dict:
        return {
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),  # which machine (raylet) holds it
            "policy_version": self.policy_version,
            "backend": self.backend.name,
            "build_seconds": self.build_seconds,
        }

    def load_weights(self, state_dict: dict, policy_version: int) -> float:
        t0 = time.time()
        self.backend.load_weights(state_dict)
        self.policy_version = policy_version
        return time.time() - t0

    def load_adapter(self, adapter: dict, policy_version: int) -> float:
        """A LoRA adapter on top of the engine's weights (the vLLM backend only; settings refuse hf)."""
        t0 = time.time()
        cast("VLLMBackend", self.backend).load_adapter(adapter)
        self.policy_version = policy_version
        return time.time() - t0

    # the engine side of the collective path (tasks/rl/weight_transfer.ActorGroupClient calls these)
    def init_weight_transfer(self, init_info: dict) -> None:
        cast("VLLMBackend", self.backend).init_weight_transfer(init_info)

    def start_weight_update(self) -> None:
        cast("VLLMBackend", self.backend).start_weight_update()

    def update_weights(self, update_info: dict) -> None:
        cast("VLLMBackend", self.backend).update_weights(update_info)

    def finish_weight_update(self, policy_version: int) -> None:
        cast("VLLMBackend", self.backend).finish_weight_update()
        self.policy_version = policy_version

    def shutdown_weight_transfer(self) -> None:
        cast("VLLMBackend", self.backend).shutdown_weight_transfer()

    def run_shard(self, shard: dict) -> dict:
        """Run the shard's episodes, write its records, return a summary (path, counts, tokens, seconds)."""
        if shard["policy_version"] != self.policy_version:
            raise RuntimeError(
                f"worker holds policy v{self.policy_version}, shard wants v{shard['policy_version']}: "
                "sync weights before dispatching"
            )
        t0 = time.time()
        items = shard["items"]
        episodes = [new_episode(Task.from_dict(it["task"]), self.chat, **self.limits) for it in items]
        ids = [it["task_index"] * 10_000 + it["rollout_index"] for it in items]
        sampling = Sampling(temperature=shard["temperature"], seed=shard["seed"])
        stats = self.backend.run_episodes(episodes, sampling, episode_ids=ids)
        records = [
            episode_record(ep, it["task_index"], it["rollout_index"], shard["policy_version"])
            for ep, it in zip(episodes, items, strict=True)
        ]
        path = write_shard(shard["path"], records)
        faults = Counter(fault for ep in episodes for fault in ep.faults)  # episodes that saw each tool fault
        return {
            "path": str(path),
            "episodes": len(records),
            "generated_tokens": stats["generated_tokens"],
            "seconds": time.time() - t0,
            "pid": os.getpid(),
            "faults": dict(faults),
        }

    def score_attempts(
        self, task_dicts: list[dict], samples: int, temperature: float, seed: int, first_index: int
    ) -> list[dict]:
        from tasks.evals.harness import score_attempts

        tasks = [Task.from_dict(d) for d in task_dicts]
        return score_attempts(
            self.backend, tasks, self.chat, samples, temperature, seed, self.limits, first_index
        ).table
