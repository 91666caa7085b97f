"""Submit a command to a Ray cluster as a Ray job, watch it from the triggerer, fail the task with its logs.

    from operators.ray_job import RayJobOperator

    train = RayJobOperator(
        task_id="grpo_update",
        entrypoint="python -m tasks --settings /data/runs/{{ run_id }}/settings.json train ...",
        cluster=setup_cluster.output,        # {"address", "dashboard_url", "env"} from the cluster-setup task
        env_vars={"EVERGREEN_RUN_DIR": "/data/runs/{{ run_id }}"},
    )

The job's stdout/stderr appear in the Airflow task log as "[ray job <id>] ..." lines while it runs; a
failed job fails the task with its status, Ray's message and its last log lines. By default the job runs
in a copy of this project (Ray `working_dir`), so `python -m tasks ...` works on any node.

Ray 2.60 clusters use token auth. The cluster dict's `env` is what a driver needs in its environment
({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": ...}, see tasks.rl.cluster.start_local_head). The hook
turns it into an explicit `Authorization: Bearer` header for the Jobs API (HTTP, dashboard port) rather
than exporting it into this process: Ray reads its own auth settings once per process, and an Airflow
worker or triggerer may talk to several clusters with different tokens.

Tests: `pytest -q tests/integration/test_ray_job_operator.py` (starts its own local Ray head).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook, BaseOperator, Context
from airflow.sdk.exceptions import AirflowException

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# Ray zips and uploads the working_dir once per content hash (limit 512 MiB, RAY_max_grpc_message_size;
# it warns at half that). Patterns are gitignore-style, relative to the working_dir; Ray also honours
# the project's .gitignore. What is left is the source and include/ (well under 1 MiB).
DEFAULT_EXCLUDES = [".venv", "runs", ".git", ".stack", "tests", "bench", "__pycache__", "*.pyc", "*.log"]
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


def default_runtime_env() -> dict:
    """This project as the job's working_dir: `python -m tasks ...` and `import tasks` work in the job."""
    return {"working_dir": str(PROJECT_ROOT), "excludes": list(DEFAULT_EXCLUDES)}


def default_submission_id(dag_id: str, run_id: str, task_id: str, map_index: int | None, try_number: int) -> str:
    """A Ray submission id that is the same for the same task try and new for each try.

    Same try -> same id: a task process that runs the same try again (an at-least-once executor, a
    re-delivered workload) re-attaches to the job it already started instead of starting a second one.
    New try -> new id: a retry after a failure runs the job afresh (Ray keeps one job per id, and an ended
    job cannot be resubmitted under its id). One exception, in RayJobOperator: a retry whose previous
    try's job is still running (the worker died, the job did not) follows that job instead of starting a
    second copy beside it. The hash keeps the id unique; the readable part is for people reading the
    Ray dashboard.
    """
    key = "|".join(map(str, (dag_id, run_id, task_id, -1 if map_index is None else map_index, try_number)))
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{dag_id}.{task_id}")[:80]
    mapped = f"-m{map_index}" if map_index is not None and map_index >= 0 else ""
    return f"airflow-{readable}{mapped}-t{try_number}-{digest}"


def _auth_headers(env: Mapping[str, str] | None) -> dict[str, str]:
    """The Jobs API header for a token-auth cluster, from the env a driver of that cluster would use.

    Precedence mirrors Ray's own loader: RAY_AUTH_TOKEN, then the file at RAY_AUTH_TOKEN_PATH. Without
    either, no header: the Ray client then falls back to this process's own Ray auth settings.
    """
    env = env or {}
    token = env.get("RAY_AUTH_TOKEN")
    path = env.get("RAY_AUTH_TOKEN_PATH")
    if not token and path:
        try:
            token = Path(path).read_text().strip()
        except OSError as e:
            raise ValueError(f"cannot read the Ray auth token file {path!r} named by the cluster's env "
                             f"({e.strerror}); pass the env of a running head (tasks.rl.cluster.LocalHead.env) "
                             "or set RAY_AUTH_TOKEN") from None
    if not token:
        if env.get("RAY_AUTH_MODE") == "token":
            raise ValueError("the cluster's env says RAY_AUTH_MODE=token but gives no token: add "
                             "RAY_AUTH_TOKEN_PATH (a file holding the token) or RAY_AUTH_TOKEN")
        return {}
    return {"Authorization": f"Bearer {token}"}


def parse_cluster(cluster: Any) -> dict:
    """A cluster description as a dict; a templated XCom may arrive as JSON or as a bare dashboard URL."""
    if isinstance(cluster, str):
        text = cluster.strip()
        if text.startswith("{"):
            try:
                cluster = json.loads(text)
            except json.JSONDecodeError:
                import ast  # a Jinja-rendered dict is its Python repr, not JSON

                cluster = ast.literal_eval(text)
        else:
            cluster = {"dashboard_url": text}
    if not isinstance(cluster, Mapping) or not cluster.get("dashboard_url"):
        raise ValueError(f"cluster {cluster!r} has no dashboard_url: the Ray Jobs API needs the head's dashboard "
                         "(start the head with a dashboard port, e.g. start_local_head(..., dashboard_port=8265))")
    return dict(cluster)


class RayJobHook(BaseHook):
    """A Ray `JobSubmissionClient` for one cluster's dashboard, authenticated with that cluster's token.

    The client is made on first use (it checks the connection and Ray version: two HTTP requests).
    `mask_token` registers the token with Airflow's secrets masker; the triggerer passes False because
    that call talks to the supervisor synchronously, which must not happen on the triggerer's event loop.
    """

    hook_name = "Ray Jobs"

    def __init__(self, dashboard_url: str, env: Mapping[str, str] | None = None, *, mask_token: bool = True,
                 logger_name: str | None = None):
        super().__init__(logger_name=logger_name)
        self.dashboard_url = dashboard_url.rstrip("/")
        self._headers = _auth_headers(env)
        if mask_token and self._headers:
            try:
                from airflow.sdk.log import mask_secret

                mask_secret(self._headers["Authorization"].removeprefix("Bearer "))
            except Exception:  # outside a task (plain scripts, tests): nothing to register with
                pass
        self._client = None

    @classmethod
    def from_cluster(cls, cluster: Any, **kwargs) -> RayJobHook:
        c = parse_cluster(cluster)
        return cls(c["dashboard_url"], c.get("env"), **kwargs)

    def __repr__(self) -> str:  # never the headers
        return f"RayJobHook({self.dashboard_url!r}, auth={'token' if self._headers else 'process default'})"

    def get_conn(self):
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            # Ray prefers RAY_API_SERVER_ADDRESS / RAY_ADDRESS from the environment over the address it is
            # given; this hook was given its cluster's Jobs API explicitly, so that one wins
            saved = {k: os.environ.pop(k, None) for k in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")}
            try:
                # a copy: the client adds to the dict it is given
                self._client = JobSubmissionClient(self.dashboard_url, headers=dict(self._headers))
            finally:
                os.environ.update({k: v for k, v in saved.items() if v is not None})
        return self._client

    def submit(self, entrypoint: str, submission_id: str, runtime_env: dict | None = None,
               metadata: dict[str, str] | None = None, agent_wait_s: float = 60.0, **kwargs) -> str:
        """Submit the job; if one with this submission_id exists already, return it (a retried call re-attaches).

        A head that has just started answers "No available agent to submit job" until its dashboard
        agent registers (the server itself waits 10 s; on a busy 2-core machine that was not enough), so
        that answer is retried for up to `agent_wait_s` seconds.
        """
        client = self.get_conn()
        deadline = time.monotonic() + agent_wait_s
        while True:
            try:
                return client.submit_job(entrypoint=entrypoint, submission_id=submission_id,
                                         runtime_env=runtime_env, metadata=metadata, **kwargs)
            except RuntimeError as submit_error:
                if "No available agent" in str(submit_error):
                    if time.monotonic() < deadline:
                        self.log.info("the Ray job agent on %s is not up yet; retrying the submission in 2 s",
                                      self.dashboard_url)
                        time.sleep(2)
                        continue
                    raise RuntimeError(
                        f"the Ray head at {self.dashboard_url} has no job agent after {agent_wait_s:.0f} s. Every "
                        "head's agent listens on port 52365 by default: if another Ray head runs on this machine, "
                        "start this one with `ray start ... --dashboard-agent-listen-port=<free port>` (see its "
                        "logs/dashboard_agent.log)") from submit_error
                # Ray 2.60 answers a duplicate id with HTTP 500 and a traceback, so look the id up rather
                # than parse the message: if the job is there, it is ours (same id = same task try)
                try:
                    info = client.get_job_info(submission_id)
                except RuntimeError:
                    raise submit_error from None
                self.log.info("Ray job %s exists already (%s): re-attaching to it", submission_id, info.status)
                return submission_id

    def info(self, job_id: str):
        """Ray's JobDetails: status, message, start/end times, entrypoint, metadata."""
        return self.get_conn().get_job_info(job_id)

    def status(self, job_id: str) -> str:
        return str(self.get_conn().get_job_status(job_id))

    def stop(self, job_id: str) -> bool:
        """Ask Ray to stop the job (SIGTERM, then SIGKILL); False if it was not running."""
        return self.get_conn().stop_job(job_id)

    def logs(self, job_id: str) -> str:
        return self.get_conn().get_job_logs(job_id)

    async def tail(self, job_id: str) -> AsyncIterator[str]:
        """The job's log lines as they are written, from its first line; ends after the job ends."""
        client = await asyncio.to_thread(self.get_conn)
        pending = ""
        async for chunk in client.tail_job_logs(job_id):
            pending += chunk
            *lines, pending = pending.split("\n")
            for line in lines:
                yield line
        if pending:
            yield pending


class RayJobOperator(BaseOperator):
    """Run `entrypoint` as a Ray job on `cluster` and succeed or fail with it.

    :param entrypoint: shell command run by the job's driver on the head (templated)
    :param cluster: {"dashboard_url": ..., "env": {...}, "address": ...} as returned by the cluster-setup
        task; templated, so an XComArg works (a JSON string or a bare dashboard URL is accepted too)
    :param runtime_env: Ray runtime_env; default: this project as working_dir (see DEFAULT_EXCLUDES).
        Pass {} for a job that needs nothing from the project (faster: no upload)
    :param env_vars: extra environment variables for the job, merged over runtime_env["env_vars"]
    :param submission_id: Ray submission id; default: deterministic per task try (default_submission_id)
    :param deferrable: wait in the triggerer (frees the worker slot); False polls in the worker
    :param poll_interval: seconds between status checks
    :param timeout: seconds (or timedelta) after which the job is stopped and the task fails; None: no limit
    :param log_tail_lines: how many of the job's last log lines go into the failure message
    :param entrypoint_num_cpus: CPUs reserved for the driver (Ray's default 0: it only orchestrates)
    """

    template_fields = ("entrypoint", "cluster", "runtime_env", "env_vars", "submission_id")
    template_fields_renderers = {"runtime_env": "json", "env_vars": "json", "cluster": "json"}
    ui_color = "#cfe3ff"

    def __init__(self, *, entrypoint: str, cluster: Any, runtime_env: dict | None = None,
                 env_vars: dict[str, str] | None = None, submission_id: str | None = None,
                 deferrable: bool = True, poll_interval: float = 5.0, timeout: float | timedelta | None = None,
                 log_tail_lines: int = 40, entrypoint_num_cpus: float | None = None, **kwargs):
        super().__init__(**kwargs)
        self.entrypoint = entrypoint
        self.cluster = cluster
        self.runtime_env = runtime_env
        self.env_vars = env_vars
        self.submission_id = submission_id
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.timeout = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        self.log_tail_lines = log_tail_lines
        self.entrypoint_num_cpus = entrypoint_num_cpus
        self.job_id: str | None = None

    def _hook(self) -> RayJobHook:
        return RayJobHook.from_cluster(self.cluster)

    def _runtime_env(self) -> dict:
        env = dict(default_runtime_env() if self.runtime_env is None else self.runtime_env)
        if self.env_vars:
            bad = sorted(k for k, v in self.env_vars.items() if v is None)
            if bad:
                raise ValueError(f"env_vars {bad} are None: give them a string value or leave them out")
            env["env_vars"] = {**env.get("env_vars", {}), **{k: str(v) for k, v in self.env_vars.items()}}
        return env

    def execute(self, context: Context):
        ti = context["ti"]
        cluster = parse_cluster(self.cluster)
        hook = self._hook()
        map_index = getattr(ti, "map_index", -1)
        submission_id = self.submission_id or default_submission_id(
            ti.dag_id, ti.run_id, ti.task_id, map_index, ti.try_number)
        metadata = {"airflow_dag_id": ti.dag_id, "airflow_run_id": ti.run_id, "airflow_task_id": ti.task_id,
                    "airflow_map_index": str(map_index), "airflow_try_number": str(ti.try_number)}
        runtime_env = self._runtime_env()
        self.log.info("submitting Ray job %s to %s: %s (working_dir: %s)", submission_id, hook.dashboard_url,
                      self.entrypoint, runtime_env.get("working_dir", "none"))
        t0 = time.monotonic()
        kwargs = {} if self.entrypoint_num_cpus is None else {"entrypoint_num_cpus": self.entrypoint_num_cpus}
        self.job_id = (None if self.submission_id else self._previous_try_still_running(hook, ti, map_index)) \
            or hook.submit(self.entrypoint, submission_id, runtime_env, metadata, **kwargs)
        self.log.info("Ray job %s is on the cluster (%.1fs); dashboard: %s/#/jobs/%s", self.job_id,
                      time.monotonic() - t0, hook.dashboard_url, self.job_id)
        ti.xcom_push(key="ray_job_id", value=self.job_id)

        from operators.triggers import RayJobTrigger

        # an absolute deadline, so that a trigger that moves to another triggerer keeps the same limit
        deadline = time.time() + self.timeout if self.timeout else None
        trigger = RayJobTrigger(job_id=self.job_id, dashboard_url=hook.dashboard_url, env=cluster.get("env"),
                                poll_interval=self.poll_interval, deadline=deadline,
                                log_tail_lines=self.log_tail_lines)
        if self.deferrable:
            self.log.info("deferring: the triggerer follows Ray job %s and streams its logs here", self.job_id)
            self.defer(trigger=trigger, method_name="execute_complete")
        # not deferrable: the same watcher, run here (it logs through this process's logging)
        return self.execute_complete(context, asyncio.run(_first_event(trigger)))

    def _previous_try_still_running(self, hook: RayJobHook, ti, map_index: int) -> str | None:
        """The previous try's job if it is still running: its task died (worker lost, heartbeat timeout)
        but the job did not, so this retry follows it rather than starting a second copy beside it.
        A previous job that ended (failed, stopped, timed out) gets a fresh job under this try's id."""
        if ti.try_number <= 1:
            return None
        previous = default_submission_id(ti.dag_id, ti.run_id, ti.task_id, map_index, ti.try_number - 1)
        try:
            status = hook.status(previous)
        except RuntimeError:  # no such job (HTTP 404): the previous try never submitted
            return None
        if status in TERMINAL:
            return None
        self.log.warning("Ray job %s of the previous try is still %s: following it instead of submitting "
                         "a second copy", previous, status)
        return previous

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None):
        if not event:
            raise AirflowException("the Ray job trigger ended without an event; check the triggerer's log")
        self.job_id = job_id = event["job_id"]
        status = event["status"]
        if status == "SUCCEEDED":
            self.log.info("Ray job %s succeeded: %s", job_id, event.get("message", ""))
            return {"job_id": job_id, "status": status}
        if status == "TIMEOUT":
            # a retry submits a new job: do not leave this one running beside it
            try:
                self._hook().stop(job_id)
                self.log.warning("stopped Ray job %s after the timeout", job_id)
            except Exception as e:
                self.log.warning("could not stop Ray job %s after the timeout: %s", job_id, e)
        tail = event.get("log_tail") or []
        dashboard = parse_cluster(self.cluster)["dashboard_url"].rstrip("/")
        raise AirflowException(
            f"Ray job {job_id} {status}: {event.get('message') or 'no message from Ray'}\n"
            f"--- last {len(tail)} log lines of the job ---\n" + "\n".join(tail) + "\n--- end of job log ---\n"
            f"full log: {dashboard}/#/jobs/{job_id} or `ray job logs {job_id} --address {dashboard}`")

    def on_kill(self) -> None:
        """The task was killed while it waited in the worker (deferrable=False): stop the Ray job too."""
        if not self.job_id:
            return
        try:
            stopped = self._hook().stop(self.job_id)
            self.log.info("on_kill: Ray job %s %s", self.job_id, "stopping" if stopped else "was not running")
        except Exception as e:  # the task is being killed anyway; say why the job may still run
            self.log.warning("on_kill: could not stop Ray job %s: %s", self.job_id, e)


async def _first_event(trigger) -> dict:
    async for event in trigger.run():
        return event.payload
    return {}
