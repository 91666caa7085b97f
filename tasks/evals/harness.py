"""Evaluate a policy on a held-out task set, and compare two policies on the same tasks.

    python -m tasks eval --model runs/local/champion --toolset 2

Fixed seeds throughout: the tasks come from `eval.seed`, greedy decoding is deterministic, and sampled
attempts use per-(task, attempt) seeds, so two models meet exactly the same tasks and the comparison
is paired. The per-task table has one row per task: greedy success, mean sampled success, mean reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tasks.envs import new_episode
from tasks.envs.base import Task
from tasks.evals.intervals import mean_ci, paired_bootstrap
from tasks.policy.backends import Sampling

if TYPE_CHECKING:
    from tasks.policy.backends import HFBackend, VLLMBackend
    from tasks.policy.chat import ChatFormat


@dataclass
class EvalResult:
    table: list[dict]  # one row per task

    def column(self, key: str) -> list[float]:
        return [row[key] for row in self.table]

    def summary(self, key: str = "sampled_success", resamples: int = 2000, confidence: float = 0.95) -> dict:
        return mean_ci(self.column(key), resamples=resamples, confidence=confidence)


def score_attempts(
    backend: HFBackend | VLLMBackend,
    tasks: list[Task],
    chat: ChatFormat,
    samples: int,
    temperature: float,
    seed: int,
    env_limits: dict | None = None,
    first_index: int = 0,
) -> EvalResult:
    """Greedy and `samples` sampled attempts per task; seeds depend on the task's index in the whole set
    (`first_index` + position), so any split of the set over workers gives the same results."""
    limits = env_limits or {}
    greedy_eps = [new_episode(t, chat, **limits) for t in tasks]
    backend.run_episodes(
        greedy_eps, Sampling(temperature=0.0, seed=seed), episode_ids=[first_index + i for i in range(len(tasks))]
    )
    sampled_eps = [new_episode(t, chat, **limits) for t in tasks for _ in range(samples)]
    backend.run_episodes(
        sampled_eps,
        Sampling(temperature=temperature, seed=seed),
        episode_ids=[(first_index + i) * 1000 + k for i in range(len(tasks)) for k in range(samples)],
    )
    table = []
    for i, (task, g) in enumerate(zip(tasks, greedy_eps, strict=True)):
        scores = [e.score() for e in sampled_eps[i * samples : (i + 1) * samples]]
        gs = g.score()
        table.append(
            {
                "task_id": task.task_id,
                "family": task.family,
                "greedy_success": float(gs["success"]),
                "greedy_reason": gs["reason"],
                "sampled_success": sum(s["success"] for s in scores) / samples,
                "sampled_reward": sum(s["reward"] for s in scores) / samples,
                "tool_errors": sum(s["tool_errors"] for s in scores) / samples,
                "greedy_answer": (g.answer or "")[:60],
                # what serving this task costs with greedy decoding (the serving-cost projection uses it)
                "greedy_completion_tokens": g.completion_tokens,
            }
        )
    return EvalResult(table)


def compare(
    challenger: EvalResult,
    champion: EvalResult,
    key: str = "sampled_success",
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict:
    ids_a, ids_b = challenger.column("task_id"), champion.column("task_id")
    if ids_a != ids_b:
        raise ValueError("paired comparison needs the same tasks in the same order for both models")
    return {
        "metric": key,
        "challenger": challenger.summary(key, resamples, confidence),
        "champion": champion.summary(key, resamples, confidence),
        "difference": paired_bootstrap(challenger.column(key), champion.column(key), resamples, confidence, seed),
    }


def format_interval(ci: dict | None, points: bool = False) -> str:
    """`55.0% [45.0, 65.0]` for a success rate, `+10.0 pts [+2.0, +18.0]` for a difference (points=True);
    the one rendering of an interval in logs and summaries."""
    if not ci:
        return "—"
    if points:
        return f"{100 * ci['mean']:+5.1f} pts [{100 * ci['low']:+5.1f}, {100 * ci['high']:+5.1f}]"
    return f"{100 * ci['mean']:5.1f}% [{100 * ci['low']:5.1f}, {100 * ci['high']:5.1f}]"
