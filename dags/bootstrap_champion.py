"""
### bootstrap_champion

Makes the first champion: builds the tiny Llama from `model` settings (nothing downloaded), fine-tunes it
by SFT into a registry-v1 tool-using agent, logs it to MLflow and registers it as `evergreen-agent`;
it becomes `champion` when the registry has none. With a champion already there it does nothing unless
`force` (then the new version is registered, and the aliases stay: promotion is the gate's job).

**Params**: `force`, `sft_steps` (SFT steps, default `bootstrap.steps`), `overrides` ({"section.field": value}).
"""

from __future__ import annotations

from airflow.sdk import Param

from operators.defaults import evergreen_dag
from operators.pools import REGISTRY_POOL
from operators.stages import StageOperator
from tasks.stages import models


@evergreen_dag(
    __doc__,
    tags=["bootstrap", "mlflow"],
    params={
        "force": Param(False, type="boolean", description="bootstrap even when a champion exists"),
        "sft_steps": Param(
            None, type=["null", "integer"], minimum=1, description="SFT steps (default bootstrap.steps)"
        ),
        "overrides": Param({}, type="object", description='any setting, e.g. {"bootstrap.batch_size": 16}'),
    },
)
def bootstrap_champion():
    StageOperator(python_callable=models.bootstrap, pool=REGISTRY_POOL)


bootstrap_champion()
