"""The promotion step: cost ledger -> gate -> model registry (the stages cost, gate and move_aliases).

    report = price_run(settings, comparisons, stages, serving)
    decision = judge(settings, comparisons, validations={"data": True, "evals": True}, cost=report)
    result = apply_decision(settings, decision, report, comparisons, run_id, run_key, tracker=tracker)
    result["decision"]["promote"], result["aliases"]

`comparisons` are tasks.evals.harness.compare() results on `promotion.metric`, keyed by registry:
the target registry's is the target workload, every other one a guard. The challenger model must
already be logged under the run's `model` artifact path. The version is registered once per run_key
and becomes `challenger`; on promote the aliases move (tasks.promotion.registry), otherwise the
decision is tagged on the version and logged, and the aliases stay.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tasks.promotion.cost import ServingProjection, StageUsage, ledger, load_prices
from tasks.promotion.gate import decide

if TYPE_CHECKING:
    from tasks.config import Settings
    from tasks.stages.contracts import Decision
    from tasks.tracking import Tracker

log = logging.getLogger(__name__)


def price_run(
    settings: Settings, comparisons: dict[str, dict], stages: list[StageUsage], serving: ServingProjection | None = None
) -> dict:
    """The cost ledger of the run (tasks.promotion.cost.ledger) with the target's gain in points."""
    gain_points = 100.0 * comparisons[settings.env.target_toolset]["difference"]["mean"]
    return ledger(stages, settings.cost, load_prices(settings.cost.prices_file), serving, gain_points)


def judge(settings: Settings, comparisons: dict[str, dict], validations: dict[str, bool], cost: dict) -> Decision:
    """The gate's Decision: the target registry's comparison is the target, every other one a guard."""
    from tasks.envs.toolset import toolset_label

    target_reg = settings.env.target_toolset
    guards = {
        f"registry_{toolset_label(reg, settings.env.name)}": cmp
        for reg, cmp in comparisons.items()
        if reg != target_reg
    }
    return decide(comparisons[target_reg], guards, validations, cost, settings.promotion)


def apply_decision(
    settings: Settings,
    decision: Decision,
    cost: dict,
    comparisons: dict[str, dict],
    run_id: str,
    run_key: str,
    tracker: Tracker | None = None,
    version_tags: dict | None = None,
    champion_version: str | None = None,
) -> dict:
    """Register the run's `model` artifact (once per run_key), make it `challenger`, then move the aliases
    or record why not. `champion_version`: the champion the challenger was measured against; where the
    alias has moved since, the decision is held (gate.champion_unchanged). The DAG's alias moves share one
    Airflow pool slot (operators/pools.py), so nothing moves it between this check and the move."""
    from tasks.promotion.gate import champion_unchanged
    from tasks.promotion.registry import CHAMPION, ModelRegistry
    from tasks.signals.toolset_hash import schema_hash

    target_reg = settings.env.target_toolset
    target = comparisons[target_reg]
    gain_points = 100.0 * target["difference"]["mean"]
    registry_hash = schema_hash(target_reg, settings.env.name)  # the one loader: the monitor's hash of it too
    registry = ModelRegistry(settings.promotion.model_name)
    version = registry.register(
        run_id,
        "model",
        run_key=run_key,
        tags={
            "evergreen.registry_hash": registry_hash,  # the toolset's hash; tag name kept: existing versions carry it
            "evergreen.eval_target": f"{target['challenger']['mean']:.4f}",
            "evergreen.gain_points": f"{gain_points:.2f}",
            "evergreen.cost_usd": f"{cost['total_usd']:.6f}",
            **(version_tags or {}),
        },
    )
    if not registry.moved_for(run_key):  # a retried step after the move must not re-point the challenger
        registry.set_challenger(version)
        if decision.promote and champion_version is not None:
            decision = champion_unchanged(decision, champion_version, registry.version_of(CHAMPION))
    if decision.promote:
        move = registry.promote(version, run_key=run_key, decision=decision.to_dict())
    else:
        registry.record_not_promoted(version, decision.to_dict())
        move = {"moved": False, "kind": "not_promoted"}
    result = {
        "decision": decision.to_dict(),
        "cost": cost,
        "version": version,
        "move": move,
        "aliases": registry.aliases(),
        "model_name": settings.promotion.model_name,
    }
    if tracker is not None:
        tracker.log_dict(result, "promotion/decision.json")
        tracker.log_metrics(
            {
                "cost.run_usd": cost["run_usd"],
                "cost.total_usd": cost["total_usd"],
                "promotion.promoted": float(decision.promote),
                "promotion.gain_points": gain_points,
            }
        )
        tracker.set_tags(
            {
                "evergreen.decision": "promoted" if decision.promote else "not_promoted",
                "evergreen.model_version": version,
            }
        )
    log.info(
        "promotion: %s (version %s): %s", "PROMOTED" if decision.promote else "not promoted", version, decision.summary
    )
    return result
