"""Rollout records: one per episode, written per shard, read back as exactly the expected set.

A record carries NeMo Gym-style identity (`task_index`, `rollout_index`, `policy_version`), the prompt
token ids, the completion token ids (everything after the prompt: the model's turns and the tool
results between them), a completion mask (1 on the model's own tokens), the sampled tokens' logprobs,
the reward with its components and reason, and the text transcript.

Shards are written atomically (temporary file, then rename) under a name fixed by the shard id, and
their seeds depend only on identity, so a retried shard rewrites the same file with the same records:
nothing is lost, nothing is counted twice. `read_step` refuses a step whose records do not match the
expected keys exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.envs.base import Episode
from tasks.storage import atomic_writer


def episode_record(ep: Episode, task_index: int, rollout_index: int, policy_version: int) -> dict:
    score = ep.score()
    # the prompt ends where the model's first token begins (after the template's generation prompt)
    n_prompt = ep.loss_mask.index(1) if 1 in ep.loss_mask else len(ep.token_ids)
    return {
        "task_id": ep.task.task_id,
        "family": ep.task.family,
        "task_index": task_index,
        "rollout_index": rollout_index,
        "policy_version": policy_version,
        "prompt_ids": ep.token_ids[:n_prompt],
        "completion_ids": ep.token_ids[n_prompt:],
        "completion_mask": ep.loss_mask[n_prompt:],
        "logprobs": ep.logprobs[n_prompt:],
        "reward": score["reward"],
        "components": score["components"],
        "reason": score["reason"],
        "success": score["success"],
        "turns": score["turns"],
        "tool_calls": score["tool_calls"],
        "tool_errors": score["tool_errors"],
        "completion_tokens": ep.completion_tokens,
        "messages": ep.messages[1:],
    }


def record_key(r: dict) -> tuple[int, int, int]:
    return (r["task_index"], r["rollout_index"], r["policy_version"])


def write_shard(path: str | Path, records: list[dict]) -> Path:
    path = Path(path)
    with atomic_writer(path) as f:  # readers see the old shard or the whole new one
        for r in records:
            f.write((json.dumps(r, separators=(",", ":")) + "\n").encode())
    return path


def clear_stale_shards(step_dir: str | Path, shard_names: set[str]) -> list[Path]:
    """Remove the step's shard files that are not among `shard_names`: a run resumed with another number
    of rollout workers cuts the batch into other shards, and the old ones would repeat its records. Those
    with a current name are rewritten whole by the new run. Returns what was removed."""
    stale = [p for p in Path(step_dir).glob("shard-*.jsonl") if p.name not in shard_names]
    for p in stale:
        p.unlink()
    return stale


def read_step(step_dir: str | Path, expected_keys: set[tuple[int, int, int]]) -> list[dict]:
    """All records of one step, sorted by identity; raises if any key is missing, duplicated or foreign."""
    seen: dict[tuple, dict] = {}
    duplicates = []
    for shard in sorted(Path(step_dir).glob("shard-*.jsonl")):
        for line in shard.read_text().splitlines():
            r = json.loads(line)
            k = record_key(r)
            if k in seen:
                duplicates.append(k)
            seen[k] = r
    missing, extra = expected_keys - seen.keys(), seen.keys() - expected_keys
    if missing or extra or duplicates:
        raise RuntimeError(
            f"rollout records in {step_dir} do not match the batch: {len(missing)} missing "
            f"(e.g. {sorted(missing)[:3]}), {len(extra)} unexpected, {len(duplicates)} duplicated"
        )
    return [seen[k] for k in sorted(seen)]
