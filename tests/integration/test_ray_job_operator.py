"""RayJobHook, RayJobTrigger and RayJobOperator against one real local Ray head (token auth, dashboard).

    pytest -q tests/integration/test_ray_job_operator.py      # ~1 minute on 2 cores

The head gets its own token, different from the one tests/integration/conftest.py puts in this process's
environment: every call here authenticates with the cluster's `env` (an explicit header), not with
whatever Ray auth settings the calling process happens to have. Jobs are tiny shell / `python -c`
commands with an empty runtime_env, except one that uses the default working_dir (this project).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

# before anything imports airflow: a throwaway home, no example DAGs
os.environ.setdefault("AIRFLOW_HOME", "/tmp/eg-rayjob-airflow")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

import structlog.testing
from airflow.sdk.exceptions import AirflowException, TaskDeferred

from hooks.ray_jobs import RayJobHook, job_ended
from operators.ray_job import RayJobOperator, default_submission_id
from triggers.ray_job import RayJobTrigger

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _OwnAgentPort:
    """The subprocess module for start_local_head, with `ray start` given a free dashboard-agent port.

    Every Ray head's job agent listens on 52365 unless told otherwise, so a second head with a dashboard
    on the same machine (another test run, a local stack) has no job agent: each submission then waits
    10 s and fails with "No available agent to submit job". start_local_head does not pass
    --dashboard-agent-listen-port yet; once it does, this adds nothing.
    """

    def __getattr__(self, name):
        return getattr(subprocess, name)

    @staticmethod
    def run(cmd, *args, **kwargs):
        if "start" in cmd and not any(str(c).startswith("--dashboard-agent-listen-port") for c in cmd):
            cmd = [*cmd, f"--dashboard-agent-listen-port={_free_port()}"]
        return subprocess.run(cmd, *args, **kwargs)


@pytest.fixture(scope="module")
def cluster():
    """One head for this module, as the cluster-setup task would describe it."""
    from tasks.rl import cluster as cluster_module
    from tasks.rl.cluster import start_local_head

    # start_local_head reuses a token this process already holds (conftest.py gives it one, for ray.init);
    # hide it so that this head gets its own and the hook must authenticate with the cluster's env
    held = {k: os.environ.pop(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN") if k in os.environ}
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(cluster_module, "subprocess", _OwnAgentPort())
            head = start_local_head(
                f"/tmp/eg-rj-{secrets.token_hex(2)}", port=_free_port(), num_cpus=1, dashboard_port=_free_port()
            )
    finally:
        os.environ.update(held)
    assert head.env["RAY_AUTH_TOKEN_PATH"].startswith(head.temp_dir), head.env
    try:
        desc = {"address": head.address, "dashboard_url": head.dashboard_url, "env": head.env}
        deadline = time.monotonic() + 60
        while True:  # the dashboard's HTTP server may come up a moment after `ray start` returns
            try:
                hook = RayJobHook.from_cluster(desc)
                hook.get_conn()
                break
            except ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        # one probe job: the head's job agent registers late on a loaded machine, and a head whose agent
        # never comes up should fail here once, with its logs, not in every test
        try:
            probe = hook.submit("true", "probe", runtime_env={}, agent_wait_s=90)
            _wait_status(hook, probe, {"SUCCEEDED"}, timeout=60)
        except Exception as e:
            logs = sorted(Path(head.temp_dir).glob("session_latest/logs/dashboard_agent*.log"))
            tail = "".join(p.read_text()[-3000:] for p in logs)
            raise RuntimeError(f"the Ray head at {head.dashboard_url} does not run jobs: {e}\n{tail}") from e
        yield desc
    finally:
        head.stop(timeout=5)  # a test head: stragglers that ignore SIGTERM are killed sooner
        shutil.rmtree(head.temp_dir, ignore_errors=True)


@pytest.fixture
def hook(cluster):
    return RayJobHook.from_cluster(cluster)


class TI:
    """The part of a RuntimeTaskInstance the operator uses (ids and xcom_push)."""

    def __init__(self, task_id: str, try_number: int = 1, map_index: int = -1):
        self.dag_id, self.run_id, self.task_id = "test_ray_job", f"manual__{secrets.token_hex(4)}", task_id
        self.try_number, self.map_index, self.xcoms = try_number, map_index, {}

    def xcom_push(self, key, value):
        self.xcoms[key] = value


def _context(task_id: str, **kw) -> dict:
    return {"ti": TI(task_id, **kw)}


async def _events(trigger: RayJobTrigger) -> list:
    return [e.payload async for e in trigger.run()]


def _wait_status(hook: RayJobHook, job_id: str, want: set[str] | None = None, timeout: float = 30) -> str:
    """Poll until the job's status is in `want` (None: until it has ended, by Ray's JobStatus.is_terminal)."""
    deadline = time.monotonic() + timeout
    while True:
        status = hook.status(job_id)
        if (status in want) if want else job_ended(status):
            return status
        assert time.monotonic() < deadline, f"job {job_id} still {status}, wanted {want or 'an end'}"
        time.sleep(0.3)


def _sid(name: str) -> str:
    return f"test-{name}-{secrets.token_hex(3)}"


def test_trigger_streams_lines_while_job_runs_then_fires_succeeded(hook, cluster, tmp_path):
    # event-driven, no sleep decides it: the job prints its lines, then waits for a file that the test
    # creates only once the trigger has logged the last line, so the lines are streamed while it runs
    release = tmp_path / "release"
    code = (
        "import os, sys, time\nfor i in range(3):\n    print('eg-line', i, flush=True)\n"
        "deadline = time.time() + 120\n"
        f"while not os.path.exists({str(release)!r}) and time.time() < deadline:\n    time.sleep(0.05)\n"
        f"sys.exit(0 if os.path.exists({str(release)!r}) else 3)"
    )
    job_id = hook.submit(f'python -c "{code}"', _sid("ok"), runtime_env={})
    trigger = RayJobTrigger(job_id, cluster["dashboard_url"], cluster["env"], poll_interval=0.3, timeout=150)
    last_line = f"[ray job {job_id}] eg-line 2"

    async def follow_then_release(logs: list[dict]) -> list:
        events = asyncio.create_task(_events(trigger))
        while not any(r["event"] == last_line for r in logs):
            assert not events.done(), f"the trigger ended before streaming the job's lines: {events.result()}"
            await asyncio.sleep(0.05)
        assert not events.done(), "the trigger fired before the job was released"
        release.touch()
        return await asyncio.wait_for(events, timeout=120)

    with structlog.testing.capture_logs() as logs:
        events = asyncio.run(follow_then_release(logs))

    assert len(events) == 1
    event = events[0]
    assert event["job_id"] == job_id and event["status"] == "SUCCEEDED", event
    messages = [r["event"] for r in logs]
    streamed = [m for m in messages if m.startswith(f"[ray job {job_id}] eg-line")]
    assert streamed == [f"[ray job {job_id}] eg-line {i}" for i in range(3)], messages
    done = next(i for i, m in enumerate(messages) if m.startswith(f"Ray job {job_id} is SUCCEEDED"))
    assert messages.index(streamed[-1]) < done, messages
    assert [f"eg-line {i}" for i in range(3)] == [line for line in event["log_tail"] if line.startswith("eg-line")]


def test_failed_job_fails_the_task_with_its_last_log_lines(cluster):
    op = RayJobOperator(
        task_id="fails",
        cluster=cluster,
        runtime_env={},
        deferrable=False,
        poll_interval=0.3,
        entrypoint="python -c \"import sys; print('bad reward shape: expected 8 got 7'); sys.exit(1)\"",
    )
    ctx = _context("fails")
    with pytest.raises(AirflowException) as err:
        op.execute(ctx)
    text = str(err.value)
    job_id = ctx["ti"].xcoms["ray_job_id"]
    assert f"Ray job {job_id} FAILED" in text, text
    assert "bad reward shape: expected 8 got 7" in text  # the task log says why
    assert cluster["dashboard_url"] in text


def test_same_submission_id_twice_is_one_job(hook):
    sid = _sid("dup")
    first = hook.submit("echo once", sid, runtime_env={})
    second = hook.submit("echo once", sid, runtime_env={})  # a retried call re-attaches
    assert first == second == sid
    assert [j.submission_id for j in hook.get_conn().list_jobs()].count(sid) == 1


def test_execute_defers_to_a_trigger_that_round_trips_and_completes(cluster):
    op = RayJobOperator(
        task_id="defers",
        cluster=cluster,
        runtime_env={},
        env_vars={"EG_GREETING": "hi"},
        entrypoint="echo greeting=$EG_GREETING",
        poll_interval=0.3,
        timeout=120,
    )
    ctx = _context("defers", try_number=2, map_index=3)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    ti = ctx["ti"]
    job_id = ti.xcoms["ray_job_id"]
    assert job_id == default_submission_id(ti.dag_id, ti.run_id, "defers", 3, 2)
    assert deferred.value.method_name == "execute_complete"
    trigger = deferred.value.trigger
    assert isinstance(trigger, RayJobTrigger) and trigger.job_id == job_id

    classpath, kwargs = trigger.serialize()
    module, name = classpath.rsplit(".", 1)
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)  # what the triggerer does
    assert rebuilt.serialize() == (classpath, kwargs)
    assert kwargs["deadline"] == pytest.approx(time.time() + 120, abs=30)

    [event] = asyncio.run(_events(rebuilt))
    assert "greeting=hi" in event["log_tail"]
    fresh = RayJobOperator(task_id="defers", cluster=cluster, entrypoint="unused")  # resumed in a new process
    assert fresh.execute_complete(ctx, event) == {"job_id": job_id, "status": "SUCCEEDED"}


def test_submission_id_is_per_task_try():
    same = default_submission_id("d", "manual__2026-01-01T00:00:00+00:00", "t", -1, 1)
    assert same == default_submission_id("d", "manual__2026-01-01T00:00:00+00:00", "t", -1, 1)
    assert same != default_submission_id("d", "manual__2026-01-01T00:00:00+00:00", "t", -1, 2)
    assert same != default_submission_id("d", "manual__2026-01-01T00:00:00+00:00", "t", 0, 1)
    assert ":" not in same and "+" not in same


def test_on_kill_stops_the_job_and_so_does_the_triggers(hook, cluster):
    op = RayJobOperator(task_id="killed", cluster=cluster, runtime_env={}, entrypoint="sleep 60")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(_context("killed"))
    other = hook.submit("sleep 60", _sid("trigger-kill"), runtime_env={})
    _wait_status(hook, op.job_id, {"RUNNING"})
    _wait_status(hook, other, {"RUNNING"})

    op.on_kill()  # the worker-side kill (deferrable=False, or killed before deferring)
    trigger = RayJobTrigger(other, cluster["dashboard_url"], cluster["env"])
    asyncio.run(trigger.on_kill())  # the user killed the deferred task: the triggerer's kill
    assert deferred.value.trigger.job_id == op.job_id
    assert _wait_status(hook, op.job_id) == "STOPPED"
    assert _wait_status(hook, other) == "STOPPED"


def test_trigger_times_out_and_the_operator_stops_the_job(hook, cluster):
    job_id = hook.submit("echo started; sleep 60", _sid("slow"), runtime_env={})
    t0 = time.monotonic()
    trigger = RayJobTrigger(job_id, cluster["dashboard_url"], cluster["env"], poll_interval=0.5, timeout=3)
    [event] = asyncio.run(_events(trigger))
    assert event["status"] == "TIMEOUT" and event["job_id"] == job_id, event
    assert time.monotonic() - t0 < 30  # 3 s deadline; slack for a loaded machine
    op = RayJobOperator(task_id="slow", cluster=cluster, entrypoint="unused")
    with pytest.raises(AirflowException, match=f"Ray job {job_id} TIMEOUT"):
        op.execute_complete(_context("slow"), event)
    assert _wait_status(hook, job_id) == "STOPPED"


def test_default_working_dir_makes_the_project_importable(cluster):
    op = RayJobOperator(
        task_id="project",
        cluster=cluster,
        deferrable=False,
        poll_interval=0.5,
        entrypoint="python -c \"import tasks.config; print('config from', tasks.config.__file__)\"",
    )
    assert op.execute(_context("project"))["status"] == "SUCCEEDED"


def test_wrong_token_is_refused_without_echoing_it(cluster):
    from ray.exceptions import AuthenticationError

    wrong = secrets.token_hex(16)
    with pytest.raises(AuthenticationError) as err:
        RayJobHook(cluster["dashboard_url"], {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": wrong}).get_conn()
    real = Path(cluster["env"]["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    assert wrong not in str(err.value) and real not in str(err.value)
    assert real not in repr(RayJobHook.from_cluster(cluster))
    with pytest.raises(ValueError, match="RAY_AUTH_TOKEN_PATH"):
        RayJobHook(cluster["dashboard_url"], {"RAY_AUTH_MODE": "token"}).get_conn()
