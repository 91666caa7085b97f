"""RayJobHook: the Ray Jobs API (a `JobSubmissionClient`) of one cluster, authenticated with its token.

    from hooks.ray_jobs import RayJobHook, job_ended

    hook = RayJobHook.from_cluster(setup_xcom)     # {"dashboard_url", "env": {RAY_AUTH_MODE, RAY_AUTH_TOKEN_PATH}}
    hook = RayJobHook()                            # everything from the `ray_jobs_default` connection
    job_id = hook.submit("python -m tasks ...", "my-submission-id", runtime_env={})
    job_ended(hook.status(job_id))                 # Ray's own JobStatus.is_terminal()

Connection (conn_type `ray_jobs`, default conn_id `ray_jobs_default`; optional, see hooks/base.py):
  host      the dashboard (Jobs API) URL, "http://ray-head:8265"; or a bare host, with port (default 8265)
            and schema (http or https, default http)
  password  the cluster's Ray auth token (or extra {"auth_token": ...})
e.g. AIRFLOW_CONN_RAY_JOBS_DEFAULT='ray-jobs://:TOKEN@ray-head:8265' or
     AIRFLOW_CONN_RAY_JOBS_DEFAULT='{"conn_type": "ray_jobs", "host": "http://ray-head:8265", "password": "TOKEN"}'

What wins: a dashboard URL given to the hook (the cluster description of the setup task) over the
connection's host; a token from the cluster's env (RAY_AUTH_TOKEN, then the file at RAY_AUTH_TOKEN_PATH,
as in tasks.rl.cluster.start_local_head), then a KubeRay cluster's own (the description's `kuberay`
reference {name, namespace, conn_id}: read from the cluster's Secret through hooks.kuberay.KubeRayHook
when the hook resolves, so that it never travels in XCom or trigger kwargs), over the connection's. The connection's token is only sent to
the connection's own host (or to any dashboard when the connection names no host): a connection for one
cluster never hands its token to another. With no token at all there is no header, and the Ray client
falls back to this process's own Ray auth settings.

The token travels as an explicit `Authorization: Bearer` header rather than through this process's
environment: Ray reads its own auth settings once per process, and an Airflow worker or triggerer may
talk to several clusters with different tokens. It is registered with Airflow's secrets masker; in a
triggerer, call `await hook.aresolve()` first so that the connection lookup and the masking do not block
the event loop. Nothing is looked up or connected when the hook is made: the connection on first use,
the client (two HTTP requests: connection and Ray version checks) on first call.

Tests: tests/unit/operators/test_hooks.py (connections), tests/integration/test_ray_job_operator.py (a real head).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hooks.base import OptionalConnectionHook

DEFAULT_DASHBOARD_PORT = 8265


def job_ended(status: Any) -> bool:
    """Whether a Ray job status (JobStatus or its name) is terminal, by Ray's own definition."""
    from ray.job_submission import JobStatus

    return JobStatus(str(status)).is_terminal()


def parse_cluster(cluster: Any) -> dict:
    """A cluster description as a dict; a templated XCom may arrive as JSON or as a bare dashboard URL."""
    if cluster is None:
        return {}
    if isinstance(cluster, str):
        text = cluster.strip()
        if text.startswith("{"):
            try:
                cluster = json.loads(text)
            except json.JSONDecodeError:
                import ast  # a Jinja-rendered dict is its Python repr, not JSON

                cluster = ast.literal_eval(text)
        else:
            cluster = {"dashboard_url": text} if text else {}
    if not isinstance(cluster, Mapping):
        raise ValueError(
            f"cluster {cluster!r} is not a cluster description: pass the cluster-setup task's "
            "output ({'dashboard_url': ..., 'env': {...}}) or a dashboard URL"
        )
    return dict(cluster)


def _env_token(env: Mapping[str, str]) -> str | None:
    """The token a driver of the cluster would use: RAY_AUTH_TOKEN, then the file at RAY_AUTH_TOKEN_PATH (Ray's order)."""
    token = env.get("RAY_AUTH_TOKEN")
    path = env.get("RAY_AUTH_TOKEN_PATH")
    if not token and path:
        try:
            token = Path(path).read_text().strip()
        except OSError as e:
            raise ValueError(
                f"cannot read the Ray auth token file {path!r} named by the cluster's env "
                f"({e.strerror}); pass the env of a running head (tasks.rl.cluster.LocalHead.env) "
                "or put the token in the ray_jobs connection"
            ) from None
    return token or None


def connection_url(conn) -> str | None:
    """The Jobs API URL a ray_jobs connection names, or None when it has no host."""
    if not conn.host:
        return None
    host = conn.host.strip().rstrip("/")
    if "://" in host:  # a whole URL: its own port (or the scheme's default), unless the connection sets one
        return host if conn.port is None or urlsplit(host).port is not None else f"{host}:{conn.port}"
    scheme = conn.schema if conn.schema in ("http", "https") else "http"
    return f"{scheme}://{host}:{conn.port or DEFAULT_DASHBOARD_PORT}"


def _connection_token(conn) -> str | None:
    if conn.password:
        return conn.password
    try:
        extra = json.loads(conn.extra) if conn.extra else {}
    except json.JSONDecodeError:
        raise ValueError(
            f"connection {conn.conn_id!r}: extra is not JSON; give the token as the password, "
            'or extra {"auth_token": "..."}'
        ) from None
    return extra.get("auth_token") or None


class RayJobHook(OptionalConnectionHook):
    """Submit, follow and stop Ray jobs on one cluster (see the module docstring for connections and auth).

    :param dashboard_url: the cluster's Jobs API, e.g. the setup task's "dashboard_url"; None: the connection's host
    :param env: the driver env of the cluster (RAY_AUTH_MODE, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN)
    :param conn_id: a `ray_jobs` connection; None: none (only the explicit arguments)
    :param kuberay: a KubeRay cluster's {name, namespace, conn_id} (the setup task's `kuberay`): its token is read
        from the cluster's Secret when the hook resolves
    """

    default_conn_name = "ray_jobs_default"
    conn_type = "ray_jobs"
    hook_name = "Ray Jobs"

    def __init__(
        self,
        dashboard_url: str | None = None,
        env: Mapping[str, str] | None = None,
        *,
        conn_id: str | None = default_conn_name,
        kuberay: Mapping[str, str | None] | None = None,
        logger_name: str | None = None,
    ):
        super().__init__(conn_id, logger_name=logger_name)
        self._given_url = dashboard_url.rstrip("/") if dashboard_url else None
        self._kuberay = dict(kuberay) if kuberay else None
        self._token_required = (env or {}).get("RAY_AUTH_MODE") == "token"
        self._env_token = _env_token(env or {})
        self._auth: tuple[str, dict[str, str]] | None = None  # (dashboard URL, headers) once resolved
        self._client = None

    @classmethod
    def from_cluster(cls, cluster: Any, **kwargs) -> RayJobHook:
        c = parse_cluster(cluster)
        return cls(c.get("dashboard_url"), c.get("env"), kuberay=c.get("kuberay"), **kwargs)

    def __repr__(self) -> str:  # never the token
        where = self._auth[0] if self._auth else (self._given_url or f"connection {self.conn_id}")
        auth = ("token" if self._auth[1] else "process default") if self._auth else "not resolved yet"
        return f"RayJobHook({where!r}, auth={auth})"

    # -- connection and token ----------------------------------------------------------------------
    def _cluster_token(self) -> str | None:
        """A KubeRay cluster's token, from its Secret (None: not a KubeRay cluster, or its auth is off)."""
        if not self._kuberay or self._env_token is not None:
            return None
        from hooks.kuberay import referenced_token

        token = referenced_token(self._kuberay)
        if token:
            self._token_required = True  # the cluster's auth is on: never fall back to no header
        return token

    def _settle(self, conn, cluster_token: str | None = None) -> str | None:
        """Fix the URL and headers from the arguments and `conn`; returns the token, for the caller to mask."""
        conn_url = connection_url(conn) if conn is not None else None
        url = self._given_url or conn_url
        if not url:
            raise ValueError(
                f"no Ray dashboard URL: the cluster description has none and connection {self.conn_id!r} "
                "is not defined or has no host. Start the head with a dashboard port (start_local_head(..., "
                "dashboard_port=8265)), or define the connection (AIRFLOW_CONN_RAY_JOBS_DEFAULT)"
            )
        token = self._env_token or cluster_token
        if token is None and conn is not None:
            conn_token = _connection_token(conn)
            if conn_token and conn_url and conn_url != url:
                self.log.warning(
                    "connection %r is for %s, not %s: its token is not sent there", conn.conn_id, conn_url, url
                )
            else:
                token = conn_token
        if token is None and self._token_required:
            raise ValueError(
                "the cluster's env says RAY_AUTH_MODE=token but gives no token: add RAY_AUTH_TOKEN_PATH "
                f"(a file holding the token) or put the token in connection {self.conn_id or 'ray_jobs_default'!r}"
            )
        self._auth = (url, {"Authorization": f"Bearer {token}"} if token else {})
        return token

    def resolve(self) -> RayJobHook:
        """Look up the connection and fix URL and token (once); workers and scripts. Returns self."""
        if self._auth is None:
            token = self._settle(self.optional_connection(), self._cluster_token())
            if token:
                from airflow.sdk.log import mask_secret

                mask_secret(token)
        return self

    async def aresolve(self) -> RayJobHook:
        """resolve() for an event loop (the triggerer): the lookup and the masking must not block it."""
        if self._auth is None:
            cluster_token = await asyncio.to_thread(self._cluster_token)  # the kubernetes client blocks
            token = self._settle(await self.aoptional_connection(), cluster_token)
            if token:
                from airflow.sdk.log import amask_secret

                await amask_secret(token)
        return self

    @property
    def dashboard_url(self) -> str:
        return self.resolve()._auth[0]

    # -- the Jobs API ------------------------------------------------------------------------------
    def get_conn(self):
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            url, headers = self.resolve()._auth
            # Ray prefers RAY_API_SERVER_ADDRESS / RAY_ADDRESS from the environment over the address it is
            # given; this hook was given its cluster's Jobs API explicitly, so that one wins
            saved = {k: os.environ.pop(k, None) for k in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")}
            try:
                # a copy: the client adds to the dict it is given
                self._client = JobSubmissionClient(url, headers=dict(headers))
            finally:
                os.environ.update({k: v for k, v in saved.items() if v is not None})
        return self._client

    def submit(
        self,
        entrypoint: str,
        submission_id: str,
        runtime_env: dict | None = None,
        metadata: dict[str, str] | None = None,
        agent_wait_s: float = 60.0,
        **kwargs,
    ) -> str:
        """Submit the job; if one with this submission_id exists already, return it (a retried call re-attaches).

        A head that has just started answers "No available agent to submit job" until its dashboard
        agent registers (the server itself waits 10 s; on a busy 2-core machine that was not enough), so
        that answer is retried for up to `agent_wait_s` seconds.
        """
        client = self.get_conn()
        deadline = time.monotonic() + agent_wait_s
        while True:
            try:
                return client.submit_job(
                    entrypoint=entrypoint,
                    submission_id=submission_id,
                    runtime_env=runtime_env,
                    metadata=metadata,
                    **kwargs,
                )
            except RuntimeError as submit_error:
                if "No available agent" in str(submit_error):
                    if time.monotonic() < deadline:
                        self.log.info(
                            "the Ray job agent on %s is not up yet; retrying the submission in 2 s", self.dashboard_url
                        )
                        time.sleep(2)
                        continue
                    raise RuntimeError(
                        f"the Ray head at {self.dashboard_url} has no job agent after {agent_wait_s:.0f} s. Every "
                        "head's agent listens on port 52365 by default: if another Ray head runs on this machine, "
                        "start this one with `ray start ... --dashboard-agent-listen-port=<free port>` (see its "
                        "logs/dashboard_agent.log)"
                    ) from submit_error
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
        await self.aresolve()
        client = await asyncio.to_thread(self.get_conn)
        pending = ""
        async for chunk in client.tail_job_logs(job_id):
            pending += chunk
            *lines, pending = pending.split("\n")
            for line in lines:
                yield line
        if pending:
            yield pending
