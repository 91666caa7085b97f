"""The timeline's report: the table of policies (tasks.timeline.plan.policy_table) and the chart.

    from tasks.timeline.report import write_report
    write_report(out, days, settings.timeline)    # <out>/report.json, report.md, timeline.png

The chart (matplotlib, Agg): daily production success per policy with the event days marked (tool changes
solid, the mix shift shaded, the malformed day dotted), and each policy's cumulative dollars below it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.storage import write_atomic
from tasks.timeline.plan import POLICIES, policy_table

if TYPE_CHECKING:
    from tasks.config_deployment import TimelineSettings
    from tasks.timeline.plan import Day, PolicyFigures

LABELS = {
    "never": "never retrain",
    "nightly": "nightly, no gate",
    "nightly_gated": "nightly, gated",
    "evergreen": "Evergreen (drift + gate)",
}

STYLES = {
    "never": {"color": "tab:blue", "linestyle": "-", "marker": "o", "linewidth": 1.5},
    "nightly": {"color": "tab:orange", "linestyle": "-", "marker": "o", "linewidth": 1.5},
    "nightly_gated": {"color": "tab:green", "linestyle": "--", "marker": "s", "linewidth": 2.5},
    "evergreen": {"color": "tab:red", "linestyle": "-", "marker": "o", "linewidth": 1.2},
}


def load_records(out: Path) -> list[dict]:
    """Every (policy, day) record written so far, by day."""
    rows = []
    for f in sorted((out / "days").glob("day-*.json")):
        rows.extend(json.loads(f.read_text()).values())
    return rows


def _hours(h: list[float | None]) -> str:
    return ", ".join("not fixed" if x is None else f"{x:.0f} h" for x in h) or "-"


def markdown(figures: list[PolicyFigures], days_run: int) -> str:
    lines = [
        f"| policy ({days_run} days) | mean success | dollars | retrains | promotions | false alarms "
        "| hours to fix each breaking change | points above never-retrain per $ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        per_usd = "-" if f.points_per_usd is None else f"{f.points_per_usd:,.0f}"
        lines.append(
            f"| {LABELS[f.policy]} | {100 * f.mean_success:.1f}% | ${f.usd:.4f} | {f.retrains} | {f.promotions} "
            f"| {f.false_alarms} | {_hours(f.hours_to_fix)} | {per_usd} |"
        )
    return "\n".join(lines) + "\n"


def goals(figures: list[PolicyFigures], records: list[dict], days: list[Day]) -> dict:
    """The issue's goals, each with what was measured (None where a policy needed for it did not run)."""
    by = {f.policy: f for f in figures}
    ev, nightly, never = by.get("evergreen"), by.get("nightly"), by.get("never")
    malformed = {d.index for d in days if any(e.startswith("malformed") for e in d.events)}
    non_breaking = {d.index for d in days if any("(non-breaking)" in e for e in d.events)}
    ev_rows = [r for r in records if r["policy"] == "evergreen"]
    return {
        "within_2_points_of_nightly": None if not (ev and nightly) else ev.mean_success >= nightly.mean_success - 0.02,
        "at_most_30pct_of_nightly_dollars": None if not (ev and nightly) else ev.usd <= 0.3 * nightly.usd,
        "20_points_above_never": None if not (ev and never) else ev.mean_success >= never.mean_success + 0.2,
        "no_promotion_on_malformed_day": None
        if not ev_rows
        else not any(r["promoted"] for r in ev_rows if r["day"] in malformed),
        "no_retrain_for_non_breaking_change": None
        if not ev_rows
        else not any(r["retrained"] for r in ev_rows if r["day"] in non_breaking),
    }


def chart(records: list[dict], days: list[Day], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True, height_ratios=(2, 1))
    for policy in POLICIES:
        rows = sorted((r for r in records if r["policy"] == policy), key=lambda r: r["day"])
        if not rows:
            continue
        x = [r["day"] for r in rows]
        # where two policies serve the same model their lines coincide: styles keep both visible
        style = STYLES[policy]
        top.plot(x, [100 * r["success"] for r in rows], markersize=3, label=LABELS[policy], **style)
        spent, total = [], 0.0
        for r in rows:
            total += r["usd"]
            spent.append(total)
        bottom.step(x, spent, where="post", label=LABELS[policy], color=style["color"], linestyle=style["linestyle"])
    for d in days:
        for e in d.events:
            if e.startswith("tool change"):
                for ax in (top, bottom):
                    ax.axvline(d.index - 0.5, color="red" if d.breaking else "grey", linewidth=1)
                top.annotate(e.split(" (")[0].removeprefix("tool change "), (d.index - 0.4, 2), fontsize=8)
            elif e.startswith("workload mix"):
                top.axvspan(d.index - 0.5, d.index + 0.5, color="orange", alpha=0.08, linewidth=0)
            elif e.startswith("malformed"):
                top.axvline(d.index, color="purple", linestyle=":", linewidth=1)
                top.annotate("malformed", (d.index + 0.1, 10), fontsize=8, color="purple")
    top.set_ylabel("production success (%, greedy)")
    top.set_ylim(0, 100)
    top.legend(loc="lower left", fontsize=8)
    top.set_title("Daily production success per policy (red: breaking tool change; shaded: mix shift)")
    bottom.set_ylabel("cumulative $ (retrains)")
    bottom.set_xlabel("day")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out: Path, days: list[Day], t: TimelineSettings) -> dict:
    records = load_records(out)
    days_run = len({r["day"] for r in records})
    figures = policy_table(records, days[:days_run], t.fix_margin)
    report = {
        "days": days_run,
        "policies": [f.to_dict() for f in figures],
        "goals": goals(figures, records, days[:days_run]),
        "chart": str(chart(records, days[:days_run], out / "timeline.png")),
        "settings": t.model_dump(),
    }
    write_atomic(out / "report.json", json.dumps(report, indent=1))
    write_atomic(out / "report.md", markdown(figures, days_run))
    return report
