"""Does the recipe hold on any machine? The demo's recipe over SFT seeds, GRPO seeds and torch thread counts.

    python bench/seeds.py                                   # 2 SFT seeds x 3 GRPO seeds x threads 1, 2 (hours)
    python bench/seeds.py --sft-seeds 1 --grpo-seeds 0 --threads 2 --set grpo.steps=2 --set bootstrap.steps=20  # smoke

A thread count changes the order floats are summed in, the way another CPU's kernels do, so the spread
over threads stands in for the spread over machines. For each (threads, SFT seed) the champion is
bootstrapped once (`python -m tasks bootstrap`, toolset v1), then for each GRPO seed the challenger is
trained from it (`python -m tasks train`, the DAG's Ray job) and both are evaluated on the gate's held-out
tasks of both toolsets (`python -m tasks eval --against`: paired bootstrap of the per-task difference).
Every draw is appended to `<out>/draws.jsonl` as it finishes and skipped when the bench is run again, so
an interrupted run resumes. With `--set grpo.validation_tasks=N` the challenger is GRPO's validated
checkpoint choice (tasks/rl/selection.py); the last step's checkpoint is then evaluated too, so one run
measures the choice against taking the last step on the same draws (`last_step` in the JSON line).
Prints one JSON line: per metric (v2 and v1 difference, greedy and sampled)
the mean and sd over draws, and how many draws clear issue 2's floor (v2 at least +25 pts with its 95 %
interval above zero, at most 5 pts lost on v1, greedy and sampled).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOOR_GAIN, FLOOR_LOSS = 0.25, -0.05
KEYS = ("greedy_success", "sampled_success")


def run_cli(args, *command: str, threads: int) -> dict:
    """`python -m tasks <command>` with the bench's --set pairs; its last stdout line as JSON."""
    sets = [x for pair in args.set for x in ("--set", pair)]
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads), "RAY_TRAIN_V2_ENABLED": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "tasks", *sets, *command], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"python -m tasks {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def last_model(run: Path, step: int) -> Path:
    """The run's last-step checkpoint saved as a model directory (checksummed, as `eval` loads)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tasks.policy.model import load_model, save_model

    out = run / "last_model"
    if not (out / "config.json").exists():
        model, chat, _ = load_model(run / "checkpoints" / f"step-{step:06d}", checksums=False)
        save_model(model, chat, out)
    return out


def passes(draw: dict) -> bool:
    """Issue 2's floor on one draw: v2 +25 pts or more with its interval above zero, v1 at most -5 pts."""
    return all(
        draw["2"][k]["difference"]["mean"] >= FLOOR_GAIN
        and draw["2"][k]["difference"]["low"] > 0
        and draw["1"][k]["difference"]["mean"] >= FLOOR_LOSS
        for k in KEYS
    )


def summarize(draws: list[dict]) -> dict:
    out = {"draws": len(draws), "passing": sum(passes(d) for d in draws)}
    for toolset in ("2", "1"):
        for key in KEYS:
            values = [d[toolset][key]["difference"]["mean"] for d in draws]
            out[f"v{toolset}_{key.split('_')[0]}_mean"] = round(statistics.fmean(values), 4) if values else None
            out[f"v{toolset}_{key.split('_')[0]}_sd"] = round(statistics.stdev(values), 4) if len(values) > 1 else None
    out["mean_passes"] = bool(draws) and all(
        out[f"v2_{k}_mean"] >= FLOOR_GAIN and out[f"v1_{k}_mean"] >= FLOOR_LOSS for k in ("greedy", "sampled")
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sft-seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--grpo-seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--out", default=str(ROOT / "runs" / "seeds"))
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="for every command")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ledger = out / "draws.jsonl"
    draws = [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []
    done = {(d["threads"], d["sft_seed"], d["grpo_seed"]) for d in draws}
    t0 = time.time()
    for threads in args.threads:
        for sft_seed in args.sft_seeds:
            champion = out / f"t{threads}-sft{sft_seed}" / "champion"
            if all((threads, sft_seed, g) in done for g in args.grpo_seeds):
                continue
            if not (champion / "config.json").exists():
                run_cli(
                    args,
                    "--set",
                    f"bootstrap.seed={sft_seed}",
                    "--set",
                    f"bootstrap.threads={threads}",
                    "bootstrap",
                    "--out",
                    str(champion),
                    threads=threads,
                )
            for grpo_seed in args.grpo_seeds:
                if (threads, sft_seed, grpo_seed) in done:
                    continue
                run = champion.parent / f"grpo{grpo_seed}"
                run_cli(
                    args,
                    "--set",
                    f"grpo.seed={grpo_seed}",
                    "--set",
                    f"grpo.threads={threads}",
                    "train",
                    "--init",
                    str(champion),
                    "--run-dir",
                    str(run),
                    threads=threads,
                )
                diff = run_cli(
                    args,
                    "eval",
                    "--model",
                    str(run / "model"),
                    "--against",
                    str(champion),
                    "--toolset",
                    "2",
                    "1",
                    threads=threads,
                )
                draw = {"threads": threads, "sft_seed": sft_seed, "grpo_seed": grpo_seed, **diff}
                if (run / "selection.json").exists():  # with grpo.validation_tasks: the last step beside the choice
                    choice = json.loads((run / "selection.json").read_text())
                    draw["chosen_step"], draw["last_step"] = choice["step"], choice["last_step"]
                    draw["last"] = (
                        diff
                        if choice["step"] == choice["last_step"]
                        else run_cli(
                            args,
                            "eval",
                            "--model",
                            str(last_model(run, choice["last_step"])),
                            "--against",
                            str(champion),
                            "--toolset",
                            "2",
                            "1",
                            threads=threads,
                        )
                    )
                    draw["last"]["passes"] = passes(draw["last"])
                draw["passes"] = passes(draw)
                with open(ledger, "a") as f:
                    f.write(json.dumps(draw) + "\n")
                draws.append(draw)
                print(
                    f"draw t{threads} sft{sft_seed} grpo{grpo_seed}: v2 greedy {draw['2']['greedy_success']['difference']['mean']:+.3f}"
                    f" v1 greedy {draw['1']['greedy_success']['difference']['mean']:+.3f} passes={draw['passes']}"
                    f" ({time.time() - t0:.0f}s)",
                    file=sys.stderr,
                )
    report = summarize(draws)
    if with_last := [d["last"] for d in draws if "last" in d]:  # the same draws, had the last step been taken
        report["last_step"] = summarize(with_last)
    print(json.dumps(report | {"seconds": round(time.time() - t0, 1), "out": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
