"""The services of the production-shaped stack (`make up STACK=prod`, scripts/stack.py): Postgres for Airflow's
metadata, Redis as the Celery broker, an S3 endpoint (moto server) for the runs and MLflow's artifacts.

Each binds 127.0.0.1, keeps its data under the stack's home (Postgres: a directory its own user can reach,
named in `<home>/postgres/data_dir`) and gets a password generated at first start and kept in
`<home>/secrets.json` (0600), never printed. Started as services of the stack (its process groups), stopped
with it. A service that cannot start raises ServiceError naming it and how to start it by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scripts.stack import Stack

RUNS_BUCKET, ARTIFACTS_BUCKET = "evergreen-runs", "mlflow-artifacts"
# moto keeps no credentials: any key pair works; real S3 takes the workers' own (IAM role, AWS_* variables)
S3_KEYS = {"AWS_ACCESS_KEY_ID": "evergreen-local", "AWS_SECRET_ACCESS_KEY": "evergreen-local-secret"}


class ServiceError(RuntimeError):
    """A service of the stack did not start: the message names it and the command to start it by hand."""


def _secrets(home: Path) -> dict[str, str]:
    path = home / "secrets.json"
    if path.exists():
        return json.loads(path.read_text())
    made = {"postgres": secrets.token_urlsafe(18), "redis": secrets.token_urlsafe(18)}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(made, f)
    return made


def _wait_port(port: int, name: str, stack: Stack, timeout: float, hint: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if stack.procs[name].poll() is not None:
            break
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.3)
    tail = (stack.home / "logs" / f"{name}.log").read_text(errors="replace")[-1500:]
    raise ServiceError(f"{name} did not start on 127.0.0.1:{port}: {hint}. Its log ends:\n{tail}")


def _as_postgres_user() -> list[str]:
    """Postgres refuses to run as root: as root, its commands run as the `postgres` user (Debian's)."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def postgres_data_dir(home: Path) -> Path:
    """Under the system's temp dir when run as root: the `postgres` user cannot enter a root-only home."""
    if os.geteuid() != 0:
        return home / "postgres" / "data"
    return Path(tempfile.gettempdir()) / f"evergreen-pg-{hashlib.sha256(str(home).encode()).hexdigest()[:10]}"


def start_postgres(stack: Stack) -> str:
    """initdb (first start), the server on 127.0.0.1:<pg_port>, the `airflow` database; returns the
    SQLAlchemy URL."""
    for tool in ("initdb", "postgres", "psql"):
        if shutil.which(tool) is None:
            raise ServiceError(
                f"{tool} not found: install Postgres (apt-get install postgresql) or put its bin on PATH"
            )
    data = postgres_data_dir(stack.home)
    if not (stack.home / "secrets.json").exists() and data.exists():
        shutil.rmtree(data)  # left by an earlier home at this path, deleted since: its password is gone with it
    pw = _secrets(stack.home)["postgres"]
    (stack.home / "postgres").mkdir(exist_ok=True)
    (stack.home / "postgres" / "data_dir").write_text(str(data))
    run_as = _as_postgres_user()
    if not (data / "PG_VERSION").exists():
        data.mkdir(parents=True, exist_ok=True, mode=0o700)
        pwfile = data.parent / f".{data.name}.pw"
        pwfile.write_text(pw)
        if run_as:
            shutil.chown(data, "postgres", "postgres")
            shutil.chown(pwfile, "postgres", "postgres")
        try:
            init = subprocess.run(
                [*run_as, "initdb", "-D", str(data), "-U", "evergreen", f"--pwfile={pwfile}", "--auth=scram-sha-256"],
                capture_output=True,
                text=True,
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if init.returncode != 0:
            raise ServiceError(f"initdb {data} failed: {init.stderr[-1500:]}")
    port = stack.pg_port
    stack._spawn(
        "postgres",
        [*run_as, "postgres", "-D", str(data), "-h", "127.0.0.1", "-p", str(port), "-k", str(data)],
    )
    _wait_port(port, "postgres", stack, 60, f"start it with `postgres -D {data} -h 127.0.0.1 -p {port}`")
    env = {**os.environ, "PGPASSWORD": pw}
    psql = ["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "evergreen", "-d", "postgres", "-tAc"]
    for _ in range(30):  # accepting connections a moment after the port opens
        have = subprocess.run(
            [*psql, "SELECT 1 FROM pg_database WHERE datname='airflow'"], env=env, capture_output=True
        )
        if have.returncode == 0:
            break
        time.sleep(0.5)
    else:
        raise ServiceError(f"postgres on port {port} refuses connections: {have.stderr.decode()[-500:]}")
    if have.stdout.strip() != b"1":
        subprocess.run([*psql, "CREATE DATABASE airflow"], env=env, check=True, capture_output=True)
    return f"postgresql+psycopg2://evergreen:{pw}@127.0.0.1:{port}/airflow"


def start_redis(stack: Stack) -> str:
    """redis-server on 127.0.0.1:<redis_port> with a password, no persistence (the broker's queue only);
    returns the broker URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ServiceError("redis-server not found: install it (apt-get install redis-server)")
    pw = _secrets(stack.home)["redis"]
    (stack.home / "redis").mkdir(exist_ok=True)
    conf = stack.home / "redis" / "redis.conf"  # the password in a 0600 file, not on a command line
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(
            f'bind 127.0.0.1\nport {stack.redis_port}\nrequirepass {pw}\nsave ""\nappendonly no\n'
            f"dir {stack.home / 'redis'}\nprotected-mode yes\n"
        )
    stack._spawn("redis", [binary, str(conf)])
    _wait_port(stack.redis_port, "redis", stack, 30, f"start it with `redis-server {conf}`")
    return f"redis://:{pw}@127.0.0.1:{stack.redis_port}/0"


def start_s3(stack: Stack) -> str:
    """moto's S3 server on 127.0.0.1:<s3_port> with the runs' and MLflow's buckets; returns its URL."""
    stack._spawn(
        "s3", [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(stack.s3_port)]
    )
    url = f"http://127.0.0.1:{stack.s3_port}"
    _wait_port(stack.s3_port, "s3", stack, 60, f"start it with `moto_server -H 127.0.0.1 -p {stack.s3_port}`")
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=S3_KEYS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_KEYS["AWS_SECRET_ACCESS_KEY"],
    )
    for bucket in (RUNS_BUCKET, ARTIFACTS_BUCKET):
        client.create_bucket(Bucket=bucket)
    return url


def start_services(stack: Stack, progress) -> str:
    """Postgres, Redis and S3 up, their settings written for every process of the stack (<home>/prod_env.json,
    0600: it holds the passwords); returns where MLflow keeps its artifacts."""
    from scripts.stack import PROD_ENV

    sql, broker, s3_url = start_postgres(stack), start_redis(stack), start_s3(stack)
    fd = os.open(stack.home / PROD_ENV, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(prod_env(stack, sql, broker, s3_url), f)
    progress(f"Postgres :{stack.pg_port}, Redis :{stack.redis_port}, S3 (moto) {s3_url} up")
    return f"s3://{ARTIFACTS_BUCKET}/"


def start_workers(stack: Stack, bin_dir: Path) -> None:
    """`stack.workers` Celery workers, each with its own scratch dir and name, as on machines of their own
    (--skip-serve-logs: the log files are the api-server's to read on this disk)."""
    for i in range(stack.workers):
        name = f"worker-{'abcdefgh'[i]}"
        stack._spawn(
            name,
            [str(bin_dir / "airflow"), "celery", "worker", "-H", f"{name}@%h", "-c", "2", "--skip-serve-logs"],
            env={"EVERGREEN_SCRATCH_DIR": str(stack.home / "scratch" / name), "EVERGREEN_WORKER_NAME": name},
        )


def prod_env(stack: Stack, sql: str, broker: str, s3_url: str) -> dict[str, str]:
    """The production shape of the stack's environment: Postgres, Celery on Redis, runs and artifacts on S3."""
    return {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sql,
        "AIRFLOW__CELERY__BROKER_URL": broker,
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + sql,
        # a worker lost mid-task: its task instance stops heartbeating and is failed (then retried on another
        # worker) after a minute, not the default five
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
        # a task's identity is the worker it ran on (core.hostname_callable): two workers on one machine
        "AIRFLOW__CORE__HOSTNAME_CALLABLE": "operators.hostname.worker_name",
        **S3_KEYS,
        "AWS_DEFAULT_REGION": "us-east-1",
        "EVERGREEN_S3_ENDPOINT_URL": s3_url,
        "MLFLOW_S3_ENDPOINT_URL": s3_url,
        "EVERGREEN_RUN_DIR": f"s3://{RUNS_BUCKET}/runs",
        # the services' own working copies (the Evergreen page's summaries); each worker has its own
        "EVERGREEN_SCRATCH_DIR": str(stack.home / "scratch" / "services"),
        "EVERGREEN_MONITOR__TRACES": f"s3://{RUNS_BUCKET}/production/traces",
    }
