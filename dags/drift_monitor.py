"""
### drift_monitor

Hourly: ingests the newest whole day(s) of production traces (GX validation, bad rows quarantined),
compares them with the days before (per workload: success, tool errors, prompt length, tool mix; Holm-
corrected tests with effect-size floors) and diffs the tool registry now served against the champion's.
When production moved, it emits one `retrain_request` asset event per window whose `extra` carries the
reasons (drift summary, tool diff, window, registry hash); `continuous_post_training` runs on it.

An hourly monitor sees each finished day many times: a window is announced once (per registry hash).
**Params**: `window` ("START/END", RFC 3339 dates; default: the last `monitor.window_days` whole days),
`reference_days` (default `drift.reference_days`). Outputs: `runs/airflow/drift_monitor/`.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Metadata, Param, task

from operators.assets import RETRAIN_REQUEST
from operators.defaults import evergreen_dag
from operators.stages import StageOperator
from tasks.stages import signals


@evergreen_dag(
    __doc__,
    schedule="@hourly",
    tags=["signals", "drift"],
    params={
        "window": Param(
            None, type=["null", "string"], description="START/END of the current window (default: last whole days)"
        ),
        "reference_days": Param(
            None, type=["null", "integer"], minimum=1, description="days before the window to compare with"
        ),
    },
)
def drift_monitor():
    verdict = StageOperator(python_callable=signals.monitor, retries=2, retry_delay=timedelta(minutes=1)).output

    # the two Airflow-only steps (a short circuit, an asset event with metadata) stay in the DAG
    @task.short_circuit
    def production_moved(verdict: dict):
        print(f"retrain={verdict['retrain']} new={verdict['new']}: {verdict['summary']}")
        return bool(verdict["retrain"] and verdict["new"])

    @task(outlets=[RETRAIN_REQUEST])
    def request_retrain(verdict: dict):
        from tasks.stages.signals import retrain_request_extra

        yield Metadata(RETRAIN_REQUEST, retrain_request_extra(verdict))

    production_moved(verdict) >> request_retrain(verdict)


drift_monitor()
