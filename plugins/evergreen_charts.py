"""The geometry of the Evergreen page's two SVG charts: coordinates and values only, no markup.
plugins/templates/macros/charts.html draws them (and formats every label and tooltip).

- success_chart: greedy success on the target toolset, champion vs challenger, one column per run
  (oldest left), each point with its 95% interval and, where a version first appears, its version.
- cost_chart: each run's cost as a bar (oldest left), coloured by the run's outcome.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

if __package__:  # plugins.evergreen_charts: the project root on sys.path (tests, uvicorn)
    from .evergreen_data import STATUS_LABEL, Run, dig, num, target_comparison
else:  # evergreen_charts: Airflow's plugins folder on sys.path
    from evergreen_data import STATUS_LABEL, Run, dig, num, target_comparison

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 720, 260, 52, 16, 22, 46
Y0, Y1 = H - PAD_B, PAD_T  # the plot's bottom and top
MAX_X_LABELS = 8  # dates under the axis, however many runs
MAX_BAR_VALUES = 12  # more values above the bars overlap; each bar's tooltip still has its value


def _frame(id_: str, label: str) -> dict:
    return {"id": id_, "label": label, "w": W, "h": H, "left": PAD_L, "right": W - PAD_R, "bottom": Y0, "empty": None}


def _x_positions(n: int) -> list[float]:
    inner = W - PAD_L - PAD_R
    if n == 1:
        return [PAD_L + inner / 2]
    return [PAD_L + 24 + i * (inner - 48) / (n - 1) for i in range(n)]


def _x_labels(runs: list[Run], xs: list[float]) -> list[dict]:
    every = max(1, math.ceil(len(runs) / MAX_X_LABELS))
    return [
        {"x": round(x, 1), "text": datetime.fromtimestamp(r.sort_ts, UTC).strftime("%m-%d %H:%M")}
        for i, (r, x) in enumerate(zip(runs, xs, strict=True))
        if (len(runs) - 1 - i) % every == 0
    ]  # the newest always


def _y_rate(v: float) -> float:
    return round(Y0 - max(0.0, min(1.0, v)) * (Y0 - Y1), 1)


def success_chart(runs: list[Run]) -> dict:
    chart = _frame("success-chart", "Success on the target toolset (greedy), champion vs challenger, per run")
    columns = []
    for r in sorted(runs, key=lambda r: r.sort_ts):
        cmp_ = target_comparison(r.summary)
        if cmp_ is not None and (num(cmp_.champion.mean) is not None or num(cmp_.challenger.mean) is not None):
            columns.append((r, cmp_))
    if not columns:
        return {**chart, "empty": "no evaluated runs yet"}
    xs = _x_positions(len(columns))
    series = []
    # dx: the two series sit side by side in each run's column, so equal rates do not hide each other
    for name, version_of, dx in (("champion", "champion_version", -5), ("challenger", "challenger_version", 5)):
        points, previous = [], object()
        for (r, cmp_), x in zip(columns, xs, strict=True):
            stat, version = getattr(cmp_, name), getattr(r.summary, version_of)
            mean, lo, hi = num(stat.mean), num(stat.low), num(stat.high)
            if mean is not None:
                has_ci = lo is not None and hi is not None
                points.append(
                    {
                        "run_id": r.run_id,
                        "x": round(x + dx, 1),
                        "y": _y_rate(mean),
                        "mean": mean,
                        "low": lo if has_ci else None,
                        "high": hi if has_ci else None,
                        "y_low": _y_rate(lo) if has_ci else None,
                        "y_high": _y_rate(hi) if has_ci else None,
                        # label a version where it first appears in the series: a long history stays readable
                        "version": version,
                        "label": version is not None and version != previous,
                    }
                )
            previous = version
        line = " ".join(f"{p['x']},{p['y']}" for p in points) if len(points) > 1 else None
        series.append({"name": name, "right": dx > 0, "points": points, "line": line})
    return {
        **chart,
        "grid": [{"y": _y_rate(t), "label": f"{int(t * 100)}%"} for t in (0, 0.25, 0.5, 0.75, 1.0)],
        "series": series,
        "xlabels": _x_labels([r for r, _ in columns], xs),
    }


def cost_chart(runs: list[Run]) -> dict:
    chart = _frame("cost-chart", "Cost per run (USD), coloured by outcome")
    priced = [(r, num(dig(r.summary.promotion, "cost", "run_usd"))) for r in sorted(runs, key=lambda r: r.sort_ts)]
    priced = [(r, max(v, 0.0)) for r, v in priced if v is not None]  # a refund is not a bar below the axis
    if not priced:
        return {**chart, "empty": "no priced runs yet"}
    top = (max(v for _, v in priced) or 1.0) * 1.15
    slot = (W - PAD_L - PAD_R) / len(priced)
    width = max(2.0, min(48.0, slot * 0.6))
    xs = [PAD_L + slot * (i + 0.5) for i in range(len(priced))]
    bars = []
    for (r, v), x in zip(priced, xs, strict=True):
        height = (v / top) * (Y0 - Y1)
        bars.append(
            {
                "run_id": r.run_id,
                "status": r.status,
                "usd": v,
                "total_usd": dig(r.summary.promotion, "cost", "total_usd"),
                "x": round(x, 1),
                "left": round(x - width / 2, 1),
                "width": round(width, 1),
                "top": round(Y0 - height, 1),
                "height": round(max(height, 0.5), 1),
            }
        )
    return {
        **chart,
        "grid": [{"y": round(Y0 - f * (Y0 - Y1), 1), "usd": f * top} for f in (0, 0.5, 1.0)],
        "bars": bars,
        "show_values": len(bars) <= MAX_BAR_VALUES,
        "xlabels": _x_labels([r for r, _ in priced], xs),
        "legend": [{"status": s, "x": PAD_L + 110 * i} for i, s in enumerate(STATUS_LABEL)],
    }
