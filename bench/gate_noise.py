"""How often would the promotion gate's defaults promote a noise-only difference? Prints one JSON line.

    python bench/gate_noise.py --runs runs/seeds             # a bench/seeds.py output directory

Noise-only pairs, from a seeds bench's models (no new training):
- `seed` pairs: two challengers trained from the same champion by the same recipe with different GRPO
  seeds; each is put to the gate as the challenger against the other as the champion (both orders).
- `float` pairs: two champions bootstrapped by the same recipe and SFT seed under different torch thread
  counts (the float order another CPU's kernels would give), both orders; and the challengers of the same
  (SFT seed, GRPO seed) under different thread counts.
- `ulp` pairs: every champion and challenger against itself with each weight moved by one float step
  (`torch.nextafter`), the smallest change a float-level difference can make.
Each pair is evaluated as the DAG evaluates (`python -m tasks eval --model A --against B --toolset 2 1`: the
gate's held-out tasks, paired bootstrap), then judged by `tasks.promotion.gate.decide` with the settings'
promotion defaults: v2 the target, v1 the guard, both validations passed, and the cost the ledger gives for
the challenger's own training (its steps' seconds on 2 CPUs). The reverse order's interval is the negated
one (the same paired resamples). Issue 19's bar: at most 5% of pairs promoted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

from seeds import ROOT, run_cli


def negated(comparison: dict) -> dict:
    """The comparison with challenger and champion swapped: the paired difference's interval negated."""
    d = comparison["difference"]
    flipped = d | {"mean": -d["mean"], "low": -d["high"], "high": -d["low"]}
    return comparison | {
        "challenger": comparison["champion"],
        "champion": comparison["challenger"],
        "difference": flipped,
    }


def training_cost(run: Path, settings) -> dict:
    """The cost ledger of a challenger's training (its metrics' seconds on 2 CPUs), as the gate sees it."""
    from tasks.promotion.cost import StageUsage, ledger, load_prices

    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    wall = sum(m["rollout_s"] + m["train_s"] + m["weight_sync_s"] for m in steps)
    usage = [StageUsage("continuous_post_training", wall_s=wall, cpus=2)]
    return ledger(usage, settings.cost, load_prices(settings.cost.prices_file))


def judge(diff: dict, cost: dict, settings) -> bool:
    from tasks.promotion.gate import decide

    metric = settings.promotion.metric
    return decide(
        target=diff["2"][metric],
        guards={"registry-1": diff["1"][metric]},
        validations={"data": True, "evals": True},
        cost=cost,
        settings=settings.promotion,
    ).promote


def ulp_twin(model_dir: Path) -> Path:
    """`model_dir` with every weight one float step up, saved beside it (once)."""
    import torch

    from tasks.policy.model import load_model, save_model

    out = model_dir.parent / f"{model_dir.name}-ulp"
    if not (out / "config.json").exists():
        model, chat, _ = load_model(model_dir)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.nextafter(p, torch.full_like(p, float("inf"))))
        save_model(model, chat, out)
    return out


def pairs(runs: Path, twins: bool = True) -> list[tuple[str, Path, Path, Path]]:
    """(kind, model A, model B, the run whose cost A carries) for every unordered noise-only pair."""
    champions = sorted(runs.glob("t*-sft*/champion"))
    out = []
    for champion in champions:
        challengers = sorted(p for p in champion.parent.glob("grpo*") if (p / "model" / "config.json").exists())
        out += [("seed", a / "model", b / "model", a) for a, b in itertools.combinations(challengers, 2)]
        if twins and challengers:
            out += [("ulp", m, ulp_twin(m), challengers[0]) for m in (champion, *(c / "model" for c in challengers))]
    by_sft: dict[str, list[Path]] = {}
    for champion in champions:
        by_sft.setdefault(champion.parent.name.split("-", 1)[1], []).append(champion)
    for same in by_sft.values():
        for a, b in itertools.combinations(same, 2):
            grpo = sorted(p for p in a.parent.glob("grpo*") if (p / "metrics.jsonl").exists())
            if grpo:  # the bootstrap's cost is not recorded; a challenger's training stands in for it
                out.append(("float", a, b, grpo[0]))
            for run in grpo:
                twin = b.parent / run.name
                if (twin / "model" / "config.json").exists():
                    out.append(("float", run / "model", twin / "model", run))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", default=str(ROOT / "runs" / "seeds"), help="a bench/seeds.py --out directory")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="for every eval")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tasks.config import load_settings, nest

    settings = load_settings(overrides=nest(dict(pair.split("=", 1) for pair in args.set)))
    runs = Path(args.runs)
    cache = runs / "gate_noise.jsonl"  # one line per evaluated pair: a rerun evaluates only new pairs
    seen = {(r["a"], r["b"]): r for r in map(json.loads, cache.read_text().splitlines())} if cache.exists() else {}
    rows = []
    for kind, a, b, run in pairs(runs):
        key = (str(a), str(b))
        if key not in seen:
            diff = run_cli(
                args, "eval", "--model", str(a), "--against", str(b), "--toolset", "2", "1", threads=args.threads
            )
            seen[key] = {"a": key[0], "b": key[1], "kind": kind, "diff": diff}
            with open(cache, "a") as f:
                f.write(json.dumps(seen[key]) + "\n")
        diff = seen[key]["diff"]
        cost = training_cost(run, settings)
        back = {reg: {k: negated(c) for k, c in d.items()} for reg, d in diff.items()}
        for order, d in (("a_over_b", diff), ("b_over_a", back)):
            rows.append(
                {
                    "kind": kind,
                    "order": order,
                    "promoted": judge(d, cost, settings),
                    "v2": d["2"]["greedy_success"]["difference"],
                }
            )
    report: dict = {"bench": "gate_noise", "pairs": len(rows), "promoted": sum(r["promoted"] for r in rows)}
    report["rate"] = round(report["promoted"] / len(rows), 4) if rows else None
    for kind in ("seed", "float", "ulp"):
        some = [r for r in rows if r["kind"] == kind]
        report[kind] = {"pairs": len(some), "promoted": sum(r["promoted"] for r in some)}
        report[kind]["abs_v2_diff_mean"] = (
            round(sum(abs(r["v2"]["mean"]) for r in some) / len(some), 4) if some else None
        )
    report["min_gain"] = settings.promotion.min_gain
    report["guard_tolerance"] = settings.promotion.guard_tolerance
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
