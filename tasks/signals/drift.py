"""Drift between two windows of production traces: the report, from streamed sufficient statistics.

    from tasks.config import DriftSettings
    from tasks.signals.drift import compare
    from tasks.signals.windowstats import WindowStats

    ref, cur = WindowStats(), WindowStats()
    for t in reference_traces:                  # one call per trace, ~1 µs, memory stays flat
        ref.add(t.workload, success=..., tool_errors=..., prompt_tokens=..., turns=..., tool_calls=...,
                tool_names=[...])
    ...                                         # same for the current window; WindowStats.merge joins chunks
    report = compare(ref, cur, DriftSettings())
    report.drifted, report.summary, report.to_dict()    # the dict is JSON-serialisable

A window keeps, per workload, only counts (tasks.signals.windowstats). Six tests per workload compare the
windows (tasks.signals.significance):

    success_rate     two-proportion z-test (pooled)            effect: |rate change|
    tool_error_rate  two-proportion z-test on the share of traces with tool_errors > 0
    prompt_tokens    two-sample Kolmogorov-Smirnov from the histograms     effect: KS distance D
    turns, tool_calls  the same KS test
    tool_names       chi-squared test of homogeneity (2 x k)    effect: population-stability index (PSI)

Where this departs from the textbook (see also the two modules above: bucketed prompt tokens, the
asymptotic KS p-value, the PSI's epsilon):
- All tests of one report (every workload, every statistic) are one family: Holm (default) or Bonferroni
  correction keeps the chance of any false alarm in a report at alpha.
- Verdict 'drift' needs statistical AND practical significance: corrected p < alpha and an observed
  effect of at least HALF the configured minimum (`min_success_diff`, `min_tool_error_diff`, `min_ks`,
  `min_psi`). With large production windows everything is significant, hence a floor on the effect; but
  the configured minimum is the shift that must be *detected*, and the observed effect of a shift of
  exactly that size falls below it about half the time, so the floor is half of it.
- A workload absent from one window, or with fewer than `min_samples` traces in either, gets the verdict
  'insufficient_data' for its tests (they leave the family); a workload new in the current window is also
  named in `reasons` and `new_workloads`, but does not by itself make `drifted` true.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

from tasks.signals.significance import (
    bonferroni_adjusted,
    chi2_and_psi,
    holm_adjusted,
    ks_from_counts,
    two_proportion_test,
    wasserstein_from_counts,
)
from tasks.signals.windowstats import WindowStats, WorkloadStats

if TYPE_CHECKING:
    from tasks.config_deployment import DriftSettings

STATISTICS = ("success_rate", "tool_error_rate", "prompt_tokens", "turns", "tool_calls", "tool_names")
EFFECT_FLOOR = 0.5  # share of the configured minimum effect an observed effect must reach


@dataclass
class DriftReport:
    """Outcome of `compare`. `reasons`: one line per drift finding and per new/vanished workload (p in a
    reason is the family-adjusted one). Each row of `tests` also carries `detail`: the rates, means and
    Wasserstein distance, or the tool whose share moved most."""

    drifted: bool
    reasons: list[str]
    tests: list[dict]
    summary: str
    settings: dict
    new_workloads: list[str] = field(default_factory=list)
    vanished_workloads: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> DriftReport:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    def test(self, workload: str, statistic: str) -> dict:
        for t in self.tests:
            if t["workload"] == workload and t["statistic"] == statistic:
                return t
        raise KeyError(f"no test of {statistic!r} for workload {workload!r} in this report")


_TEST_NAMES = {
    "success_rate": "two_proportion_z",
    "tool_error_rate": "two_proportion_z",
    "prompt_tokens": "ks_2samp",
    "turns": "ks_2samp",
    "tool_calls": "ks_2samp",
    "tool_names": "chi2_homogeneity",
}


def _min_effect(statistic: str, s: DriftSettings) -> float:
    return {"success_rate": s.min_success_diff, "tool_error_rate": s.min_tool_error_diff, "tool_names": s.min_psi}.get(
        statistic, s.min_ks
    )


def _row(workload: str, statistic: str, s: DriftSettings, n_ref: int, n_cur: int) -> dict:
    return {
        "workload": workload,
        "statistic": statistic,
        "test": _TEST_NAMES[statistic],
        "value": None,
        "p_value": None,
        "p_adjusted": None,
        "effect": None,
        "effect_threshold": EFFECT_FLOOR * _min_effect(statistic, s),
        "alpha": s.alpha,
        "n_reference": n_ref,
        "n_current": n_cur,
        "verdict": "insufficient_data",
        "reason": "",
        "detail": {},
    }


def _rate_test(row: dict, x1: int, n1: int, x2: int, n2: int) -> None:
    z, p = two_proportion_test(x1, n1, x2, n2)
    r1, r2 = x1 / n1, x2 / n2
    row.update(value=z, p_value=p, effect=abs(r2 - r1), detail={"reference": r1, "current": r2})


def _mean(c: Counter) -> float:
    return sum(k * v for k, v in c.items()) / max(1, sum(c.values()))


def _ks_test(row: dict, ref: Counter, cur: Counter) -> None:
    d, p = ks_from_counts(ref, cur)
    row.update(
        value=d,
        p_value=p,
        effect=d,
        detail={
            "mean_reference": _mean(ref),
            "mean_current": _mean(cur),
            "wasserstein": wasserstein_from_counts(ref, cur),
        },
    )


def _names_test(row: dict, ref: Counter, cur: Counter) -> None:
    if sum(ref.values()) == 0 or sum(cur.values()) == 0:
        side = "reference" if sum(ref.values()) == 0 else "current"
        row["reason"] = f"no tool calls in the {side} window"
        return
    chi2, p, psi = chi2_and_psi(ref, cur)
    n1, n2 = sum(ref.values()), sum(cur.values())
    # the tool whose share moved most, for the reason line
    top = max(set(ref) | set(cur), key=lambda k: abs(cur.get(k, 0) / n2 - ref.get(k, 0) / n1))
    row.update(
        value=chi2,
        p_value=p,
        effect=psi,
        detail={"largest_change": top, "reference": ref.get(top, 0) / n1, "current": cur.get(top, 0) / n2},
    )


def _workload_tests(name: str, ref: WorkloadStats | None, cur: WorkloadStats | None, s: DriftSettings) -> list[dict]:
    n_ref, n_cur = (ref.n if ref else 0), (cur.n if cur else 0)
    rows = [_row(name, stat, s, n_ref, n_cur) for stat in STATISTICS]
    if ref is None or cur is None or min(n_ref, n_cur) < s.min_samples:
        why = (
            "new workload: absent from the reference window"
            if ref is None
            else "absent from the current window"
            if cur is None
            else f"{n_ref} reference / {n_cur} current traces, fewer than min_samples={s.min_samples}"
        )
        for row in rows:
            row["reason"] = why
        return rows
    by = dict(zip(STATISTICS, rows, strict=True))
    _rate_test(by["success_rate"], ref.successes, ref.n, cur.successes, cur.n)
    _rate_test(by["tool_error_rate"], ref.with_tool_error, ref.n, cur.with_tool_error, cur.n)
    for stat in ("prompt_tokens", "turns", "tool_calls"):
        _ks_test(by[stat], getattr(ref, stat), getattr(cur, stat))
    _names_test(by["tool_names"], ref.tool_names, cur.tool_names)
    return rows


def _finding(row: dict) -> str:
    w, stat, d, p = row["workload"], row["statistic"], row["detail"], row["p_adjusted"]
    if stat in ("success_rate", "tool_error_rate"):
        label = "success rate" if stat == "success_rate" else "share of traces with tool errors"
        return (
            f"{w}: {label} {d['reference']:.2f} -> {d['current']:.2f} ({d['current'] - d['reference']:+.2f}, p={p:.1g})"
        )
    if stat == "tool_names":
        return (
            f"{w}: tool-name mix changed (PSI={row['effect']:.2f}, p={p:.1g}; largest change "
            f"{d['largest_change']} {d['reference']:.2f} -> {d['current']:.2f})"
        )
    return (
        f"{w}: {stat.replace('_', ' ')} distribution shifted (KS D={row['effect']:.2f}, "
        f"mean {d['mean_reference']:.3g} -> {d['mean_current']:.3g}, p={p:.1g})"
    )


def _decide(rows: list[dict], s: DriftSettings) -> None:
    tested = [r for r in rows if r["p_value"] is not None]
    adjust = holm_adjusted if s.correction == "holm" else bonferroni_adjusted
    for row, q in zip(tested, adjust([r["p_value"] for r in tested]), strict=True):
        row["p_adjusted"] = q
        significant = q < s.alpha
        # tolerance: an effect computed as 0.8 - 0.775 must count as the 0.025 it is
        large = row["effect"] >= row["effect_threshold"] - 1e-12
        row["verdict"] = "drift" if significant and large else "no_drift"
        row["reason"] = (
            _finding(row)
            if row["verdict"] == "drift"
            else f"effect {row['effect']:.3g} below floor {row['effect_threshold']:.3g} (p_adj={q:.2g})"
            if significant
            else f"p_adj={q:.2g} >= alpha={s.alpha}"
        )


def _summary(rows: list[dict], reasons: list[str], s: DriftSettings) -> str:
    drift = sum(r["verdict"] == "drift" for r in rows)
    short = sum(r["verdict"] == "insufficient_data" for r in rows)
    head = f"drift in {drift} of {len(rows)} tests" if drift else f"no drift in {len(rows)} tests"
    head += f" ({s.correction}, alpha={s.alpha}" + (f", {short} with insufficient data)" if short else ")")
    return head + (": " + "; ".join(reasons) if reasons else "")


def compare(reference: WindowStats, current: WindowStats, settings: DriftSettings | None = None) -> DriftReport:
    """Six tests per workload in either window, one correction over all of them, verdicts and reasons."""
    if settings is None:
        from tasks.config import DriftSettings  # pydantic import only when needed

        settings = DriftSettings()
    names = sorted(set(reference.workloads) | set(current.workloads))
    rows = [
        row
        for name in names
        for row in _workload_tests(name, reference.workloads.get(name), current.workloads.get(name), settings)
    ]
    _decide(rows, settings)
    for row in rows:  # JSON-clean: plain floats
        for k in ("value", "p_value", "p_adjusted", "effect"):
            if row[k] is not None:
                row[k] = float(row[k])
    new = [n for n in names if n not in reference.workloads]
    vanished = [n for n in names if n not in current.workloads]
    reasons = [f"new workload {n} ({current.workloads[n].n} traces)" for n in new]
    reasons += [f"workload {n} absent from the current window" for n in vanished]
    reasons += [r["reason"] for r in rows if r["verdict"] == "drift"]
    return DriftReport(
        drifted=any(r["verdict"] == "drift" for r in rows),
        reasons=reasons,
        tests=rows,
        summary=_summary(rows, reasons, settings),
        settings=settings.model_dump(),
        new_workloads=new,
        vanished_workloads=vanished,
    )
