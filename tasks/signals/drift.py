"""Drift between two windows of production traces, from streamed sufficient statistics.

    from tasks.config import DriftSettings
    from tasks.signals.drift import WindowStats, compare

    ref, cur = WindowStats(), WindowStats()
    for t in reference_traces:                  # one call per trace, ~1 µs, memory stays flat
        ref.add(t.workload, success=..., tool_errors=..., prompt_tokens=..., turns=..., tool_calls=...,
                tool_names=[...])
    ...                                         # same for the current window; WindowStats.merge joins chunks
    report = compare(ref, cur, DriftSettings())
    report.drifted, report.summary, report.to_dict()    # the dict is JSON-serialisable

A window keeps, per workload, only counts: traces, successes, traces with a tool error, and histograms
(Counters) of prompt tokens, turns, tool calls and tool names. Six tests per workload compare the windows:

    success_rate     two-proportion z-test (pooled)            effect: |rate change|
    tool_error_rate  two-proportion z-test on the share of traces with tool_errors > 0
    prompt_tokens    two-sample Kolmogorov-Smirnov from the histograms     effect: KS distance D
    turns, tool_calls  the same KS test
    tool_names       chi-squared test of homogeneity (2 x k)    effect: population-stability index (PSI)

Where this departs from the textbook:
- Prompt tokens are bucketed before counting so that a histogram stays small: exact below 256, above it
  rounded down to 16 buckets per doubling (256, 272, ..., 496, 512, 544, ..., 1024, 1088, ...), i.e. a
  relative bucket width of at most 1/16. At most ~450 distinct keys up to 1M tokens. The KS statistic is
  that of the bucketed values (it can only be smaller than the raw one, by at most one bucket's mass).
- The KS p-value is asymptotic: the limiting Kolmogorov distribution at sqrt(en) * D, en = n1*n2/(n1+n2)
  the effective size. scipy's `ks_2samp(method="asymp")` uses `kstwo.sf(D, round(en))` instead, whose
  cost grows with en (~20 ms at en = 15,000, seconds for production windows); the limit is never smaller
  (conservative) and within 2% of it beyond en = 2,000, 15% at en = 100. Turns, tool calls and bucketed
  tokens are discrete with many ties, and on discrete data the KS p-value is conservative as well, so the
  false-alarm rate stays below alpha and power is slightly lower than the continuous theory says.
- All tests of one report (every workload, every statistic) are one family: Holm (default) or Bonferroni
  correction keeps the chance of any false alarm in a report at alpha.
- Verdict 'drift' needs statistical AND practical significance: corrected p < alpha and an observed
  effect of at least HALF the configured minimum (`min_success_diff`, `min_tool_error_diff`, `min_ks`,
  `min_psi`). With large production windows everything is significant, hence a floor on the effect; but
  the configured minimum is the shift that must be *detected*, and the observed effect of a shift of
  exactly that size falls below it about half the time, so the floor is half of it.
- PSI replaces empty bins by a share of 1e-4 (the usual epsilon) so that it stays finite.
- A workload absent from one window, or with fewer than `min_samples` traces in either, gets the verdict
  'insufficient_data' for its tests (they leave the family); a workload new in the current window is also
  named in `reasons` and `new_workloads`, but does not by itself make `drifted` true.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields

import numpy as np
from scipy import special, stats

STATISTICS = ("success_rate", "tool_error_rate", "prompt_tokens", "turns", "tool_calls", "tool_names")
EFFECT_FLOOR = 0.5          # share of the configured minimum effect an observed effect must reach
PSI_EPSILON = 1e-4          # share given to an empty bin in the PSI
_EXACT_BELOW = 256          # prompt tokens below this are counted exactly
_MANTISSA_BITS = 4          # above it: 2**4 = 16 buckets per doubling
_FORMAT_VERSION = 1


def bucket_prompt_tokens(tokens: int) -> int:
    """Lower edge of the prompt-token bucket of `tokens` (exact below 256, 16 buckets per doubling above)."""
    tokens = int(tokens)
    if tokens < _EXACT_BELOW:
        return tokens
    shift = tokens.bit_length() - 1 - _MANTISSA_BITS
    return tokens >> shift << shift


# ---------------------------------------------------------------------------------------------------------
# Streaming sufficient statistics

def _int_counter(d: dict, what: str) -> Counter:
    try:
        return Counter({int(k): int(v) for k, v in d.items()})
    except (TypeError, ValueError, AttributeError):
        raise ValueError(f"{what}: expected a mapping of integer values to counts, got {d!r}") from None


@dataclass(slots=True)
class WorkloadStats:
    """Counts of one workload in one window. Histograms are Counters: value -> traces (names -> calls)."""

    n: int = 0
    successes: int = 0
    with_tool_error: int = 0
    prompt_tokens: Counter = field(default_factory=Counter)     # bucketed, see bucket_prompt_tokens
    turns: Counter = field(default_factory=Counter)
    tool_calls: Counter = field(default_factory=Counter)
    tool_names: Counter = field(default_factory=Counter)

    def merge(self, other: WorkloadStats) -> None:
        self.n += other.n
        self.successes += other.successes
        self.with_tool_error += other.with_tool_error
        self.prompt_tokens.update(other.prompt_tokens)
        self.turns.update(other.turns)
        self.tool_calls.update(other.tool_calls)
        self.tool_names.update(other.tool_names)

    def to_dict(self) -> dict:
        # JSON keys are strings; sorted so that equal stats serialise identically
        def hist(c: Counter) -> dict:
            return {str(k): c[k] for k in sorted(c)}
        return {"n": self.n, "successes": self.successes, "with_tool_error": self.with_tool_error,
                "prompt_tokens": hist(self.prompt_tokens), "turns": hist(self.turns),
                "tool_calls": hist(self.tool_calls), "tool_names": hist(self.tool_names)}

    @classmethod
    def from_dict(cls, d: dict) -> WorkloadStats:
        missing = [f.name for f in fields(cls) if f.name not in d]
        if missing:
            raise ValueError(f"workload stats lack {missing}; expected the output of WorkloadStats.to_dict()")
        return cls(n=int(d["n"]), successes=int(d["successes"]), with_tool_error=int(d["with_tool_error"]),
                   prompt_tokens=_int_counter(d["prompt_tokens"], "prompt_tokens"),
                   turns=_int_counter(d["turns"], "turns"),
                   tool_calls=_int_counter(d["tool_calls"], "tool_calls"),
                   tool_names=Counter({str(k): int(v) for k, v in d["tool_names"].items()}))


@dataclass(slots=True)
class WindowStats:
    """Per-workload counts of one window of traces; `add` once per trace, `merge` to join chunks."""

    workloads: dict[str, WorkloadStats] = field(default_factory=dict)

    def add(self, workload: str, *, success: bool, tool_errors: int, prompt_tokens: int, turns: int,
            tool_calls: int, tool_names: Sequence[str]) -> None:
        # Hot path (once per trace): plain attribute and Counter updates only. Checked before any update so
        # a bad trace leaves the stats untouched; `a | b` of ints is negative iff one of them is.
        try:
            bad = (tool_errors | prompt_tokens | turns | tool_calls) < 0 or isinstance(tool_names, str)
        except TypeError:
            # not all ints: JSON Schema's "integer" also admits 512.0, so integral floats are accepted
            values = (tool_errors, prompt_tokens, turns, tool_calls)
            bad = not all(isinstance(v, float) and v.is_integer() and v >= 0 or isinstance(v, int) and v >= 0
                          for v in values) or isinstance(tool_names, str)
            if not bad:
                tool_errors, prompt_tokens, turns, tool_calls = map(int, values)
        if bad:
            raise ValueError(
                f"trace of workload {workload!r}: tool_errors={tool_errors!r}, prompt_tokens={prompt_tokens!r}, "
                f"turns={turns!r}, tool_calls={tool_calls!r} must be non-negative ints and tool_names a "
                f"list of names (got {tool_names!r}); fix the trace parser")
        w = self.workloads.get(workload)
        if w is None:
            w = self.workloads[workload] = WorkloadStats()
        w.n += 1
        if success:
            w.successes += 1
        if tool_errors:
            w.with_tool_error += 1
        w.prompt_tokens[bucket_prompt_tokens(prompt_tokens) if prompt_tokens >= _EXACT_BELOW
                        else prompt_tokens] += 1
        w.turns[turns] += 1
        w.tool_calls[tool_calls] += 1
        for name in tool_names:
            w.tool_names[name] += 1

    def merge(self, other: WindowStats) -> None:
        for name, stats_ in other.workloads.items():
            mine = self.workloads.get(name)
            if mine is None:
                mine = self.workloads[name] = WorkloadStats()
            mine.merge(stats_)

    def total(self) -> int:
        return sum(w.n for w in self.workloads.values())

    def to_dict(self) -> dict:
        return {"version": _FORMAT_VERSION, "prompt_token_buckets": f"exact<{_EXACT_BELOW}, "
                f"{2 ** _MANTISSA_BITS} per doubling above",
                "workloads": {name: self.workloads[name].to_dict() for name in sorted(self.workloads)}}

    @classmethod
    def from_dict(cls, d: dict) -> WindowStats:
        if d.get("version") != _FORMAT_VERSION or "workloads" not in d:
            raise ValueError(f"window stats of version {d.get('version')!r}, expected {_FORMAT_VERSION} with "
                             "'workloads'; recompute them from the traces with this code")
        return cls({name: WorkloadStats.from_dict(w) for name, w in d["workloads"].items()})


# ---------------------------------------------------------------------------------------------------------
# Pure tests

def two_proportion_test(x1: int, n1: int, x2: int, n2: int) -> tuple[float, float]:
    """Two-sided pooled z-test of x1/n1 == x2/n2. z > 0 when the second (current) rate is higher."""
    if n1 <= 0 or n2 <= 0 or not (0 <= x1 <= n1 and 0 <= x2 <= n2):
        raise ValueError(f"two_proportion_test needs 0 <= x <= n and n > 0, got {x1}/{n1} and {x2}/{n2}")
    pooled = (x1 + x2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if se == 0:                 # both all-success or all-failure: identical, nothing to test
        return 0.0, 1.0
    z = (x2 / n2 - x1 / n1) / se
    return z, float(2 * special.ndtr(-abs(z)))     # ndtr: the normal CDF without scipy.stats overhead


def _aligned(ref: Counter, cur: Counter, what: str) -> tuple[list, np.ndarray, np.ndarray]:
    keys = sorted(k for k in set(ref) | set(cur) if ref.get(k, 0) + cur.get(k, 0) > 0)
    a = np.array([ref.get(k, 0) for k in keys], dtype=float)
    b = np.array([cur.get(k, 0) for k in keys], dtype=float)
    if (a < 0).any() or (b < 0).any() or a.sum() == 0 or b.sum() == 0:
        raise ValueError(f"{what}: both histograms need non-negative counts and at least one observation, "
                         f"got {dict(ref)} and {dict(cur)}")
    return keys, a, b


def ks_from_counts(ref: Counter, cur: Counter) -> tuple[float, float]:
    """Two-sample KS statistic D (exact, from the value histograms) and its asymptotic p-value.

    D = max |F_ref - F_cur| over the union of the supports (ECDFs are step functions, so the maximum is
    attained at a support point). p-value: the asymptotic Kolmogorov distribution at sqrt(en) * D with
    en = n1*n2/(n1+n2); at least scipy's ks_2samp(method="asymp") p-value, and conservative on discrete data.
    """
    _, a, b = _aligned(ref, cur, "ks_from_counts")
    n1, n2 = a.sum(), b.sum()
    d = float(np.abs(np.cumsum(a) / n1 - np.cumsum(b) / n2).max())
    if d == 0:
        return 0.0, 1.0
    # special.kolmogorov is the limit of kstwo: ~1 µs instead of ~1.3 µs per unit of en (see module doc)
    return d, float(min(1.0, special.kolmogorov(math.sqrt(n1 * n2 / (n1 + n2)) * d)))


def wasserstein_from_counts(ref: Counter, cur: Counter) -> float:
    """Earth mover's distance between the two value histograms (in the values' units; report only)."""
    keys, a, b = _aligned(ref, cur, "wasserstein_from_counts")
    values = np.asarray(keys, dtype=float)
    return float(stats.wasserstein_distance(values, values, a, b))


def chi2_and_psi(ref: Counter, cur: Counter) -> tuple[float, float, float]:
    """Chi-squared test of homogeneity of the 2 x k table (categories seen in either) and the PSI.

    Pearson's statistic without Yates' correction (which would make only the two-category case
    conservative). PSI = sum (q - p) ln(q / p) over shares, an empty bin counted as PSI_EPSILON.
    """
    _, a, b = _aligned(ref, cur, "chi2_and_psi")
    if a.size < 2:              # one category on both sides: the same mix
        return 0.0, 1.0, 0.0
    chi2, p, _, _ = stats.chi2_contingency(np.stack([a, b]), correction=False)
    ps = np.maximum(a / a.sum(), PSI_EPSILON)
    qs = np.maximum(b / b.sum(), PSI_EPSILON)
    return float(chi2), float(p), float(np.sum((qs - ps) * np.log(qs / ps)))


def _check_p(p_values) -> np.ndarray:
    p = np.asarray(p_values, dtype=float)
    if p.ndim != 1 or ((p < 0) | (p > 1) | np.isnan(p)).any():
        raise ValueError(f"p-values must be a flat sequence of numbers in [0, 1], got {p_values!r}")
    return p


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values: max over j <= i of (m - j + 1) p_(j), capped at 1."""
    p = _check_p(p_values)
    m = p.size
    if m == 0:
        return []
    order = np.argsort(p, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj
    return out.tolist()


def bonferroni_adjusted(p_values: Sequence[float]) -> list[float]:
    p = _check_p(p_values)
    return np.minimum(1.0, p * p.size).tolist()


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Rejections of Holm's procedure at family-wise level alpha (adjusted p < alpha)."""
    return [q < alpha for q in holm_adjusted(p_values)]


def bonferroni(p_values: Sequence[float], alpha: float) -> list[bool]:
    return [q < alpha for q in bonferroni_adjusted(p_values)]


# ---------------------------------------------------------------------------------------------------------
# Report

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


_TEST_NAMES = {"success_rate": "two_proportion_z", "tool_error_rate": "two_proportion_z",
               "prompt_tokens": "ks_2samp", "turns": "ks_2samp", "tool_calls": "ks_2samp",
               "tool_names": "chi2_homogeneity"}


def _min_effect(statistic: str, s) -> float:
    return {"success_rate": s.min_success_diff, "tool_error_rate": s.min_tool_error_diff,
            "tool_names": s.min_psi}.get(statistic, s.min_ks)


def _row(workload, statistic, s, n_ref, n_cur) -> dict:
    return {"workload": workload, "statistic": statistic, "test": _TEST_NAMES[statistic], "value": None,
            "p_value": None, "p_adjusted": None, "effect": None,
            "effect_threshold": EFFECT_FLOOR * _min_effect(statistic, s), "alpha": s.alpha,
            "n_reference": n_ref, "n_current": n_cur, "verdict": "insufficient_data", "reason": "",
            "detail": {}}


def _rate_test(row: dict, x1: int, n1: int, x2: int, n2: int) -> None:
    z, p = two_proportion_test(x1, n1, x2, n2)
    r1, r2 = x1 / n1, x2 / n2
    row.update(value=z, p_value=p, effect=abs(r2 - r1), detail={"reference": r1, "current": r2})


def _mean(c: Counter) -> float:
    return sum(k * v for k, v in c.items()) / max(1, sum(c.values()))


def _ks_test(row: dict, ref: Counter, cur: Counter) -> None:
    d, p = ks_from_counts(ref, cur)
    row.update(value=d, p_value=p, effect=d,
               detail={"mean_reference": _mean(ref), "mean_current": _mean(cur),
                       "wasserstein": wasserstein_from_counts(ref, cur)})


def _names_test(row: dict, ref: Counter, cur: Counter) -> None:
    if sum(ref.values()) == 0 or sum(cur.values()) == 0:
        side = "reference" if sum(ref.values()) == 0 else "current"
        row["reason"] = f"no tool calls in the {side} window"
        return
    chi2, p, psi = chi2_and_psi(ref, cur)
    n1, n2 = sum(ref.values()), sum(cur.values())
    # the tool whose share moved most, for the reason line
    top = max(set(ref) | set(cur), key=lambda k: abs(cur.get(k, 0) / n2 - ref.get(k, 0) / n1))
    row.update(value=chi2, p_value=p, effect=psi,
               detail={"largest_change": top, "reference": ref.get(top, 0) / n1, "current": cur.get(top, 0) / n2})


def _workload_tests(name: str, ref: WorkloadStats | None, cur: WorkloadStats | None, s) -> list[dict]:
    n_ref, n_cur = (ref.n if ref else 0), (cur.n if cur else 0)
    rows = [_row(name, stat, s, n_ref, n_cur) for stat in STATISTICS]
    if ref is None or cur is None or min(n_ref, n_cur) < s.min_samples:
        why = ("new workload: absent from the reference window" if ref is None
               else "absent from the current window" if cur is None
               else f"{n_ref} reference / {n_cur} current traces, fewer than min_samples={s.min_samples}")
        for row in rows:
            row["reason"] = why
        return rows
    by = dict(zip(STATISTICS, rows))
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
        return (f"{w}: {label} {d['reference']:.2f} -> {d['current']:.2f} "
                f"({d['current'] - d['reference']:+.2f}, p={p:.1g})")
    if stat == "tool_names":
        return (f"{w}: tool-name mix changed (PSI={row['effect']:.2f}, p={p:.1g}; largest change "
                f"{d['largest_change']} {d['reference']:.2f} -> {d['current']:.2f})")
    return (f"{w}: {stat.replace('_', ' ')} distribution shifted (KS D={row['effect']:.2f}, "
            f"mean {d['mean_reference']:.3g} -> {d['mean_current']:.3g}, p={p:.1g})")


def _decide(rows: list[dict], s) -> None:
    tested = [r for r in rows if r["p_value"] is not None]
    adjust = holm_adjusted if s.correction == "holm" else bonferroni_adjusted
    for row, q in zip(tested, adjust([r["p_value"] for r in tested])):
        row["p_adjusted"] = q
        significant = q < s.alpha
        # tolerance: an effect computed as 0.8 - 0.775 must count as the 0.025 it is
        large = row["effect"] >= row["effect_threshold"] - 1e-12
        row["verdict"] = "drift" if significant and large else "no_drift"
        row["reason"] = (_finding(row) if row["verdict"] == "drift"
                         else f"effect {row['effect']:.3g} below floor {row['effect_threshold']:.3g} "
                              f"(p_adj={q:.2g})" if significant
                         else f"p_adj={q:.2g} >= alpha={s.alpha}")


def _summary(rows: list[dict], reasons: list[str], s) -> str:
    drift = sum(r["verdict"] == "drift" for r in rows)
    short = sum(r["verdict"] == "insufficient_data" for r in rows)
    head = f"drift in {drift} of {len(rows)} tests" if drift else f"no drift in {len(rows)} tests"
    head += f" ({s.correction}, alpha={s.alpha}" + (f", {short} with insufficient data)" if short else ")")
    return head + (": " + "; ".join(reasons) if reasons else "")


def compare(reference: WindowStats, current: WindowStats, settings=None) -> DriftReport:
    """Six tests per workload in either window, one correction over all of them, verdicts and reasons."""
    if settings is None:
        from tasks.config import DriftSettings     # pydantic import only when needed
        settings = DriftSettings()
    names = sorted(set(reference.workloads) | set(current.workloads))
    rows = [row for name in names
            for row in _workload_tests(name, reference.workloads.get(name), current.workloads.get(name), settings)]
    _decide(rows, settings)
    for row in rows:            # JSON-clean: plain floats
        for k in ("value", "p_value", "p_adjusted", "effect"):
            if row[k] is not None:
                row[k] = float(row[k])
    new = [n for n in names if n not in reference.workloads]
    vanished = [n for n in names if n not in current.workloads]
    reasons = [f"new workload {n} ({current.workloads[n].n} traces)" for n in new]
    reasons += [f"workload {n} absent from the current window" for n in vanished]
    reasons += [r["reason"] for r in rows if r["verdict"] == "drift"]
    return DriftReport(drifted=any(r["verdict"] == "drift" for r in rows), reasons=reasons, tests=rows,
                       summary=_summary(rows, reasons, settings), settings=settings.model_dump(),
                       new_workloads=new, vanished_workloads=vanished)
