"""Whether the challenger ships: what the run cost, the gate's decision, the model registry's aliases.

Usage:

    cost(settings, rd)           # cost.json: every stage's held resources priced, plus the serving change
    gate(settings, rd)           # decision.json: tasks.promotion.gate.decide, budget included
    force_promotion(settings, rd, "why")   # promote whatever the gate said (it keeps the gate's checks)
    move_aliases(settings, rd)   # register the challenger; move champion/previous on promote
    rollback(settings, rd, confirm=True, reason="...")   # champion := previous
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.config import Settings
    from tasks.rundir import RunDir

log = logging.getLogger(__name__)


def _chosen(settings: Settings, rd: RunDir) -> dict:
    """The comparisons on the gate's metric (greedy or sampled), per toolset."""
    comparisons = rd.read("comparisons.json")
    return comparisons["greedy" if settings.promotion.metric == "greedy_success" else "sampled"]


def cost(settings: Settings, rd: RunDir) -> dict:
    """Price every stage's held resources (timings/*.json) and the projected serving change."""
    from tasks.promotion.cost import ServingProjection, StageUsage
    from tasks.promotion.step import price_run
    from tasks.stages.evaluation import eval_table

    stages = []
    for f in sorted((rd.path / "timings").glob("*.json")):
        t = json.loads(f.read_text())
        stages.append(
            StageUsage(
                t["stage"],
                t["wall_s"],
                cpus=t["cpus"],
                tokens_generated=t.get("tokens_generated", 0),
                tokens_trained=t.get("tokens_trained", 0),
            )
        )
    target = settings.env.target_toolset

    def tokens(who: str) -> float:
        table = eval_table(rd, who, target, settings.env.name).table
        return sum(r.get("greedy_completion_tokens", 0) for r in table) / max(1, len(table))

    report = price_run(
        settings, _chosen(settings, rd), stages, ServingProjection(tokens("champion"), tokens("challenger"))
    )
    rd.write(report, "cost.json")
    log.info("cost: run $%.4f, total $%.4f over %d stages", report["run_usd"], report["total_usd"], len(stages))
    return {
        "run_usd": report["run_usd"],
        "total_usd": report["total_usd"],
        "usd_per_success_point": report["usd_per_success_point"],
    }


def gate(settings: Settings, rd: RunDir) -> dict:
    """The promotion decision (pure: tasks.promotion.gate.decide) with its reasons; `promotion.max_cost_usd`
    (the DAG param max_cost_usd) is one of its checks."""
    from tasks.promotion.step import judge

    signals = rd.read("signals.json") or {}
    validations = {
        "data": signals.get("data_validation") == "passed",
        "evals": bool(rd.read("comparisons.json")["evals_valid"]),
    }
    decision = judge(settings, _chosen(settings, rd), validations, rd.read("cost.json"))
    rd.write(decision.to_dict(), "decision.json")
    log.info("gate: %s: %s", "PROMOTE" if decision.promote else "do not promote", decision.summary)
    for check in decision.checks:
        log.info("  %s %s: %s", "ok  " if check["passed"] else "FAIL", check["name"], check["reason"])
    return {"promote": decision.promote, "reasons": decision.reasons}


def force_promotion(settings: Settings, rd: RunDir, reason: str) -> dict:
    """Rewrite the gate's decision as a promotion, keeping every check it made (what it would have said is in
    `checks` and the summary): a manual override, or a policy that ships without a gate (tasks/timeline)."""
    from tasks.stages.contracts import Decision

    gate_said = Decision.model_validate(rd.read("decision.json"))
    said = "promote" if gate_said.promote else "do not promote: " + "; ".join(gate_said.reasons)
    forced = gate_said.model_copy(
        update={
            "promote": True,
            "reasons": [f"forced ({reason}); the gate said {said}"],
            "summary": f"forced: {reason}",
        }
    )
    rd.write(forced.to_dict(), "decision.json")
    log.warning("promotion forced (%s); the gate said %s", reason, said)
    return {"promote": True, "gate_promote": gate_said.promote}


def move_aliases(settings: Settings, rd: RunDir) -> dict:
    """Register the challenger and move the aliases (or record 'not promoted'); idempotent per DAG run."""
    from tasks.promotion.step import apply_decision
    from tasks.stages.contracts import Decision
    from tasks.stages.evaluation import challenger_version
    from tasks.stages.report import stage_run, tracker_of

    decision = Decision.model_validate(rd.read("decision.json"))
    with stage_run(settings, rd, "promotion"):
        result = apply_decision(
            settings,
            decision,
            rd.read("cost.json"),
            _chosen(settings, rd),
            rd.read("run.json")["mlflow_run_id"],
            rd.run_id,
            tracker=tracker_of(settings),
            version_tags={"evergreen.policy_version": str(challenger_version(rd)), "airflow.run_id": rd.run_id},
            champion_version=(rd.read("champion.json") or {}).get("version"),
        )
    rd.write(result, "promotion.json")
    return {"version": result["version"], "aliases": result["aliases"], "promoted": decision.promote}


def rollback(settings: Settings, rd: RunDir, confirm: bool = False, reason: str = "") -> dict:
    """champion := previous, once per run (its moves are journalled by run key: a retry moves nothing
    twice); refuses without confirm."""
    if not confirm:
        raise PermissionError(
            "rollback moves the production alias: trigger it with the param confirm=true (and a reason)"
        )
    from tasks.promotion.registry import ModelRegistry
    from tasks.stages.report import tracker_of

    tracker_of(settings)
    registry = ModelRegistry(settings.promotion.model_name)
    reason = reason or "manual rollback"
    result = registry.rollback(f"{rd.dag_id}/{rd.run_id}")
    registry.tag_version(result["to"], {"evergreen.rollback_reason": reason[:500]})
    log.info("rollback %s: champion %s -> %s (%s)", settings.promotion.model_name, result["from"], result["to"], reason)
    return {**result, "aliases": registry.aliases()}
