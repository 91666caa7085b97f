"""What every Evergreen DAG shares: `@evergreen_dag(__doc__, tags=[...], params={...})`.

One set of defaults for the five DAGs: no catch-up of missed intervals (a missed nightly run is not worth
three queued ones), one run at a time (a second trigger queues, it is not lost), owner and retries on
every task, an execution_timeout on every task (`orchestration.task_timeout_s`), and a failure callback
that logs one line: what failed, why, and where the run's page is. A DAG that needs other retries sets
them on its tasks.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

log = logging.getLogger(__name__)

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

    from tasks.config import load_settings

    defaults = {
        **DAG_DEFAULTS["default_args"],
        "on_failure_callback": log_failure,
        "execution_timeout": timedelta(seconds=load_settings().orchestration.task_timeout_s),
    }
    return dag(
        schedule=schedule,
        doc_md=doc,
        tags=["evergreen", *tags],
        params=params,
        **{**DAG_DEFAULTS, "default_args": defaults},
    )


def log_failure(context) -> None:
    """One line for a failed task: which, why (the exception's first line), and the run's pages."""
    ti, error = context.get("ti"), context.get("exception")
    why = (str(error).strip().splitlines() or [type(error).__name__])[0][:300] if error else "no exception recorded"
    dag_id, run_id = getattr(ti, "dag_id", "?"), getattr(ti, "run_id", "?")
    log.error(
        "evergreen: %s.%s of run %s failed (try %s): %s: %s; the run: /dags/%s/runs/%s, the Evergreen page: "
        "/evergreen/",
        dag_id,
        getattr(ti, "task_id", "?"),
        run_id,
        getattr(ti, "try_number", "?"),
        type(error).__name__ if error else "failure",
        why,
        dag_id,
        run_id,
    )


def job_timeout() -> timedelta:
    """`ray.job_timeout_s` of the deployment's settings (file and EVERGREEN_* variables), read when the DAG
    file is parsed: a Ray job that runs longer is stopped and its task fails."""
    from tasks.config import load_settings

    return timedelta(seconds=load_settings().ray.job_timeout_s)
