"""Intervals and tests for the benchmark's figures: exact for proportions, family bootstrap
for the rest, McNemar's exact test between methods.

- A proportion (accuracy, AC@k, FPR, repair rate, confident-wrong rate, ...) gets the
  Clopper-Pearson interval (``scipy.stats.binomtest(...).proportion_ci(method="exact")``),
  so 28 of 28 reads [0.88, 1.00], never the degenerate [1.00, 1.00] a bootstrap gives.
- Any other statistic (MRR, Avg@5, ECE, Brier, NLL, medians, balanced accuracy) gets a
  percentile bootstrap that resamples whole *families*: runs of one family share a scenario
  and are correlated, so resampling runs would understate the spread.
- Two methods on the same runs: McNemar's exact test, a two-sided binomial test on the
  discordant pairs (``scipy.stats.binomtest``).

Every interval is a dict ``{"value", "low", "high", "n", "interval"}``; proportions also
carry ``k`` (successes).

References
----------
Clopper, Pearson. The use of confidence or fiducial limits illustrated in the case of the
binomial. Biometrika 1934.
Field, Welsh. Bootstrapping clustered data. JRSS B 2007.
McNemar. Note on the sampling error of the difference between correlated proportions or
percentages. Psychometrika 1947.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.stats import binomtest

__all__ = ["CONFIDENCE", "proportion_interval", "family_bootstrap", "mcnemar_exact"]

#: Level of every interval in the report.
CONFIDENCE = 0.95


def proportion_interval(successes: Sequence[bool] | np.ndarray, *,
                        confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Share of true values with its exact (Clopper-Pearson) interval.

    Parameters
    ----------
    successes : array of bool or 0/1
        One entry per trial; NaN entries are dropped (a run where the metric is undefined).
    confidence : float, default=0.95

    Returns
    -------
    dict
        ``value`` (k / n), ``low``, ``high``, ``n``, ``k``, ``interval`` ("clopper-pearson");
        NaN value and bounds for n = 0.
    """
    x = np.asarray(successes, dtype=float)
    x = x[~np.isnan(x)]
    n, k = int(x.size), int(np.sum(x > 0.5))
    if n == 0:
        return {"value": math.nan, "low": math.nan, "high": math.nan, "n": 0, "k": 0,
                "interval": "clopper-pearson"}
    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    return {"value": k / n, "low": float(ci.low), "high": float(ci.high), "n": n, "k": k,
            "interval": "clopper-pearson"}


def family_bootstrap(columns: dict[str, np.ndarray], statistic: Callable[..., float],
                     groups: Sequence[Any] | np.ndarray, *, n_resamples: int = 1000,
                     confidence: float = CONFIDENCE, seed: int = 0) -> dict[str, Any]:
    """Point estimate and percentile interval of ``statistic``, resampling whole groups.

    Parameters
    ----------
    columns : dict of str -> ndarray
        Per-run arrays of equal length, passed to ``statistic`` as keyword arguments.
    statistic : callable
        ``statistic(**columns) -> float``.
    groups : array
        Per-run group (the zoo family): a resample draws as many groups as there are, with
        replacement, and keeps every run of each draw.
    n_resamples : int, default=1000
    confidence : float, default=0.95
    seed : int, default=0
        Seed of a local ``numpy.random.Generator`` (deterministic).

    Returns
    -------
    dict
        ``value``, ``low``, ``high``, ``n`` (runs), ``n_groups``, ``interval``
        ("family bootstrap"); bounds NaN with fewer than two groups.

    Raises
    ------
    ValueError
        If the columns and groups differ in length.
    """
    arrays = {k: np.asarray(v) for k, v in columns.items()}
    g = np.asarray(groups, dtype=object)
    sizes = {k: len(v) for k, v in arrays.items()} | {"groups": len(g)}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"bootstrap columns and groups differ in length: {sizes}")
    n = len(g)
    out: dict[str, Any] = {"value": math.nan, "low": math.nan, "high": math.nan, "n": n,
                           "n_groups": 0, "interval": "family bootstrap"}
    if n == 0:
        return out
    out["value"] = float(statistic(**arrays))
    labels = sorted({str(x) for x in g})
    out["n_groups"] = len(labels)
    if len(labels) < 2:
        return out
    members = [np.flatnonzero(np.array([str(x) for x in g]) == lab) for lab in labels]
    rng = np.random.default_rng(seed)
    stats = np.empty(n_resamples)
    for i in range(n_resamples):
        draw = rng.integers(0, len(members), size=len(members))
        idx = np.concatenate([members[j] for j in draw])
        stats[i] = statistic(**{k: v[idx] for k, v in arrays.items()})
    stats = stats[~np.isnan(stats)]
    if stats.size:
        alpha = (1 - confidence) / 2
        out["low"] = float(np.quantile(stats, alpha))
        out["high"] = float(np.quantile(stats, 1 - alpha))
    return out


def mcnemar_exact(correct_a: Sequence[bool] | np.ndarray, correct_b: Sequence[bool] | np.ndarray
                  ) -> dict[str, Any]:
    """McNemar's exact test on paired per-run correctness of two methods.

    Returns
    -------
    dict
        ``both``, ``a_only`` (A right, B wrong), ``b_only``, ``neither`` and ``pvalue``
        (two-sided exact binomial on the discordant pairs; 1.0 when they never disagree).

    Raises
    ------
    ValueError
        If the arrays differ in shape.
    """
    a = np.asarray(correct_a, dtype=bool)
    b = np.asarray(correct_b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"paired arrays differ in shape: {a.shape} vs {b.shape}.")
    a_only, b_only = int(np.sum(a & ~b)), int(np.sum(~a & b))
    p = 1.0 if a_only + b_only == 0 else float(binomtest(a_only, a_only + b_only, 0.5).pvalue)
    return {"both": int(np.sum(a & b)), "a_only": a_only, "b_only": b_only,
            "neither": int(np.sum(~a & ~b)), "statistic": float(min(a_only, b_only)),
            "pvalue": p}
