"""
### timeline

A simulated month of production (`timeline.*` settings), and four retraining policies run over the same
days from the same first champion: never retrain; retrain and promote every night (no gate); retrain every
night, promote through the gate; Evergreen (the drift monitor and tool diff decide when to retrain, the gate
and its cost threshold what ships). Each day's traffic is the deployed model's episodes through vLLM; each
retrain is a real continuous_post_training run through the same stage functions, its alias moved in a
throwaway MLflow registry per policy. One task per day (`day_01.timeline_day` ...), so progress shows per day in
the grid; `timeline_report` writes the table and the chart (`timeline/report.md`, `timeline/timeline.png` in the
run's directory) even when a day failed. Manual only. `python -m tasks timeline` runs the same without Airflow.
"""

from __future__ import annotations

from airflow.sdk import Param, TaskGroup, chain

from operators.defaults import evergreen_dag
from operators.stages import StageOperator
from tasks.stages import timeline as stages


def _days() -> int:
    """timeline.days of the deployment's settings, read when the file is parsed: one task per day."""
    from tasks.config import load_settings

    return load_settings().timeline.days


@evergreen_dag(
    __doc__,
    tags=["experiment"],
    params={
        "overrides": Param(
            {}, type="object", description='timeline and training settings, e.g. {"timeline.traces_per_day": 300}'
        ),
    },
)
def timeline():
    days = []
    for i in range(_days()):  # a group per day: the grid shows the month's progress day by day
        with TaskGroup(group_id=f"day_{i + 1:02d}"):
            days.append(StageOperator(python_callable=stages.timeline_day, op_kwargs={"index": i}))
    report = StageOperator(python_callable=stages.timeline_report, trigger_rule="all_done")
    chain(StageOperator(python_callable=stages.prepare_timeline), *days, report)


timeline()
