"""The promotion gate: one pure function that says whether a challenger replaces the champion, and why.

    from tasks.promotion.gate import decide
    d = decide(target=compare(challenger, champion, key=s.promotion.metric),   # tasks.evals.harness.compare
               guards={"registry-2": compare(...), "registry-3": compare(...)},
               validations={"data": True, "evals": True},
               cost=ledger(...),                                                 # tasks.promotion.cost.ledger
               settings=s.promotion)
    d.promote, d.reasons, d.to_dict()   # to_dict() is plain JSON (no NaN/inf), for MLflow tags and run logs

Promote only if every check passes (all are listed in `checks`, passed or not, with their numbers):
  metric            every comparison is on `settings.metric` (a gate judging the wrong column is no gate)
  target_gain       lower confidence bound of the target's paired difference >= min_gain. Judged on the
                    bound, not the mean: a +1 point mean on 50 tasks has an interval that reaches below zero,
                    so it is not promoted however good the point estimate looks.
  guard:<name>      lower bound of each guard workload's difference >= -guard_tolerance (non-inferiority by
                    interval: a guard measured on too few tasks to exclude a large regression blocks, even
                    with a zero mean)
  gain_per_dollar   (target difference mean x 100 points) / cost["total_usd"] >= min_gain_per_dollar (0 disables
                    the check: a policy that does not price the gain). The mean,
                    not the bound, because this prices the expected gain (the bound is already required to clear
                    min_gain). A mean <= 0 fails outright (nothing to pay for); a total of $0 with a positive
                    gain is treated as infinite and the reason says so (observed is None: JSON has no inf).
  budget            cost["total_usd"] <= max_cost_usd, when the policy sets a budget (None: no budget, the
                    check is not listed). A run dearer than its budget is not promoted however good.
  validation:<name> every recorded validation passed, and "data" and "evals" were recorded: a missing
                    validation blocks (the gate never assumes a check it did not see).

Bounds are compared with a 1e-9 tolerance: bootstrap quantiles of k/n means are floats, and a bound equal to
the threshold up to rounding counts as reaching it. Malformed inputs (a comparison without a difference, a
validation that is not a bool, a negative cost) raise ValueError naming the input: those are bugs upstream,
not decisions. Pure Python; nothing runs at import time.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tasks.stages.contracts import Decision

if TYPE_CHECKING:
    from tasks.config_deployment import PromotionSettings

REQUIRED_VALIDATIONS = ("data", "evals")
_EPS = 1e-9


def _number(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        # numpy floats are float subclasses and pass; NaN/inf would make every comparison below meaningless
        raise ValueError(
            f"{where} must be a finite number (got {value!r}); pass the dict from "
            f"tasks.evals.harness.compare / tasks.promotion.cost.ledger unchanged"
        )
    return float(value)


def _difference(name: str, comparison: dict) -> dict:
    diff = comparison.get("difference") if isinstance(comparison, dict) else None
    if not isinstance(diff, dict):
        raise ValueError(
            f"comparison {name!r} has no 'difference'; pass the dict returned by "
            f"tasks.evals.harness.compare(challenger, champion, key=...)"
        )
    out = {k: _number(f"comparison {name!r} difference.{k}", diff.get(k)) for k in ("mean", "low", "high")}
    out["n"] = int(_number(f"comparison {name!r} difference.n", diff.get("n")))
    out["confidence"] = _number(f"comparison {name!r} difference.confidence", diff.get("confidence", 0.95))
    return out


def _pts(x: float) -> str:
    return f"{x * 100:+.1f} pts"


def _interval(d: dict) -> str:
    return f"mean {_pts(d['mean'])}, {d['confidence']:.0%} interval [{_pts(d['low'])}, {_pts(d['high'])}], n={d['n']}"


def _check(name: str, passed: object, observed: Any, threshold: Any, unit: str, reason: str, **details: Any) -> dict:
    return {
        "name": name,
        "passed": bool(passed),
        "observed": observed,
        "threshold": threshold,
        "unit": unit,
        "reason": reason,
        "details": details,
    }


def decide(
    target: dict, guards: dict[str, dict], validations: dict[str, bool], cost: dict, settings: PromotionSettings
) -> Decision:
    """Judge a challenger; `settings` is `Settings.promotion`. Deterministic in its inputs."""
    t = _difference("target", target)
    g = {name: _difference(f"guard {name}", guards[name]) for name in sorted(guards)}
    total = _number("cost['total_usd']", cost.get("total_usd") if isinstance(cost, dict) else None)
    if total < 0:
        raise ValueError(f"cost['total_usd'] is {total}; a cost cannot be negative (the ledger floors it at run_usd)")
    for name, value in validations.items():
        # `value in (True, False)` admits numpy bools and 0/1, refuses strings like "false" (which are truthy)
        if value not in (True, False):
            raise ValueError(f"validation {name!r} must be True or False (got {value!r})")
    checks: list[dict] = []

    metrics = {"target": target.get("metric"), **{f"guard:{n}": guards[n].get("metric") for n in g}}
    wrong = {k: m for k, m in metrics.items() if m != settings.metric}
    checks.append(
        _check(
            "metric",
            not wrong,
            dict(sorted(wrong.items())) if wrong else settings.metric,
            settings.metric,
            "metric",
            f"comparisons not on promotion.metric={settings.metric!r}: {wrong}; rerun compare(..., key={settings.metric!r})"
            if wrong
            else f"all {len(metrics)} comparisons are on {settings.metric!r}",
        )
    )

    ok = t["low"] >= settings.min_gain - _EPS
    checks.append(
        _check(
            "target_gain",
            ok,
            t["low"],
            settings.min_gain,
            "fraction",
            f"target gain shown: lower bound {_pts(t['low'])} >= min_gain {_pts(settings.min_gain)} ({_interval(t)})"
            if ok
            else f"target gain not shown: lower bound {_pts(t['low'])} < min_gain {_pts(settings.min_gain)} "
            f"({_interval(t)}); if the gain is real, more eval tasks narrow the interval",
            **t,
        )
    )

    for name, d in g.items():
        ok = d["low"] >= -settings.guard_tolerance - _EPS
        checks.append(
            _check(
                f"guard:{name}",
                ok,
                d["low"],
                -settings.guard_tolerance,
                "fraction",
                f"guard {name!r} non-inferior: lower bound {_pts(d['low'])} >= -{settings.guard_tolerance * 100:.1f} pts "
                f"({_interval(d)})"
                if ok
                else f"guard {name!r} may have regressed: lower bound {_pts(d['low'])} < -{settings.guard_tolerance * 100:.1f} "
                f"pts ({_interval(d)}); a regression this large is not excluded",
                **d,
            )
        )

    gain_points = t["mean"] * 100
    if settings.min_gain_per_dollar == 0:
        # the policy does not price the gain (e.g. "ship whatever handles the new tools, if no worse");
        # the figure is still reported
        gpd = gain_points / total if total > 0 else None
        ok = True
        reason = (
            f"gain per dollar not required (min_gain_per_dollar=0); observed "
            f"{'n/a' if gpd is None else f'{gpd:.4g} pts/$'} for {gain_points:+.2f} pts"
        )
    elif gain_points <= 0:
        gpd, ok = (gain_points / total if total > 0 else None), False
        reason = (
            f"no estimated gain ({gain_points:+.2f} pts mean) to pay ${total:.2f} for; "
            f"gain per dollar must reach {settings.min_gain_per_dollar:g} pts/$"
        )
    elif total == 0:
        gpd, ok = None, True
        reason = (
            f"total cost is $0, so gain per dollar is treated as infinite (>= {settings.min_gain_per_dollar:g} "
            f"pts/$) for a gain of {gain_points:+.2f} pts; check the ledger recorded the run's stages"
        )
    else:
        gpd = gain_points / total
        ok = gpd >= settings.min_gain_per_dollar - _EPS
        reason = (
            f"{gain_points:+.2f} pts for ${total:.2f} = {gpd:.4g} pts/$ "
            f"{'>=' if ok else '<'} min_gain_per_dollar {settings.min_gain_per_dollar:g}"
            + ("" if ok else "; the gain does not pay for its run and serving cost")
        )
    checks.append(
        _check(
            "gain_per_dollar",
            ok,
            gpd,
            float(settings.min_gain_per_dollar),
            "points per USD",
            reason,
            gain_points=gain_points,
            total_usd=total,
            infinite=bool(ok and gpd is None),
        )
    )

    if settings.max_cost_usd is not None:
        budget = float(settings.max_cost_usd)
        ok = total <= budget + _EPS
        checks.append(
            _check(
                "budget",
                ok,
                total,
                budget,
                "USD",
                f"cost ${total:.4f} {'within' if ok else 'over'} the budget max_cost_usd=${budget:.4f}",
            )
        )

    names = list(REQUIRED_VALIDATIONS) + sorted(n for n in validations if n not in REQUIRED_VALIDATIONS)
    for name in names:
        if name not in validations:
            checks.append(
                _check(
                    f"validation:{name}",
                    False,
                    None,
                    True,
                    "bool",
                    f"validation {name!r} missing: no result was recorded; run it before promoting",
                )
            )
        else:
            ok = bool(validations[name])
            checks.append(
                _check(
                    f"validation:{name}", ok, ok, True, "bool", f"validation {name!r} {'passed' if ok else 'failed'}"
                )
            )

    failed = [c for c in checks if not c["passed"]]
    promote = not failed
    if promote:
        gpd_text = "infinite (cost $0)" if gpd is None else f"{gpd:.4g}"
        reasons = [
            f"promote: target lower bound {_pts(t['low'])} >= {_pts(settings.min_gain)}, "
            f"{len(g)} guard(s) non-inferior within {settings.guard_tolerance * 100:.1f} pts, "
            f"{gpd_text} pts/$ >= {settings.min_gain_per_dollar:g}, validations {', '.join(names)} passed"
        ]
    else:
        reasons = [c["reason"] for c in failed]
    summary = (
        f"{'PROMOTE' if promote else 'HOLD'} {settings.model_name}: {settings.metric} {_interval(t)}; "
        f"total ${total:.2f}; {len(checks) - len(failed)}/{len(checks)} checks passed"
        + ("" if promote else f"; failed: {', '.join(c['name'] for c in failed)}")
    )
    return Decision(promote=promote, checks=checks, reasons=reasons, summary=summary)


def champion_unchanged(decision: Decision, measured_against: str | None, current: str | None) -> Decision:
    """The decision, held where the champion alias moved since the challenger was measured against
    `measured_against` (another run promoted, or a rollback): the gain was against a model no longer
    serving. Pure; a decision that does not promote, or a champion that has not moved, comes back as it is."""
    if not decision.promote or measured_against is None or current == measured_against:
        return decision
    reason = (
        f"the champion moved from version {measured_against} to {current} since this run measured its "
        f"challenger against {measured_against}: not promoted; run again to compare with the new champion"
    )
    check = _check("champion_unchanged", False, current, measured_against, "version", reason)
    return Decision(
        promote=False,
        checks=[*decision.checks, check],
        reasons=[reason],
        summary=decision.summary.replace("PROMOTE", "HOLD", 1) + "; failed: champion_unchanged",
    )
