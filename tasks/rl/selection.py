"""The challenger is the best validated checkpoint, not simply the last step's weights.

    python -m tasks --set grpo.validation_tasks=64 train --init <champion> --run-dir <run>   # <run>/selection.json

At step 0 and at every checkpoint, GRPO's rank-0 worker scores the pool's current weights on dev-split
tasks of both toolsets (content disjoint from training and from the gate's eval tasks by construction):
greedy and one sample per task. The challenger is the checkpoint with the best target score among those
whose guard score (the champion's toolset) is within `grpo.validation_max_guard_loss` of the champion's
own; if none is, the one that lost least on the guard. A single GRPO run's last step is one draw of a
noisy trajectory (17-22 points of spread from float order alone, docs/experiments.md): a later step can
have sharpened the target and forgotten the guard, an earlier one held it.

The scores are appended to `<run>/validation.jsonl` (one row per scored step, the champion's first), so a
resumed run keeps the ones before the interruption; the choice goes to `<run>/selection.json`. Scoring
happens only where a checkpoint is written, so the chosen weights are always on disk.

Departure from plain early stopping: the run always trains its full length (the best step is only known
afterwards), and the choice is among checkpoints, the way model selection on a dev set is done in SFT.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.storage import write_atomic

if TYPE_CHECKING:
    import torch

    from tasks.config import Settings
    from tasks.envs.base import Task
    from tasks.rl.rollout import RolloutPool

log = logging.getLogger(__name__)

VALIDATION_SEED = 2_000_000  # task seeds disjoint from training's (1e6 + ...) and the demonstrations' (3e6 + ...)


def validation_score(row: dict, toolset: str) -> float:
    """One number per toolset: the mean of greedy success and one-sample success."""
    return (row[toolset]["greedy"] + row[toolset]["sampled"]) / 2


def choose_checkpoint(rows: list[dict], target: str, guard: str, max_guard_loss: float) -> dict:
    """The chosen row among the trained ones (`step` > 0): the best target score whose guard score is at
    most `max_guard_loss` below the champion's (the row of step 0); ties go to the higher guard score,
    then the later step (where validation cannot tell, the run's last word, as without it). With no row
    within the guard, the one with the best guard score."""
    champion = next((r for r in rows if r["step"] == 0), None)
    trained = [r for r in rows if r["step"] > 0]
    if champion is None or not trained:
        raise ValueError("checkpoint choice needs the champion's validation row (step 0) and at least one trained row")
    floor = validation_score(champion, guard) - max_guard_loss
    held = [r for r in trained if validation_score(r, guard) >= floor - 1e-9]
    if held:
        return max(held, key=lambda r: (validation_score(r, target), validation_score(r, guard), r["step"]))
    return max(trained, key=lambda r: (validation_score(r, guard), validation_score(r, target), r["step"]))


def choose_init(probes: list[dict], below: float) -> dict:
    """What GRPO starts from, given the probes' shards (each {"target_successes", "target_episodes",
    "fallbacks": {alias: {"version", "target_successes"}}}): the champion, unless it solves less than `below` of
    the first batch's target tasks (then few groups hold a success and GRPO has little or nothing to learn
    from) and a fallback probed on every shard solves more; then the fallback that solves most (ties: the
    first listed)."""
    episodes = sum(p["target_episodes"] for p in probes)
    if not probes or episodes == 0:
        return {"alias": "champion", "reason": "no probe of the target toolset", "success_rate": None}
    rate = sum(p["target_successes"] for p in probes) / episodes
    keep = {"alias": "champion", "success_rate": rate}
    if rate >= below:
        return keep | {"reason": f"the champion solves {rate:.1%} of the first batch (>= {below:.1%})"}
    everywhere = [a for a in probes[0].get("fallbacks", {}) if all(a in p.get("fallbacks", {}) for p in probes)]
    rates = {a: sum(p["fallbacks"][a]["target_successes"] for p in probes) / episodes for a in everywhere}
    best = max(everywhere, key=lambda a: rates[a], default=None)  # max keeps the first of equals
    if best is None or rates[best] <= rate:
        tried = ", ".join(f"{a} {r:.1%}" for a, r in rates.items()) or "no fallback in the registry"
        return keep | {"reason": f"the champion solves {rate:.1%} of the first batch; {tried}: none solves more"}
    return {
        "alias": best,
        "version": probes[0]["fallbacks"][best]["version"],
        "success_rate": rates[best],
        "champion_success_rate": rate,
        "reason": f"the champion solves {rate:.1%} of the first batch (< {below:.1%}), {best} "
        f"v{probes[0]['fallbacks'][best]['version']} {rates[best]:.1%}",
    }


def validation_tasks(settings: Settings) -> dict[str, list[Task]]:
    """The dev-split tasks of both toolsets, the same for every step and every run of these settings."""
    from tasks.envs import get_env

    env, n = get_env(settings.env.name), settings.grpo.validation_tasks
    return {
        str(toolset): env.generate_tasks(n, VALIDATION_SEED + i, env.load_toolset(toolset), split="dev")
        for i, toolset in enumerate((settings.env.target_toolset, settings.env.champion_toolset))
    }


class CheckpointChoice:
    """Scores the pool's weights at every checkpoint; at the end puts the chosen checkpoint's weights back
    into the model. The chosen checkpoint is never rotated away (`protected`), so a resumed run can
    still restore it."""

    def __init__(self, settings: Settings, run_dir: Path) -> None:
        self.settings, self.path = settings, Path(run_dir) / "validation.jsonl"
        self.tasks = validation_tasks(settings)
        self.target, self.guard = str(settings.env.target_toolset), str(settings.env.champion_toolset)
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        by_step = {row["step"]: row for row in map(json.loads, lines)}  # a step scored twice: its last row
        self.rows = [by_step[step] for step in sorted(by_step)]

    def score(self, pool: RolloutPool, step: int) -> dict:
        """Score the pool's current weights (policy `step`) on both toolsets; append the row."""
        t0 = time.time()
        row: dict = {"step": step}
        for toolset, tasks in self.tasks.items():
            result = pool.score_attempts(tasks, 1, self.settings.rollout.temperature, self.settings.eval.seed)
            row[toolset] = {k: statistics.fmean(result.column(f"{k}_success")) for k in ("greedy", "sampled")}
        self.rows = [r for r in self.rows if r["step"] != step] + [row]
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        log.info(
            "validation at step %d: target v%s %.3f, guard v%s %.3f (%.1fs)",
            step,
            self.target,
            validation_score(row, self.target),
            self.guard,
            validation_score(row, self.guard),
            time.time() - t0,
        )
        return row

    def needs_champion(self) -> bool:
        return not any(r["step"] == 0 for r in self.rows)

    def protected(self) -> tuple[int, ...]:
        """The step chosen so far (none before a trained step is scored)."""
        return (self.chosen()["step"],) if any(r["step"] > 0 for r in self.rows) else ()

    def chosen(self) -> dict:
        return choose_checkpoint(self.rows, self.target, self.guard, self.settings.grpo.validation_max_guard_loss)

    def finish(self, model: torch.nn.Module, last_step: int, checkpoint_dir: Path) -> int:
        """Load the chosen checkpoint's weights into `model` (unless it is the last step's); write
        selection.json; return the chosen step."""
        from tasks.rl.checkpoint import restore_weights

        chosen = self.chosen()
        step = chosen["step"]
        if step != last_step:
            restore_weights(Path(checkpoint_dir) / f"step-{step:06d}", model)
        champion = next(r for r in self.rows if r["step"] == 0)
        choice = {
            "step": step,
            "last_step": last_step,
            "target": self.target,
            "guard": self.guard,
            "max_guard_loss": self.settings.grpo.validation_max_guard_loss,
            "rows": self.rows,
        }
        write_atomic(self.path.parent / "selection.json", json.dumps(choice, indent=1))
        log.info(
            "challenger: step %d of %d (validation target v%s %.3f, guard v%s %.3f; the champion's %.3f, %.3f)",
            step,
            last_step,
            self.target,
            validation_score(chosen, self.target),
            self.guard,
            validation_score(chosen, self.guard),
            validation_score(champion, self.target),
            validation_score(champion, self.guard),
        )
        return step


def open_choice(settings: Settings, run_dir: Path, pool: RolloutPool, start: int) -> CheckpointChoice | None:
    """The run's checkpoint choice (None with grpo.validation_tasks=0), the champion scored first: at
    step 0 the engines hold its weights (nothing is synced before the first update). A resumed run whose
    checkpoint was written but not scored scores it now (the engines hold exactly its weights)."""
    if not settings.grpo.validation_tasks:
        return None
    choice = CheckpointChoice(settings, run_dir)
    if choice.needs_champion():
        if start:
            raise RuntimeError(
                f"grpo.validation_tasks is on for a run resumed at step {start} without the champion's "
                f"validation row: remove {Path(run_dir) / 'checkpoints'} to start over, or set "
                "grpo.validation_tasks=0"
            )
        choice.score(pool, 0)
    if start and not any(r["step"] == start for r in choice.rows):  # killed between its checkpoint and its score
        choice.score(pool, start)
    return choice


def challenger_step(grpo_dir: str | Path) -> int:
    """The challenger's policy version: the chosen step (selection.json), else the last step trained."""
    from tasks.rl.metrics import read_metrics

    grpo_dir = Path(grpo_dir)
    if (grpo_dir / "selection.json").exists():
        return int(json.loads((grpo_dir / "selection.json").read_text())["step"])
    metrics = read_metrics(grpo_dir / "metrics.jsonl")
    return int(metrics[-1]["step"]) if metrics else 0
