"""Environments benchmark: thousands of scripted desk episodes in flight against the resources server.

    python bench/envs.py                      # 1024 then 4096 episodes in flight, the naive peer at 1024
    python bench/envs.py --episodes 256       # a quick look: 64 then 256, the peer at 64

Each episode is what a rollout does to its environment, minus the model: POST /seed_session with its
task, one or two tool calls (the known-correct v2 call, after a wrong one for every other episode:
a v1-style format that strict v2 refuses) and POST /verify with the expected answer. All N episodes
start at once over one ResourcesServerBackend (one pooled aiohttp client) against
include/tools/desk_resources_server.py, started here for each phase with `--latency-ms 50` (a tool's
work), so the figure measures how many calls the client and server keep in flight, not the desk's math.

Prints ONE JSON line: tool steps/s, p50/p99 call latency, errors per fault (a planned refusal is not an
error; anything else, or an episode that did not verify as correct, is), the peak RSS of the server
and of this client process (psutil, sampled), the same at the smaller size (flat memory from 1024 to
4096 in flight is the target), and the ratio against a naive peer measured in the same run: the same
episodes at the smaller size, each with its own httpx.AsyncClient (a new connection per episode, its
own cookie jar). Target: 8,000 tool steps/s with zero errors at 4096 in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.envs.desk import OPS, UNITS, generate_tasks  # noqa: E402
from tasks.envs.http_backend import ResourcesServerBackend  # noqa: E402
from tasks.envs.toolset import load_toolset  # noqa: E402
from tasks.net import free_port  # noqa: E402

SERVER = ROOT / "include/tools/desk_resources_server.py"


# ---------------------------------------------------------------- the scripted policy


def scripted_calls(task, wrong: bool) -> list[tuple[str, dict, bool]]:
    """(tool, arguments, should succeed): the strict-v2 call that solves the task, after a v1-style
    slip when `wrong` (an operator word, a unit name, a capitalised city: all refused by v2)."""
    tool = next(t for t in task.tools if t["x-evergreen-handler"] == task.family)
    props = tool["function"]["parameters"]["properties"]
    data = task.to_dict().get("data") or task.to_dict()["service"]  # Task.service became Task.data
    right = list(data["solution"])
    if task.family == "calc":
        slip, right[2] = list(right), OPS[right[2]][0]
    elif task.family == "convert":
        slip = [right[0], UNITS[right[1]][0], right[2]]
    else:
        slip = [right[0].title(), right[1]]

    def args(values):
        return {
            name: str(v) if spec["type"] == "string" else v
            for (name, spec), v in zip(props.items(), values, strict=True)
        }

    name = tool["function"]["name"]
    return ([(name, args(slip), False)] if wrong else []) + [(name, args(right), True)]


def make_episodes(n: int) -> list[tuple]:
    tasks = generate_tasks(n, seed=11, toolset=load_toolset("2", "desk"))
    return [(t.to_dict(), t.expected, scripted_calls(t, wrong=i % 2 == 1)) for i, t in enumerate(tasks)]


def tally(faults: Counter, ok: bool, want: bool, fault: str | None) -> None:
    """Count an outcome: a planned refusal is "refused_planned"; anything off the script is an error."""
    if ok == want:
        faults["refused_planned" if not want else "ok"] += 1
    else:
        faults[fault or "unexpected_success"] += 1


# ---------------------------------------------------------------- the two clients


async def run_pooled(url: str, episodes: list, latencies: list, faults: Counter) -> None:
    backend = ResourcesServerBackend(url, timeout=30.0, max_connections=1024)

    async def episode(task, expected, calls):
        session = backend.open_session(task)
        error = await session.aseed()
        if error is not None:
            faults[error.fault] += 1
            return
        for name, args, want in calls:
            start = time.perf_counter()
            result = await session.acall(name, args)
            latencies.append(time.perf_counter() - start)
            tally(faults, not result.is_error, want, result.fault)
        score = await session.averify(expected)
        faults["verified" if score.get("success") else score.get("fault") or "not_correct"] += 1

    try:
        await asyncio.gather(*(episode(*e) for e in episodes))
    finally:
        await backend.aclose()


async def run_naive(url: str, episodes: list, latencies: list, faults: Counter) -> None:
    """The peer: what one writes first, a fresh httpx client (connection, cookie jar) per episode."""
    import httpx

    async def episode(task, expected, calls):
        try:
            async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
                (await client.post("/seed_session", json={"task": task})).raise_for_status()
                for name, args, want in calls:
                    start = time.perf_counter()
                    body = (await client.post("/" + name, json=args)).json()
                    latencies.append(time.perf_counter() - start)
                    tally(faults, not body.get("is_error"), want, body.get("fault"))
                score = (await client.post("/verify", json={"answer": expected})).json()
                faults["verified" if score.get("success") else "not_correct"] += 1
        except (httpx.HTTPError, ValueError) as e:
            faults[f"naive:{type(e).__name__}"] += 1

    await asyncio.gather(*(episode(*e) for e in episodes))


# ---------------------------------------------------------------- a phase: fresh server, one client kind


@contextlib.contextmanager
def server(latency_ms: float):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", str(port), "--latency-ms", str(latency_ms)],
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/tools", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server did not start: {proc.stderr.read().decode()[-2000:]}") from None
                time.sleep(0.1)
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(10)


class PeakRSS:
    """Peak RSS of some processes, sampled every 20 ms on a thread (psutil has no per-phase peak)."""

    def __init__(self, **pids: int):
        self.procs = {k: psutil.Process(p) for k, p in pids.items()}
        self.peak = {k: 0 for k in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while True:
            for k, p in self.procs.items():
                with contextlib.suppress(psutil.Error):
                    self.peak[k] = max(self.peak[k], p.memory_info().rss)
            if self._stop.wait(0.02):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def phase(kind: str, episodes: list, latency_ms: float) -> dict:
    latencies, faults = [], Counter()
    runner = run_pooled if kind == "pooled" else run_naive
    with server(latency_ms) as (url, proc), PeakRSS(server=proc.pid, client=os.getpid()) as rss:
        start = time.perf_counter()
        asyncio.run(runner(url, episodes, latencies, faults))
        wall = time.perf_counter() - start
    latencies.sort()
    pct = (
        (lambda q: round(1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))], 1))
        if latencies
        else (lambda q: None)
    )
    planned = {"ok", "refused_planned", "verified"}
    return {
        "episodes": len(episodes),
        "tool_steps": len(latencies),
        "tool_steps_per_s": round(len(latencies) / wall),
        "episodes_per_s": round(len(episodes) / wall),
        "p50_call_ms": pct(0.50),
        "p99_call_ms": pct(0.99),
        "errors": {k: v for k, v in faults.items() if k not in planned},
        "planned_refusals": faults["refused_planned"],
        "verified": faults["verified"],
        "server_peak_rss_mb": round(rss.peak["server"] / 2**20, 1),
        "client_peak_rss_mb": round(rss.peak["client"] / 2**20, 1),
        "wall_s": round(wall, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=4096, help="episodes in flight at once (the large phase)")
    ap.add_argument("--small", type=int, default=None, help="the smaller phase (default 1024, or N/4 below that)")
    ap.add_argument("--latency-ms", type=float, default=50.0)
    args = ap.parse_args()
    with contextlib.suppress(ImportError):  # the same loop for both clients; uvloop is uvicorn's too
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    small_n = args.small or (1024 if args.episodes > 1024 else max(1, args.episodes // 4))
    everything = make_episodes(args.episodes)
    # small first: Python keeps freed memory, so a large phase after it shows only what it adds on top
    small = phase("pooled", everything[:small_n], args.latency_ms)
    large = phase("pooled", everything, args.latency_ms)
    peer = phase("naive", everything[:small_n], args.latency_ms)
    print(
        json.dumps(
            {
                "bench": "envs",
                "backend": "ResourcesServerBackend (aiohttp, one pool)",
                "latency_ms": args.latency_ms,
                **large,
                "small": small,
                "peer": {"kind": "httpx.AsyncClient per episode", **peer},
                "ratio_vs_peer": round(small["tool_steps_per_s"] / max(1, peer["tool_steps_per_s"]), 2),
                "server_rss_growth": round(large["server_peak_rss_mb"] / max(1e-9, small["server_peak_rss_mb"]), 2),
                "client_rss_growth": round(large["client_peak_rss_mb"] / max(1e-9, small["client_peak_rss_mb"]), 2),
                "cpus": os.cpu_count(),
                "target_tool_steps_per_s": 8000,
            }
        )
    )


if __name__ == "__main__":
    main()
