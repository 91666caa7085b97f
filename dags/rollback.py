"""
### rollback

Manual: moves the MLflow `champion` alias back to `previous` (and `previous` to the rolled-back version),
once per DAG run, with the reason tagged on the version. Refuses unless `confirm` is true.
"""

from __future__ import annotations

from airflow.sdk import Param

from operators.defaults import evergreen_dag
from operators.pools import REGISTRY_POOL
from operators.stages import StageOperator
from tasks.stages import promotion


@evergreen_dag(
    __doc__,
    tags=["model-registry", "mlflow"],
    params={
        "confirm": Param(False, type="boolean", description="must be true: this moves the production alias"),
        "reason": Param("", type="string", description="why (tagged on the version)"),
    },
)
def rollback():
    # retries are safe: the move is journalled per run (tasks.promotion.registry)
    StageOperator(python_callable=promotion.rollback, pool=REGISTRY_POOL)


rollback()
