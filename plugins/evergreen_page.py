"""The Evergreen page: one FastAPI app that shows why each continuous_post_training run ran, what it
measured, what it cost and what the promotion gate decided.

Airflow mounts it at /evergreen (plugins/evergreen_plugin.py) and shows it in the UI's nav bar, inside an
iframe at /plugin/evergreen. To look at it without Airflow:

    EVERGREEN_RUN_DIR=runs/local uvicorn --factory plugins.evergreen_page:create_app --port 8090
    # then open http://127.0.0.1:8090/  (routes: /, /api/runs, /health)

Data: one `summary.json` per DAG run, `<runs_root>/continuous_post_training/<run_dir>/summary.json`
(written by tasks.stages.report.summarize, tasks.stages.contracts.RunSummary), read on every request so that a new run shows up without a restart.
runs_root is $EVERGREEN_RUN_DIR when set (relative to the project), else `run_dir` of tasks.config.
Only dag_id, run_id and status are required; every other key may be missing ("—") or malformed (listed
as an error, never a crashed page). Every string from a summary is user-controlled (reasons, asset event
extras, REST params), so all of it goes through html.escape, links must be http(s), and the page sends a
Content-Security-Policy without scripts.

Tests: tests/unit/plugins/test_evergreen_page.py (TestClient), tests/e2e/test_browser.py (Airflow UI).
"""
from __future__ import annotations

import html
import json
import math
import os
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

DAG_ID = "continuous_post_training"
PROJECT_ROOT = Path(__file__).resolve().parents[1]
MAX_SUMMARY_BYTES = 4 << 20  # a summary is a few KiB; a huge file is a bug, not something to parse per request
MAX_RUNS_SHOWN = 100
STATUS_LABEL = {"promoted": "PROMOTED", "not_promoted": "not promoted", "skipped": "skipped", "failed": "failed"}
# No script anywhere on the page: even a summary string that escaped html.escape could not run.
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; "
       "form-action 'none'; frame-ancestors 'self'")
DASH = "—"

Auth = Callable[[Request], Awaitable[None]]


# ---------------------------------------------------------------------------------------------- data

@dataclass
class Run:
    run_dir: str      # the directory name under <runs_root>/continuous_post_training/
    summary: dict
    sort_ts: float    # started_at (else finished_at, else the file's mtime) as a POSIX timestamp

    @property
    def status(self) -> str:
        return self.summary["status"]

    def as_json(self) -> dict:
        return {"run_dir": self.run_dir, "gain_per_dollar": gain_per_dollar(self.summary),
                "summary": _json_safe(self.summary)}


def _json_safe(v: Any) -> Any:
    """NaN/Infinity (Python's json writes them, e.g. an undefined drift effect) become null: strict JSON
    encoders, Starlette's included, refuse them."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_safe(x) for x in v]
    return v


@dataclass
class Runs:
    root: Path | None
    runs: list[Run] = field(default_factory=list)         # newest first
    errors: list[dict] = field(default_factory=list)      # {"path", "error"}


def runs_root() -> Path:
    """$EVERGREEN_RUN_DIR, else tasks.config's run_dir; resolved the way tasks.rundir.RunDir resolves it."""
    env = os.environ.get("EVERGREEN_RUN_DIR")
    if env:
        p = Path(env)
        return (p if p.is_absolute() else PROJECT_ROOT / p).resolve()
    try:
        from tasks.config import load_settings
    except ModuleNotFoundError:
        # An api-server started without the project on PYTHONPATH still finds the project's settings.
        sys.path.append(str(PROJECT_ROOT))
        from tasks.config import load_settings
    return Path(load_settings().run_dir).resolve()


def _parse_ts(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:  # our writers use UTC; a naive stamp is read as UTC rather than server-local time
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def _read_summary(path: Path) -> dict:
    size = path.stat().st_size
    if size > MAX_SUMMARY_BYTES:
        raise ValueError(f"{size} bytes, more than the {MAX_SUMMARY_BYTES} a summary may have")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {type(data).__name__}, not an object")
    for key in ("dag_id", "run_id", "status"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise ValueError(f"required key {key!r} is missing or not a non-empty string")
    return data


def load_runs(root: Path | None = None) -> Runs:
    """Every summary under root (default: runs_root()), newest first; bad files become errors."""
    if root is None:
        try:
            root = runs_root()
        except Exception as e:  # noqa: BLE001 - a bad settings file is shown on the page, not a 500
            return Runs(None, errors=[{"path": "settings", "error": f"{type(e).__name__}: {e}"}])
    out = Runs(root)
    base = root / DAG_ID
    if not base.is_dir():
        return out
    for path in sorted(base.glob("*/summary.json")):
        rel = str(path.relative_to(root))
        try:
            summary = _read_summary(path)
            ts = _parse_ts(summary.get("started_at")) or _parse_ts(summary.get("finished_at")) or path.stat().st_mtime
        except (OSError, ValueError, RecursionError) as e:  # JSON and Unicode decode errors are ValueErrors
            out.errors.append({"path": rel, "error": f"{type(e).__name__}: {e}"})
            continue
        out.runs.append(Run(path.parent.name, summary, ts))
    out.runs.sort(key=lambda r: (r.sort_ts, r.summary["run_id"]), reverse=True)
    return out


# --------------------------------------------------------------------------------------- value helpers

def _get(d: Any, *keys: str) -> Any:
    """d[k1][k2]... or None when any level is missing or not a dict (summaries are only loosely typed)."""
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _list(v: Any) -> list:
    return v if isinstance(v, list) else []


def gain_per_dollar(summary: dict) -> float | None:
    """Success points gained on the target registry (greedy, point estimate) per dollar of total cost."""
    target = summary.get("target_toolset")
    diff = _num(_get(summary, "greedy", str(target), "difference", "mean")) if target is not None else None
    total = _num(_get(summary, "promotion", "cost", "total_usd"))
    if diff is None or total is None or total <= 0:
        return None
    return 100.0 * diff / total


def e(v: Any) -> str:
    """The one way a value reaches the HTML: escaped, quotes included (it may land in an attribute)."""
    return DASH if v is None else html.escape(str(v), quote=True)


def _pct(v: Any) -> str:
    v = _num(v)
    return DASH if v is None else f"{100 * v:.1f}%"


def _pts(v: Any) -> str:
    v = _num(v)
    return DASH if v is None else f"{100 * v:+.1f}"


def _interval(stat: Any, diff: bool = False) -> str:
    """'62.0% [55.3, 68.7]' for a success rate, '+12.3 pts [+5.1, +19.0]' for a difference."""
    mean = _num(_get(stat, "mean"))
    if mean is None:
        return DASH
    lo, hi = _num(_get(stat, "low")), _num(_get(stat, "high"))
    if diff:
        text = f"{_pts(mean)} pts"
        if lo is not None and hi is not None:
            text += f" <span class=\"ci\">[{_pts(lo)}, {_pts(hi)}]</span>"
        return text
    text = _pct(mean)
    if lo is not None and hi is not None:
        text += f" <span class=\"ci\">[{100 * lo:.1f}, {100 * hi:.1f}]</span>"
    return text


def _usd(v: Any) -> str:
    v = _num(v)
    if v is None:
        return DASH
    return f"${v:,.2f}" if abs(v) >= 1 else f"${v:.4f}"


def _plain(v: Any) -> str:
    """A check's observed value or threshold: numbers rounded, anything else escaped."""
    n = _num(v)
    if n is not None:
        return f"{n:.4g}"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):  # NaN or infinity: no measurement
        return DASH
    if isinstance(v, (dict, list)):
        return e(json.dumps(v, default=str))
    return e(v)


def _when(v: Any) -> str:
    ts = _parse_ts(v)
    if ts is None:
        return e(v)
    return e(datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))


def _duration(v: Any) -> str:
    s = _num(v)
    if s is None:
        return DASH
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def _link(url: Any, text: Any = None) -> str:
    """An anchor only for http(s) URLs and local paths: a summary could carry `javascript:` as a link."""
    if not isinstance(url, str) or not url:
        return DASH
    # http(s), or a path on this server (the Airflow run link is "/dags/..."); "//host" is another site.
    if not (url.lower().startswith(("http://", "https://")) or (url.startswith("/") and not url.startswith("//"))):
        return f"<code>{e(url)}</code>"
    # No target=_blank: inside Airflow the page is an iframe sandboxed without allow-popups, where such
    # links do nothing; a plain link at least opens in the frame (or in the tab when opened directly).
    return f'<a href="{e(url)}" rel="noopener noreferrer">{e(text if text is not None else url)}</a>'


def _yes_no(v: Any) -> str:
    return DASH if v is None else ("yes" if v else "no")


def _json_block(v: Any) -> str:
    return f"<pre>{e(json.dumps(v, indent=1, ensure_ascii=False, default=str))}</pre>"


def _status_class(status: str) -> str:
    return status if status in STATUS_LABEL else "other"


def _status_label(status: str) -> str:
    return STATUS_LABEL.get(status, status)


def _registries(summary: dict) -> list[tuple[str, str]]:
    """(registry, role) for the target, the guards, then any other registry the evals measured."""
    out: list[tuple[str, str]] = []
    target = summary.get("target_toolset")
    if isinstance(target, (str, int)):
        out.append((str(target), "target"))
    for g in _list(summary.get("guard_registries")):
        if isinstance(g, (str, int)) and str(g) not in {r for r, _ in out}:
            out.append((str(g), "guard"))
    for mode in ("greedy", "sampled"):
        for r in (summary.get(mode) or {}) if isinstance(summary.get(mode), dict) else {}:
            if r not in {x for x, _ in out}:
                out.append((r, "other"))
    return out


# --------------------------------------------------------------------------------------------- charts

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 720, 260, 52, 16, 22, 46


def _x_positions(n: int) -> list[float]:
    inner = W - PAD_L - PAD_R
    if n == 1:
        return [PAD_L + inner / 2]
    return [PAD_L + 24 + i * (inner - 48) / (n - 1) for i in range(n)]


def _short_date(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%m-%d %H:%M")


def _svg_open(id_: str, label: str) -> str:
    return (f'<svg id="{id_}" class="chart" role="img" aria-label="{e(label)}" viewBox="0 0 {W} {H}" '
            f'xmlns="http://www.w3.org/2000/svg" preserveAspectRatio="xMidYMid meet">'
            f"<title>{e(label)}</title>")


def _empty_chart(id_: str, label: str, text: str) -> str:
    return (_svg_open(id_, label) + f'<text class="empty" x="{W / 2}" y="{H / 2}" text-anchor="middle">'
            f"{e(text)}</text></svg>")


def success_chart(runs: list[Run]) -> str:
    """Greedy success on the target registry, champion vs challenger, one column per run (oldest left),
    each point labelled with its model version and drawn with its 95% interval."""
    label = "Success on the target registry (greedy), champion vs challenger, per run"
    points = []
    for r in sorted(runs, key=lambda r: r.sort_ts):
        target = r.summary.get("target_toolset")
        cmp_ = _get(r.summary, "greedy", str(target)) if target is not None else None
        champ, chall = _get(cmp_, "champion"), _get(cmp_, "challenger")
        if _num(_get(champ, "mean")) is None and _num(_get(chall, "mean")) is None:
            continue
        points.append((r, champ, chall))
    if not points:
        return _empty_chart("success-chart", label, "no evaluated runs yet")
    y0, y1 = H - PAD_B, PAD_T

    def y(v: float) -> float:
        return y0 - max(0.0, min(1.0, v)) * (y0 - y1)

    parts = [_svg_open("success-chart", label)]
    for tick in (0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line class="grid" x1="{PAD_L}" x2="{W - PAD_R}" y1="{y(tick):.1f}" y2="{y(tick):.1f}"/>'
                     f'<text class="tick" x="{PAD_L - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{int(tick * 100)}%</text>')
    xs = _x_positions(len(points))
    for series, key, ver_key, dx in (("champion", 1, "champion_version", -5), ("challenger", 2, "challenger_version", 5)):
        # dx: the two series sit side by side in each run's column, so equal rates do not hide each other
        line = [(xs[i] + dx, _num(_get(p[key], "mean"))) for i, p in enumerate(points)]
        pts = " ".join(f"{x:.1f},{y(v):.1f}" for x, v in line if v is not None)
        if len(pts.split()) > 1:
            parts.append(f'<polyline class="line {series}" points="{pts}"/>')
        previous = object()
        for i, p in enumerate(points):
            version = p[0].summary.get(ver_key)
            # label a version where it first appears in the series: a long history stays readable
            parts.append(_success_point(series, p[0], p[key], version, xs[i] + dx, dx > 0, y,
                                        label=version != previous))
            previous = version
    parts.extend(_x_labels([p[0] for p in points], xs))
    parts.append(f'<g class="legend"><circle class="champion" cx="{PAD_L + 8}" cy="{H - 10}" r="4.5"/>'
                 f'<text x="{PAD_L + 18}" y="{H - 6}">champion</text>'
                 f'<rect class="challenger" x="{PAD_L + 100}" y="{H - 14}" width="8" height="8"/>'
                 f'<text x="{PAD_L + 114}" y="{H - 6}">challenger (bars: 95% interval)</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def _success_point(series: str, run: Run, stat: Any, version: Any, x: float, right: bool,
                   y: Callable[[float], float], label: bool = True) -> str:
    """One model's success on one run: a marker, its 95% interval as a whisker, its version beside it."""
    mean = _num(_get(stat, "mean"))
    if mean is None:
        return ""
    lo, hi = _num(_get(stat, "low")), _num(_get(stat, "high"))
    has_ci = lo is not None and hi is not None
    whisker = (f'<line class="whisker {series}" x1="{x:.1f}" x2="{x:.1f}" y1="{y(lo):.1f}" y2="{y(hi):.1f}"/>'
               if has_ci else "")
    tip = (f"{series} v{version if version is not None else '?'} on run {run.summary['run_id']}: {_pct(mean)}"
           + (f" [{100 * lo:.1f}, {100 * hi:.1f}]" if has_ci else ""))
    marker = (f'<circle cx="{x:.1f}" cy="{y(mean):.1f}" r="4.5"><title>{e(tip)}</title></circle>'
              if series == "champion" else
              f'<rect x="{x - 4:.1f}" y="{y(mean) - 4:.1f}" width="8" height="8"><title>{e(tip)}</title></rect>')
    ver = (f'<text class="ver" x="{x + (8 if right else -8):.1f}" y="{y(mean) + 4:.1f}" '
           f'text-anchor="{"start" if right else "end"}">{e(f"v{version}")}</text>' if label and version is not None else "")
    return f'<g class="point {series}" data-run-id="{e(run.summary["run_id"])}">{whisker}{marker}{ver}</g>'


def _x_labels(runs: list[Run], xs: list[float]) -> list[str]:
    every = max(1, math.ceil(len(runs) / 8))  # at most ~8 dates under the axis, however many runs
    return [f'<text class="xlabel" x="{x:.1f}" y="{H - PAD_B + 16}" text-anchor="middle">{e(_short_date(r.sort_ts))}</text>'
            for i, (r, x) in enumerate(zip(runs, xs)) if (len(runs) - 1 - i) % every == 0]  # the newest always


def cost_chart(runs: list[Run]) -> str:
    """Cost of each run (bars, oldest left), coloured by the run's outcome."""
    label = "Cost per run (USD), coloured by outcome"
    bars = [(r, _num(_get(r.summary, "promotion", "cost", "run_usd"))) for r in sorted(runs, key=lambda r: r.sort_ts)]
    bars = [(r, max(v, 0.0)) for r, v in bars if v is not None]  # a refund is not a bar below the axis
    if not bars:
        return _empty_chart("cost-chart", label, "no priced runs yet")
    top = (max(v for _, v in bars) or 1.0) * 1.15
    y0, y1 = H - PAD_B, PAD_T
    slot = (W - PAD_L - PAD_R) / len(bars)
    width = max(2.0, min(48.0, slot * 0.6))
    parts = [_svg_open("cost-chart", label)]
    for frac in (0, 0.5, 1.0):
        yy = y0 - frac * (y0 - y1)
        parts.append(f'<line class="grid" x1="{PAD_L}" x2="{W - PAD_R}" y1="{yy:.1f}" y2="{yy:.1f}"/>'
                     f'<text class="tick" x="{PAD_L - 6}" y="{yy + 4:.1f}" text-anchor="end">{e(_usd(frac * top))}</text>')
    xs = [PAD_L + slot * (i + 0.5) for i in range(len(bars))]
    for (r, v), x in zip(bars, xs):
        hgt = (v / top) * (y0 - y1)
        total = _get(r.summary, "promotion", "cost", "total_usd")
        tip = f"run {r.summary['run_id']} ({_status_label(r.status)}): {_usd(v)} (total with serving: {_usd(total)})"
        value = (f'<text class="val" x="{x:.1f}" y="{y0 - hgt - 4:.1f}" text-anchor="middle">{e(_usd(v))}</text>'
                 if len(bars) <= 12 else "")  # more values than that overlap; the tooltip still has each
        parts.append(f'<g class="bar {_status_class(r.status)}" data-run-id="{e(r.summary["run_id"])}">'
                     f'<rect x="{x - width / 2:.1f}" y="{y0 - hgt:.1f}" width="{width:.1f}" height="{max(hgt, 0.5):.1f}">'
                     f"<title>{e(tip)}</title></rect>{value}</g>")
    parts.extend(_x_labels([r for r, _ in bars], xs))
    legend_x = PAD_L
    for status in ("promoted", "not_promoted", "skipped", "failed"):
        parts.append(f'<g class="legend bar {status}"><rect x="{legend_x}" y="{H - 14}" width="8" height="8"/>'
                     f'<text x="{legend_x + 12}" y="{H - 6}">{e(_status_label(status))}</text></g>')
        legend_x += 110
    parts.append("</svg>")
    return "".join(parts)


# ----------------------------------------------------------------------------------------- page parts

def _decision_box(run: Run) -> str:
    s = run.summary
    decision = _get(s, "promotion", "decision") or {}
    summary = decision.get("summary") if isinstance(decision, dict) else None
    reasons = _list(_get(decision, "reasons"))
    if run.status == "skipped":  # no gate ran: say why the run stopped (the skip, then what the signals said)
        reasons = [*([s["skip_reason"]] if s.get("skip_reason") else []), *reasons, *_list(_get(s, "signals", "reasons"))]
    versions = ""
    if s.get("challenger_version") is not None or s.get("champion_version") is not None:
        versions = (f'<p class="versions">champion v{e(s.get("champion_version"))} → challenger '
                    f'v{e(s.get("challenger_version"))}</p>')
    items = "".join(f"<li>{e(r)}</li>" for r in reasons)
    return (f'<section id="last-decision" class="decision {_status_class(run.status)}" '
            f'data-status="{e(run.status)}" data-run-id="{e(s["run_id"])}">'
            f'<div class="label">Last run: <strong class="verdict">{e(_status_label(run.status))}</strong></div>'
            f'<p class="run-id">{e(s["run_id"])} · finished {_when(s.get("finished_at"))}</p>{versions}'
            + (f'<p class="summary">{e(summary)}</p>' if summary else "")
            + (f'<ul class="reasons">{items}</ul>' if items else "")
            + f'<p class="gpd">gain per dollar: {_gpd(s)}</p></section>')


def _gpd(s: dict) -> str:
    g = gain_per_dollar(s)
    return DASH if g is None else f"{g:.1f} pts/$"


def _why(s: dict) -> str:
    trig = s.get("trigger") if isinstance(s.get("trigger"), dict) else {}
    kind = trig.get("kind")
    rows = [f"<p>Trigger: <strong class=\"trigger-kind\">{e(kind)}</strong>"
            + {"schedule": " (the nightly schedule)", "asset": " (a retrain_request asset event)",
               "rest": " (a REST API call)", "manual": " (triggered by hand)"}.get(kind if isinstance(kind, str) else "", "")
            + "</p>"]
    events = _list(trig.get("asset_events"))
    if events:
        rows.append('<ul class="asset-events">' + "".join(
            f"<li><code>{e(_get(ev, 'uri'))}</code>{_json_block(_get(ev, 'extra')) if _get(ev, 'extra') else ''}</li>"
            for ev in events) + "</ul>")
    if trig.get("params"):
        rows.append(f"<div class=\"params\">params: {_json_block(trig['params'])}</div>")
    if s.get("skip_reason"):
        rows.append(f'<p class="skip-reason">Skipped: {e(s["skip_reason"])}</p>')
    sig = s.get("signals") if isinstance(s.get("signals"), dict) else {}
    if sig:
        rows.append(f"<p>Signals ({e(sig.get('window'))}): retrain = <strong>{_yes_no(sig.get('retrain'))}</strong>"
                    + (f" — {e(sig['summary'])}" if sig.get("summary") else "") + "</p>")
        reasons = _list(sig.get("reasons"))
        if reasons:
            rows.append('<ul class="signal-reasons">' + "".join(f"<li>{e(r)}</li>" for r in reasons) + "</ul>")
        drift = [d for d in _list(sig.get("drift")) if isinstance(d, dict)]
        if drift:
            # a test that could not run (e.g. verdict "insufficient_data") has no effect or p: say why
            verdicts = any("verdict" in d for d in drift)
            rows.append('<table class="drift"><caption>Drift tests (Holm-adjusted p)</caption><thead><tr>'
                        "<th>workload</th><th>statistic</th><th>effect</th><th>p adjusted</th><th>significant</th>"
                        + ("<th>verdict</th>" if verdicts else "") + "</tr></thead><tbody>" + "".join(
                            f"<tr class=\"{'sig' if d.get('significant') else ''}\"><td>{e(d.get('workload'))}</td>"
                            f"<td>{e(d.get('statistic'))}</td><td>{_plain(d.get('effect'))}</td>"
                            f"<td>{_plain(d.get('p_adjusted'))}</td><td>{_yes_no(d.get('significant'))}</td>"
                            + (f"<td>{e(d.get('verdict'))}</td>" if verdicts else "") + "</tr>"
                            for d in drift) + "</tbody></table>")
        td = sig.get("tooldiff") if isinstance(sig.get("tooldiff"), dict) else None
        if td is not None:
            changes = _list(td.get("changes"))
            breaking = td.get("breaking")  # a count, or (older summaries) a flag
            breaking = _yes_no(breaking) if isinstance(breaking, bool) or breaking is None else e(breaking)
            rows.append(f'<p class="tooldiff">Tool registry diff: breaking changes: <strong>{breaking}</strong>'
                        + (f" — {e(td['summary'])}" if td.get("summary") else "") + "</p>"
                        + ('<ul class="tool-changes">' + "".join(f"<li>{e(c)}</li>" for c in changes) + "</ul>"
                           if changes else ""))
    return '<section class="why"><h3>Why it ran</h3>' + "".join(rows) + "</section>"


def _success(s: dict) -> str:
    regs = _registries(s)
    if not regs:
        return '<section class="success"><h3>Success</h3><p>no evaluation</p></section>'
    cv, nv = s.get("champion_version"), s.get("challenger_version")
    body = []
    for reg, role in regs:
        for mode in ("greedy", "sampled"):
            cmp_ = _get(s, mode, reg)
            if cmp_ is None and mode == "sampled":
                continue
            body.append(f'<tr class="{role} {mode}" data-registry="{e(reg)}" data-mode="{mode}">'
                        f"<td>{e(reg)} <span class=\"role\">{role}</span></td>"
                        f"<td>{mode}{' (gate)' if mode == 'greedy' else ''}</td>"
                        f"<td>{_interval(_get(cmp_, 'champion'))}</td><td>{_interval(_get(cmp_, 'challenger'))}</td>"
                        f"<td>{_interval(_get(cmp_, 'difference'), diff=True)}</td></tr>")
    return ('<section class="success"><h3>Success before → after</h3><table class="success-table"><thead><tr>'
            f"<th>registry</th><th>decoding</th><th>champion v{e(cv)}</th><th>challenger v{e(nv)}</th>"
            "<th>difference</th></tr></thead><tbody>" + "".join(body) + "</tbody></table>"
            '<p class="note">Success rates with their 95% paired-bootstrap interval; the gate judges greedy.</p></section>')


def _cost(s: dict) -> str:
    cost = _get(s, "promotion", "cost")
    if not isinstance(cost, dict):
        return f'<section class="cost"><h3>Cost</h3><p>{DASH}</p></section>'
    stages = [st for st in _list(cost.get("stages")) if isinstance(st, dict)]
    table = ("<table class=\"stages\"><thead><tr><th>stage</th><th>wall</th><th>cost</th></tr></thead><tbody>"
             + "".join(f"<tr><td>{e(st.get('stage'))}</td><td>{_duration(st.get('wall_s'))}</td>"
                       f"<td>{_usd(st.get('usd'))}</td></tr>" for st in stages) + "</tbody></table>") if stages else ""
    upp = _num(cost.get("usd_per_success_point"))
    return ('<section class="cost"><h3>Cost</h3><dl>'
            f"<dt>this run</dt><dd class=\"run-usd\">{_usd(cost.get('run_usd'))}</dd>"
            f"<dt>total (run + projected serving change)</dt><dd class=\"total-usd\">{_usd(cost.get('total_usd'))}</dd>"
            f"<dt>gain per dollar</dt><dd class=\"gain-per-dollar\">{_gpd(s)}</dd>"
            f"<dt>dollars per success point</dt><dd>{DASH if upp is None else _usd(upp)}</dd></dl>{table}</section>")


def _training(s: dict) -> str:
    """The GRPO run in figures: steps, rewards, KL to the champion, the engine/trainer gap."""
    t = s.get("training")
    if not isinstance(t, dict) or not t.get("steps"):
        return ""

    def num(key: str, fmt: str) -> str:
        v = _num(t.get(key))
        return DASH if v is None else format(v, fmt)

    return ('<section class="training"><h3>Training</h3><dl>'
            f"<dt>GRPO steps</dt><dd class=\"steps\">{e(t.get('steps'))}</dd>"
            f"<dt>reward first → last</dt><dd>{num('first_reward', '.3f')} → {num('final_reward', '.3f')}</dd>"
            f"<dt>KL to champion (token mean)</dt><dd class=\"kl\">{num('kl', '.4f')}</dd>"
            f"<dt>ratio (token mean)</dt><dd>{num('ratio_mean', '.4f')}</dd>"
            f"<dt>engine/trainer |Δ log p| mean / max</dt><dd class=\"engine-gap\">{num('engine_logp_gap_mean', '.2e')}"
            f" / {num('engine_logp_gap_max', '.2e')}</dd>"
            f"<dt>engine/trainer KL (k3)</dt><dd>{num('engine_k3', '.2e')}</dd></dl></section>")


def _decision(s: dict, status: str) -> str:
    d = _get(s, "promotion", "decision")
    head = f'<p class="verdict {_status_class(status)}">{e(_status_label(status))}</p>'
    if not isinstance(d, dict):
        return f'<section class="gate"><h3>Decision</h3>{head}</section>'
    reasons = "".join(f"<li>{e(r)}</li>" for r in _list(d.get("reasons")))
    checks = [c for c in _list(d.get("checks")) if isinstance(c, dict)]
    table = ("<table class=\"checks\"><thead><tr><th>check</th><th>passed</th><th>observed</th><th>threshold</th>"
             "<th>unit</th><th>reason</th></tr></thead><tbody>" + "".join(
                 f"<tr class=\"{'pass' if c.get('passed') else 'fail'}\"><td>{e(c.get('name'))}</td>"
                 f"<td>{DASH if c.get('passed') is None else ('✓' if c.get('passed') else '✗')}</td>"
                 f"<td>{_plain(c.get('observed'))}</td><td>{_plain(c.get('threshold'))}</td>"
                 f"<td>{e(c.get('unit'))}</td><td>{e(c.get('reason'))}</td></tr>" for c in checks)
             + "</tbody></table>") if checks else ""
    p = s.get("promotion") if isinstance(s.get("promotion"), dict) else {}
    registry = ""
    if p.get("model_name") or p.get("version") or p.get("aliases"):
        aliases = p.get("aliases") if isinstance(p.get("aliases"), dict) else {}
        registry = (f'<p class="registry">{e(p.get("model_name"))} version {e(p.get("version"))}; aliases: '
                    + (", ".join(f"{e(k)} → v{e(v)}" for k, v in aliases.items()) or DASH) + "</p>")
    return (f'<section class="gate"><h3>Decision</h3>{head}'
            + (f"<p>{e(d['summary'])}</p>" if d.get("summary") else "")
            + (f'<ul class="reasons">{reasons}</ul>' if reasons else "") + table + registry + "</section>")


def _links(s: dict) -> str:
    links = s.get("links") if isinstance(s.get("links"), dict) else {}
    job = links.get("ray_job_id")
    return ('<section class="links"><h3>Links</h3><ul>'
            f"<li>MLflow run: <span class=\"mlflow-link\">{_link(links.get('mlflow_run'))}</span></li>"
            f"<li>Ray dashboard: <span class=\"ray-link\">{_link(links.get('ray_dashboard'))}</span>"
            f" · job <code class=\"ray-job-id\">{e(job)}</code></li>"
            f"<li>Airflow run: <span class=\"airflow-link\">{_link(links.get('airflow_run'))}</span></li>"
            "</ul></section>")


def _timings(s: dict) -> str:
    t = s.get("timings") if isinstance(s.get("timings"), dict) else {}
    if not t:
        return ""
    return ('<details class="timings"><summary>Stage timings</summary><table><tbody>'
            + "".join(f"<tr><td>{e(k)}</td><td>{_duration(v)}</td></tr>" for k, v in t.items())
            + "</tbody></table></details>")


def _run_card(i: int, run: Run) -> str:
    s = run.summary
    return (f'<article class="run {_status_class(run.status)}" id="run-{i}" data-run-id="{e(s["run_id"])}" '
            f'data-status="{e(run.status)}"><header><h2>{e(s["run_id"])}</h2>'
            f'<span class="badge {_status_class(run.status)}">{e(_status_label(run.status))}</span>'
            f'<p class="meta">{e(s["dag_id"])} · started {_when(s.get("started_at"))} · finished '
            f'{_when(s.get("finished_at"))} · wall {_duration(s.get("wall_s"))}</p></header>'
            f'<div class="grid">{_why(s)}{_success(s)}{_cost(s)}{_training(s)}{_decision(s, run.status)}{_links(s)}</div>'
            f"{_timings(s)}</article>")


STYLE = """
:root{--fg:#1d2430;--muted:#5b6675;--bg:#fff;--card:#f6f8fa;--line:#d8dee4;--ok:#1a7f37;--no:#8c959f;
--skip:#bf8700;--fail:#cf222e;--champ:#0969da;--chall:#e16f24}
@media (prefers-color-scheme: dark){:root{--fg:#e6edf3;--muted:#9da7b3;--bg:#0d1117;--card:#161b22;--line:#30363d}}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--fg);background:var(--bg);margin:0;padding:16px 20px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:15px;margin:0;word-break:break-all} h3{font-size:13px;margin:0 0 6px;
text-transform:uppercase;letter-spacing:.04em;color:var(--muted)}
.sub{color:var(--muted);margin:0 0 14px} .ci{color:var(--muted);font-size:12px} code{font-size:12px}
pre{background:var(--bg);border:1px solid var(--line);padding:6px;max-height:160px;overflow:auto;font-size:12px;margin:4px 0}
.decision{border-left:6px solid var(--no);background:var(--card);padding:10px 14px;margin-bottom:16px}
.decision.promoted{border-color:var(--ok)} .decision.skipped{border-color:var(--skip)} .decision.failed{border-color:var(--fail)}
.decision .label{font-size:16px} .decision p{margin:4px 0} .verdict{font-weight:700}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(360px,1fr));gap:16px;margin-bottom:16px}
.charts figure{margin:0;background:var(--card);padding:8px;border:1px solid var(--line)}
figcaption{font-weight:600;margin-bottom:4px} svg.chart{width:100%;height:auto;display:block}
svg .grid{stroke:var(--line);stroke-width:1} svg text{fill:var(--muted);font-size:11px}
svg .line{fill:none;stroke-width:1.5;opacity:.6} svg .line.champion{stroke:var(--champ)} svg .line.challenger{stroke:var(--chall)}
svg .whisker{stroke-width:2} svg .whisker.champion{stroke:var(--champ)} svg .whisker.challenger{stroke:var(--chall)}
svg .champion circle,svg circle.champion{fill:var(--champ)} svg .challenger rect,svg rect.challenger{fill:var(--chall)}
svg .bar.promoted rect{fill:var(--ok)} svg .bar.not_promoted rect{fill:var(--no)} svg .bar.skipped rect{fill:var(--skip)}
svg .bar.failed rect{fill:var(--fail)} svg .bar.other rect{fill:var(--muted)}
.run{border:1px solid var(--line);background:var(--card);padding:12px 14px;margin-bottom:14px}
.run header{display:flex;flex-wrap:wrap;gap:8px;align-items:center} .run .meta{flex-basis:100%;margin:2px 0 8px;color:var(--muted)}
.badge{padding:1px 8px;border-radius:10px;color:#fff;background:var(--no);font-size:12px;font-weight:600}
.badge.promoted{background:var(--ok)} .badge.skipped{background:var(--skip)} .badge.failed{background:var(--fail)}
.run .grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(320px,1fr));gap:12px 20px}
.run .gate{grid-column:span 2} @media (max-width:760px){.run .gate{grid-column:auto}}
table{border-collapse:collapse;width:100%;font-size:13px;margin:4px 0} caption{text-align:left;color:var(--muted);font-size:12px}
th,td{border-bottom:1px solid var(--line);padding:3px 6px;text-align:left;vertical-align:top}
tr.fail td:nth-child(2){color:var(--fail);font-weight:700} tr.pass td:nth-child(2){color:var(--ok);font-weight:700}
tr.sig td{font-weight:600} .role{color:var(--muted);font-size:11px} dl{display:grid;grid-template-columns:auto 1fr;gap:2px 10px;margin:0}
dt{color:var(--muted)} dd{margin:0} .errors{border-left:6px solid var(--fail);background:var(--card);padding:8px 14px;margin-bottom:16px}
.links a{word-break:break-all} .empty-state{padding:24px;background:var(--card);border:1px dashed var(--line)} .note{color:var(--muted);font-size:12px}
"""


ICON_SVG = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" fill="none" stroke="#1a7f37" '
            'stroke-width="2" stroke-linejoin="round"><path d="M12 2 5 11h4l-5 7h16l-5-7h4z"/><path d="M12 18v4"/></svg>')


def render_page(data: Runs) -> str:
    runs = data.runs[:MAX_RUNS_SHOWN]
    parts = ['<!doctype html><html lang="en"><head><meta charset="utf-8">'
             '<meta name="viewport" content="width=device-width, initial-scale=1">'
             f"<title>Evergreen</title><style>{STYLE}</style></head><body>"
             "<h1>Evergreen: continuous post-training</h1>"
             f'<p class="sub">{len(data.runs)} run(s) of <code>{DAG_ID}</code> under <code>{e(data.root)}</code>, '
             'newest first · <a href="api/runs">JSON</a></p>']
    if data.errors:
        parts.append('<section id="errors" class="errors"><h3>Unreadable summaries</h3><ul>' + "".join(
            f"<li><code>{e(err['path'])}</code>: {e(err['error'])}</li>" for err in data.errors) + "</ul></section>")
    if not runs:
        parts.append('<section id="empty-state" class="empty-state"><p>No finished runs yet. A summary appears here '
                     f"when a <code>{DAG_ID}</code> run finishes (its <code>summarize</code> task writes "
                     "<code>summary.json</code>).</p></section>")
    else:
        parts.append(_decision_box(runs[0]))
    parts.append('<div class="charts">'
                 f"<figure><figcaption>Success on the target registry (greedy) per model version</figcaption>"
                 f"{success_chart(runs)}</figure>"
                 f"<figure><figcaption>Cost per run</figcaption>{cost_chart(runs)}</figure></div>")
    parts.append('<div id="runs">' + "".join(_run_card(i, r) for i, r in enumerate(runs)) + "</div>")
    if len(data.runs) > len(runs):
        parts.append(f'<p class="note">{len(data.runs) - len(runs)} older run(s) not shown; see the JSON.</p>')
    parts.append("</body></html>")
    return "".join(parts)


# ------------------------------------------------------------------------------------------------ app

def create_app(*, auth: Auth | None = None, login_url: Callable[[Request], str] | None = None) -> FastAPI:
    """The Evergreen app. `auth(request)` raises HTTPException(401/403) for a caller who may not see the
    runs (None: everyone may, as in tests and the standalone uvicorn mode); `login_url(request)` is where
    an unauthenticated browser is sent instead of a bare 401. Building it does no I/O."""
    app = FastAPI(title="Evergreen", docs_url=None, redoc_url=None, openapi_url=None)

    async def check(request: Request, html_page: bool) -> Response | None:
        if auth is None:
            return None
        try:
            await auth(request)
        except HTTPException as exc:
            if not html_page:
                return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)
            if exc.status_code == 401 and login_url is not None:
                return RedirectResponse(login_url(request), status_code=303)
            # 403: a bad or foreign token, or a user without access to the DAG's runs: say so, in the page
            login = f' <a href="{e(login_url(request))}">Sign in again</a>.' if login_url is not None else ""
            return HTMLResponse(f"<!doctype html><title>Evergreen</title><p>{e(exc.detail)}.{login}</p>",
                                status_code=exc.status_code, headers={"Content-Security-Policy": CSP})
        return None

    @app.get("/", response_class=HTMLResponse)
    async def page(request: Request) -> Response:
        denied = await check(request, html_page=True)
        if denied is not None:
            return denied
        return HTMLResponse(render_page(load_runs()), headers={
            "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"})

    @app.get("/api/runs")
    async def api_runs(request: Request) -> Response:
        denied = await check(request, html_page=False)
        if denied is not None:
            return denied
        data = load_runs()
        return JSONResponse({"dag_id": DAG_ID, "runs_root": None if data.root is None else str(data.root),
                             "count": len(data.runs), "runs": [r.as_json() for r in data.runs],
                             "errors": data.errors}, headers={"Cache-Control": "no-store"})

    @app.get("/icon.svg")
    async def icon() -> Response:
        # The nav entry's icon (external_views "icon"); static, so no auth (the UI loads it with <img>).
        return Response(ICON_SVG, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    @app.get("/health")
    async def health() -> dict:
        # Unauthenticated on purpose (probes): counts only, no run content.
        data = load_runs()
        return {"status": "ok" if data.root is not None else "error", "runs": len(data.runs),
                "errors": len(data.errors)}

    return app


# ----------------------------------------------------------------------------- inside the Airflow server

async def airflow_auth(request: Request) -> None:
    """The Airflow UI's own check: the `_token` cookie (or a Bearer token) must belong to a user who may
    read continuous_post_training's runs. Airflow imports happen here, per request, so the plugin module
    stays light; they are already loaded in the api-server that calls this."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

    user = await get_user(request, None, await bearer_scheme(request))
    if not get_auth_manager().is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN,
                                                details=DagDetails(id=DAG_ID), user=user):
        raise HTTPException(status_code=403, detail=f"not allowed to read the runs of {DAG_ID}")


def airflow_login_url(request: Request) -> str:
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager().get_url_login(next_url=str(request.url))


def create_airflow_app() -> FastAPI:
    return create_app(auth=airflow_auth, login_url=airflow_login_url)
