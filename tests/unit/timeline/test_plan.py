"""The month's script and the policies' rules (tasks/timeline/plan.py): pure, tested directly."""

from __future__ import annotations

import math

import pytest

from tasks.config_deployment import TimelineSettings
from tasks.timeline.plan import hours_to_fix, mix_on, plan, policy_table, promotes, wants_retrain

FAMILIES = ("calc", "convert", "lookup")
BREAKING = {("1", "2"), ("2", "4"), ("3", "4")}


def _plan(**kw):
    return plan(TimelineSettings(**kw), FAMILIES, lambda old, new: (old, new) in BREAKING)


def test_the_default_month_has_the_issues_events_on_their_days():
    days = _plan()
    assert len(days) == 30 and days[0].date.isoformat() == "2026-11-02" and days[29].date.isoformat() == "2026-12-01"
    assert [d.index for d in days if d.breaking] == [5, 22]
    assert [d.toolset for d in (days[4], days[5], days[12], days[22])] == ["1", "2", "3", "4"]
    assert days[12].events == ("tool change v2 -> v3 (non-breaking)",) and not days[12].breaking
    assert days[19].malformed_share == 0.3 and "malformed traffic (30% of lines)" in days[19].events
    assert {d.malformed_share for d in days if d.index != 19} == {0.01}
    shifting = [d.index for d in days if any(e.startswith("workload mix") for e in d.events)]
    assert shifting == list(range(15, 22))
    quiet = [d.index for d in days if not d.changed]
    assert 0 in quiet and 5 not in quiet and 29 in quiet


def test_the_mix_moves_linearly_then_stays():
    t = TimelineSettings()
    assert mix_on(t, FAMILIES, 14) == pytest.approx({f: 1 / 3 for f in FAMILIES})
    mid = mix_on(t, FAMILIES, 15 + 3)  # day 4 of 7
    assert mid["calc"] == pytest.approx(1 / 3 + 4 / 7 * (0.6 - 1 / 3))
    assert mix_on(t, FAMILIES, 21) == pytest.approx({"calc": 0.6, "convert": 0.2, "lookup": 0.2})
    assert mix_on(t, FAMILIES, 29) == mix_on(t, FAMILIES, 21)
    assert math.isclose(sum(mid.values()), 1.0)


def test_a_mix_naming_an_unknown_workload_says_which():
    with pytest.raises(ValueError, match=r"names \['poetry'\]"):
        _plan(mix_shift={"start_day": 1, "days": 2, "to": {"poetry": 1.0}})


def test_settings_refuse_events_outside_the_month_and_a_month_without_day_0():
    with pytest.raises(ValueError, match="past the last day"):
        TimelineSettings(days=10)  # the default changes on days 12 and 22
    with pytest.raises(ValueError, match="must start with a change at day 0"):
        TimelineSettings(toolsets=[{"day": 1, "toolset": "2"}])


def test_the_policies_rules():
    assert [wants_retrain(p, False) for p in ("never", "nightly", "nightly_gated", "evergreen")] == [
        False,
        True,
        True,
        False,
    ]
    assert wants_retrain("evergreen", True) and not wants_retrain("never", True)
    assert promotes("nightly", gate_promote=False) and not promotes("nightly_gated", gate_promote=False)
    assert promotes("evergreen", True) and not promotes("evergreen", False)
    with pytest.raises(ValueError, match="use one of"):
        wants_retrain("weekly", True)


def _rows(policy, successes, retrained=(), promoted=(), usd=0.0, pending=()):
    """One policy's records; a promotion on day d deploys a new version from day d + 1."""
    rows, version = [], 1
    for i, success in enumerate(successes):
        rows.append(
            {
                "policy": policy,
                "day": i,
                "success": success,
                "deployed_version": str(version),
                "retrained": i in retrained,
                "promoted": i in promoted,
                "usd": usd if i in retrained else 0.0,
                "pending": i in pending,
            }
        )
        version += i in promoted
    return rows


def test_hours_to_fix_count_from_the_change_to_the_first_promoted_model_clearly_better():
    days = _plan(
        days=10,
        toolsets=[{"day": 0, "toolset": "1"}, {"day": 3, "toolset": "2"}, {"day": 7, "toolset": "4"}],
        mix_shift=None,
        malformed_day=None,
    )
    # v2 lands on day 3 (0.4); promoted on day 3 (no better: 0.45 on day 4) and day 4 (0.7 on day 5): 48 h.
    # v4 lands on day 7 (0.1): a better day 8 without a promotion is no fix, and nothing is promoted after it
    rows = _rows("evergreen", [0.9, 0.9, 0.9, 0.4, 0.45, 0.7, 0.7, 0.1, 0.3, 0.3], promoted=(3, 4))
    assert hours_to_fix(rows, days, margin=0.1) == [48.0, None]


def test_the_table_counts_false_alarms_only_on_quiet_days_with_nothing_pending():
    days = _plan(
        days=6, toolsets=[{"day": 0, "toolset": "1"}, {"day": 2, "toolset": "2"}], mix_shift=None, malformed_day=None
    )
    records = (
        _rows("never", [0.9, 0.9, 0.4, 0.4, 0.4, 0.4])
        + _rows(
            "nightly", [0.9, 0.85, 0.4, 0.6, 0.9, 0.88], retrained=range(6), promoted=range(6), usd=0.01, pending=(2, 3)
        )
        + _rows("evergreen", [0.9, 0.9, 0.4, 0.9, 0.9, 0.9], retrained=(2,), promoted=(2,), usd=0.01, pending=(2,))
    )
    by = {f.policy: f for f in policy_table(records, days, margin=0.1)}
    # quiet days 0, 1, 3, 4, 5; on day 3 the v2 break is still pending (not fixed): not a false alarm
    assert by["nightly"].retrains == 6 and by["nightly"].false_alarms == 4
    assert by["evergreen"].false_alarms == 0 and by["evergreen"].retrains == 1
    assert by["evergreen"].hours_to_fix == [24.0] and by["nightly"].hours_to_fix == [24.0]  # day 3: +20 pts
    assert by["never"].hours_to_fix == [None] and by["never"].points_per_usd is None
    gain = 100 * (by["evergreen"].mean_success - by["never"].mean_success)
    assert by["evergreen"].points_per_usd == pytest.approx(gain / 0.01)
