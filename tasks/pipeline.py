"""The loop from the command line, without Airflow: bootstrap → eval champion → GRPO on v2 → eval challenger.

    python -m tasks demo                 # the embedded default, on this machine
    EVERGREEN_GRPO__STEPS=5 python -m tasks demo

Each stage is one function here, so the Airflow tasks (a later issue) call the same code. The summary
printed at the end is also written to `<run_dir>/summary.json`.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)


def bootstrap_champion(settings, out_dir: str | Path) -> dict:
    """Build the tiny model from config and fine-tune it into a registry-v1 agent; returns its stats."""
    from tasks.envs import get_env
    from tasks.policy.model import build_model, save_model
    from tasks.policy.sft import sft_train

    t0 = time.time()
    model, tokenizer = build_model(settings.model)
    losses = sft_train(model, tokenizer, settings)
    path = save_model(model, tokenizer, out_dir, registry=get_env(settings.env.name).load_registry(settings.env.champion_registry))
    stats = {"model_dir": str(path), "sft_steps": len(losses), "final_loss": losses[-1], "seconds": time.time() - t0,
             "parameters": sum(p.numel() for p in model.parameters())}
    log.info("bootstrap: %s", stats)
    return stats


def eval_tasks(settings, registry: str):
    from tasks.envs import get_env

    env = get_env(settings.env.name)
    return env.generate_tasks(settings.eval.num_tasks, settings.eval.seed, env.load_registry(registry),
                              split=settings.eval.split)


def evaluate_pool(pool, settings, registries: list[str]) -> dict:
    """{registry: EvalResult} for the weights currently in the pool."""
    out = {}
    for reg in registries:
        t0 = time.time()
        out[reg] = pool.evaluate(eval_tasks(settings, reg), settings.eval.samples, settings.rollout.temperature,
                                 settings.eval.seed)
        s = out[reg].summary("sampled_success", settings.eval.bootstrap_resamples, settings.eval.confidence)
        log.info("eval v%s policy v%d: sampled success %.3f [%.3f, %.3f], greedy %.3f (%.1fs)", reg,
                 pool.policy_version, s["mean"], s["low"], s["high"], out[reg].summary("greedy_success")["mean"],
                 time.time() - t0)
    return out


def _fmt(ci: dict) -> str:
    return f"{100 * ci['mean']:5.1f}% [{100 * ci['low']:5.1f}, {100 * ci['high']:5.1f}]"


def production_signals(settings, champion_dir: Path, out_dir: Path) -> dict:
    """The demo's production: two past days of champion traffic (through vLLM), the tool registry
    switching from the champion's to the target at midnight between them; then the monitor's verdict
    on the second day against the first."""
    from datetime import datetime, timedelta, timezone

    from tasks.signals.ingest import Window
    from tasks.signals.monitor import check_production
    from tasks.signals.simulate import simulate_traces

    today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    day1, day2 = today - timedelta(days=2), today - timedelta(days=1)
    schedule = [(day1, settings.env.champion_registry), (day2, settings.env.target_registry)]
    manifest = simulate_traces(out_dir / "traces", day1, today, settings.simulate.traces, schedule,
                               policy=str(champion_dir), settings=settings,
                               malformed_share=settings.simulate.malformed_share, seed=settings.grpo.seed)
    one_day = settings.model_copy(update={"drift": settings.drift.model_copy(update={"reference_days": 1})})
    verdict = check_production(one_day, out_dir / "traces", out_dir / "monitor", Window(day2, today),
                               champion=champion_dir, registry=settings.env.target_registry)
    return {"manifest": manifest, "verdict": verdict}


def run_demo(settings, fresh: bool = True, run_key: str | None = None) -> dict:
    """The whole loop on this machine, as one MLflow run with a nested run per stage; ends with the
    promotion decision and a printed summary. `run_key` makes registry moves idempotent (an Airflow run id)."""
    import ray
    from safetensors.torch import load_file

    from tasks.evals.harness import compare
    from tasks.rl.cluster import connect
    from tasks.rl.rollout import RolloutPool
    from tasks.rl.train import run_grpo
    from tasks.tracking import Tracker

    t_start = time.time()
    run_dir = Path(settings.run_dir).resolve()
    if fresh and run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    champ_dir = run_dir / "champion"
    run_key = run_key or f"cli-demo-{time.strftime('%Y%m%dT%H%M%S')}"
    timings = {}
    tracker = Tracker.from_settings(settings)
    with tracker.pipeline_run("demo", settings=settings, tags={"airflow.dag_id": "cli-demo", "airflow.run_id": run_key}) as run:
        t0 = time.time()
        boot = bootstrap_champion(settings, champ_dir) if not (champ_dir / "config.json").exists() else {"model_dir": str(champ_dir)}
        timings["bootstrap_s"] = time.time() - t0
        _track_bootstrap(tracker, settings, champ_dir, boot, run_key)
        t0 = time.time()
        signals = production_signals(settings, champ_dir, run_dir / "signals")
        timings["signals_s"] = time.time() - t0
        _track_signals(tracker, run_dir / "signals", signals)

        owns_ray = not ray.is_initialized()  # a caller's cluster (tests, Airflow) is left running
        connect(settings)
        try:
            t0 = time.time()
            pool = RolloutPool(champ_dir, settings)
            timings["engines_s"] = time.time() - t0
            regs = [settings.env.champion_registry, settings.env.target_registry]
            t0 = time.time()
            champion = evaluate_pool(pool, settings, regs)
            timings["eval_champion_s"] = time.time() - t0

            t0 = time.time()
            run_grpo(settings, champ_dir, run_dir / "grpo", actors=pool.actors)
            timings["grpo_s"] = time.time() - t0

            t0 = time.time()
            challenger_dir = run_dir / "grpo" / "model"
            pool.load_weights(load_file(challenger_dir / "model.safetensors"), version=settings.grpo.steps)
            challenger = evaluate_pool(pool, settings, regs)
            timings["eval_challenger_s"] = time.time() - t0
            pool.shutdown()
        finally:
            if owns_ray:
                ray.shutdown()

        e = settings.eval
        comparisons = {reg: compare(challenger[reg], champion[reg], "sampled_success", e.bootstrap_resamples, e.confidence)
                       for reg in regs}
        greedy = {reg: compare(challenger[reg], champion[reg], "greedy_success", e.bootstrap_resamples, e.confidence)
                  for reg in regs}
        for reg in regs:
            for name, res in (("champion", champion[reg]), ("challenger", challenger[reg])):
                (run_dir / f"eval_{name}_v{reg}.jsonl").write_text("\n".join(json.dumps(r) for r in res.table) + "\n")
        from tasks.rl.metrics import read_metrics, training_digest

        metrics = read_metrics(run_dir / "grpo" / "metrics.jsonl")
        evals_ok = _track_evals(tracker, settings, run_dir, champion, challenger, comparisons, greedy)
        _track_training(tracker, run_dir / "grpo", metrics)
        tracker.log_artifacts(challenger_dir, "model")
        promotion = _promote(settings, tracker, run, run_key, champion, challenger, comparisons, greedy, timings,
                             metrics, validations={"data": signals["verdict"]["data_validation"] == "passed",
                                                   "evals": evals_ok})
        summary = {"run_dir": str(run_dir), "bootstrap": boot, "signals": signals["verdict"],
                   "sampled": comparisons, "greedy": greedy, "promotion": promotion,
                   "mlflow": tracker.run_url(run), "timings": timings, "wall_s": time.time() - t_start,
                   "grpo_metrics": metrics, "training": training_digest(metrics)}
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        tracker.log_artifact(run_dir / "summary.json")
    print_summary(summary, settings)
    return summary


def _track_bootstrap(tracker, settings, champ_dir: Path, boot: dict, run_key: str) -> None:
    """The bootstrapped model is logged and registered; it becomes champion when the registry has none."""
    from tasks.promotion.registry import CHAMPION, ModelRegistry

    with tracker.stage("bootstrap") as stage:
        tracker.log_metrics({k: v for k, v in boot.items() if k in ("sft_steps", "final_loss", "seconds", "parameters")})
        tracker.log_artifacts(champ_dir, "model")
        registry = ModelRegistry(settings.promotion.model_name)
        version = registry.register(stage.info.run_id, "model", run_key=f"{run_key}:bootstrap",
                                    tags={"evergreen.kind": "bootstrap", "evergreen.registry": settings.env.champion_registry})
        if registry.version_of(CHAMPION) is None:
            registry.promote(version, run_key=f"{run_key}:bootstrap",
                             decision={"promote": True, "reasons": ["first model: the registry had no champion"]})


def _track_signals(tracker, out: Path, signals: dict) -> None:
    import pandas as pd

    verdict = signals["verdict"]
    with tracker.stage("signals"):
        tracker.log_metrics({"retrain": float(verdict["retrain"]), "rows_current": verdict["rows"]["current"] or 0,
                             "rows_reference": verdict["rows"]["reference"] or 0})
        report = json.loads((out / "monitor" / "drift_report.json").read_text())
        tracker.log_metrics({f"drift.{t['workload']}.{t['statistic']}.{k}": t[k] for t in report["tests"]
                             for k in ("effect", "p_adjusted") if isinstance(t.get(k), (int, float))})
        tracker.set_tags({"evergreen.registry_hash": verdict.get("registry_hash") or "",
                          "evergreen.retrain_reason": verdict["summary"][:250]})
        monitor = out / "monitor"
        for name, where in (("signals.json", "signals"), ("drift_report.json", "signals"), ("tooldiff.json", "signals"),
                            ("current/summary.json", "signals/ingest"), ("current/validation.json", "signals/ingest")):
            if (monitor / name).exists():
                tracker.log_artifact(monitor / name, where)
        tracker.log_artifacts(monitor / "current" / "gx_docs", "signals/gx_docs")
        rows = [json.loads(line) for line in (monitor / "current" / "accepted" / "part-00000.jsonl").read_text().splitlines()]
        frame = pd.DataFrame({"trace_id": [r["trace_id"] for r in rows], "workload": [r["workload"] for r in rows],
                              "timestamp": [r["timestamp"] for r in rows], "success": [r["outcome"]["success"] for r in rows]})
        tracker.log_dataset(frame, name="production-traces", source=str(out / "traces"), context="drift-current")


def _track_evals(tracker, settings, run_dir: Path, champion, challenger, comparisons, greedy) -> bool:
    """Eval metrics and tables; returns whether every table passed the GX eval suite."""
    from tasks.data.checks import check_eval_table
    from tasks.data.validation import Validator

    validator = Validator(run_dir / "gx_docs_evals")
    ok = True
    with tracker.stage("evals"):
        for reg in comparisons:
            for name, res in (("champion", champion[reg]), ("challenger", challenger[reg])):
                outcome = check_eval_table(res.table, settings.eval.num_tasks, validator=validator)
                ok &= outcome.success
                tracker.log_artifact(run_dir / f"eval_{name}_v{reg}.jsonl", "evals")
            tracker.log_metrics({f"v{reg}.{kind}.{who}": cmp[who]["mean"]
                                 for kind, table in (("sampled", comparisons), ("greedy", greedy))
                                 for cmp in [table[reg]] for who in ("champion", "challenger")})
            tracker.log_metrics({f"v{reg}.greedy.difference_low": greedy[reg]["difference"]["low"]})
        tracker.set_tags({"evergreen.eval_validation": "passed" if ok else "failed"})
    return ok


def _track_training(tracker, grpo_dir: Path, metrics: list[dict]) -> None:
    with tracker.stage("training"):
        for m in metrics:
            tracker.log_metrics({k: v for k, v in m.items() if k != "step"}, step=m["step"])
        shards = sorted((grpo_dir / "rollouts").glob("step-*/shard-0000.jsonl"))
        if shards:  # a sample of rollouts (the last step's first shard), not all of them
            tracker.log_artifact(shards[-1], "sample_rollouts")
        tracker.set_tags({"evergreen.policy_version": str(metrics[-1]["step"]) if metrics else "0"})


def _promote(settings, tracker, run, run_key, champion, challenger, comparisons, greedy, timings, metrics, validations):
    """Cost ledger from what each stage held on this machine, then the gate and the registry."""
    import os

    from tasks.promotion.cost import ServingProjection, StageUsage
    from tasks.promotion.step import promotion_step

    cores = os.cpu_count() or 1
    actors = settings.rollout.num_workers * settings.rollout.cpus_per_worker
    stages = [
        StageUsage("bootstrap", timings["bootstrap_s"], cpus=cores),
        StageUsage("signals", timings["signals_s"], cpus=cores),
        StageUsage("evals", timings["engines_s"] + timings["eval_champion_s"] + timings["eval_challenger_s"], cpus=actors),
        StageUsage("grpo", timings["grpo_s"], cpus=actors + settings.grpo.num_train_workers,
                   tokens_generated=int(sum(m.get("generated_tokens", 0) for m in metrics)),
                   tokens_trained=int(sum(m.get("trained_tokens", 0) for m in metrics))),
    ]
    target = settings.env.target_registry

    def tokens(result):
        return sum(r.get("greedy_completion_tokens", 0) for r in result.table) / max(1, len(result.table))

    serving = ServingProjection(tokens(champion[target]), tokens(challenger[target]))
    chosen = greedy if settings.promotion.metric == "greedy_success" else comparisons
    return promotion_step(settings, chosen, validations, stages, run.info.run_id, run_key, tracker=tracker,
                          serving=serving, version_tags={"evergreen.policy_version": str(settings.grpo.steps)})


def print_summary(summary: dict, settings) -> None:
    tgt, champ = settings.env.target_registry, settings.env.champion_registry
    lines = ["", "=" * 78, "Evergreen demo: champion (SFT on registry v%s) vs challenger (GRPO on v%s)" % (champ, tgt),
             f"success per task, mean of {settings.eval.samples} samples at T={settings.rollout.temperature}, "
             f"{settings.eval.num_tasks} held-out tasks, {int(100 * settings.eval.confidence)}% paired-bootstrap intervals", ""]
    sig = summary.get("signals")
    if sig:
        lines += [f"  production signals ({sig['window']}): retrain={sig['retrain']}"]
        lines += [f"    - {r[:110]}" for r in sig["reasons"][:4]] + [""]
    for label, key in (("sampled", "sampled"), ("greedy", "greedy")):
        for reg in (tgt, champ):
            c = summary[key][reg]
            lines.append(f"  [{label:7s}] registry v{reg}: champion {_fmt(c['champion'])}  challenger {_fmt(c['challenger'])}"
                         f"  diff {100 * c['difference']['mean']:+5.1f} pts [{100 * c['difference']['low']:+5.1f}, "
                         f"{100 * c['difference']['high']:+5.1f}]")
    promo = summary.get("promotion")
    if promo:
        d = promo["decision"]
        lines += ["", f"  promotion ({settings.promotion.metric}): {'PROMOTED' if d['promote'] else 'not promoted'} "
                      f"{promo['model_name']} version {promo['version']}; aliases {promo['aliases']}",
                  f"    cost ${promo['cost']['total_usd']:.4f} (run ${promo['cost']['run_usd']:.4f}); {d['summary'][:150]}"]
    t = summary["timings"]
    lines += ["", "  wall %.0fs: bootstrap %.0fs, signals %.0fs, engines %.0fs, eval %.0fs + %.0fs, GRPO %.0fs (%d steps)" % (
        summary["wall_s"], t.get("bootstrap_s", 0), t.get("signals_s", 0), t.get("engines_s", 0), t.get("eval_champion_s", 0),
        t.get("eval_challenger_s", 0), t.get("grpo_s", 0), len(summary["grpo_metrics"])),
        f"  artifacts: {summary['run_dir']} (summary.json, signals/ (traces, quarantine, GX data docs, drift report),",
        "             eval tables, grpo/metrics.jsonl, grpo/rollouts, checkpoints)",
        f"  MLflow: {summary.get('mlflow', '')}",
        "=" * 78]
    print("\n".join(lines), flush=True)
