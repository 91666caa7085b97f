"""The local Evergreen stack: MLflow server + Airflow (api-server, scheduler, dag-processor, triggerer).

    python scripts/stack.py up            # start, print the login once, keep running until Ctrl-C (make up)
    python scripts/stack.py down          # stop a stack started in the background (by its pid file)

    from scripts.stack import Stack       # tests and scripts/demo.py
    with Stack(home=Path(".stack")) as stack:
        stack.client().trigger("bootstrap_champion", conf={})

Everything lives under `home` (default `.stack/`): the Airflow home (SQLite metadata, logs, the generated
password of the single admin user `evergreen`), the MLflow store (SQLite + artifacts) and each process's
log. Servers bind 127.0.0.1. The stack is stopped through its own process groups, never by name: another
person's Airflow on this machine is left alone. Ray is not started here: the DAG's cluster-setup task
starts a head for each run and its teardown stops it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from scripts import services
from scripts.airflow_api import ApiClient
from tasks.net import port_busy
from tasks.processes import end_processes

PROJECT = Path(__file__).resolve().parents[1]
USER = "evergreen"
# MLflow 3's server starts a job runner and seven huey consumers for its GenAI jobs (evaluations, trace
# rollups) that Evergreen never submits: on 2 cores they slow its start past a minute under load
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
PROD_ENV = "prod_env.json"  # a prod stack's Postgres, Redis and S3 settings, mode 0600 (passwords)


@dataclass
class Stack:
    home: Path = PROJECT / ".stack"
    api_port: int = 8080
    mlflow_port: int = 5000
    ray_head_port: int = 6390
    ray_dashboard_port: int = 8265
    env_extra: dict = field(default_factory=dict)  # EVERGREEN_* settings for every task of this stack
    kind: str = "local"  # local: LocalExecutor, SQLite, a local run dir; prod: see scripts/services.py
    pg_port: int = 5442
    redis_port: int = 6389
    s3_port: int = 9010
    workers: int = 2  # Celery workers of a prod stack, each with its own scratch dir
    procs: dict = field(default_factory=dict)
    commands: dict = field(default_factory=dict)  # name -> (command, extra env): what restart() runs again

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.mlflow_port}"

    @property
    def airflow_home(self) -> Path:
        return self.home / "airflow"

    @property
    def runs_root(self) -> Path:
        """The runs as files: a local run dir itself; a run dir on S3 pulled into <home>/runs-view first."""
        where = self.env()["EVERGREEN_RUN_DIR"]
        if not where.startswith("s3://"):
            return Path(where)
        from tasks.mirror import Mirror

        os.environ.update({k: v for k, v in self.env().items() if k.startswith(("AWS_", "EVERGREEN_S3"))})
        Mirror(where, self.home / "runs-view").pull()
        return self.home / "runs-view"

    def env(self) -> dict:
        venv_bin = str(Path(sys.executable).parent)
        # not the caller's Ray settings: a RAY_ADDRESS left by a driver in this process (a test that ran
        # dag.test) would send every Ray client of the stack to a cluster that is gone
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env = {
            **inherited,
            "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONPATH": str(PROJECT),
            "AIRFLOW_HOME": str(self.airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.airflow_home / 'airflow.db'}",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__BASE_URL": self.api_url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api_url}/execution/",
            # training tasks outlive the default token (apache/airflow#67939); GRPO itself runs as a Ray job
            "AIRFLOW__EXECUTION_API__JWT_EXPIRATION_TIME": "7200",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            "EVERGREEN_TRACKING__URI": self.mlflow_url,
            "EVERGREEN_RUN_DIR": str(self.home / "runs"),
            "EVERGREEN_MONITOR__TRACES": str(self.home / "runs" / "production" / "traces"),
            "EVERGREEN_RAY__HEAD_PORT": str(self.ray_head_port),
            "EVERGREEN_RAY__DASHBOARD_PORT": str(self.ray_dashboard_port),
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_TRAIN_V2_ENABLED": "1",
            "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            # every process of this stack inherits it, including the ones that leave its process groups
            "EVERGREEN_STACK": str(self.home),
        }
        env.update(self._prod)
        env.update({k: str(v) for k, v in self.env_extra.items()})
        return env

    @property
    def _prod(self) -> dict:
        path = self.home / PROD_ENV  # written by start() (scripts/services.py): a later `down` or `runs_root` reads it
        return json.loads(path.read_text()) if self.kind == "prod" and path.exists() else {}

    @property
    def username(self) -> str:
        return USER

    @property
    def password_file(self) -> Path:
        """Where the simple auth manager keeps the admin's generated password (printed instead of it: a
        terminal or CI log is no place for a credential)."""
        return self.airflow_home / "simple_auth_manager_passwords.json.generated"

    @property
    def password(self) -> str:
        """The generated password of the admin user (the simple auth manager writes it at first start)."""
        path = self.password_file
        deadline = time.time() + 60
        while not path.exists() and time.time() < deadline:
            time.sleep(1)
        return json.loads(path.read_text())[USER]

    def client(self) -> ApiClient:
        return ApiClient(self.api_url, USER, self.password)

    def kill(self, name: str) -> None:
        """SIGKILL one service's process group (a fault drill: no chance to clean up)."""
        os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait(timeout=30)

    def restart(self, name: str) -> None:
        """Start a service again with the command it was started with."""
        self._spawn(name, *self.commands[name])

    def _spawn(self, name: str, cmd: list[str], env: dict | None = None) -> None:
        self.commands[name] = (cmd, env)
        log = open(self.home / "logs" / f"{name}.log", "ab")  # noqa: SIM115 (the service writes it while it runs)
        # its own session: stopping the stack signals the whole group (gunicorn / executor children too)
        self.procs[name] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env() | (env or {}), cwd=PROJECT, start_new_session=True
        )
        (self.home / "pids").mkdir(exist_ok=True)
        (self.home / "pids" / f"{name}.pid").write_text(str(self.procs[name].pid))

    def _wait_http(self, name: str, url: str, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                tail = (self.home / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode} while starting; its log ends:\n{tail}")
            try:
                with urllib.request.urlopen(url, timeout=5):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(1)
        raise TimeoutError(f"{name} not answering {url} after {timeout}s; see {self.home / 'logs' / (name + '.log')}")

    def start(self, progress=print) -> Stack:
        ports = [(self.api_port, "Airflow api-server"), (self.mlflow_port, "MLflow")]
        if self.kind == "prod":
            ports += [(self.pg_port, "Postgres"), (self.redis_port, "Redis"), (self.s3_port, "S3 (moto)")]
        for port, what in ports:
            if port_busy(port):
                raise RuntimeError(
                    f"port {port} for {what} is taken: stop whatever listens there "
                    f"(`python scripts/stack.py down` if it is a stack left running)"
                )
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        self.airflow_home.mkdir(parents=True, exist_ok=True)
        (self.home / "mlflow").mkdir(exist_ok=True)
        (self.home / "events").mkdir(exist_ok=True)  # drop a file named retrain_request here (operators/assets.py)
        t0 = time.time()
        bin_dir = Path(sys.executable).parent
        artifacts = str(self.home / "mlflow" / "artifacts")
        if self.kind == "prod":
            artifacts = services.start_services(self, progress)
        self._spawn(
            "mlflow",
            [
                str(bin_dir / "mlflow"),
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.mlflow_port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{self.home / 'mlflow' / 'mlflow.db'}",
                "--artifacts-destination",
                artifacts,
            ],
            env=MLFLOW_SERVER_ENV,
        )
        migrate = subprocess.run(
            [str(bin_dir / "airflow"), "db", "migrate"], env=self.env(), cwd=PROJECT, capture_output=True, text=True
        )
        if migrate.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{migrate.stdout[-2000:]}\n{migrate.stderr[-3000:]}")
        from operators.pools import REGISTRY_POOL

        pool = subprocess.run(
            [
                str(bin_dir / "airflow"),
                "pools",
                "set",
                REGISTRY_POOL,
                "1",
                "alias moves of the model registry, one at a time",
            ],
            env=self.env(),
            cwd=PROJECT,
            capture_output=True,
            text=True,
        )
        if pool.returncode != 0:
            raise RuntimeError(f"airflow pools set {REGISTRY_POOL} failed:\n{pool.stderr[-3000:]}")
        for component in ("api-server", "scheduler", "dag-processor", "triggerer"):
            cmd = [str(bin_dir / "airflow"), component]
            if component == "api-server":
                cmd += ["--host", "127.0.0.1", "--port", str(self.api_port)]
            elif component in ("scheduler", "triggerer"):
                # serve-logs (0.0.0.0:8793/8794) is for a log reader on another machine; the LocalExecutor's
                # task logs and the triggerer's are files the api-server reads here
                cmd += ["--skip-serve-logs"]
            self._spawn(component, cmd)
        if self.kind == "prod":
            services.start_workers(self, bin_dir)
        self._wait_http("mlflow", f"{self.mlflow_url}/health", 120)
        self._wait_http("api-server", f"{self.api_url}/api/v2/monitor/health", 180)
        progress(
            f"stack up in {time.time() - t0:.0f}s: Airflow {self.api_url}, MLflow {self.mlflow_url} "
            f"(logs in {self.home / 'logs'})"
        )
        return self

    def stop(self, progress=print) -> None:
        pids = {name: p.pid for name, p in self.procs.items()}
        if not pids and (self.home / "pids").exists():
            pids = {f.stem: int(f.read_text()) for f in (self.home / "pids").glob("*.pid")}
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.time() + 30
        for name, pid in pids.items():
            while time.time() < deadline:
                try:
                    os.killpg(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.5)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            (self.home / "pids" / f"{name}.pid").unlink(missing_ok=True)
        self.procs = {}
        strays = self._end_strays()
        progress(
            f"stack stopped ({', '.join(pids) or 'nothing was running'}"
            + (f"; ended {strays} processes that had left its process groups)" if strays else ")")
        )

    def _end_strays(self, grace: float = 15) -> int:
        """End what the stack started outside its services' process groups: the LocalExecutor's task
        processes start their own sessions and outlive the scheduler (an interrupted demo once left a
        bootstrap training for 79 minutes), and the Ray head a task starts is theirs. They all carry
        EVERGREEN_STACK=<this home> in their environment."""
        strays = self.processes()
        end_processes(strays, grace)
        return len(strays)

    def processes(self) -> list:
        """Every process the stack started, at any depth (its services, their task processes, the Ray heads
        and engines those start): they carry EVERGREEN_STACK=<this home>. psutil.Process objects."""
        import psutil

        mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.pid not in mine and proc.environ().get("EVERGREEN_STACK") == str(self.home):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def listening(self) -> list[tuple[int, str, str, int]]:
        """(pid, process name, address, port) of every listening TCP socket of the stack's processes."""
        import psutil

        out = []
        for proc in self.processes():
            try:
                out += [
                    (proc.pid, proc.name(), c.laddr.ip, c.laddr.port)
                    for c in proc.net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN
                ]
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return out

    def __enter__(self) -> Stack:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("--home", default=str(PROJECT / ".stack"))
    parser.add_argument(
        "--kind",
        choices=["local", "prod"],
        default="local",
        help="local: LocalExecutor on SQLite, runs on disk (make up); prod: Postgres, Celery on Redis, two "
        "workers, runs on S3 (make up STACK=prod)",
    )
    args = parser.parse_args(argv)
    stack = Stack(home=Path(args.home), kind=args.kind)
    if args.command == "down":
        stack.stop()
        return 0
    try:
        stack.start()
    except (services.ServiceError, RuntimeError) as e:
        stack.stop(progress=lambda _: None)
        print(f"stack not started: {e}", file=sys.stderr)
        return 1
    client = stack.client()
    client.wait_for_dags(["continuous_post_training", "drift_monitor", "bootstrap_champion", "rollback"])
    for dag_id in (
        "continuous_post_training",
        "drift_monitor",
        "bootstrap_champion",
        "rollback",
        "simulate_production",
    ):
        client.unpause(dag_id)  # a watcher on a paused DAG misses its events
    _ = stack.password  # waits until the auth manager has written it
    print(
        f"\nAirflow UI: {stack.api_url}  (user {USER}; password in {stack.password_file})\n"
        f"Evergreen page: {stack.api_url}/evergreen/\nMLflow UI: {stack.mlflow_url}\n"
        f"Ray dashboard (while a run holds a cluster): http://127.0.0.1:{stack.ray_dashboard_port}\n"
        "Ctrl-C stops everything.",
        flush=True,
    )
    try:
        while all(p.poll() is None for p in stack.procs.values()):
            time.sleep(2)
        dead = [n for n, p in stack.procs.items() if p.poll() is not None]
        print(f"{dead} exited; see {stack.home / 'logs'}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
