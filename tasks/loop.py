"""The loop as stages for a workflow engine: each Airflow task body is one call to a function here.

    from tasks.loop import RunDir, open_run, validate_data, ...
    rd = RunDir.for_run(settings, "continuous_post_training", "manual__2026-12-03T04:00:00+00:00")
    open_run(settings, rd, trigger={"kind": "rest"})
    verdict = validate_data(settings, rd)
    ...

No Airflow import: the same functions run in an Airflow worker, a test or a notebook. Stages hand each
other files in one directory per DAG run (`<run_dir>/<dag_id>/<run_id>/`), never large XComs; what they
return is small JSON for the Airflow UI. Every stage that spends compute writes `timings/<stage>.json`
(wall seconds, CPUs held, tokens), which the cost stage prices. Every stage logs a nested MLflow run under
the DAG run's pipeline run, opened by `open_run` and closed by `summarize`.

Where the DAG departs from `python -m tasks demo` (tasks/pipeline.py): the GRPO update runs as a Ray job
(`python -m tasks train`) that a deferred Airflow task watches, so a long update never holds a worker
slot; evaluations run per model as mapped tasks against the run's Ray cluster; the promotion is three
tasks (cost, gate, registry) so the UI shows which one said no.
"""
from __future__ import annotations

import json
import logging
import re
import shlex
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

log = logging.getLogger(__name__)

CHAMPION_URI = "models:/{name}@champion"


@dataclass(frozen=True)
class RunDir:
    """One DAG run's directory; every stage reads and writes here."""
    path: Path
    dag_id: str
    run_id: str

    @classmethod
    def for_run(cls, settings, dag_id: str, run_id: str) -> "RunDir":
        safe = re.sub(r"\.\.+", "_", re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id)).strip("_.") or "run"
        path = Path(settings.run_dir).resolve() / dag_id / safe
        path.mkdir(parents=True, exist_ok=True)
        return cls(path, dag_id, run_id)

    def file(self, *parts: str) -> Path:
        p = self.path.joinpath(*parts)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def read(self, *parts: str, default=None):
        p = self.path.joinpath(*parts)
        return json.loads(p.read_text()) if p.exists() else default

    def write(self, data, *parts: str) -> Path:
        p = self.file(*parts)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str))
        tmp.replace(p)  # a reader never sees half a file
        return p

    def record_timing(self, stage: str, seconds: float, cpus: float, **extra) -> None:
        self.write({"stage": stage, "wall_s": seconds, "cpus": cpus, **extra}, "timings", f"{stage}.json")


def _tracker(settings):
    from tasks.tracking import Tracker

    return Tracker.from_settings(settings)


def _stage(settings, rd: RunDir, name: str):
    return _tracker(settings).stage_of(rd.read("run.json")["mlflow_run_id"], name)


def _cores() -> int:
    import os

    return os.cpu_count() or 1


# --------------------------------------------------------------------------------------------- run
def open_run(settings, rd: RunDir, trigger: dict) -> dict:
    """Open the DAG run's MLflow pipeline run (params = the effective settings); once per DAG run."""
    existing = rd.read("run.json")
    if existing:  # a retried task must not open a second MLflow run
        return existing
    tracker = _tracker(settings)
    run_id = tracker.open_run(rd.dag_id, settings=settings, tags={
        "airflow.dag_id": rd.dag_id, "airflow.run_id": rd.run_id, "evergreen.trigger": trigger.get("kind", "")})
    info = {"dag_id": rd.dag_id, "run_id": rd.run_id, "run_dir": str(rd.path), "mlflow_run_id": run_id,
            "mlflow_url": tracker.url_of(run_id), "started_at": datetime.now(timezone.utc).isoformat(),
            "trigger": trigger}
    rd.write(info, "run.json")
    log.info("run %s: MLflow run %s", rd.run_id, info["mlflow_url"])
    return info


def last_full_days(days: int, end: datetime | None = None):
    """The window of the `days` whole UTC days before `end` (default now)."""
    from tasks.signals.ingest import Window

    end = (end or datetime.now(timezone.utc)).astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return Window(end - timedelta(days=days), end)


def validate_data(settings, rd: RunDir, window: str | None = None) -> dict:
    """Ingest the production window (GX; bad rows quarantined) and test it for drift and tool changes.

    A window that fails validation raises (bad data never trains a model); the verdict is returned."""
    from tasks.pipeline import _track_signals
    from tasks.signals.ingest import Window
    from tasks.signals.monitor import check_production

    t0 = time.time()
    win = Window.parse(window) if window else last_full_days(settings.monitor.window_days)
    try:
        champion = champion_dir(settings, rd)
    except RuntimeError as e:  # nothing to train from: the skip path says so (a scheduled run before bootstrap)
        return _nothing_to_do(rd, win, str(e), no_champion=True)
    if not _has_traces(settings.monitor.traces, win):
        return _nothing_to_do(rd, win, f"no production traces for {win} under {settings.monitor.traces}")
    verdict = check_production(settings, settings.monitor.traces, rd.path / "signals" / "monitor", win,
                               champion=champion, registry=settings.env.target_registry)
    rd.write(verdict, "signals.json")
    with _stage(settings, rd, "signals") as _:
        _track_signals(_tracker(settings), rd.path / "signals", {"verdict": verdict})
    rd.record_timing("validate_data", time.time() - t0, cpus=1)
    return {k: verdict[k] for k in ("retrain", "reasons", "summary", "window", "rows", "data_validation")}


def _nothing_to_do(rd: RunDir, window, why: str, no_champion: bool = False) -> dict:
    verdict = {"retrain": False, "reasons": [], "summary": why, "window": str(window), "rows": {"current": 0},
               "data_validation": "no data", "no_champion": no_champion}
    rd.write(verdict, "signals.json")
    log.warning("validate_data: %s", why)
    return verdict


def should_train(verdict: dict, trigger: dict, force: bool = False) -> tuple[bool, str]:
    """Train when forced, when the data shows drift or a breaking tool change, or when an event asked for it
    and there is data to learn from. Pure."""
    if verdict.get("no_champion"):
        return False, verdict["summary"]
    if force:
        return True, "forced by the `force` param"
    if verdict.get("retrain"):
        return True, "production moved: " + verdict.get("summary", "")
    asked = [e for e in trigger.get("asset_events", []) if (e.get("extra") or {}).get("retrain", True)]
    rows = (verdict.get("rows") or {}).get("current") or 0
    if asked and rows:
        return True, f"retrain requested by {len(asked)} asset event(s) with {rows} new rows"
    if not rows:
        return False, "no new production data in the window, no drift"
    return False, "no drift and no breaking tool change: " + verdict.get("summary", "")


def record_skip(settings, rd: RunDir, reason: str) -> dict:
    rd.write({"skipped": True, "reason": reason}, "skip.json")
    log.info("skipping training: %s", reason)
    return {"skipped": True, "reason": reason}


# ------------------------------------------------------------------------------------------ models
def champion_dir(settings, rd: RunDir) -> Path:
    """The registry's champion, downloaded once per run (its checksums verified when loaded)."""
    dest = rd.path / "champion"
    if (dest / "config.json").exists():
        return dest
    _tracker(settings)  # sets the tracking URI the registry lives in
    from tasks.policy.model import resolve_model_dir

    import tempfile

    uri = CHAMPION_URI.format(name=settings.promotion.model_name)
    # parallel tasks may ask at once: each downloads to its own dir, the first rename wins
    scratch = Path(tempfile.mkdtemp(prefix=".champion-", dir=rd.path))
    try:
        got = resolve_model_dir(uri, cache_dir=scratch)
    except Exception as e:  # noqa: BLE001 - MLflow raises several types for a missing alias
        raise RuntimeError(f"no champion in the MLflow registry ({uri}): run the bootstrap_champion DAG first "
                           f"({type(e).__name__}: {e})") from e
    try:
        got.rename(dest)
    except OSError:
        if not (dest / "config.json").exists():
            raise
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    return dest


def bootstrap(settings, rd: RunDir, force: bool = False) -> dict:
    """SFT the first champion and register it; it becomes `champion` when the registry has none."""
    from tasks.pipeline import _track_bootstrap, bootstrap_champion
    from tasks.promotion.registry import CHAMPION, ModelRegistry

    tracker = _tracker(settings)
    registry = ModelRegistry(settings.promotion.model_name)
    current = registry.version_of(CHAMPION)
    if current is not None and not force:
        log.info("registry %s already has champion version %s; nothing to do (force=true retrains)",
                 settings.promotion.model_name, current)
        return {"champion": current, "bootstrapped": False}
    out = rd.path / "model"
    t0 = time.time()
    stats = bootstrap_champion(settings, out) if not (out / "config.json").exists() else {"model_dir": str(out)}
    with tracker.pipeline_run("bootstrap_champion", settings=settings,
                              tags={"airflow.dag_id": rd.dag_id, "airflow.run_id": rd.run_id}):
        _track_bootstrap(tracker, settings, out, stats, rd.run_id)
    result = {"champion": registry.version_of(CHAMPION), "bootstrapped": True, "seconds": time.time() - t0,
              "aliases": registry.aliases(), **{k: v for k, v in stats.items() if k != "model_dir"}}
    log.info("bootstrap: %s", result)
    return result


# ------------------------------------------------------------------------------------------- tasks
def build_tasks(settings, rd: RunDir, registry: str) -> dict:
    """The held-out evaluation tasks of one tool registry (fixed seed, content of `eval.split`), for every
    model of this run."""
    from collections import Counter

    from tasks.envs import get_env

    env = get_env(settings.env.name)
    tasks = env.generate_tasks(settings.eval.num_tasks, settings.eval.seed, env.load_registry(registry),
                               split=settings.eval.split)
    path = rd.file("tasks", f"eval_v{registry}.jsonl")
    path.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks))
    out = {"registry": registry, "tasks": len(tasks), "families": dict(Counter(t.family for t in tasks)),
           "path": str(path), "role": "target" if registry == settings.env.target_registry else "guard"}
    log.info("built %d eval tasks for registry v%s: %s", len(tasks), registry, out["families"])
    return out


def _load_tasks(rd: RunDir, registry: str):
    from tasks.envs.base import Task

    path = rd.path / "tasks" / f"eval_v{registry}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the build_tasks stage writes it (was it skipped or cleared?)")
    return [Task.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def registries(settings) -> list[str]:
    """Target first, then the guards (today: the champion's own registry)."""
    return [settings.env.target_registry, settings.env.champion_registry]


# -------------------------------------------------------------------------------------------- ray
def _connect(settings, cluster: dict):
    """Attach this process to the run's cluster as a driver (auth env first: ray reads it at init)."""
    import os

    # before the first `import ray` of this process: Ray reads its auth mode and token then
    os.environ.update(cluster.get("env") or {})
    from tasks.rl.cluster import connect

    return connect(settings.model_copy(update={"ray": settings.ray.model_copy(update={"address": cluster["address"]})}))


def engine_namespace(rd: RunDir) -> str:
    """The Ray namespace of a run's rollout engines (`rollout-<i>`, tasks.rl.rollout.start_rollout_actors):
    the probes start them, the GRPO job and the evals reuse them, the evals stop them. An engine takes
    25-45 s to start here; building one set per stage cost the demo about 1.5 minutes."""
    return f"evergreen-engines-{rd.path.name}"


def probe_rollouts(settings, rd: RunDir, cluster: dict, shard: int, num_shards: int) -> dict:
    """The champion's rollouts on one shard of the first training batch (target registry): they check the
    rollout contract with GX and measure the starting reward before the update spends anything. Probe i
    starts the run's engine i (kept for the GRPO job and the evals) while the run has one, else a temporary one."""
    t0 = time.time()
    _connect(settings, cluster)
    import ray
    from safetensors.torch import load_file

    from tasks.data.checks import check_rollouts
    from tasks.rl.rollout import RolloutPool, start_rollout_actors
    from tasks.rl.train import training_tasks

    one = settings.model_copy(update={"rollout": settings.rollout.model_copy(update={"num_workers": 1})})
    champ = champion_dir(settings, rd)
    kept = shard < settings.rollout.num_workers
    try:
        tasks = training_tasks(settings, 0)[shard::num_shards]
        actors = start_rollout_actors(champ, settings, indices=[shard], namespace=engine_namespace(rd) if kept else None)
        pool = RolloutPool(champ, one, actors=actors, first_core=shard)
        pool.load_weights(load_file(champ / "model.safetensors"), version=0)  # a rerun finds the engine as GRPO left it
        records = pool.run_batch(tasks, settings.rollout.group_size, rd.path / "probe" / f"shard-{shard}",
                                 seed=settings.grpo.seed + shard)
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
    out = {"shard": shard, "episodes": len(records), "success_rate": sum(r["success"] for r in records) / len(records),
           "mean_reward": sum(r["reward"] for r in records) / len(records),
           "tokens": int(sum(len(r.get("completion_ids") or []) for r in records))}
    rd.record_timing(f"probe_rollouts_{shard}", time.time() - t0, cpus=settings.rollout.cpus_per_worker,
                     tokens_generated=out["tokens"], engine_pids=pids, engines_kept=kept)
    rd.write(out, "probe", f"shard-{shard}.json")
    log.info("probe shard %d/%d: %s", shard, num_shards, out)
    return out


def grpo_command(settings, rd: RunDir, cluster: dict, overrides: dict | None = None,
                 fail_at_step: int | None = None) -> dict:
    """The Ray job's entrypoint and environment: GRPO from this run's champion against the target registry.
    Overrides reach the job as --set flags so it trains with exactly this run's settings; the driver gets
    the cluster's own address (`auto` may resolve to another interface than the head's 127.0.0.1) and its
    auth token path (a job driver does not inherit the head's environment)."""
    champ = champion_dir(settings, rd)
    # a local head runs jobs on this machine, with this interpreter; a KubeRay image has its own `python`
    args = ["python" if settings.ray.backend == "kuberay" else sys.executable, "-m", "tasks"]
    for key, value in sorted((overrides or {}).items()):
        args += ["--set", f"{key}={value}"]
    args += ["train", "--init", str(champ), "--run-dir", str(rd.path / "grpo"), "--engines", engine_namespace(rd)]
    if fail_at_step is not None:
        args += ["--fail-at-step", str(int(fail_at_step))]
    rd.write({"started": time.time()}, "grpo_job.json")
    env = {"EVERGREEN_RAY__ADDRESS": cluster["address"] if cluster.get("backend") == "local" else "auto",
           "RAY_TRAIN_V2_ENABLED": "1", **(cluster.get("env") or {})}
    return {"entrypoint": shlex.join(args), "env_vars": env}


def record_training(settings, rd: RunDir, job: dict | None = None) -> dict:
    """After the Ray job: its metrics and the challenger go to MLflow (the model under the pipeline run's
    `model` path, which the registry stage registers)."""
    from tasks.pipeline import _track_training
    from tasks.rl.metrics import read_metrics

    grpo = rd.path / "grpo"
    metrics_file = grpo / "metrics.jsonl"
    if not (grpo / "model" / "config.json").exists():
        raise FileNotFoundError(f"the GRPO job finished but {grpo / 'model'} has no model: read the job's log")
    metrics = read_metrics(metrics_file)
    started = (rd.read("grpo_job.json") or {}).get("started", time.time())
    actors = settings.rollout.num_workers * settings.rollout.cpus_per_worker
    rd.record_timing("grpo", time.time() - started, cpus=actors + settings.grpo.num_train_workers,
                     tokens_generated=int(sum(m.get("generated_tokens", 0) for m in metrics)),
                     tokens_trained=int(sum(m.get("trained_tokens", 0) for m in metrics)))
    tracker = _tracker(settings)
    with _stage(settings, rd, "training"):
        _track_training(tracker, grpo, metrics)
        tracker.set_tags({"ray.job_id": (job or {}).get("job_id", "")})
    with tracker.within(rd.read("run.json")["mlflow_run_id"]):
        tracker.log_artifacts(grpo / "model", "model")
    last = metrics[-1] if metrics else {}
    return {"steps": len(metrics), "final_reward": last.get("reward_mean"), "job": job}


def evaluate(settings, rd: RunDir, cluster: dict) -> dict:
    """Champion, then challenger, on every registry's held-out tasks, on the run's engines (the ones the
    probes started and GRPO trained with; started here if gone), which are stopped at the end. Each model's
    weights are loaded into them (`RolloutPool.load_weights`, through the object store): both meet the same
    engines and configuration, and no second set is built."""
    from safetensors.torch import load_file

    t0 = time.time()
    _connect(settings, cluster)
    import ray

    from tasks.rl.rollout import RolloutPool, start_rollout_actors

    out: dict = {}
    champ = champion_dir(settings, rd)
    try:
        pool = RolloutPool(champ, settings, actors=start_rollout_actors(champ, settings, namespace=engine_namespace(rd)))
        for who, (weights, version) in {"champion": (champ / "model.safetensors", 0),
                                        "challenger": (rd.path / "grpo" / "model" / "model.safetensors", 1)}.items():
            seconds = pool.load_weights(load_file(weights), version=version)
            log.info("%s weights loaded into %d engines in %.3fs", who, len(pool.actors), seconds)
            for reg in registries(settings):
                result = pool.evaluate(_load_tasks(rd, reg), settings.eval.samples, settings.rollout.temperature,
                                       settings.eval.seed)
                path = rd.file(f"eval_{who}_v{reg}.jsonl")  # the names _track_evals logs
                path.write_text("".join(json.dumps(r) + "\n" for r in result.table))
                out.setdefault(who, {})[reg] = {"greedy": result.summary("greedy_success")["mean"],
                                                "sampled": result.summary("sampled_success")["mean"]}
                log.info("evaluate %s on registry v%s: greedy %.3f, sampled %.3f", who, reg,
                         out[who][reg]["greedy"], out[who][reg]["sampled"])
        pids = pool.engine_pids()
        pool.shutdown()
    finally:
        ray.shutdown()
    rd.record_timing("evaluate", time.time() - t0, cpus=settings.rollout.num_workers * settings.rollout.cpus_per_worker,
                     engine_pids=pids)
    return out


def _table(rd: RunDir, who: str, reg: str):
    from tasks.evals.harness import EvalResult

    path = rd.path / f"eval_{who}_v{reg}.jsonl"
    return EvalResult([json.loads(line) for line in path.read_text().splitlines() if line.strip()])


def validate_evals(settings, rd: RunDir) -> dict:
    """GX on every eval table, then the paired comparisons (both decodings) the gate judges."""
    from tasks.evals.harness import compare
    from tasks.pipeline import _track_evals

    regs = registries(settings)
    champion = {reg: _table(rd, "champion", reg) for reg in regs}
    challenger = {reg: _table(rd, "challenger", reg) for reg in regs}
    e = settings.eval
    sampled = {reg: compare(challenger[reg], champion[reg], "sampled_success", e.bootstrap_resamples, e.confidence)
               for reg in regs}
    greedy = {reg: compare(challenger[reg], champion[reg], "greedy_success", e.bootstrap_resamples, e.confidence)
              for reg in regs}
    tracker = _tracker(settings)
    with _stage(settings, rd, "evals"):
        ok = _track_evals(tracker, settings, rd.path, champion, challenger, sampled, greedy)
    rd.write({"sampled": sampled, "greedy": greedy, "evals_valid": ok}, "comparisons.json")
    if not ok:
        log.warning("eval tables failed GX validation: the gate will refuse to promote (see gx_docs_evals/)")
    t = settings.env.target_registry
    return {"evals_valid": ok, "target_greedy": greedy[t]["difference"], "target_sampled": sampled[t]["difference"]}


def cost(settings, rd: RunDir) -> dict:
    """Price every stage's held resources (timings/*.json) and the projected serving change."""
    from tasks.promotion.cost import ServingProjection, StageUsage
    from tasks.promotion.step import price_run

    stages = []
    for f in sorted((rd.path / "timings").glob("*.json")):
        t = json.loads(f.read_text())
        stages.append(StageUsage(t["stage"], t["wall_s"], cpus=t["cpus"], tokens_generated=t.get("tokens_generated", 0),
                                 tokens_trained=t.get("tokens_trained", 0)))
    comparisons = rd.read("comparisons.json")
    chosen = comparisons["greedy" if settings.promotion.metric == "greedy_success" else "sampled"]
    target = settings.env.target_registry

    def tokens(who):
        table = _table(rd, who, target).table
        return sum(r.get("greedy_completion_tokens", 0) for r in table) / max(1, len(table))

    report = price_run(settings, chosen, stages, ServingProjection(tokens("champion"), tokens("challenger")))
    rd.write(report, "cost.json")
    log.info("cost: run $%.4f, total $%.4f over %d stages", report["run_usd"], report["total_usd"], len(stages))
    return {"run_usd": report["run_usd"], "total_usd": report["total_usd"],
            "usd_per_success_point": report["usd_per_success_point"]}


def gate(settings, rd: RunDir, max_cost_usd: float | None = None) -> dict:
    """The promotion decision (pure: tasks.promotion.gate.decide) with its reasons; a run dearer than the
    `max_cost_usd` budget is not promoted however good."""
    from tasks.promotion.step import judge

    comparisons = rd.read("comparisons.json")
    chosen = comparisons["greedy" if settings.promotion.metric == "greedy_success" else "sampled"]
    signals = rd.read("signals.json") or {}
    validations = {"data": signals.get("data_validation") == "passed", "evals": bool(comparisons["evals_valid"])}
    cost_report = rd.read("cost.json")
    decision = judge(settings, chosen, validations, cost_report)
    if max_cost_usd is not None:
        within = cost_report["total_usd"] <= float(max_cost_usd)
        reason = (f"cost ${cost_report['total_usd']:.4f} {'within' if within else 'over'} the run's budget "
                  f"max_cost_usd=${float(max_cost_usd):.4f}")
        decision.checks.append({"name": "budget", "passed": within, "observed": cost_report["total_usd"],
                                "threshold": float(max_cost_usd), "unit": "USD", "reason": reason})
        if not within:
            decision.reasons = ([reason] + decision.reasons) if not decision.promote else [reason]
            decision.promote = False
            decision.summary = "not promoted: " + reason
    rd.write(decision.to_dict(), "decision.json")
    log.info("gate: %s: %s", "PROMOTE" if decision.promote else "do not promote", decision.summary)
    for check in decision.checks:
        log.info("  %s %s: %s", "ok  " if check["passed"] else "FAIL", check["name"], check["reason"])
    return {"promote": decision.promote, "reasons": decision.reasons}


def update_registry(settings, rd: RunDir) -> dict:
    """Register the challenger and move the aliases (or record 'not promoted'); idempotent per DAG run."""
    from tasks.promotion.gate import Decision
    from tasks.promotion.step import apply_decision

    comparisons = rd.read("comparisons.json")
    chosen = comparisons["greedy" if settings.promotion.metric == "greedy_success" else "sampled"]
    decision = Decision(**rd.read("decision.json"))
    tracker = _tracker(settings)
    with _stage(settings, rd, "promotion"):
        result = apply_decision(settings, decision, rd.read("cost.json"), chosen, rd.read("run.json")["mlflow_run_id"],
                                rd.run_id, tracker=tracker,
                                version_tags={"evergreen.policy_version": str(settings.grpo.steps),
                                              "airflow.run_id": rd.run_id})
    rd.write(result, "promotion.json")
    return {"version": result["version"], "aliases": result["aliases"], "promoted": decision.promote}


def summarize(settings, rd: RunDir, links: dict | None = None) -> dict:
    """The run's summary.json (the Evergreen page reads it), its MLflow status, and a printed summary;
    runs whatever happened upstream."""
    from tasks.rl.metrics import metrics_digest

    run = rd.read("run.json") or {}
    promotion, skip = rd.read("promotion.json"), rd.read("skip.json")
    status = ("promoted" if promotion["decision"]["promote"] else "not_promoted") if promotion else \
        "skipped" if skip else "failed"
    signals = rd.read("signals.json") or {}
    drift = (_read_json(rd.path / "signals" / "monitor" / "drift_report.json") or {}).get("tests", [])
    tooldiff = _read_json(rd.path / "signals" / "monitor" / "tooldiff.json") or {}
    comparisons = rd.read("comparisons.json") or {}
    timings = {f.stem: json.loads(f.read_text())["wall_s"] for f in sorted((rd.path / "timings").glob("*.json"))}
    started = run.get("started_at")
    summary = {
        "dag_id": rd.dag_id, "run_id": rd.run_id, "run_dir": str(rd.path), "status": status,
        "started_at": started, "finished_at": datetime.now(timezone.utc).isoformat(),
        "trigger": run.get("trigger", {}), "skip_reason": (skip or {}).get("reason"),
        "signals": {"retrain": signals.get("retrain"), "reasons": signals.get("reasons", []),
                    "summary": signals.get("summary"), "window": signals.get("window"), "rows": signals.get("rows"),
                    "data_validation": signals.get("data_validation"),
                    "drift": [{k: t.get(k) for k in ("workload", "statistic", "effect", "p_adjusted", "significant",
                                                     "verdict")} for t in drift],
                    "tooldiff": {"breaking": (tooldiff.get("counts") or {}).get("breaking", 0),
                                 "summary": tooldiff.get("summary"),
                                 "changes": [_change_text(c) for c in (tooldiff.get("changes") or [])][:40]}},
        "target_registry": settings.env.target_registry, "guard_registries": registries(settings)[1:],
        "greedy": comparisons.get("greedy"), "sampled": comparisons.get("sampled"),
        "probe": [json.loads(f.read_text()) for f in sorted((rd.path / "probe").glob("shard-*.json"))],
        "training": metrics_digest(rd.path / "grpo" / "metrics.jsonl"),
        "promotion": promotion, "champion_version": None, "challenger_version": (promotion or {}).get("version"),
        "links": {"mlflow_run": run.get("mlflow_url"), **(links or {})},
        "timings": timings,
        "wall_s": (datetime.now(timezone.utc) - datetime.fromisoformat(started)).total_seconds() if started else None,
    }
    if promotion:
        move = promotion.get("move") or {}
        summary["champion_version"] = move.get("from") or promotion["aliases"].get("previous")
    rd.write(summary, "summary.json")
    if run.get("mlflow_run_id"):
        try:
            tracker = _tracker(settings)
            with tracker.within(run["mlflow_run_id"]):
                tracker.log_artifact(rd.path / "summary.json")
            tracker.finish(run["mlflow_run_id"], "FAILED" if status == "failed" else "FINISHED")
        except Exception as e:  # noqa: BLE001 - the summary on disk matters more than the MLflow status
            log.warning("could not close MLflow run %s: %s", run["mlflow_run_id"], e)
    log.info("%s", format_summary(summary))
    return {"status": status, "summary": str(rd.path / "summary.json")}


def _change_text(change) -> str:
    if not isinstance(change, dict):
        return str(change)
    return f"{change.get('kind', '')}: {change.get('detail') or change.get('description') or change}"


def _read_json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def _pct(ci: dict | None) -> str:
    if not ci:
        return "—"
    return f"{100 * ci['mean']:5.1f}% [{100 * ci['low']:5.1f}, {100 * ci['high']:5.1f}]"


def format_summary(summary: dict) -> str:
    """Plain-text summary of one DAG run (the task log, `make demo`)."""
    lines = ["=" * 78, f"{summary['dag_id']} {summary['run_id']}: {summary['status'].upper()}",
             f"  trigger: {summary.get('trigger', {}).get('kind')}"]
    sig = summary.get("signals") or {}
    if sig.get("window"):
        lines.append(f"  signals {sig['window']}: retrain={sig.get('retrain')}; {str(sig.get('summary'))[:150]}")
    if summary.get("skip_reason"):
        lines.append(f"  skipped: {summary['skip_reason']}")
    for kind in ("greedy", "sampled"):
        for reg, c in (summary.get(kind) or {}).items():
            lines.append(f"  [{kind:7s}] registry v{reg}: champion {_pct(c['champion'])} -> challenger "
                         f"{_pct(c['challenger'])}  diff {100 * c['difference']['mean']:+5.1f} pts "
                         f"[{100 * c['difference']['low']:+5.1f}, {100 * c['difference']['high']:+5.1f}]")
    promo = summary.get("promotion")
    if promo:
        d, c = promo["decision"], promo["cost"]
        lines.append(f"  decision: {'PROMOTED' if d['promote'] else 'not promoted'} {promo['model_name']} version "
                     f"{promo['version']}; aliases {promo['aliases']}")
        lines.append(f"  cost ${c['total_usd']:.4f} (run ${c['run_usd']:.4f}); {d['summary'][:160]}")
    for name, url in (summary.get("links") or {}).items():
        if url:
            lines.append(f"  {name}: {url}")
    lines.append("=" * 78)
    return "\n".join(lines)


# ------------------------------------------------------------------------------ monitor / rollback
def monitor(settings, out_dir: str | Path, window: str | None = None, reference_days: int | None = None) -> dict:
    """drift_monitor's check of one window; returns the verdict plus whether it is new (not yet announced):
    an hourly monitor sees the same finished day many times and must ask for retraining once."""
    from tasks.signals.ingest import Window
    from tasks.signals.monitor import check_production

    win = Window.parse(window) if window else last_full_days(settings.monitor.window_days)
    s = settings
    if reference_days:
        s = settings.model_copy(update={"drift": settings.drift.model_copy(update={"reference_days": int(reference_days)})})
    out = Path(out_dir)
    key = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(win))
    if not _has_traces(settings.monitor.traces, win):
        summary = f"no production traces for {win} under {settings.monitor.traces}: nothing to compare"
        log.warning(summary)
        return {"retrain": False, "new": False, "summary": summary, "reasons": [], "window": str(win), "rows": {}}
    champion = None
    try:
        from tasks.policy.model import resolve_model_dir

        _tracker(settings)
        champion = resolve_model_dir(CHAMPION_URI.format(name=settings.promotion.model_name),
                                     cache_dir=out / "champion" / key)
    except Exception as e:  # noqa: BLE001 - no champion yet: drift only, no tool diff
        log.warning("no champion in the registry (%s): checking drift without the tool diff", type(e).__name__)
    verdict = check_production(s, settings.monitor.traces, out / "windows" / key, win, champion=champion,
                               registry=settings.env.target_registry if champion else None)
    announced = out / "announced" / f"{key}_{verdict.get('registry_hash') or 'none'}.json"
    verdict["new"] = verdict["retrain"] and not announced.exists()
    if verdict["new"]:
        announced.parent.mkdir(parents=True, exist_ok=True)
        announced.write_text(json.dumps({"window": str(win), "summary": verdict["summary"]}))
    return verdict


def _has_traces(source: str, window) -> bool:
    from tasks.signals.ingest import select_files

    try:
        return bool(select_files(source, window))
    except FileNotFoundError:
        return False


def retrain_request_extra(verdict: dict) -> dict:
    """The asset event's `extra`: why retraining is asked for, small enough for the metadata DB."""
    return {"retrain": bool(verdict["retrain"]), "window": verdict["window"], "summary": verdict["summary"][:500],
            "reasons": [r[:300] for r in verdict["reasons"][:10]], "registry_hash": verdict.get("registry_hash"),
            "rows": verdict.get("rows"), "tool_change_breaking": verdict.get("tool_change_breaking"),
            "drifted": verdict.get("drifted")}


def rollback(settings, run_key: str, confirm: bool, reason: str) -> dict:
    """champion := previous, once per run_key; refuses without confirm."""
    if not confirm:
        raise PermissionError("rollback moves the production alias: trigger it with the param confirm=true "
                              "(and a reason)")
    from tasks.promotion.registry import ModelRegistry

    _tracker(settings)
    registry = ModelRegistry(settings.promotion.model_name)
    result = registry.rollback(run_key)
    registry.tag_version(result["to"], {"evergreen.rollback_reason": reason[:500]})
    log.info("rollback %s: champion %s -> %s (%s)", settings.promotion.model_name, result["from"], result["to"], reason)
    return {**result, "aliases": registry.aliases()}


def simulate_production(settings, days: int = 2, change: bool = True) -> dict:
    """The demo's production: `days` past days of champion traffic (through vLLM), the tool registry
    switching to the target at midnight before the last day when `change`.

    The engine runs in a process of its own (`python -m tasks simulate`): when vLLM builds an engine it scans
    every loaded module, and trips over the unbound Flask proxies an Airflow worker has imported."""
    import subprocess
    import tempfile

    import yaml

    _tracker(settings)
    from tasks.policy.model import resolve_model_dir

    out = Path(settings.monitor.traces)
    champion = resolve_model_dir(CHAMPION_URI.format(name=settings.promotion.model_name),
                                 cache_dir=out.parent / "champion")
    today = last_full_days(1).end
    start = today - timedelta(days=days)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="evergreen-settings-") as cfg:
        yaml.safe_dump(settings.model_dump(mode="json"), cfg)
        cfg.flush()
        cmd = [sys.executable, "-m", "tasks", "--config", cfg.name, "simulate", "--out", str(out),
               "--start", start.isoformat(), "--end", today.isoformat(), "--traces", str(settings.simulate.traces),
               "--from-registry", settings.env.champion_registry, "--to-registry", settings.env.target_registry,
               "--policy", str(champion), "--malformed-share", str(settings.simulate.malformed_share),
               "--seed", str(settings.grpo.seed)]
        if change:
            cmd += ["--change-at", (today - timedelta(days=1)).isoformat()]
        log.info("simulating production: %s", shlex.join(cmd))
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=_child_env())
        lines = []
        for line in proc.stdout:  # progress into this task's log as it happens
            lines.append(line.rstrip())
            log.info("[simulate] %s", line.rstrip()[:500])
        if proc.wait() != 0:
            raise RuntimeError(f"simulation failed ({proc.returncode}): " + "\n".join(lines[-20:]))
    manifest = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
    return {"traces": str(out), "days": days, "change": change,
            **{k: v for k, v in manifest.items() if isinstance(v, (int, float, str))}}


def _child_env() -> dict:
    import os

    from tasks.config import PROJECT_ROOT

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    return env
