"""The month's script and the policies' rules, as pure functions (tests call them directly).

days = plan(settings.timeline, families=("calc", "convert", "lookup"), breaking=lambda old, new: ...)
days[5].toolset, days[5].events        # "2", ("tool change v1 -> v2 (breaking)",)
wants_retrain("evergreen", verdict_retrain=True)     # True
promotes("nightly", gate_promote=False)              # True: that policy has no gate
table = policy_table(records, days, margin=0.1)      # the per-policy figures of the report
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.config_deployment import TimelineSettings

POLICIES = ("never", "nightly", "nightly_gated", "evergreen")


@dataclass(frozen=True)
class Day:
    """One simulated day: what production serves, the workload mix, and what happened that day."""

    index: int
    date: date
    toolset: str
    mix: dict[str, float]
    malformed_share: float
    events: tuple[str, ...] = ()
    breaking: bool = False  # a breaking tool change lands this day

    @property
    def changed(self) -> bool:
        return bool(self.events)


def mix_on(t: TimelineSettings, families: tuple[str, ...], day: int) -> dict[str, float]:
    """The workload mix of `day`: even, moving linearly towards mix_shift.to over its days, then staying."""
    even = {f: 1 / len(families) for f in families}
    shift = t.mix_shift
    if shift is None or day < shift.start_day:
        return even
    unknown = sorted(set(shift.to) - set(families))
    if unknown:
        raise ValueError(f"timeline.mix_shift.to names {unknown}: the environment's workloads are {list(families)}")
    total = sum(shift.to.values())
    if total <= 0:
        raise ValueError("timeline.mix_shift.to: give at least one workload a positive weight")
    target = {f: shift.to.get(f, 0.0) / total for f in families}
    x = min(1.0, (day - shift.start_day + 1) / shift.days)
    return {f: (1 - x) * even[f] + x * target[f] for f in families}


def plan(t: TimelineSettings, families: tuple[str, ...], breaking: Callable[[str, str], bool]) -> list[Day]:
    """Every day of the timeline. `breaking(old, new)` says whether a toolset change breaks (the tool diff)."""
    start = date.fromisoformat(t.start)
    changes = {c.day: c.toolset for c in t.toolsets}
    days, toolset = [], changes[0]
    for i in range(t.days):
        events, broke = [], False
        if i in changes and i > 0 and changes[i] != toolset:
            broke = breaking(toolset, changes[i])
            events.append(f"tool change v{toolset} -> v{changes[i]} ({'breaking' if broke else 'non-breaking'})")
            toolset = changes[i]
        shift = t.mix_shift
        if shift is not None and shift.start_day <= i < shift.start_day + shift.days:
            events.append(f"workload mix shift, day {i - shift.start_day + 1} of {shift.days}")
        malformed = t.background_malformed_share
        if i == t.malformed_day:
            events.append(f"malformed traffic ({t.malformed_share:.0%} of lines)")
            malformed = t.malformed_share
        days.append(Day(i, start + timedelta(days=i), toolset, mix_on(t, families, i), malformed, tuple(events), broke))
    return days


def wants_retrain(policy: str, verdict_retrain: bool) -> bool:
    """Whether `policy` retrains tonight; `verdict_retrain` is the drift monitor and tool diff's verdict."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: use one of {POLICIES}")
    return {"never": False, "nightly": True, "nightly_gated": True, "evergreen": verdict_retrain}[policy]


def promotes(policy: str, gate_promote: bool) -> bool:
    """Whether a retrain of `policy` ships: the nightly policy promotes whatever the gate says."""
    return True if policy == "nightly" else gate_promote


@dataclass
class PolicyFigures:
    """What the report shows for one policy over the month."""

    policy: str
    mean_success: float
    usd: float
    retrains: int
    promotions: int
    false_alarms: int
    hours_to_fix: list[float | None] = field(default_factory=list)  # one per breaking change; None: never fixed
    points_per_usd: float | None = None  # success points above never-retrain per dollar; None: no dollars spent

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def hours_to_fix(rows: list[dict], days: list[Day], margin: float) -> list[float | None]:
    """Per breaking change: hours from the change (the start of its day) to the start of the first day on which a
    model promoted since serves with success at least `margin` above the day the change landed (a promotion
    lands overnight); None when that does not happen before the next breaking change or the month's end.
    `rows`: one policy's records, with success and deployed_version."""
    by_day = {r["day"]: r for r in rows}
    breaks = [d.index for d in days if d.breaking]
    out: list[float | None] = []
    for k, change in enumerate(breaks):
        end = breaks[k + 1] if k + 1 < len(breaks) else len(days)
        landed = by_day.get(change)
        fixed = None
        if landed is not None:
            fixed = next(
                (
                    i
                    for i in range(change + 1, end)
                    if i in by_day
                    and by_day[i]["deployed_version"] != landed["deployed_version"]
                    and by_day[i]["success"] >= landed["success"] + margin
                ),
                None,
            )
        out.append(None if fixed is None else 24.0 * (fixed - change))
    return out


def policy_table(records: list[dict], days: list[Day], margin: float) -> list[PolicyFigures]:
    """Per policy: mean daily success, dollars, retrains, promotions, false alarms (retrains on a day with no
    event while the deployed model was trained for the toolset in production), hours to fix each breaking
    change, and success points above never-retrain per dollar. `records`: one row per (policy, day) with
    success, deployed_version, usd, retrained, promoted, pending (the deployed model's toolset differs from
    production's by a breaking change)."""
    policies = [p for p in POLICIES if any(r["policy"] == p for r in records)]
    means = {p: statistics.fmean(r["success"] for r in records if r["policy"] == p) for p in policies}
    baseline = means.get("never")
    out = []
    for p in policies:
        rows = sorted((r for r in records if r["policy"] == p), key=lambda r: r["day"])
        usd = sum(r["usd"] for r in rows)
        quiet = {d.index for d in days if not d.changed}
        out.append(
            PolicyFigures(
                policy=p,
                mean_success=means[p],
                usd=usd,
                retrains=sum(r["retrained"] for r in rows),
                promotions=sum(r["promoted"] for r in rows),
                false_alarms=sum(r["retrained"] and r["day"] in quiet and not r["pending"] for r in rows),
                hours_to_fix=hours_to_fix(rows, days, margin),
                points_per_usd=(100 * (means[p] - baseline) / usd) if usd > 0 and baseline is not None else None,
            )
        )
    return out
