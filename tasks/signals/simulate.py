"""A production simulator: traces from an environment and a policy, with a tool change at a known time.

    from tasks.signals.simulate import simulate_traces
    simulate_traces("runs/sim", start, end, n_traces=2000, schedule=[(start, "1"), (change_at, "2")],
                    policy="runs/local/champion")           # a model directory: episodes through vLLM
    simulate_traces(..., policy="scripted")                 # a rule-based agent: fast, no model needed

`schedule` says which toolset production serves from when on: the toolset changes at a known
time, which is what drift and tool-change detection must find. Traces are written date-partitioned as
`DIR/date=YYYY-MM-DD/traces-00000.jsonl.gz` in the trace contract (include/schemas/trace.schema.json),
and a share `malformed_share` of the lines is replaced by one of MALFORMED_KINDS, listed in
DIR/manifest.json with the expected number of each, so that tests can reconcile ingestion exactly.

The scripted policy is the champion's habits without the model: it calls the offered tool with
arguments in any of the formats the lenient v1 service accepted (the environment's demonstration), and answers with
the tool's result, or gives up after an error. Against the strict v2 service its success drops.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.config_sections import EnvSettings
from tasks.envs import get_env, new_episode
from tasks.envs.base import Episode
from tasks.policy.chat import ChatFormat
from tasks.policy.tokenizer import default_chat
from tasks.storage import write_atomic

if TYPE_CHECKING:
    from tasks.config import Settings
    from tasks.envs import Environment
    from tasks.envs.base import Task
    from tasks.policy.backends import VLLMBackend

log = logging.getLogger(__name__)
SLIP_RATE = 0.08  # the scripted agent gives up this often even after a good tool result (production is never perfect)
MALFORMED_KINDS = (
    "broken_json",
    "missing_field",
    "wrong_type",
    "negative_tokens",
    "future_timestamp",
    "duplicate_trace_id",
    "non_utf8",
)


def toolset_at(schedule: list[tuple[datetime, str]], when: datetime) -> str:
    """The toolset version production served at `when` (the last schedule entry at or before it)."""
    current = schedule[0][1]
    for since, version in sorted(schedule):
        if since <= when:
            current = version
    return current


def episode_to_trace(ep: Episode, trace_id: str, when: datetime, model_version: str, rng: random.Random) -> dict:
    """An episode in the trace contract: OpenAI chat messages (arguments as JSON strings) with tool_calls
    and tool_call_id; a tool message without an id answers a call that could not be parsed."""
    messages = []
    for m in ep.messages:
        msg = dict(m)
        if m.get("tool_calls"):
            msg["content"] = m["content"] or None
            msg["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])},
                }
                for c in m["tool_calls"]
            ]
        msg.pop("name", None)
        messages.append(msg)
    # errors of calls made; a turn whose call could not be parsed made no call (its error has no call id)
    tool_errors = sum(
        m["role"] == "tool" and "tool_call_id" in m and m["content"].startswith("error") for m in ep.messages
    )
    score = ep.score()
    prompt_tokens = ep.loss_mask.index(1) if 1 in ep.loss_mask else len(ep.token_ids)
    return {
        "trace_id": trace_id,
        "timestamp": when.isoformat().replace("+00:00", "Z"),
        "workload": ep.task.family,
        "model": {"name": "evergreen-agent", "version": model_version},
        "tools": ep.tools,
        "messages": messages,
        "outcome": {
            "success": score["success"],
            "reward": score["reward"],
            "tool_errors": tool_errors,
            "latency_ms": round(40 + 2.5 * ep.completion_tokens + rng.expovariate(1 / 30), 1),
            "prompt_tokens": prompt_tokens,
            "completion_tokens": ep.completion_tokens,
        },
        "registry_version": ep.task.data.get("registry_version"),  # the toolset; key kept (trace data)
    }


def _run_scripted(episodes: list[Episode], seed: int) -> None:
    """Turn 1: the demonstration's call (any v1-accepted format). Turn 2: the result, or give up."""
    for i, ep in enumerate(episodes):
        rng = random.Random(seed * 1_000_003 + i)
        demonstration = get_env(ep.task.env).demonstration
        assert demonstration is not None, f"environment {ep.task.env!r} has no demonstration for the scripted policy"
        # the champion's habits: a task with a value convention is demonstrated as its lenient version would be
        # (a strict toolset's own demonstrations follow it, and would never fail)
        habit = ep.task
        if "convention" in habit.data:
            habit = type(habit).from_dict({**habit.to_dict(), "data": {**habit.data, "convention": "any"}})
        call, _ = demonstration(habit, rng)
        ep.add_message(call)
        if ep.done:
            continue
        result = ep.messages[-1]["content"]
        gave_up = result.startswith("error") or rng.random() < SLIP_RATE
        answer = "I could not get an answer from the tool." if gave_up else result
        ep.add_message({"role": "assistant", "content": answer})


def _run_model(
    episodes: list[Episode],
    model_dir: str,
    settings: Settings,
    seed: int,
    temperature: float | None = None,
    backend: VLLMBackend | None = None,
) -> None:
    """The episodes through vLLM: on `backend` with the model's weights loaded into it (an engine kept across
    calls, as the timeline keeps one), else on an engine built for this call and freed after it."""
    from tasks.policy.backends import Sampling, VLLMBackend

    sampling = Sampling(temperature=settings.rollout.temperature if temperature is None else temperature, seed=seed)
    if backend is not None:
        from safetensors.torch import load_file

        backend.load_weights(load_file(str(Path(model_dir) / "model.safetensors")))
        backend.run_episodes(episodes, sampling)
        return
    engine = VLLMBackend(
        model_dir,
        max_len=settings.model.max_len,
        kv_cache_mb=settings.rollout.kv_cache_mb,
        seed=seed,
        dtype=settings.model.dtype,
    )
    engine.run_episodes(episodes, sampling)
    del engine
    import gc

    gc.collect()  # the engine's KV cache is freed now, before the caller builds its own engines


def tasks_in_mix(env: Environment, n: int, seed: int, toolset: dict, mix: dict[str, float] | None) -> list[Task]:
    """`n` production tasks on `toolset`, workloads in the proportions `mix` (None: the environment's own
    order). Drawn from a larger pool of the environment's tasks by family, so any environment's generator
    serves; the quotas are the largest remainders of n x weight."""
    if not mix:
        return env.generate_tasks(n, seed, toolset)
    total = sum(mix.values())
    exact = {f: n * w / total for f, w in mix.items()}
    quota = {f: int(x) for f, x in exact.items()}
    for f in sorted(exact, key=lambda f: quota[f] - exact[f])[: n - sum(quota.values())]:
        quota[f] += 1
    pool = env.generate_tasks(max(3, len(mix)) * n, seed, toolset)
    by_family: dict[str, list[Task]] = {}
    for task in pool:
        by_family.setdefault(task.family, []).append(task)
    short = [f for f, k in quota.items() if len(by_family.get(f, [])) < k]
    if short:
        raise ValueError(f"mix names workloads {short} that environment {env.name!r} does not generate enough of")
    chosen = [t for f, k in quota.items() for t in by_family[f][:k]]
    random.Random(seed).shuffle(chosen)
    return chosen


def _malform(kind: str, line: bytes, previous: bytes | None, now: datetime) -> bytes:
    trace = json.loads(line)
    if kind == "broken_json":
        return line[: len(line) // 2]
    if kind == "missing_field":
        trace.pop("outcome")
    elif kind == "wrong_type":
        trace["outcome"]["prompt_tokens"] = str(trace["outcome"]["prompt_tokens"])
    elif kind == "negative_tokens":
        trace["outcome"]["completion_tokens"] = -1
    elif kind == "future_timestamp":
        trace["timestamp"] = (now + timedelta(days=30)).isoformat()
    elif kind == "duplicate_trace_id":
        return previous if previous is not None else line
    elif kind == "non_utf8":
        return line.replace(b'"workload"', b'"work\xffload"', 1)
    return json.dumps(trace).encode()


def simulate_traces(
    out_dir: str | Path,
    start: datetime,
    end: datetime,
    n_traces: int,
    schedule: list[tuple[datetime, str]],
    policy: str = "scripted",
    settings: Settings | None = None,
    malformed_share: float = 0.0,
    seed: int = 0,
    model_version: str = "champion",
    mix: dict[str, float] | None = None,
    temperature: float | None = None,
    backend: VLLMBackend | None = None,
) -> dict:
    """Write `n_traces` lines between start and end; returns (and writes) the manifest. `mix`: workload
    weights (tasks_in_mix); `temperature`: the model's sampling temperature (default rollout.temperature,
    0 greedy); `backend`: a vLLM engine to load the model's weights into instead of building one."""
    if not schedule:
        raise ValueError("schedule is empty: give at least [(start, toolset_version)]")
    if policy != "scripted" and settings is None:
        raise ValueError("a model policy needs settings (engine limits and sampling temperature)")
    rng = random.Random(seed)
    span = (end - start).total_seconds()
    times = sorted(start + timedelta(seconds=rng.uniform(0, span)) for _ in range(n_traces))
    versions = [toolset_at(schedule, t) for t in times]
    # the scripted agent speaks the embedded default's format (its traces are OpenAI messages either way)
    if policy == "scripted":
        chat = default_chat()
    else:
        assert settings is not None  # checked above
        chat = ChatFormat.load(policy, settings.model.tool_call_parser)
    limits = {"max_turns": 4, "max_tokens_per_turn": 96, "max_len": 512}
    if settings is not None:
        limits = {
            "max_turns": settings.env.max_turns,
            "max_tokens_per_turn": settings.env.max_tokens_per_turn,
            "max_len": settings.model.max_len,
        }
    episodes: list[Episode] = [None] * n_traces  # type: ignore[list-item]  # every slot is filled by the loop below
    for version in sorted(set(versions)):
        idx = [i for i, v in enumerate(versions) if v == version]
        env = get_env(settings.env.name if settings is not None else EnvSettings.model_fields["name"].default)
        tasks = tasks_in_mix(env, len(idx), seed * 7919 + int(version), env.load_toolset(version), mix)
        for i, task in zip(idx, tasks, strict=True):
            task.data["registry_version"] = version
            episodes[i] = new_episode(task, chat, **limits)
    log.info("simulating %d traces %s .. %s with policy %s", n_traces, start.isoformat(), end.isoformat(), policy)
    if policy == "scripted":
        _run_scripted(episodes, seed)
    else:
        assert settings is not None  # checked above
        _run_model(episodes, policy, settings, seed, temperature, backend)

    out = Path(out_dir)
    files: dict[str, gzip.GzipFile] = {}
    malformed: Counter = Counter()
    now = datetime.now(UTC)
    previous = None
    try:
        for i, (ep, when) in enumerate(zip(episodes, times, strict=True)):
            trace_id = hashlib.sha1(f"{seed}-{i}".encode()).hexdigest()[:20]
            line = json.dumps(episode_to_trace(ep, trace_id, when, model_version, rng)).encode()
            if malformed_share and rng.random() < malformed_share:
                kind = rng.choice(MALFORMED_KINDS)
                if kind == "duplicate_trace_id" and previous is None:
                    kind = "broken_json"
                line = _malform(kind, line, previous, now)
                malformed[kind] += 1
            else:
                previous = line
            day = when.strftime("%Y-%m-%d")
            if day not in files:
                path = out / f"date={day}" / "traces-00000.jsonl.gz"
                path.parent.mkdir(parents=True, exist_ok=True)
                files[day] = gzip.open(path, "wb", compresslevel=1)  # noqa: SIM115 (one per day, closed in finally)
            files[day].write(line + b"\n")
    finally:
        for f in files.values():
            f.close()
    successes = Counter((v, ep.score()["success"]) for v, ep in zip(versions, episodes, strict=True))
    manifest = {
        "traces": n_traces,
        "start": start.isoformat(),
        "end": end.isoformat(),
        "policy": policy,
        "schedule": [[t.isoformat(), v] for t, v in sorted(schedule)],
        "malformed": dict(malformed),
        "valid": n_traces - sum(malformed.values()),
        "success_rate": {v: successes[(v, True)] / max(1, versions.count(v)) for v in sorted(set(versions))},
        "workloads": {
            f: {"episodes": len(got), "success_rate": sum(got) / len(got)}
            for f in sorted({ep.task.family for ep in episodes})
            for got in [[ep.score()["success"] for ep in episodes if ep.task.family == f]]
        },
        "days": sorted(files),
    }
    write_atomic(out / "manifest.json", json.dumps(manifest, indent=1))
    log.info(
        "simulated %d traces into %s (%d malformed): success by toolset %s",
        n_traces,
        out,
        sum(malformed.values()),
        manifest["success_rate"],
    )
    return manifest
