"""
### simulate_production

The demo's production traffic: `days` past days of the champion answering tasks through vLLM, written
as traces (date=YYYY-MM-DD partitions) where `drift_monitor` reads them; with `tool_change`, the tool
registry switches to the target (v2) at midnight before the last day, as a real tool release would.
Manual only; `make demo` runs it. Not part of a production deployment.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Param, dag, task


@dag(
    dag_id="simulate_production",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["evergreen", "demo"],
    default_args={"owner": "evergreen", "retries": 1, "retry_delay": timedelta(seconds=10)},
    params={
        "days": Param(2, type="integer", minimum=1, maximum=14),
        "tool_change": Param(True, type="boolean"),
        "overrides": Param({}, type="object", description='any setting, e.g. {"simulate.traces": 600}'),
    },
)
def simulate_production():
    @task
    def simulate(params=None):
        from operators.stages import settings_for
        from tasks.loop import simulate_production as run

        return run(settings_for(params), days=int(params["days"]), change=bool(params["tool_change"]))

    simulate()


simulate_production()
