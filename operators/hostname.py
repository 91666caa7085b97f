"""Airflow's `core.hostname_callable` for workers that share a machine: a task instance records the worker it
ran on (EVERGREEN_WORKER_NAME, set per worker by scripts/stack.py's prod stack), else the machine's name.

    AIRFLOW__CORE__HOSTNAME_CALLABLE=operators.hostname.worker_name
"""

from __future__ import annotations

import os
import socket


def worker_name() -> str:
    return os.environ.get("EVERGREEN_WORKER_NAME") or socket.getfqdn()
