"""RayJobTrigger: follow one Ray job from the Airflow triggerer, streaming its log, until it ends.

    from triggers.ray_job import RayJobTrigger
    RayJobTrigger(job_id, dashboard_url, env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/tmp/.../token"},
                  conn_id="ray_jobs_default", poll_interval=5, deadline=time.time() + 3600)

It logs the job's new output lines as they are written (so they appear in the Airflow task log, prefixed
"[ray job <id>] "), checks the job's status every `poll_interval` seconds, and fires one event when the
job ends (JobStatus.is_terminal()) or the deadline passes:

    {"job_id": ..., "status": "SUCCEEDED" | "FAILED" | "STOPPED" | "TIMEOUT" | "ERROR",
     "message": Ray's message (or why the trigger gave up), "log_tail": [last log lines]}

Its kwargs (stored in the metadata database) hold no credential: the dashboard URL, the connection id
and at most the *path* of a token file. The token itself is resolved here, in the triggerer, by
RayJobHook (the file, or the `ray_jobs` connection from Airflow's Connections or secrets backend); an
env that carries the token inline is refused (trigger_env).

Nothing here blocks the triggerer's event loop: the connection is looked up asynchronously, the log
follows Ray's websocket tail, and the blocking Jobs API calls (status, full logs, stop) run in threads.
If the websocket fails, the trigger falls back to reading the whole log each poll and logging only what
is new. A trigger that is restarted on another triggerer starts the log from its first line again (its
kwargs cannot record how far it got).

Tests: `pytest -q tests/integration/test_ray_job_operator.py`, tests/unit/operators/test_hooks.py (kwargs).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import suppress
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from hooks.ray_jobs import RayJobHook, job_ended

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # Ray colours some of its own lines
# what of a cluster's driver env a trigger may carry: how to authenticate, never the token itself
_TRIGGER_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")


def trigger_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The part of a cluster's env that may go into trigger kwargs; ValueError if it holds the token itself."""
    env = dict(env or {})
    if env.get("RAY_AUTH_TOKEN"):
        raise ValueError(
            "the cluster's env holds the Ray auth token itself (RAY_AUTH_TOKEN), and trigger kwargs are "
            "stored in Airflow's metadata database: give the cluster a RAY_AUTH_TOKEN_PATH (a file the "
            "triggerer can read) or put the token in the ray_jobs connection (its password)"
        )
    return {k: env[k] for k in _TRIGGER_ENV if env.get(k)}


class RayJobTrigger(BaseTrigger):
    """Wait for a Ray job to end, streaming its log lines; see the module docstring for the event.

    :param dashboard_url: the cluster's Jobs API; None: the connection's host
    :param env: RAY_AUTH_MODE / RAY_AUTH_TOKEN_PATH of the cluster (see trigger_env)
    :param conn_id: the `ray_jobs` connection the hook may take its token (and URL) from
    :param kuberay: a KubeRay cluster's {name, namespace, conn_id}: the token is read from its Secret here
    :param deadline: wall-clock time (epoch seconds) after which a TIMEOUT event fires; the operator turns
        its `timeout` into a deadline so that a trigger that moves between triggerers keeps the same limit
    :param max_poll_failures: consecutive failed status checks (dashboard unreachable) before an ERROR event
    """

    def __init__(
        self,
        job_id: str,
        dashboard_url: str | None = None,
        env: dict[str, str] | None = None,
        poll_interval: float = 5.0,
        deadline: float | None = None,
        timeout: float | None = None,
        log_tail_lines: int = 40,
        max_poll_failures: int = 5,
        conn_id: str | None = RayJobHook.default_conn_name,
        kuberay: dict[str, str | None] | None = None,
    ):
        super().__init__()
        self.job_id = job_id
        self.dashboard_url = dashboard_url
        self.env = trigger_env(env)
        self.conn_id = conn_id
        self.kuberay = dict(kuberay) if kuberay else None  # a reference: the token is read in the triggerer
        self.poll_interval = float(poll_interval)
        self.deadline = deadline if deadline is not None else (time.time() + timeout if timeout else None)
        self.log_tail_lines = int(log_tail_lines)
        self.max_poll_failures = int(max_poll_failures)
        self._hook: RayJobHook | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "triggers.ray_job.RayJobTrigger",
            {
                "job_id": self.job_id,
                "dashboard_url": self.dashboard_url,
                "env": self.env,
                "conn_id": self.conn_id,
                "kuberay": self.kuberay,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "log_tail_lines": self.log_tail_lines,
                "max_poll_failures": self.max_poll_failures,
            },
        )

    def with_hook(self, hook: RayJobHook) -> RayJobTrigger:
        """Use a hook that is resolved already: the operator's, when it runs this trigger in the worker."""
        self._hook = hook
        return self

    async def _ahook(self) -> RayJobHook:
        if self._hook is None:
            hook = RayJobHook(self.dashboard_url, self.env, conn_id=self.conn_id, kuberay=self.kuberay)
            self._hook = await hook.aresolve()  # the connection lookup and masking, without blocking the loop
        return self._hook

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = await self._ahook()
        prefix = f"[ray job {self.job_id}] "
        tail: deque[str] = deque(maxlen=self.log_tail_lines)
        logged = 0  # lines of the job's log written to our log so far (the tail and the full log agree on order)

        def emit(line: str) -> None:
            nonlocal logged
            line = _ANSI.sub("", line).rstrip("\r")
            logged += 1
            tail.append(line)
            self.log.info("%s%s", prefix, line)

        async def follow() -> None:
            async for line in hook.tail(self.job_id):
                emit(line)

        async def catch_up() -> None:
            """Log what the full log has beyond what was logged: after the tail ended or failed."""
            with suppress(Exception):
                text = await asyncio.to_thread(hook.logs, self.job_id)
                lines = text.split("\n")
                if lines and lines[-1] == "":
                    lines.pop()
                for line in lines[logged:]:
                    emit(line)

        follower: asyncio.Task | None = None
        try:
            failures, last_status, tail_lost = 0, None, False
            while True:
                try:
                    info = await asyncio.to_thread(hook.info, self.job_id)
                    failures = 0
                except Exception as e:
                    failures += 1
                    if failures >= self.max_poll_failures:
                        yield self._event(
                            "ERROR",
                            f"could not read the job's status {failures} times in a row from {hook.dashboard_url}: {e}",
                            tail,
                        )
                        return
                    self.log.warning(
                        "Ray job %s: status check failed (%d/%d): %s", self.job_id, failures, self.max_poll_failures, e
                    )
                    await asyncio.sleep(self.poll_interval)
                    continue
                status = str(info.status)
                if status != last_status:
                    self.log.info("Ray job %s is %s: %s", self.job_id, status, _short(info.message))
                    last_status = status
                if follower is None:  # hook.info made the client: start following the log
                    follower = asyncio.create_task(follow())
                elif follower.done() and not job_ended(status):
                    # the websocket closed or failed before the job ended: read the full log each poll
                    if not tail_lost:
                        error = None if follower.cancelled() else follower.exception()
                        self.log.warning(
                            "Ray job %s: log tail ended early (%s); reading the full log each poll",
                            self.job_id,
                            error or "closed",
                        )
                        tail_lost = True
                    await catch_up()
                ended = job_ended(status)
                if ended or (self.deadline is not None and time.time() >= self.deadline):
                    # the log file is complete once the job has ended: read the rest of it from the full log
                    # rather than wait for the websocket to drain and close (seconds on a busy head)
                    await _cancel(follower)
                    await catch_up()
                    if ended:
                        yield self._event(status, _short(info.message), tail)
                    else:
                        yield self._event(
                            "TIMEOUT",
                            f"still {status} when the deadline passed (Ray: {_short(info.message) or 'no message'})",
                            tail,
                        )
                    return
                wait = self.poll_interval
                if self.deadline is not None:
                    wait = max(0.0, min(wait, self.deadline - time.time()))
                await asyncio.sleep(wait)
        finally:
            await _cancel(follower)

    def _event(self, status: str, message: str, tail: deque[str]) -> TriggerEvent:
        self.log.info("Ray job %s: %s event (%s)", self.job_id, status, message or "no message")
        return TriggerEvent({"job_id": self.job_id, "status": status, "message": message, "log_tail": list(tail)})

    async def on_kill(self) -> None:
        """The user killed the deferred task (mark failed/success, clear): stop the job as well."""
        hook = await self._ahook()
        stopped = await asyncio.wait_for(asyncio.to_thread(hook.stop, self.job_id), timeout=30)
        self.log.info(
            "Ray job %s: %s after the task was killed", self.job_id, "stopping" if stopped else "was not running"
        )


def _short(message: str | None) -> str:
    """Ray's status message without the copy of the log it appends to failures (the lines are logged anyway)."""
    first = (message or "").strip().split("\n", 1)[0]
    return re.sub(r",? *last available logs.*$", "", first)


async def _cancel(task: asyncio.Task | None) -> None:
    if task is not None and not task.done():
        task.cancel()
        with suppress(BaseException):
            await task
