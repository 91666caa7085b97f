"""Champion against challenger on the same held-out tasks, then the paired comparisons the gate judges.

Usage:

    evaluate(settings, rd)                 # eval_champion_v<toolset>.jsonl, eval_challenger_v<toolset>.jsonl
    validate_evals(settings, rd)           # GX on every table; comparisons.json (greedy and sampled)
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from tasks.envs.toolset import toolset_label

if TYPE_CHECKING:
    from tasks.config import Settings
    from tasks.evals.harness import EvalResult
    from tasks.rundir import RunDir

log = logging.getLogger(__name__)


def challenger_version(rd: RunDir) -> int:
    """The challenger's policy version: the GRPO step it was chosen at (the last one without validation)."""
    from tasks.rl.selection import challenger_step

    return challenger_step(rd.path / "grpo")


def evaluate(settings: Settings, rd: RunDir) -> dict:
    """Champion, then challenger, on every toolset's held-out tasks, on the run's engines (the ones the
    probes started and GRPO trained with; started here if gone), which are stopped at the end (unless
    ray.engine_namespace keeps them for later runs). Each model's
    weights are loaded into them (`RolloutPool.load_weights`, through the object store): both meet the same
    engines and configuration, and no second set is built."""
    from safetensors.torch import load_file

    from tasks.stages.models import champion_dir
    from tasks.stages.rollouts import connect, engine_namespace, load_tasks, toolsets

    t0 = time.time()
    connect(settings, rd)
    import ray

    from tasks.rl.rollout import RolloutPool, start_rollout_actors

    out: dict = {}
    champ = champion_dir(settings, rd)
    try:
        pool = RolloutPool(
            champ, settings, actors=start_rollout_actors(champ, settings, namespace=engine_namespace(settings, rd))
        )
        for who, (weights, version) in {
            "champion": (champ / "model.safetensors", 0),
            "challenger": (rd.path / "grpo" / "model" / "model.safetensors", challenger_version(rd)),
        }.items():
            seconds = pool.load_weights(load_file(weights), version=version)
            log.info("%s weights loaded into %d engines in %.3fs", who, len(pool.actors), seconds)
            for toolset in toolsets(settings):
                result = pool.score_attempts(
                    load_tasks(rd, toolset, settings.env.name),
                    settings.eval.samples,
                    settings.rollout.temperature,
                    settings.eval.seed,
                )
                rd.write_lines(result.table, f"eval_{who}_{toolset_label(toolset, settings.env.name)}.jsonl")
                out.setdefault(who, {})[toolset] = {
                    "greedy": result.summary("greedy_success")["mean"],
                    "sampled": result.summary("sampled_success")["mean"],
                }
                log.info(
                    "evaluate %s on toolset %s: greedy %.3f, sampled %.3f",
                    who,
                    toolset,
                    out[who][toolset]["greedy"],
                    out[who][toolset]["sampled"],
                )
        pids = pool.engine_pids()
        if not settings.ray.engine_namespace:  # engines named by the deployment outlive the run
            pool.shutdown()
    finally:
        ray.shutdown()
    rd.record_timing(
        "evaluate",
        time.time() - t0,
        cpus=settings.rollout.num_workers * settings.rollout.cpus_per_worker,
        engine_pids=pids,
    )
    return out


def eval_table(rd: RunDir, who: str, toolset: str, env: str | None = None) -> EvalResult:
    """The EvalResult evaluate wrote for `who` (champion | challenger) on `toolset`."""
    from tasks.evals.harness import EvalResult

    return EvalResult(rd.read_lines(f"eval_{who}_{toolset_label(toolset, env)}.jsonl"))


def validate_evals(settings: Settings, rd: RunDir) -> dict:
    """GX on every eval table, then the paired comparisons (both decodings) the gate judges."""
    from tasks.data.checks import check_eval_table
    from tasks.data.validation import Validator
    from tasks.evals.harness import compare
    from tasks.stages.contracts import Comparisons
    from tasks.stages.report import stage_run, tracker_of
    from tasks.stages.rollouts import toolsets

    e = settings.eval
    tables = {
        (who, t): eval_table(rd, who, t, settings.env.name)
        for who in ("champion", "challenger")
        for t in toolsets(settings)
    }
    comparisons = Comparisons(
        evals_valid=True,
        **{
            kind: {
                t: compare(
                    tables["challenger", t],
                    tables["champion", t],
                    f"{kind}_success",
                    e.interval_resamples,
                    e.confidence,
                )
                for t in toolsets(settings)
            }
            for kind in ("sampled", "greedy")
        },
    )
    tracker = tracker_of(settings)
    docs = rd.path / "gx_docs_evals"  # GX data docs of the eval tables: where a failed validation points
    validator = Validator(docs)

    def label(toolset: str) -> str:
        return toolset_label(toolset, settings.env.name)

    with stage_run(settings, rd, "evals"):
        for (who, toolset), table in tables.items():
            outcome = check_eval_table(table.table, settings.eval.num_tasks, docs, validator)
            comparisons.evals_valid &= outcome.success
            tracker.log_artifact(rd.path / f"eval_{who}_{toolset_label(toolset, settings.env.name)}.jsonl", "evals")
        for kind, by_toolset in (("sampled", comparisons.sampled), ("greedy", comparisons.greedy)):
            tracker.log_metrics(
                {
                    f"{label(t)}.{kind}.{who}": getattr(c, who).mean
                    for t, c in by_toolset.items()
                    for who in ("champion", "challenger")
                }
            )
        tracker.log_metrics(
            {f"{label(t)}.greedy.difference_low": c.difference.low for t, c in comparisons.greedy.items()}
        )
        tracker.set_tags({"evergreen.eval_validation": "passed" if comparisons.evals_valid else "failed"})
    rd.write(comparisons, "comparisons.json")
    if not comparisons.evals_valid:
        log.warning("eval tables failed GX validation: the gate will refuse to promote (see gx_docs_evals/)")
    t = settings.env.target_toolset
    return {
        "evals_valid": comparisons.evals_valid,
        "target_greedy": comparisons.greedy[t].difference.model_dump(),
        "target_sampled": comparisons.sampled[t].difference.model_dump(),
    }
