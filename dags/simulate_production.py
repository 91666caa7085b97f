"""
### simulate_production

The demo's production traffic: `days` past days of the champion answering tasks through vLLM, written
as traces (date=YYYY-MM-DD partitions) where `drift_monitor` reads them; with `tool_change`, the tool
registry switches to the target (v2) at midnight before the last day, as a real tool release would.
Manual only; `make demo` runs it. Not part of a production deployment.
"""

from __future__ import annotations

from airflow.sdk import Param

from operators.defaults import evergreen_dag
from operators.stages import StageOperator
from tasks.stages import simulate


@evergreen_dag(
    __doc__,
    tags=["demo"],
    params={
        "days": Param(2, type="integer", minimum=1, maximum=14),
        "tool_change": Param(True, type="boolean"),
        "overrides": Param({}, type="object", description='any setting, e.g. {"simulate.traces": 600}'),
    },
)
def simulate_production():
    StageOperator(python_callable=simulate.simulate_production)


simulate_production()
