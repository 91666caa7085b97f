"""What the e2e tests read from and do to a running stack: a run's task states, directory and Ray processes, the
sockets its processes listen on, and the fault drill that SIGKILLs a run's Ray head mid-GRPO."""

from __future__ import annotations

import ipaddress
import json
import time

from tasks.rl.cluster import LocalHead, local_temp_dir

DAG = "continuous_post_training"


def states(client, run_id: str, dag_id: str = DAG) -> dict:
    tis = client.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=100")["task_instances"]
    return {t["task_id"] + (f"[{t['map_index']}]" if t.get("map_index", -1) >= 0 else ""): t["state"] for t in tis}


def ray_pids(run_id: str) -> list[int]:
    """The processes of the run's local Ray head (found by its temp dir, as teardown finds them)."""
    return LocalHead("", local_temp_dir(f"{DAG}/{run_id}"), None, {}).pids()


def described(pids: list[int]) -> list[str]:
    """`pid name cmdline` of each process still there: what an assertion on leftovers should show."""
    import psutil

    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out.append(f"{pid} {p.name()} {' '.join(p.cmdline())[:200]} (started {time.ctime(p.create_time())})")
        except psutil.Error:
            out.append(f"{pid} (gone)")
    return out


def exposed(stack) -> list[tuple]:
    """Listening sockets of the stack's processes that are not on loopback."""
    return [s for s in stack.listening() if not ipaddress.ip_address(s[2].removeprefix("::ffff:")).is_loopback]


def run_dir(stack, run_id: str):
    for path in (stack.runs_root / DAG).glob("*/run.json"):
        if json.loads(path.read_text())["run_id"] == run_id:
            return path.parent
    return None


def kill_head(run_id: str) -> list[str]:
    """SIGKILL the run's Ray head node (its GCS and raylet), as a lost head machine would; the dashboard,
    the workers, the engines and the job's driver are left to notice (teardown must end what remains)."""
    import psutil

    killed = []
    for pid in ray_pids(run_id):
        try:
            proc = psutil.Process(pid)
            if proc.name() in ("gcs_server", "raylet"):
                proc.kill()
                killed.append(proc.name())
        except psutil.NoSuchProcess:
            continue
    return killed


def next_run(client, since: str, timeout: float = 300) -> str:
    """The id of the first run of the DAG queued at or after `since` (an ISO time)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        runs = [r for r in client.runs(DAG) if (r.get("queued_at") or "") >= since]
        if runs:
            return runs[-1]["dag_run_id"]
        time.sleep(1)
    raise TimeoutError(f"no {DAG} run queued after {since} within {timeout} s")


def head_kill_drill(stack, run_id: str, timeout: float = 1200) -> dict:
    """Watch the run: while its GRPO task is deferred, SIGKILL the scheduler and the triggerer and start them
    again; once GRPO has saved its first checkpoint, SIGKILL the run's Ray head; until then, check that no
    process of the stack listens beyond loopback. Returns what happened, when the run has ended."""
    from tasks.rl.checkpoint import latest_checkpoint

    client = stack.client()
    seen, deadline, restarted, head, where = set(), time.time() + timeout, None, None, None
    while (run := client.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}"))["state"] not in ("success", "failed"):
        assert time.time() < deadline, f"run {run_id} still {run['state']} after {timeout} s"
        if head is None:  # the sockets while the cluster is whole
            sockets = stack.listening()
            assert sockets and exposed(stack) == [], exposed(stack)
            seen |= {name for _, name, _, _ in sockets}
        if restarted is None and states(client, run_id).get("grpo_update") == "deferred":
            for service in ("triggerer", "scheduler"):
                stack.kill(service)
            restarted = time.time()
            for service in ("scheduler", "triggerer"):
                stack.restart(service)
        where = run_dir(stack, run_id) or where  # each call pulls what the run's tasks pushed since (S3)
        if head is None and where and (checkpoint := latest_checkpoint(where / "grpo" / "checkpoints")) is not None:
            head = (checkpoint.name, kill_head(run_id), time.time())
        time.sleep(0.5)
    return {
        "run_id": run_id,
        "run": run,
        "run_dir": where,
        "restarted": restarted,
        "head": head,
        "seen": seen,
        "ended_at": time.time(),
    }


KILLED_TASK = "validate_evals"  # the task whose Celery worker the prod drill kills


def worker_kill_drill(stack, run_id: str, task: str = KILLED_TASK, timeout: float = 1500) -> dict:
    """Watch the run: once `task` runs, SIGKILL the Celery worker running it (its process group: the worker,
    its pool and the task's processes), as a lost machine would; start it again once the task's retry runs
    elsewhere. Returns the killed worker's name and the run as it ended."""
    client = stack.client()
    killed, restarted, deadline = None, False, time.time() + timeout
    path = f"/api/v2/dags/{DAG}/dagRuns/{run_id}"
    while (run := client.get(path))["state"] not in ("success", "failed"):
        assert time.time() < deadline, f"run {run_id} still {run['state']} after {timeout} s"
        ti = next(t for t in client.get(f"{path}/taskInstances?limit=100")["task_instances"] if t["task_id"] == task)
        if killed is None and ti["state"] == "running" and ti.get("hostname") in stack.procs:
            killed = ti["hostname"]
            stack.kill(killed)
        elif killed and not restarted and ti["state"] == "running" and ti["try_number"] > 1:
            stack.restart(killed)
            restarted = True
        time.sleep(0.5)
    if killed and not restarted:
        stack.restart(killed)
    return {"killed": killed, "run": run}
