"""
### bootstrap_champion

Makes the first champion: builds the tiny Llama from `model` settings (nothing downloaded), fine-tunes it
by SFT into a registry-v1 tool-using agent, logs it to MLflow and registers it as `evergreen-agent`;
it becomes `champion` when the registry has none. With a champion already there it does nothing unless
`force` (then the new version is registered, and the aliases stay: promotion is the gate's job).

**Params**: `force`, `sft_steps` (SFT steps, default `bootstrap.steps`), `overrides` ({"section.field": value}).
"""
from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Param, dag, task

from operators.stages import run_stage


@dag(
    dag_id="bootstrap_champion",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["evergreen", "bootstrap", "mlflow"],
    default_args={"owner": "evergreen", "retries": 1, "retry_delay": timedelta(seconds=30)},
    params={
        "force": Param(False, type="boolean", description="bootstrap even when a champion exists"),
        "sft_steps": Param(None, type=["null", "integer"], minimum=1, description="SFT steps (default bootstrap.steps)"),
        "overrides": Param({}, type="object", description='any setting, e.g. {"bootstrap.batch_size": 16}'),
    },
)
def bootstrap_champion():
    @task
    def bootstrap(params=None):
        return run_stage("bootstrap", force=bool(params["force"]))

    bootstrap()


bootstrap_champion()
