"""`make demo`: the whole loop as real Airflow runs on this machine, then a summary; stops what it started.

    python scripts/demo.py                 # from a clean .stack/ (the last demo's state is removed first)

1. starts the stack (scripts/stack.py: MLflow on 127.0.0.1:5000, Airflow api-server on 127.0.0.1:8080,
   scheduler, dag-processor, triggerer) and unpauses the DAGs;
2. triggers `bootstrap_champion` through the REST API (SFT of the first champion, registered in MLflow);
3. triggers `simulate_production`: two days of champion traffic, the tool registry switching to v2 between;
4. unpauses `drift_monitor`, whose run detects the change and emits a `retrain_request` asset event;
5. waits for the `continuous_post_training` run that event starts (Ray head, rollouts, GRPO as a Ray job,
   evals, cost, gate, move_aliases) and prints its summary, the orchestration overhead and the URLs.
Everything stays under .stack/ afterwards: `make up` serves it (Airflow UI, Evergreen page, MLflow UI).
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.stack import PROJECT, USER, Stack
from tasks.stages.demo import DEMO_REFERENCE_DAYS

# the same demo settings as `python -m tasks demo` (tasks.stages.demo.demo_settings)
DEMO_ENV = {"EVERGREEN_DRIFT__REFERENCE_DAYS": str(DEMO_REFERENCE_DAYS)}


def _iso(ts: str | None) -> datetime | None:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")) if ts else None


def _union_seconds(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def overhead(client, dag_id: str, run: dict, run_dir: Path) -> dict:
    """DAG run wall time minus the time some task body was computing (the union of the bodies' own
    intervals, task_times/*.json, so that tasks running side by side count once; the deferred GRPO task's
    interval is its Ray job). What is left is scheduling, queueing, task process start-up and deferral."""
    tis = client.get(f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}/taskInstances?limit=100")["task_instances"]
    wall = (_iso(run["end_date"]) - _iso(run["start_date"])).total_seconds()
    bodies = [json.loads(f.read_text()) for f in (run_dir / "task_times").glob("*.json")]
    intervals = [(b["start"], b["end"]) for b in bodies]
    for t in tis:
        if t["task_id"] == "grpo_update" and t.get("start_date") and t.get("end_date"):
            intervals.append((_iso(t["start_date"]).timestamp(), _iso(t["end_date"]).timestamp()))
    busy = _union_seconds(intervals)
    return {
        "run_wall_s": wall,
        "task_instances": len(tis),
        "sum_task_duration_s": sum(t.get("duration") or 0 for t in tis),
        "compute_s": busy,
        "overhead_s": wall - busy,
        "overhead_share": (wall - busy) / wall if wall else None,
    }


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # progress lines appear as they happen, also in a log file
    # a SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C does, so `with stack` stops every process it started
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    t_start = time.time()
    home = PROJECT / ".stack"
    if home.exists():
        print(f"removing the previous demo's state in {home}")
        shutil.rmtree(home)
    stack = Stack(home=home, env_extra=DEMO_ENV)
    phases = {}
    with stack:
        client = stack.client()
        client.wait_for_dags(
            ["continuous_post_training", "drift_monitor", "bootstrap_champion", "simulate_production", "rollback"]
        )
        for dag_id in ("continuous_post_training", "bootstrap_champion", "simulate_production"):
            client.unpause(dag_id)  # the retrain watchers only fire for an unpaused consumer
        _ = stack.password  # waits until the auth manager has written it
        print(
            f"Airflow UI {stack.api_url} (user {USER}; password in {stack.password_file}); MLflow {stack.mlflow_url}",
            flush=True,
        )

        for dag_id in ("bootstrap_champion", "simulate_production"):
            t0 = time.time()
            print(f"\n{dag_id}: triggered through POST /api/v2/dags/{dag_id}/dagRuns", flush=True)
            run = client.wait_for_run(dag_id, client.trigger(dag_id), timeout=1800)
            phases[dag_id] = time.time() - t0
            if run["state"] != "success":
                print(f"{dag_id} failed: see {stack.api_url}/dags/{dag_id}/runs/{run['dag_run_id']}", file=sys.stderr)
                return 1

        t0 = time.time()
        since = datetime.now(UTC).isoformat()
        print("\ndrift_monitor: unpaused; its scheduled run checks yesterday against the day before", flush=True)
        client.unpause("drift_monitor")
        monitor = client.wait_for_run("drift_monitor", after=since, timeout=900)
        phases["drift_monitor"] = time.time() - t0
        if monitor["state"] != "success":
            print("drift_monitor failed", file=sys.stderr)
            return 1
        print("\ncontinuous_post_training: started by the retrain_request asset event", flush=True)
        t0 = time.time()
        run = client.wait_for_run("continuous_post_training", after=since, timeout=2400)
        phases["continuous_post_training"] = time.time() - t0
        from tasks.stages.contracts import RunSummary
        from tasks.stages.report import format_summary

        run_dir = stack.runs_root / "continuous_post_training"
        summaries = sorted(run_dir.glob("*/summary.json"), key=lambda p: p.stat().st_mtime)
        if not summaries:
            print(f"no summary under {run_dir}", file=sys.stderr)
            return 1
        summary = RunSummary.model_validate_json(summaries[-1].read_text())
        cost = overhead(client, "continuous_post_training", run, summaries[-1].parent)
        print("\n" + format_summary(summary))
        print(
            f"  why: trigger={summary.trigger.get('kind')}; asset event extra: "
            f"{json.dumps([e.get('extra', {}).get('summary') for e in summary.trigger.get('asset_events', [])])[:300]}"
        )
        print(
            f"  orchestration: DAG run {cost['run_wall_s']:.0f}s wall, {cost['task_instances']} task instances; "
            f"some task body computing {cost['compute_s']:.0f}s; overhead {cost['overhead_s']:.0f}s "
            f"({100 * (cost['overhead_share'] or 0):.0f}% of the run)"
        )
        print("  phases: " + ", ".join(f"{k} {v:.0f}s" for k, v in phases.items()))
        print(f"  Airflow run: {stack.api_url}/dags/continuous_post_training/runs/{run['dag_run_id']}")
        print(f"  Evergreen page: {stack.api_url}/evergreen/   MLflow: {stack.mlflow_url}")
        print(f"  state kept in {home}: `make up` serves it again")
        (home / "demo_result.json").write_text(
            json.dumps(
                {
                    "phases": phases,
                    "orchestration": cost,
                    "wall_s": time.time() - t_start,
                    "state": run["state"],
                    "status": summary.status,
                },
                indent=1,
            )
        )
        print(f"\ndemo wall time {time.time() - t_start:.0f}s; continuous_post_training {run['state']}", flush=True)
        return 0 if run["state"] == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
