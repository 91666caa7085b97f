"""A GRPO run's per-step metrics (`<run>/metrics.jsonl`, one JSON line per step): kept once per step across
resumes, and digested into the few figures a run summary and the Evergreen page show. No torch here: the
summary runs in an Airflow task.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tasks.storage import write_atomic

log = logging.getLogger(__name__)


def keep_metrics(path: Path, last_step: int) -> int:
    """Drop metric lines past `last_step` (the checkpoint a run resumes from): steps a killed run logged
    after its last checkpoint are trained again, and each step must appear, and be priced, once. Returns
    the number of lines dropped."""
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= last_step]
    if len(kept) != len(lines):
        write_atomic(path, "".join(line + "\n" for line in kept))
        log.info("resume at step %d: dropped %d metric lines of steps trained again", last_step, len(lines) - len(kept))
    return len(lines) - len(kept)


def training_digest(metrics: list[dict]) -> dict:
    """A GRPO run's per-step metrics in a few figures (the summary, the page): steps, first and last reward,
    and the KL to the reference, the ratio and the engine/trainer gap as token-weighted means over all
    steps (the max gap as a max)."""
    if not metrics:
        return {"steps": 0}

    def weighted(key: str, tokens: str) -> float | None:
        pairs = [(m[key], m.get(tokens, 0)) for m in metrics if m.get(key) is not None]
        total = sum(t for _, t in pairs)
        return sum(v * t for v, t in pairs) / total if total else None

    return {
        "steps": len(metrics),
        "first_reward": metrics[0].get("reward_mean"),
        "final_reward": metrics[-1].get("reward_mean"),
        "final_success": metrics[-1].get("success_rate"),
        "kl": weighted("kl", "kl_tokens"),
        "ratio_mean": weighted("ratio_mean", "pg_tokens"),
        "engine_logp_gap_mean": weighted("engine_logp_gap_mean", "engine_tokens"),
        "engine_logp_gap_max": max((m.get("engine_logp_gap_max") or 0.0 for m in metrics), default=0.0),
        "engine_k3": weighted("engine_k3", "engine_tokens"),
        "trained_tokens": sum(m.get("trained_tokens", 0) for m in metrics),
    }


def read_metrics(path: Path) -> list[dict]:
    """The per-step metric lines of a GRPO run; none when it has not written any yet."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def metrics_digest(path: Path) -> dict:
    """`training_digest` of a metrics file (none yet: zero steps)."""
    return training_digest(read_metrics(Path(path)))
