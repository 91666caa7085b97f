"""The timeline DAG's stages (tasks/timeline/run.py): the month lives in the DAG run's directory.

prepare_timeline(settings, rd)          # the first champion in every policy's registry, the plan
timeline_day(settings, rd, index=4)     # every policy's day 4 (a day already written is returned as it is)
timeline_report(settings, rd)           # report.json, report.md, timeline.png from the days written
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.config import Settings
    from tasks.rundir import RunDir
    from tasks.timeline.run import Timeline


def _timeline(settings: Settings, rd: RunDir) -> Timeline:
    from tasks.timeline.run import Timeline

    return Timeline(settings, rd.path / "timeline")


def prepare_timeline(settings: Settings, rd: RunDir) -> dict:
    return _timeline(settings, rd).prepare()


def timeline_day(settings: Settings, rd: RunDir, index: int) -> dict:
    """Day `index` for every policy; what each did (the day's files hold the rest). A day past the run's
    timeline.days (the DAG has one task per day of the deployment's setting) does nothing."""
    if index >= settings.timeline.days:
        return {"day": index, "skipped": f"past timeline.days={settings.timeline.days}"}
    records = _timeline(settings, rd).run_day(index)
    return {
        policy: {k: r.get(k) for k in ("success", "retrained", "run_status", "promoted", "usd")}
        for policy, r in records.items()
    }


def timeline_report(settings: Settings, rd: RunDir) -> dict:
    report = _timeline(settings, rd).report()
    return {"days": report["days"], "policies": report["policies"], "goals": report["goals"], "chart": report["chart"]}
