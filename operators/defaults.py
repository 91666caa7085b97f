"""What every Evergreen DAG shares: `@evergreen_dag(__doc__, tags=[...], params={...})`.

One set of defaults for the five DAGs: no catch-up of missed intervals (a missed nightly run is not worth
three queued ones), one run at a time (a second trigger queues, it is not lost), owner and retries on
every task. A DAG that needs other retries sets them on its tasks.
"""
from __future__ import annotations

from datetime import datetime, timedelta

DAG_DEFAULTS = {
    "start_date": datetime(2026, 1, 1),
    "catchup": False,
    "max_active_runs": 1,
    "default_args": {"owner": "evergreen", "retries": 1, "retry_delay": timedelta(seconds=30)},
}


def evergreen_dag(doc: str, *, tags: list[str], params: dict, schedule=None):
    """Airflow's `@dag` with the shared defaults, the module docstring as the DAG's doc and the `evergreen`
    tag; the DAG id is the decorated function's name."""
    from airflow.sdk import dag

    return dag(schedule=schedule, doc_md=doc, tags=["evergreen", *tags], params=params, **DAG_DEFAULTS)


def job_timeout() -> timedelta:
    """`ray.job_timeout_s` of the deployment's settings (file and EVERGREEN_* variables), read when the DAG
    file is parsed: a Ray job that runs longer is stopped and its task fails."""
    from tasks.config import load_settings

    return timedelta(seconds=load_settings().ray.job_timeout_s)
