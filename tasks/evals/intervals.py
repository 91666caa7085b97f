"""Bootstrap confidence intervals (percentile method) for a mean and for a paired difference of means.

Pure numpy; deterministic in `seed`. The paired version resamples *tasks*, keeping each task's two
scores together, which is what makes a small true difference on the same tasks detectable.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _percentile_ci(values: np.ndarray, resamples: int, confidence: float, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    n = len(values)
    idx = rng.integers(0, n, size=(resamples, n))
    means = values[idx].mean(axis=1)
    alpha = (1 - confidence) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


def mean_ci(
    values: Sequence[float] | np.ndarray, resamples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> dict:
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        raise ValueError("mean_ci needs at least one value")
    lo, hi = _percentile_ci(v, resamples, confidence, seed)
    return {"mean": float(v.mean()), "low": lo, "high": hi, "n": int(v.size), "confidence": confidence}


def paired_bootstrap(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict:
    """Interval of mean(a - b) over paired samples (a[i], b[i] measured on the same task i)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or x.size == 0:
        raise ValueError(f"paired_bootstrap needs two equal, non-empty samples; got {x.shape} and {y.shape}")
    d = x - y
    lo, hi = _percentile_ci(d, resamples, confidence, seed)
    return {
        "mean": float(d.mean()),
        "low": lo,
        "high": hi,
        "n": int(d.size),
        "confidence": confidence,
        "excludes_zero": bool(lo > 0 or hi < 0),
    }
