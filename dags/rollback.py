"""
### rollback

Manual: moves the MLflow `champion` alias back to `previous` (and `previous` to the rolled-back version),
once per DAG run, with the reason tagged on the version. Refuses unless `confirm` is true.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Param, dag, task


@dag(
    dag_id="rollback",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["evergreen", "registry", "mlflow"],
    default_args={"owner": "evergreen", "retries": 1, "retry_delay": timedelta(seconds=10)},
    params={
        "confirm": Param(False, type="boolean", description="must be true: this moves the production alias"),
        "reason": Param("", type="string", description="why (tagged on the version)"),
    },
)
def rollback():
    @task  # retries are safe: the move is journalled per run (tasks.promotion.registry)
    def move_champion_back(params=None, run_id=None):
        from operators.stages import settings_for
        from tasks.loop import rollback as do_rollback

        return do_rollback(settings_for(params), run_key=f"rollback/{run_id}", confirm=bool(params["confirm"]),
                           reason=params["reason"] or "manual rollback")

    move_champion_back()


rollback()
