"""Airflow pools the DAGs use (no Airflow import: scripts/stack.py creates them before Airflow starts).

REGISTRY_POOL: every task that moves the model registry's aliases (move_aliases, rollback, bootstrap) takes
its one slot, so two DAGs never move aliases at once. Create it once per deployment:

    airflow pools set evergreen_registry 1 "alias moves of the model registry, one at a time"
"""

REGISTRY_POOL = "evergreen_registry"
