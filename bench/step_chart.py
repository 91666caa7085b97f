"""Where one GRPO step's time goes, as a chart: bench/rl_step.py's JSON line in, a PNG out.

    python bench/rl_step.py --model <champion> --tasks 16 --group 8 > /tmp/rl_step.json
    python bench/step_chart.py /tmp/rl_step.json docs/step_breakdown.png

One horizontal bar per part of the step (step_breakdown_s), and a line at the compute limit of the update
(compute_limit_s: 8 FLOPs per parameter per token at the machine's measured matmul rate), so the distance
between the update's bars and the line is what the update loses to overheads.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def draw(figures: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = figures["step_breakdown_s"]
    names = list(parts)
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(names) + 1.6))
    ax.barh(names, [parts[n] for n in names], color=["#4c72b0" if n != "weight_sync" else "#dd8452" for n in names])
    update = sum(v for n, v in parts.items() if n not in ("rollout", "weight_sync"))
    ax.axvline(figures["compute_limit_s"], color="red", linestyle="--", linewidth=1)
    ax.annotate(
        f"update's compute limit {figures['compute_limit_s']:.2f} s (update {update:.2f} s)",
        (figures["compute_limit_s"], len(names) - 0.5),
        fontsize=8,
        color="red",
    )
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title(
        f"one GRPO step: {figures['episodes']} episodes, {figures['step_tokens']:,} tokens, {figures['device']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    line = Path(sys.argv[1]).read_text().strip().splitlines()[-1]
    print(draw(json.loads(line), Path(sys.argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
