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
    return env.generate_tasks(settings.eval.num_tasks, settings.eval.seed, env.load_registry(registry))


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


def run_demo(settings, fresh: bool = True) -> dict:
    import ray
    from safetensors.torch import load_file

    from tasks.evals.harness import compare
    from tasks.rl.cluster import connect
    from tasks.rl.rollout import RolloutPool
    from tasks.rl.train import run_grpo

    t_start = time.time()
    run_dir = Path(settings.run_dir).resolve()
    if fresh and run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    champ_dir = run_dir / "champion"
    timings = {}
    t0 = time.time()
    boot = bootstrap_champion(settings, champ_dir) if not (champ_dir / "config.json").exists() else {"model_dir": str(champ_dir)}
    timings["bootstrap_s"] = time.time() - t0
    t0 = time.time()
    signals = production_signals(settings, champ_dir, run_dir / "signals")
    timings["signals_s"] = time.time() - t0

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
        pool.sync_weights(load_file(challenger_dir / "model.safetensors"), version=settings.grpo.steps)
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
    summary = {"run_dir": str(run_dir), "bootstrap": boot, "signals": signals["verdict"],
               "sampled": comparisons, "greedy": greedy,
               "timings": timings, "wall_s": time.time() - t_start,
               "grpo_metrics": [json.loads(l) for l in (run_dir / "grpo" / "metrics.jsonl").read_text().splitlines()]}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary, settings)
    return summary


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
    t = summary["timings"]
    lines += ["", "  wall %.0fs: bootstrap %.0fs, signals %.0fs, engines %.0fs, eval %.0fs + %.0fs, GRPO %.0fs (%d steps)" % (
        summary["wall_s"], t.get("bootstrap_s", 0), t.get("signals_s", 0), t.get("engines_s", 0), t.get("eval_champion_s", 0),
        t.get("eval_challenger_s", 0), t.get("grpo_s", 0), len(summary["grpo_metrics"])),
        f"  artifacts: {summary['run_dir']} (summary.json, signals/ (traces, quarantine, GX data docs, drift report),",
        "             eval tables, grpo/metrics.jsonl, grpo/rollouts, checkpoints)",
        "=" * 78]
    print("\n".join(lines), flush=True)
