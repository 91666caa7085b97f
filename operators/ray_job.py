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
({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": ...}, see tasks.rl.cluster.start_local_head); a KubeRay
cluster's `kuberay` reference ({name, namespace, conn_id}) has the hook and the trigger read its token from
the cluster's Secret (hooks/kuberay.py auth_token); a
`ray_jobs` connection (conn_id, default `ray_jobs_default`; hooks/ray_jobs.py) may give the dashboard URL
and the token instead, e.g. for a long-lived cluster. The token never goes into XCom or the trigger's
kwargs: the trigger gets the URL, the connection id and at most the token file's path, and resolves the
token itself in the triggerer.

Tests: `pytest -q tests/integration/test_ray_job_operator.py` (starts its own local Ray head).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException

from hooks.ray_jobs import RayJobHook, job_ended, parse_cluster

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# Ray zips and uploads the working_dir once per content hash (limit 512 MiB, RAY_max_grpc_message_size;
# it warns at half that). Patterns are gitignore-style, relative to the working_dir; Ray also honours
# the project's .gitignore. What is left is the source and include/ (well under 1 MiB).
DEFAULT_EXCLUDES = [".venv", "runs", ".git", ".stack", "tests", "bench", "__pycache__", "*.pyc", "*.log"]


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
    :param conn_id: a `ray_jobs` connection for what the cluster description leaves out (the dashboard URL,
        the token); the default one is used only if it is defined. None: the cluster description alone
    """

    template_fields = ("entrypoint", "cluster", "runtime_env", "env_vars", "submission_id")
    template_fields_renderers = {"runtime_env": "json", "env_vars": "json", "cluster": "json"}
    ui_color = "#cfe3ff"

    def __init__(
        self,
        *,
        entrypoint: str,
        cluster: Any,
        runtime_env: dict | None = None,
        env_vars: dict[str, str] | None = None,
        submission_id: str | None = None,
        deferrable: bool = True,
        poll_interval: float = 5.0,
        timeout: float | timedelta | None = None,
        log_tail_lines: int = 40,
        entrypoint_num_cpus: float | None = None,
        conn_id: str | None = RayJobHook.default_conn_name,
        **kwargs,
    ):
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
        self.conn_id = conn_id
        self.job_id: str | None = None

    def _hook(self) -> RayJobHook:
        return RayJobHook.from_cluster(self.cluster, conn_id=self.conn_id)

    def _runtime_env(self) -> dict:
        env = dict(default_runtime_env() if self.runtime_env is None else self.runtime_env)
        if self.env_vars:
            bad = sorted(k for k, v in self.env_vars.items() if v is None)
            if bad:
                raise ValueError(f"env_vars {bad} are None: give them a string value or leave them out")
            env["env_vars"] = {**env.get("env_vars", {}), **{k: str(v) for k, v in self.env_vars.items()}}
        return env

    def execute(self, context: Context):
        from triggers.ray_job import RayJobTrigger, trigger_env  # the trigger's module only when a task runs

        ti = context["ti"]
        # refuse an inline token before anything runs: it could not travel to the triggerer
        env = trigger_env(parse_cluster(self.cluster).get("env"))
        hook = self._hook()
        map_index = getattr(ti, "map_index", -1)
        submission_id = self.submission_id or default_submission_id(
            ti.dag_id, ti.run_id, ti.task_id, map_index, ti.try_number
        )
        metadata = {
            "airflow_dag_id": ti.dag_id,
            "airflow_run_id": ti.run_id,
            "airflow_task_id": ti.task_id,
            "airflow_map_index": str(map_index),
            "airflow_try_number": str(ti.try_number),
        }
        runtime_env = self._runtime_env()
        self.log.info(
            "submitting Ray job %s to %s: %s (working_dir: %s)",
            submission_id,
            hook.dashboard_url,
            self.entrypoint,
            runtime_env.get("working_dir", "none"),
        )
        t0 = time.monotonic()
        kwargs = {} if self.entrypoint_num_cpus is None else {"entrypoint_num_cpus": self.entrypoint_num_cpus}
        self.job_id = (
            None if self.submission_id else self._previous_try_still_running(hook, ti, map_index)
        ) or hook.submit(self.entrypoint, submission_id, runtime_env, metadata, **kwargs)
        self.log.info(
            "Ray job %s is on the cluster (%.1fs); dashboard: %s/#/jobs/%s",
            self.job_id,
            time.monotonic() - t0,
            hook.dashboard_url,
            self.job_id,
        )
        ti.xcom_push(key="ray_job_id", value=self.job_id)

        # an absolute deadline, so that a trigger that moves to another triggerer keeps the same limit
        deadline = time.time() + self.timeout if self.timeout else None
        trigger = RayJobTrigger(
            job_id=self.job_id,
            dashboard_url=hook.dashboard_url,
            env=env,
            conn_id=self.conn_id,
            kuberay=parse_cluster(self.cluster).get("kuberay"),  # a reference; the triggerer reads the token
            poll_interval=self.poll_interval,
            deadline=deadline,
            log_tail_lines=self.log_tail_lines,
        )
        if self.deferrable:
            self.log.info("deferring: the triggerer follows Ray job %s and streams its logs here", self.job_id)
            self.defer(trigger=trigger, method_name="execute_complete")
        # not deferrable: the same watcher, run here (it logs through this process's logging)
        return self.execute_complete(context, asyncio.run(_first_event(trigger.with_hook(hook))))

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
        if job_ended(status):
            return None
        self.log.warning(
            "Ray job %s of the previous try is still %s: following it instead of submitting a second copy",
            previous,
            status,
        )
        return previous

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None):
        if not event:
            raise AirflowException("the Ray job trigger ended without an event; check the triggerer's log")
        self.job_id = job_id = event["job_id"]
        status = event["status"]
        if status == "SUCCEEDED":
            self.log.info("Ray job %s succeeded: %s", job_id, event.get("message", ""))
            return {"job_id": job_id, "status": status}
        hook = self._hook()
        if status == "TIMEOUT":
            # a retry submits a new job: do not leave this one running beside it
            try:
                hook.stop(job_id)
                self.log.warning("stopped Ray job %s after the timeout", job_id)
            except Exception as e:
                self.log.warning("could not stop Ray job %s after the timeout: %s", job_id, e)
        tail = event.get("log_tail") or []
        dashboard = hook.dashboard_url
        raise AirflowException(
            f"Ray job {job_id} {status}: {event.get('message') or 'no message from Ray'}\n"
            f"--- last {len(tail)} log lines of the job ---\n" + "\n".join(tail) + "\n--- end of job log ---\n"
            f"full log: {dashboard}/#/jobs/{job_id} or `ray job logs {job_id} --address {dashboard}`"
        )

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
