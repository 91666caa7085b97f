"""The run's tasks and its first rollouts: which toolsets it serves, their held-out eval tasks, and the
champion's probe rollouts on the run's Ray cluster.

    toolsets(settings)                                    # ["2", "1"]: the target, then the guards
    build_tasks(settings, rd, toolset="2")                # tasks/eval_v2.jsonl
    probe_rollouts(settings, rd, shard=0, num_shards=2)   # on the cluster of <rd>/cluster.json

A toolset is one version of the tool registry (its schemas); the model registry is MLflow's.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from tasks.envs.toolset import toolset_label

if TYPE_CHECKING:
    from tasks.config import Settings
    from tasks.envs.base import Task
    from tasks.rundir import RunDir
    from tasks.stages.contracts import ClusterInfo

log = logging.getLogger(__name__)

PROBE_SHARDS = (0, 1)  # probe_rollouts tasks: shard i starts the run's rollout engine i


def toolsets(settings: Settings) -> list[str]:
    """The tool-registry versions a run evaluates on: the target first, then the guards (today: the
    champion's own)."""
    return list(dict.fromkeys([settings.env.target_toolset, settings.env.champion_toolset]))  # one when the same


def pin_toolsets(settings: Settings, rd: RunDir) -> Settings:
    """`settings` with each toolset that is not a shipped version (an MCP server, a URL, an object, a file:
    what a tool watch names) pinned to the copy this run read first, <rd>/toolsets/<field>.json. A tool
    change during the run then cannot give its stages different tools (build_tasks, the GRPO job and the
    evals name their files by the toolset's hash). The first reader's copy wins (a hard link: atomic and
    exclusive). A source that cannot be read is left as it is, with a warning: the stage that needs those
    tools fails with the reason, and the others (teardown, summary) still run."""
    import json
    import os
    import tempfile

    from tasks.envs import get_env
    from tasks.envs.toolset import shipped_version

    pins: dict[str, str] = {}
    for field in ("target_toolset", "champion_toolset"):
        source = str(getattr(settings.env, field))
        path = rd.path / "toolsets" / f"{field}.json"
        if shipped_version(source) or source == str(path):
            continue
        if not path.exists():
            try:
                toolset = get_env(settings.env.name).load_toolset(source)
            except Exception as e:
                log.warning(
                    "toolset %s=%s not pinned (%s: %s); stages read it themselves", field, source, type(e).__name__, e
                )
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump({**toolset, "x-evergreen-source": source}, f)
            try:
                os.link(tmp, path)
                log.info(
                    "toolset %s=%s pinned for this run at %s (%d tools)", field, source, path, len(toolset["tools"])
                )
            except FileExistsError:
                pass  # another task of this run pinned it first: its copy is the run's
            finally:
                os.unlink(tmp)
        pins[field] = str(path)
    if not pins:
        return settings
    return settings.model_copy(update={"env": settings.env.model_copy(update=pins)})


def eval_tasks(settings: Settings, toolset: str) -> list[Task]:
    """The held-out evaluation tasks of one toolset: fixed seed, content of `eval.split`."""
    from tasks.envs import get_env

    env = get_env(settings.env.name)
    return env.generate_tasks(
        settings.eval.num_tasks, settings.eval.seed, env.load_toolset(toolset), split=settings.eval.split
    )


def build_tasks(settings: Settings, rd: RunDir, toolset: str) -> dict:
    """eval_tasks of one toolset, written for every model of this run to meet."""
    from collections import Counter

    tasks = eval_tasks(settings, toolset)
    path = rd.write_lines(
        [t.to_dict() for t in tasks], "tasks", f"eval_{toolset_label(toolset, settings.env.name)}.jsonl"
    )
    out = {
        "toolset": toolset,
        "tasks": len(tasks),
        "families": dict(Counter(t.family for t in tasks)),
        "path": str(path),
        "role": "target" if toolset == settings.env.target_toolset else "guard",
    }
    log.info("built %d eval tasks for toolset %s: %s", len(tasks), toolset, out["families"])
    return out


def load_tasks(rd: RunDir, toolset: str, env: str | None = None) -> list[Task]:
    """The tasks build_tasks wrote for `toolset`."""
    from tasks.envs.base import Task

    name = f"eval_{toolset_label(toolset, env)}.jsonl"
    if not (rd.path / "tasks" / name).exists():
        raise FileNotFoundError(
            f"{rd.path / 'tasks' / name} is missing: the build_tasks stage writes it (was it skipped or cleared?)"
        )
    return [Task.from_dict(row) for row in rd.read_lines("tasks", name)]


def cluster_of(rd: RunDir) -> ClusterInfo:
    """The run's Ray cluster as its setup wrote it (cluster.json)."""
    from tasks.stages.contracts import ClusterInfo

    data = rd.read("cluster.json")
    if data is None:
        raise FileNotFoundError(f"{rd.path / 'cluster.json'} is missing: the ray_cluster_setup task writes it")
    return ClusterInfo.model_validate(data)


def connect(settings: Settings, rd: RunDir) -> Any:
    """Attach this process to the run's cluster as a driver (auth env first: ray reads it at init)."""
    import os

    info = cluster_of(rd)
    # before the first `import ray` of this process: Ray reads its auth mode and token then
    os.environ.update(info.env)
    from tasks.rl.cluster import connect as ray_connect

    return ray_connect(settings.model_copy(update={"ray": settings.ray.model_copy(update={"address": info.address})}))


def engine_namespace(settings: Settings, rd: RunDir) -> str:
    """The Ray namespace of a run's rollout engines (`rollout-<i>`, tasks.rl.rollout.start_rollout_actors):
    the probes start them, the GRPO job and the evals reuse them, the evals stop them. An engine takes
    25-45 s to start here; building one set per stage cost the demo about 1.5 minutes. ray.engine_namespace
    names engines that outlive the run (the timeline's runs of one day share them)."""
    return settings.ray.engine_namespace or f"evergreen-engines-{rd.path.name}"


def probe_rollouts(settings: Settings, rd: RunDir, shard: int, num_shards: int) -> dict:
    """The champion's rollouts on one shard of the first training batch (target toolset): they check the
    rollout contract with GX and measure the starting reward before the update spends anything. Probe i
    starts the run's engine i (kept for the GRPO job and the evals) while the run has one, else a temporary one.
    Where the champion solves less than grpo.init_fallback_below of the shard's target tasks, the
    grpo.init_fallback models run the same tasks too (what GRPO starts from: tasks.stages.models.init_dir)."""
    t0 = time.time()
    connect(settings, rd)
    import ray
    from safetensors.torch import load_file

    from tasks.data.checks import check_rollouts
    from tasks.rl.rollout import RolloutPool, start_rollout_actors
    from tasks.rl.train import training_tasks
    from tasks.rl.update import guard_count
    from tasks.stages.models import champion_dir, fallback_dir
    from tasks.stages.signals import with_production_tasks

    settings = with_production_tasks(settings, rd)  # the first batch of the GRPO job, as it will draw it
    one = settings.model_copy(update={"rollout": settings.rollout.model_copy(update={"num_workers": 1})})
    champ = champion_dir(settings, rd)
    kept = shard < settings.rollout.num_workers
    first = training_tasks(settings, 0)
    target_ids = {t.task_id for t in first[: settings.grpo.tasks_per_step - guard_count(settings.grpo)]}
    fallbacks: dict[str, dict] = {}
    try:
        tasks = first[shard::num_shards]
        actors = start_rollout_actors(
            champ, settings, indices=[shard], namespace=engine_namespace(settings, rd) if kept else None
        )
        pool = RolloutPool(champ, one, actors=actors, first_core=shard)
        pool.load_weights(load_file(champ / "model.safetensors"), version=0)  # a rerun finds the engine as GRPO left it
        records = pool.run_batch(
            tasks, settings.rollout.group_size, rd.path / "probe" / f"shard-{shard}", seed=settings.grpo.seed + shard
        )
        target = [r for r in records if r["task_id"] in target_ids]
        if sum(r["success"] for r in target) < settings.grpo.init_fallback_below * len(target):
            # too little to learn from: the same tasks by the models GRPO may start from instead (models.init_dir)
            for alias in settings.grpo.init_fallback:
                path = fallback_dir(settings, rd, alias)
                if path is None:
                    continue
                pool.load_weights(load_file(path / "model.safetensors"), version=0)
                tried = pool.run_batch(
                    tasks,
                    settings.rollout.group_size,
                    rd.path / "probe" / f"shard-{shard}-{alias}",
                    seed=settings.grpo.seed + shard,
                )
                version = json.loads(path.with_name(path.name + ".json").read_text())["version"]
                fallbacks[alias] = {
                    "version": version,
                    "target_successes": sum(r["success"] for r in tried if r["task_id"] in target_ids),
                }
                log.info("probe shard %d: %s v%s solves %s", shard, alias, version, fallbacks[alias])
        pids = pool.engine_pids()
        if not kept:
            pool.shutdown()
    finally:
        ray.shutdown()
    outcome = check_rollouts(records, settings.rollout.group_size, docs_dir=rd.path / "probe" / f"gx_docs-{shard}")
    outcome.raise_for_failure()
    expected = len(tasks) * settings.rollout.group_size
    if len(records) != expected:
        raise RuntimeError(f"probe shard {shard}: {len(records)} rollout records, expected {expected}")
    out = {
        "shard": shard,
        "episodes": len(records),
        "success_rate": sum(r["success"] for r in records) / len(records),
        "mean_reward": sum(r["reward"] for r in records) / len(records),
        "tokens": int(sum(len(r.get("completion_ids") or []) for r in records)),
        "target_episodes": len(target),
        "target_successes": sum(r["success"] for r in target),
        "fallbacks": fallbacks,
    }
    rd.record_timing(
        f"probe_rollouts_{shard}",
        time.time() - t0,
        cpus=settings.rollout.cpus_per_worker,
        tokens_generated=out["tokens"],
        engine_pids=pids,
        engines_kept=kept,
    )
    rd.write(out, "probe", f"shard-{shard}.json")
    log.info("probe shard %d/%d: %s", shard, num_shards, out)
    return out
