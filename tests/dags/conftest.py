"""Airflow for the DAG tests: a throwaway AIRFLOW_HOME with a migrated SQLite DB, the project's dags/ and
plugins/, set before anything imports airflow (it reads its configuration once, at import)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
DAGS = PROJECT / "dags"
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="eg-airflow-tests-"))
AIRFLOW_ENV = {
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT / "plugins"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME / 'airflow.db'}",
    "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
}
os.environ.update(AIRFLOW_ENV)

# Ray reads its auth mode and token once, when first imported: every head this process starts (one per
# DAG run) shares this token (tasks.rl.cluster.start_local_head keeps a token the process holds)
if not os.environ.get("RAY_AUTH_TOKEN_PATH"):
    import secrets

    _token = AIRFLOW_HOME / "ray_auth_token"
    _token.write_text(secrets.token_hex(32))
    _token.chmod(0o600)
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(_token)})


@pytest.fixture(scope="session")
def airflow_db():
    """`airflow db migrate` once per test run (about 5 s); dag.test() needs the tables."""
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), "db", "migrate"],
        env=os.environ.copy(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    from operators.pools import REGISTRY_POOL

    pool = subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), "pools", "set", REGISTRY_POOL, "1", "tests"],
        env=os.environ.copy(),
        capture_output=True,
        text=True,
    )
    assert pool.returncode == 0, pool.stderr[-3000:]
    return AIRFLOW_HOME
