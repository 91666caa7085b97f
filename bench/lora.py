"""Full-weight GRPO against LoRA GRPO, side by side in one run: bytes and seconds per weight sync, seconds
per step, and the v2 gain after the same steps.

    python bench/lora.py                                     # bootstraps a champion, 10 steps each (~15 min)
    python bench/lora.py --init runs/local/champion --set grpo.steps=30 --lora-set grpo.lr=3e-3

Both arms start from the same champion with the same settings (seeds included); the LoRA arm adds
`grpo.lora.rank` (and any `--lora-set`). Each arm is `python -m tasks train`, then `python -m tasks eval
--against` the champion on both toolsets (the gate's held-out tasks, paired bootstrap). Prints one JSON
line: per arm the mean sync bytes, sync seconds, train seconds and step seconds from its metrics.jsonl, the
v2 and v1 greedy differences; and the LoRA / full ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from seeds import ROOT, run_cli


def arm(args, name: str, sets: list[str], champion: Path, out: Path) -> dict:
    run = out / name
    extra = [x for pair in sets for x in ("--set", pair)]
    run_cli(args, *extra, "train", "--init", str(champion), "--run-dir", str(run), threads=args.threads)
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
        threads=args.threads,
    )
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]

    def mean(key: str) -> float:
        return statistics.fmean(m.get(key, 0.0) for m in steps)  # ahead_wait_s: asynchronous runs only

    return {
        "steps": len(steps),
        "sync_bytes": mean("weight_sync_bytes"),
        "sync_s": round(mean("weight_sync_s"), 4),
        "train_s": round(mean("train_s"), 3),
        "step_s": round(mean("rollout_s") + mean("train_s") + mean("ahead_wait_s") + mean("weight_sync_s"), 3),
        "v2_greedy": diff["2"]["greedy_success"]["difference"],
        "v1_greedy": diff["1"]["greedy_success"]["difference"],
    }


def arms_parser(doc: str, name: str) -> argparse.ArgumentParser:
    """The options every two-arm bench shares (this one and bench/async_grpo.py): the champion, threads, the
    output directory runs/<name>, and --set pairs for every command of both arms."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--init", help="the champion both arms start from (default: bootstrap one into --out)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "runs" / name))
    ap.add_argument(
        "--set",
        action="append",
        default=["grpo.steps=10"],
        metavar="SECTION.FIELD=VALUE",
        help="for every command of both arms (default grpo.steps=10)",
    )
    return ap


def starting_point(args) -> tuple[Path, Path]:
    """(output directory, champion): --init, or a champion bootstrapped into the output directory once."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    champion = Path(args.init) if args.init else out / "champion"
    if not (champion / "config.json").exists():
        run_cli(args, "bootstrap", "--out", str(champion), threads=args.threads)
    return out, champion


def main(argv: list[str] | None = None) -> int:
    ap = arms_parser(__doc__, "lora")
    ap.add_argument("--rank", type=int, default=8, help="grpo.lora.rank of the LoRA arm")
    ap.add_argument(
        "--lora-set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="for the LoRA arm's training only",
    )
    args = ap.parse_args(argv)
    out, champion = starting_point(args)
    full = arm(args, "full", [], champion, out)
    lora = arm(args, "lora", [f"grpo.lora.rank={args.rank}", *args.lora_set], champion, out)
    ratio = {k: round(lora[k] / full[k], 4) if full[k] else None for k in ("sync_bytes", "sync_s", "train_s", "step_s")}
    print(json.dumps({"full": full, "lora": lora, "lora_over_full": ratio, "champion": str(champion)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
