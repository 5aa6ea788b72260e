"""Diagnosis metrics of EVALUATION.md, per run and aggregated, with bootstrap intervals.

Two layers:

- per-run scores (:func:`score_run`): what one method said about one run against its ground
  truth (predicted label and its confidence, rank of the true cause, layer hit, onset error);
- aggregates over runs (:func:`summarize`): failure accuracy, cause AC@k / Avg@5 / MRR, layer
  accuracy, onset hit rate and median error, detection latency, healthy FPR, ECE / Brier /
  NLL of the top-1 confidence, each with a percentile-bootstrap 95% interval, plus
  counterfactual validity, repair rate and McNemar's test between two methods.

Conventions (the same for every method):

- A run is judged failing when some hypothesis has ``confidence >= 0.5``; the predicted
  label is then the top hypothesis's ``failure_type`` with its confidence, otherwise
  ``"healthy"`` with confidence ``1 - top confidence`` (``1`` for an empty list).
- Cause ranks use the hypotheses' list order (highest confidence first); a cause counts
  once, at its first position. A run whose true cause is never named has no rank (a miss
  for AC@k and a reciprocal rank of 0).
- Layer and onset use the top hypothesis, whatever its confidence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from neuraldbg.records import HEALTHY, Hypothesis

__all__ = [
    "THRESHOLD",
    "predicted_label",
    "cause_rank",
    "score_run",
    "ac_at_k",
    "avg_at_k",
    "mean_reciprocal_rank",
    "expected_calibration_error",
    "brier_score",
    "negative_log_likelihood",
    "reliability_table",
    "bootstrap_ci",
    "mcnemar_test",
    "summarize",
    "counterfactual_validity",
    "repair_rate",
]

#: Confidence at or above which a hypothesis declares the run failing (the contract's rule).
THRESHOLD = 0.5
#: Probabilities are clipped to [EPS, 1 - EPS] inside the NLL.
EPS = 1e-6


# --------------------------------------------------------------------------- per run
def predicted_label(hyps: Sequence[Hypothesis], threshold: float = THRESHOLD) -> tuple[str, float]:
    """The method's verdict on a run and the confidence it gives that verdict.

    Parameters
    ----------
    hyps : sequence of Hypothesis
        Highest confidence first.
    threshold : float, default=0.5
        A hypothesis at or above it declares a failure.

    Returns
    -------
    label : str
        The top hypothesis's ``failure_type``, or ``"healthy"``.
    confidence : float
        Its confidence, or ``1 - top confidence`` for ``"healthy"`` (``1.0`` with no hypothesis).
    """
    if not hyps:
        return HEALTHY, 1.0
    top = max(float(h.confidence) for h in hyps)
    first = next(h for h in hyps if float(h.confidence) == top)
    if top >= threshold:
        return first.failure_type, top
    return HEALTHY, 1.0 - top


def cause_rank(hyps: Sequence[Hypothesis], true_cause: str) -> int | None:
    """1-based rank of ``true_cause`` among the distinct causes named, in list order.

    None when the cause is never named.
    """
    seen: list[str] = []
    for h in hyps:
        if h.root_cause not in seen:
            seen.append(h.root_cause)
        if h.root_cause == true_cause:
            return len(seen)
    return None


def score_run(hyps: Sequence[Hypothesis], truth: dict[str, Any]) -> dict[str, Any]:
    """Score one method's hypotheses on one run against its ground truth.

    Parameters
    ----------
    hyps : sequence of Hypothesis
        The method's answer, highest confidence first.
    truth : dict
        The run's ``ground_truth``: ``failure_type``, ``root_cause``, ``origin_layers``,
        ``onset_step``, ``onset_tolerance``.

    Returns
    -------
    dict
        ``pred_failure``, ``confidence`` (of the verdict), ``failure_correct``, ``pred_cause``,
        ``cause_rank`` (NaN when absent or for a healthy run), ``pred_layer``,
        ``layer_correct``, ``pred_step``, ``onset_error``, ``onset_hit`` (None where the truth
        has no onset), ``flagged`` (any hypothesis >= threshold), ``n_hypotheses``.
    """
    true_failure = truth.get("failure_type", HEALTHY)
    label, conf = predicted_label(hyps)
    top = hyps[0] if hyps else None
    failing = true_failure != HEALTHY
    rank = cause_rank(hyps, truth.get("root_cause", "none")) if failing else None
    out: dict[str, Any] = {
        "pred_failure": label,
        "confidence": conf,
        "failure_correct": bool(label == true_failure),
        "pred_cause": top.root_cause if top is not None and label != HEALTHY else "none",
        "cause_rank": float(rank) if rank is not None else math.nan,
        "pred_layer": top.origin_layer if top is not None else "",
        "pred_step": int(top.origin_step) if top is not None else -1,
        "flagged": bool(any(float(h.confidence) >= THRESHOLD for h in hyps)),
        "n_hypotheses": len(hyps),
        "layer_correct": None,
        "onset_error": math.nan,
        "onset_hit": None,
    }
    if failing:
        layers = list(truth.get("origin_layers") or [])
        out["layer_correct"] = bool(top is not None and top.origin_layer in layers)
        onset = truth.get("onset_step")
        if onset is not None:
            tol = int(truth.get("onset_tolerance", 0))
            if top is None:
                out["onset_hit"] = False
            else:
                err = abs(int(top.origin_step) - int(onset))
                out["onset_error"] = float(err)
                out["onset_hit"] = bool(err <= tol)
    return out


# --------------------------------------------------------------------------- rank metrics
def _ranks(ranks: Sequence[float] | np.ndarray) -> np.ndarray:
    r = np.asarray(ranks, dtype=float)
    return np.where(np.isnan(r), np.inf, r)


def ac_at_k(ranks: Sequence[float] | np.ndarray, k: int) -> float:
    """Share of runs whose true cause is ranked within the top ``k`` (NaN rank = miss)."""
    r = _ranks(ranks)
    return float(np.mean(r <= k)) if r.size else math.nan


def avg_at_k(ranks: Sequence[float] | np.ndarray, k: int = 5) -> float:
    """Mean of AC@1 .. AC@k (Avg@5 for k=5)."""
    return float(np.mean([ac_at_k(ranks, j) for j in range(1, k + 1)]))


def mean_reciprocal_rank(ranks: Sequence[float] | np.ndarray) -> float:
    """Mean of 1/rank, 0 for a cause never named."""
    r = _ranks(ranks)
    return float(np.mean(1.0 / r)) if r.size else math.nan


# --------------------------------------------------------------------------- calibration
def _cc(conf: Sequence[float] | np.ndarray, correct: Sequence[bool] | np.ndarray
        ) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(conf, dtype=float)
    y = np.asarray(correct, dtype=float)
    if c.shape != y.shape:
        raise ValueError(f"conf and correct differ in shape: {c.shape} vs {y.shape}.")
    if c.size and (np.nanmin(c) < -1e-9 or np.nanmax(c) > 1 + 1e-9):
        raise ValueError(f"confidences must lie in [0, 1]; got range [{c.min()}, {c.max()}].")
    return np.clip(c, 0.0, 1.0), y  # float round-off (1.0000000000000002) is not an error


def reliability_table(conf: Sequence[float] | np.ndarray, correct: Sequence[bool] | np.ndarray,
                      n_bins: int = 15) -> pd.DataFrame:
    """Equal-width confidence bins: count, mean confidence and accuracy per bin.

    Bin ``b`` holds confidences in ``(b/n, (b+1)/n]``; confidence 0 goes to the first bin
    (edges from ``numpy.linspace``, assignment by ``searchsorted`` as scikit-learn's
    ``calibration_curve`` does).
    """
    c, y = _cc(conf, correct)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    idx = np.searchsorted(edges[1:-1], c, side="left")
    rows = []
    for b in range(n_bins):
        m = idx == b
        n = int(m.sum())
        rows.append({"bin": b, "lower": b / n_bins, "upper": (b + 1) / n_bins, "count": n,
                     "mean_confidence": float(c[m].mean()) if n else math.nan,
                     "accuracy": float(y[m].mean()) if n else math.nan})
    return pd.DataFrame(rows)


def expected_calibration_error(conf: Sequence[float] | np.ndarray,
                               correct: Sequence[bool] | np.ndarray, n_bins: int = 15) -> float:
    """ECE: sum over equal-width bins of (bin share) x |accuracy - mean confidence|.

    Bins as in :func:`reliability_table`.
    """
    c, y = _cc(conf, correct)
    if not c.size:
        return math.nan
    idx = np.searchsorted(np.linspace(0.0, 1.0, n_bins + 1)[1:-1], c, side="left")
    gap = np.bincount(idx, weights=y - c, minlength=n_bins)
    return float(np.sum(np.abs(gap)) / c.size)


def brier_score(conf: Sequence[float] | np.ndarray, correct: Sequence[bool] | np.ndarray) -> float:
    """Mean squared difference between the confidence and the 0/1 correctness."""
    c, y = _cc(conf, correct)
    return float(np.mean((c - y) ** 2)) if c.size else math.nan


def negative_log_likelihood(conf: Sequence[float] | np.ndarray,
                            correct: Sequence[bool] | np.ndarray) -> float:
    """Mean Bernoulli NLL of the correctness under the confidence (clipped to [1e-6, 1-1e-6])."""
    c, y = _cc(conf, correct)
    if not c.size:
        return math.nan
    p = np.clip(c, EPS, 1 - EPS)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


# --------------------------------------------------------------------------- inference
def bootstrap_ci(columns: dict[str, np.ndarray], statistic: Callable[..., float], *,
                 n_resamples: int = 1000, confidence: float = 0.95, seed: int = 0
                 ) -> tuple[float, float, float]:
    """Point estimate and percentile-bootstrap interval of ``statistic`` over runs.

    Parameters
    ----------
    columns : dict of str -> ndarray
        Per-run arrays of equal length, passed to ``statistic`` as keyword arguments; runs
        are resampled together (paired).
    statistic : callable
        ``statistic(**columns) -> float``.
    n_resamples : int, default=1000
    confidence : float, default=0.95
    seed : int, default=0
        Seed of the local ``numpy.random.Generator`` (results are deterministic).

    Returns
    -------
    (estimate, low, high) : tuple of float
        NaN everywhere for zero runs; the interval is NaN where resampled statistics are.
    """
    arrays = {k: np.asarray(v) for k, v in columns.items()}
    lengths = {len(v) for v in arrays.values()}
    if len(lengths) != 1:
        sizes = {k: len(v) for k, v in arrays.items()}
        raise ValueError(f"bootstrap columns differ in length: {sizes}")
    n = lengths.pop()
    if n == 0:
        return math.nan, math.nan, math.nan
    est = float(statistic(**arrays))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_resamples, n))
    stats = np.array([statistic(**{k: v[i] for k, v in arrays.items()}) for i in idx], dtype=float)
    stats = stats[~np.isnan(stats)]
    if not stats.size:
        return est, math.nan, math.nan
    alpha = (1 - confidence) / 2
    return est, float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha))


def mcnemar_test(correct_a: Sequence[bool] | np.ndarray, correct_b: Sequence[bool] | np.ndarray
                 ) -> dict[str, float]:
    """McNemar's exact test on paired per-run correctness of two methods.

    Returns
    -------
    dict
        ``a_only`` (A right, B wrong), ``b_only``, ``both``, ``neither``, ``statistic`` and
        ``pvalue`` (exact binomial, two-sided; 1.0 when the methods never disagree).
    """
    from statsmodels.stats.contingency_tables import mcnemar

    a = np.asarray(correct_a, dtype=bool)
    b = np.asarray(correct_b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"paired arrays differ in shape: {a.shape} vs {b.shape}.")
    table = np.array([[np.sum(a & b), np.sum(a & ~b)], [np.sum(~a & b), np.sum(~a & ~b)]])
    if table[0, 1] + table[1, 0] == 0:
        stat, p = 0.0, 1.0
    else:
        res = mcnemar(table, exact=True)
        stat, p = float(res.statistic), float(res.pvalue)
    return {"both": int(table[0, 0]), "a_only": int(table[0, 1]), "b_only": int(table[1, 0]),
            "neither": int(table[1, 1]), "statistic": stat, "pvalue": p}


# --------------------------------------------------------------------------- aggregates
def _mean(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else math.nan


def _median(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    return float(np.median(x)) if x.size else math.nan


def _interval(columns: dict[str, Any], stat: Callable[..., float], n: int, seed: int
              ) -> dict[str, float]:
    est, lo, hi = bootstrap_ci(columns, stat, n_resamples=n, seed=seed)
    return {"value": est, "low": lo, "high": hi, "n": int(len(next(iter(columns.values()))))}


def summarize(records: pd.DataFrame, *, n_resamples: int = 1000, seed: int = 0,
              n_bins: int = 15) -> dict[str, dict[str, float]]:
    """Every diagnosis metric of one method over its scored runs, with 95% intervals.

    Parameters
    ----------
    records : DataFrame
        One row per scored run for one method: the columns of :func:`score_run` plus
        ``true_failure`` and, optionally, ``latency`` (steps from onset to the first
        detection, NaN when never detected) and ``detected``.
    n_resamples : int, default=1000
    seed : int, default=0
    n_bins : int, default=15

    Returns
    -------
    dict
        metric name -> ``{"value", "low", "high", "n"}``.
    """
    r = records
    failing = r[r["true_failure"] != HEALTHY]
    healthy = r[r["true_failure"] == HEALTHY]
    out: dict[str, dict[str, float]] = {}

    def frac(col: pd.Series) -> np.ndarray:
        return col.astype(float).to_numpy()

    out["failure_accuracy"] = _interval({"x": frac(r["failure_correct"])}, _mean, n_resamples,
                                        seed)
    out["failure_accuracy_failing"] = _interval({"x": frac(failing["failure_correct"])}, _mean,
                                                n_resamples, seed)
    ranks = failing["cause_rank"].astype(float).to_numpy()
    for k in (1, 3):
        out[f"cause_ac@{k}"] = _interval({"r": ranks}, lambda r, k=k: ac_at_k(r, k), n_resamples,
                                         seed)
    out["cause_avg@5"] = _interval({"r": ranks}, lambda r: avg_at_k(r, 5), n_resamples, seed)
    out["cause_mrr"] = _interval({"r": ranks}, lambda r: mean_reciprocal_rank(r), n_resamples,
                                 seed)
    out["layer_accuracy"] = _interval({"x": frac(failing["layer_correct"])}, _mean, n_resamples,
                                      seed)
    if "origin_scope" in r.columns:  # faults in named layers (not run-wide, where any counts)
        local = failing[failing["origin_scope"] == "layer"]
        out["layer_accuracy_local"] = _interval({"x": frac(local["layer_correct"])}, _mean,
                                                n_resamples, seed)
    with_onset = failing[failing["onset_hit"].notna()]
    out["onset_hit"] = _interval({"x": frac(with_onset["onset_hit"])}, _mean, n_resamples, seed)
    out["onset_median_error"] = _interval(
        {"x": with_onset["onset_error"].astype(float).to_numpy()}, _median, n_resamples, seed)
    if "latency" in r.columns:
        lat = with_onset["latency"].astype(float).to_numpy()
        out["detection_rate"] = _interval({"x": (~np.isnan(lat)).astype(float)}, _mean,
                                          n_resamples, seed)
        out["detection_median_latency"] = _interval({"x": lat}, _median, n_resamples, seed)
    out["healthy_fpr"] = _interval({"x": frac(healthy["flagged"])}, _mean, n_resamples, seed)
    conf = r["confidence"].astype(float).to_numpy()
    corr = frac(r["failure_correct"])
    cols = {"conf": conf, "correct": corr}
    out["ece"] = _interval(cols, lambda conf, correct: expected_calibration_error(conf, correct,
                                                                                  n_bins),
                           n_resamples, seed)
    out["brier"] = _interval(cols, brier_score, n_resamples, seed)
    out["nll"] = _interval(cols, negative_log_likelihood, n_resamples, seed)
    return out


def counterfactual_validity(cases: pd.DataFrame, *, n_resamples: int = 1000, seed: int = 0
                            ) -> dict[str, dict[str, float]]:
    """What-if predictions against really re-running the run with the knob changed.

    Parameters
    ----------
    cases : DataFrame
        One row per (run, knob change): ``p_failure`` (predicted P(failure) under the
        change) and ``actual_failure`` (bool: the re-run failed).

    Returns
    -------
    dict
        ``accuracy`` (``p_failure >= 0.5`` agrees with the re-run) and ``brier``, with intervals.
    """
    p = cases["p_failure"].astype(float).to_numpy()
    y = cases["actual_failure"].astype(float).to_numpy()
    return {
        "accuracy": _interval({"p": p, "y": y}, lambda p, y: float(np.mean((p >= 0.5) == (y > 0.5)))
                              if p.size else math.nan, n_resamples, seed),
        "brier": _interval({"p": p, "y": y}, lambda p, y: float(np.mean((p - y) ** 2))
                           if p.size else math.nan, n_resamples, seed),
    }


def repair_rate(repairs: pd.DataFrame, *, n_resamples: int = 1000, seed: int = 0
                ) -> dict[str, float]:
    """Share of failing runs whose top suggested intervention, re-run, trained healthily.

    ``repairs`` has one row per failing run with a bool ``repaired`` (False when the method
    suggested nothing).
    """
    return _interval({"x": repairs["repaired"].astype(float).to_numpy()}, _mean, n_resamples, seed)
