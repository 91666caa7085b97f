"""The timeline's report (tasks/timeline/report.py) on written day records: the table, the goals, the chart."""

from __future__ import annotations

import json

from tasks.config_deployment import TimelineSettings
from tasks.timeline.plan import plan
from tasks.timeline.report import write_report

SETTINGS = TimelineSettings(
    days=5,
    toolsets=[{"day": 0, "toolset": "1"}, {"day": 1, "toolset": "2"}, {"day": 3, "toolset": "3"}],
    mix_shift=None,
    malformed_day=2,
)
SUCCESS = {
    "never": [0.9, 0.4, 0.4, 0.4, 0.4],
    "nightly": [0.9, 0.4, 0.85, 0.86, 0.87],
    "evergreen": [0.9, 0.4, 0.84, 0.85, 0.85],
}
RETRAINED = {"never": set(), "nightly": {0, 1, 2, 3, 4}, "evergreen": {1}}
PROMOTED = {"never": set(), "nightly": {0, 1, 3, 4}, "evergreen": {1}}


def _write_days(out):
    for d in range(5):
        records = {
            p: {
                "policy": p,
                "day": d,
                "deployed_version": str(1 + sum(x < d for x in PROMOTED[p])),
                "success": SUCCESS[p][d],
                "retrained": d in RETRAINED[p],
                "promoted": d in PROMOTED[p],
                "usd": 0.002 if d in RETRAINED[p] else 0.0,
                "pending": p == "never" and d >= 1 or (d == 1),
            }
            for p in SUCCESS
        }
        (out / "days").mkdir(parents=True, exist_ok=True)
        (out / "days" / f"day-{d:02d}.json").write_text(json.dumps(records))


def test_the_report_has_the_table_the_goals_and_a_chart(tmp_path):
    _write_days(tmp_path)
    days = plan(SETTINGS, ("calc", "convert", "lookup"), lambda old, new: (old, new) == ("1", "2"))
    report = write_report(tmp_path, days, SETTINGS)
    by = {p["policy"]: p for p in report["policies"]}
    assert report["days"] == 5 and list(by) == ["never", "nightly", "evergreen"]
    assert by["nightly"]["retrains"] == 5 and by["nightly"]["usd"] == 0.01 and by["evergreen"]["usd"] == 0.002
    assert by["evergreen"]["hours_to_fix"] == [24.0] and by["never"]["hours_to_fix"] == [None]
    assert by["nightly"]["false_alarms"] == 2  # days 0 and 4: quiet, nothing pending (2 malformed, 3 non-breaking)
    goals = report["goals"]
    assert goals["no_promotion_on_malformed_day"] and goals["no_retrain_for_non_breaking_change"]
    assert goals["within_2_points_of_nightly"] and goals["at_most_30pct_of_nightly_dollars"]
    assert goals["20_points_above_never"]
    table = (tmp_path / "report.md").read_text()
    assert "| Evergreen (drift + gate) | 76.8% | $0.0020 | 1 | 1 | 0 | 24 h |" in table
    png = (tmp_path / "timeline.png").read_bytes()
    assert png[:4] == b"\x89PNG" and len(png) > 20_000
