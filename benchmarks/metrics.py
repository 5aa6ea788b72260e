"""Diagnosis metrics of docs/evaluation.md, per run and aggregated, with 95% intervals.

The one metrics module of the benchmark (calibration measures share their binning and
clipping with :mod:`causal_models.calibration`, which the probabilistic model is
calibrated with). Two layers:

- per-run scores (:func:`score_run`): what one method said about one run against its ground
  truth (predicted label and its confidence, rank of the true cause, layer hit, onset error,
  confident-wrong);
- aggregates over runs (:func:`summarize`): failure accuracy, cause AC@k / Avg@5 / MRR, layer
  accuracy, onset hit rate and median error, detection latency, healthy FPR, confident-wrong
  rate, ECE / Brier / NLL and sharpness of the top-1 confidence, plus counterfactual validity
  (balanced over the fixes and the still-fails halves) and repair rate. Proportions carry
  exact Clopper-Pearson intervals, everything else a bootstrap over families
  (:mod:`benchmarks.stats`).

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

from benchmarks.stats import family_bootstrap, mcnemar_exact, proportion_interval
from causal_models.calibration import (
    binary_expected_calibration_error,
    confidence_bins,
)
from causal_models.calibration import (
    negative_log_likelihood as _class_nll,
)
from neuraldbg.records import HEALTHY, Hypothesis

__all__ = [
    "THRESHOLD",
    "predicted_label",
    "cause_rank",
    "score_run",
    "ac_at_k",
    "avg_at_k",
    "mean_reciprocal_rank",
    "top1_expected_calibration_error",
    "top1_brier_score",
    "top1_negative_log_likelihood",
    "reliability_table",
    "sharpness",
    "mcnemar_test",
    "summarize",
    "counterfactual_validity",
    "repair_rate",
]

#: Confidence at or above which a hypothesis declares the run failing (the contract's rule).
THRESHOLD = 0.5
#: Causes that are not a specific (falsifiable) claim: not counted as confident-wrong.
NON_SPECIFIC_CAUSES = frozenset({"unknown", "none", ""})


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
        has no onset), ``flagged`` (any hypothesis >= threshold), ``n_hypotheses``,
        ``confident_wrong`` (a failing run whose top hypothesis, at confidence >= 0.5, names
        a specific cause that is not the true one; None for a healthy run).
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
        "confident_wrong": None,
    }
    if failing:
        out["confident_wrong"] = bool(
            top is not None and float(top.confidence) >= THRESHOLD
            and top.root_cause not in NON_SPECIFIC_CAUSES
            and top.root_cause != truth.get("root_cause", "none"))
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

    Bin ``b`` holds confidences in ``(b/n, (b+1)/n]``, confidence 0 the first bin
    (:func:`causal_models.calibration.confidence_bins`, the binning of every ECE here).
    """
    c, y = _cc(conf, correct)
    idx = confidence_bins(c, n_bins)
    rows = []
    for b in range(n_bins):
        m = idx == b
        n = int(m.sum())
        rows.append({"bin": b, "lower": b / n_bins, "upper": (b + 1) / n_bins, "count": n,
                     "mean_confidence": float(c[m].mean()) if n else math.nan,
                     "accuracy": float(y[m].mean()) if n else math.nan})
    return pd.DataFrame(rows)


def top1_expected_calibration_error(conf: Sequence[float] | np.ndarray,
                                    correct: Sequence[bool] | np.ndarray, n_bins: int = 15
                                    ) -> float:
    """ECE: sum over equal-width bins of (bin share) x |accuracy - mean confidence|.

    :func:`causal_models.calibration.binary_expected_calibration_error`, bins as in
    :func:`reliability_table`.
    """
    c, y = _cc(conf, correct)
    return binary_expected_calibration_error(c, y, n_bins) if c.size else math.nan


def top1_brier_score(conf: Sequence[float] | np.ndarray,
                     correct: Sequence[bool] | np.ndarray) -> float:
    """Mean squared difference between the confidence and the 0/1 correctness."""
    c, y = _cc(conf, correct)
    return float(np.mean((c - y) ** 2)) if c.size else math.nan


def top1_negative_log_likelihood(conf: Sequence[float] | np.ndarray,
                                 correct: Sequence[bool] | np.ndarray) -> float:
    """Mean Bernoulli NLL of the correctness under the confidence: the class NLL of
    :func:`causal_models.calibration.negative_log_likelihood` (same clipping, 1e-12) on the
    two classes (wrong, right)."""
    c, y = _cc(conf, correct)
    if not c.size:
        return math.nan
    return _class_nll(np.column_stack([1.0 - c, c]), (y > 0.5).astype(int))


def sharpness(conf: Sequence[float] | np.ndarray) -> dict[str, float]:
    """How much the top-1 confidences move: distinct values (to 1e-6) and standard deviation.

    A calibrated method that gives every run the same number tells the user nothing.
    """
    c = np.asarray(conf, dtype=float)
    c = c[~np.isnan(c)]
    return {"distinct": int(np.unique(np.round(c, 6)).size),
            "std": float(np.std(c)) if c.size else math.nan}


def mcnemar_test(correct_a: Sequence[bool] | np.ndarray, correct_b: Sequence[bool] | np.ndarray
                 ) -> dict[str, float]:
    """McNemar's exact test on paired per-run correctness (:func:`stats.mcnemar_exact`)."""
    return mcnemar_exact(correct_a, correct_b)


# --------------------------------------------------------------------------- aggregates
def _mean(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else math.nan


def _median(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    return float(np.median(x)) if x.size else math.nan


def _groups(frame: pd.DataFrame) -> np.ndarray:
    """Bootstrap clusters: the zoo family of each run (each run its own when unknown)."""
    if "family" in frame.columns:
        return frame["family"].astype(str).to_numpy()
    return np.arange(len(frame)).astype(str)


def _prop(x: pd.Series | np.ndarray) -> dict[str, Any]:
    return proportion_interval(np.asarray(pd.Series(x).astype(float), dtype=float))


def summarize(records: pd.DataFrame, *, n_resamples: int = 1000, seed: int = 0,
              n_bins: int = 15) -> dict[str, dict[str, Any]]:
    """Every diagnosis metric of one method over its scored runs, with 95% intervals.

    Parameters
    ----------
    records : DataFrame
        One row per scored run for one method: the columns of :func:`score_run` plus
        ``true_failure``, ``family`` (the bootstrap's cluster) and, optionally, ``latency``
        (steps from onset to the first detection, NaN when never detected).
    n_resamples : int, default=1000
        Family-bootstrap resamples (the non-proportion metrics).
    seed : int, default=0
    n_bins : int, default=15

    Returns
    -------
    dict
        metric name -> ``{"value", "low", "high", "n", "interval", ...}``: exact intervals
        for proportions, a family bootstrap otherwise; ``sharpness_distinct`` has no interval.
    """
    r = records
    failing = r[r["true_failure"] != HEALTHY]
    healthy = r[r["true_failure"] == HEALTHY]
    out: dict[str, dict[str, Any]] = {}

    def boot(frame: pd.DataFrame, cols: dict[str, np.ndarray], stat: Callable[..., float]
             ) -> dict[str, Any]:
        return family_bootstrap(cols, stat, _groups(frame), n_resamples=n_resamples, seed=seed)

    out["failure_accuracy"] = _prop(r["failure_correct"])
    out["failure_accuracy_failing"] = _prop(failing["failure_correct"])
    ranks = failing["cause_rank"].astype(float).to_numpy()
    for k in (1, 3):
        out[f"cause_ac@{k}"] = _prop(np.where(np.isnan(ranks), np.inf, ranks) <= k)
    out["cause_avg@5"] = boot(failing, {"r": ranks}, lambda r: avg_at_k(r, 5))
    out["cause_mrr"] = boot(failing, {"r": ranks}, lambda r: mean_reciprocal_rank(r))
    out["layer_accuracy"] = _prop(failing["layer_correct"])
    if "origin_scope" in r.columns:  # faults in named layers (not run-wide, where any counts)
        out["layer_accuracy_local"] = _prop(
            failing[failing["origin_scope"] == "layer"]["layer_correct"])
    with_onset = failing[failing["onset_hit"].notna()]
    out["onset_hit"] = _prop(with_onset["onset_hit"])
    out["onset_median_error"] = boot(with_onset,
                                     {"x": with_onset["onset_error"].astype(float).to_numpy()},
                                     _median)
    if "latency" in r.columns:
        lat = with_onset["latency"].astype(float).to_numpy()
        out["detection_rate"] = _prop(~np.isnan(lat))
        out["detection_median_latency"] = boot(with_onset, {"x": lat}, _median)
    out["healthy_fpr"] = _prop(healthy["flagged"])
    if "confident_wrong" in r.columns:
        out["confident_wrong"] = _prop(failing["confident_wrong"])
    conf = r["confidence"].astype(float).to_numpy()
    cols = {"conf": conf, "correct": r["failure_correct"].astype(float).to_numpy()}
    out["ece"] = boot(r, cols, lambda conf, correct: top1_expected_calibration_error(
        conf, correct, n_bins))
    out["brier"] = boot(r, cols, top1_brier_score)
    out["nll"] = boot(r, cols, top1_negative_log_likelihood)
    out["sharpness_std"] = boot(r, {"c": conf}, lambda c: sharpness(c)["std"])
    out["sharpness_distinct"] = {"value": float(sharpness(conf)["distinct"]), "low": math.nan,
                                 "high": math.nan, "n": int(len(conf)), "interval": "none"}
    return out


def _balanced(p: np.ndarray, y: np.ndarray) -> float:
    """Mean of the accuracy on the cases that stayed failing and on those fixed (NaN-free
    halves only)."""
    pred = p >= THRESHOLD
    halves = [np.mean(pred[y == v] == v) for v in (True, False) if np.any(y == v)]
    return float(np.mean(halves)) if halves else math.nan


def counterfactual_validity(cases: pd.DataFrame, *, n_resamples: int = 1000, seed: int = 0
                            ) -> dict[str, dict[str, Any]]:
    """What-if predictions against really re-running the run with the knob changed.

    Parameters
    ----------
    cases : DataFrame
        One row per (run, knob change): ``p_failure`` (predicted P(failure) under the
        change), ``actual_failure`` (bool: the re-run failed) and ``family``.

    Returns
    -------
    dict
        ``accuracy`` (``p_failure >= 0.5`` agrees with the re-run), ``accuracy_fixed`` (on the
        changes whose re-run trained healthily), ``accuracy_still_fails`` (on those whose
        re-run failed) with exact intervals; ``balanced_accuracy`` (mean of the two halves;
        always answering "still fails" scores 0.5) and ``brier`` with a family bootstrap.
    """
    p = cases["p_failure"].astype(float).to_numpy()
    y = cases["actual_failure"].astype(bool).to_numpy()
    pred = p >= THRESHOLD
    groups = _groups(cases)
    return {
        "accuracy": proportion_interval(pred == y),
        "accuracy_fixed": proportion_interval((pred == y)[~y]),
        "accuracy_still_fails": proportion_interval((pred == y)[y]),
        "balanced_accuracy": family_bootstrap({"p": p, "y": y}, _balanced, groups,
                                              n_resamples=n_resamples, seed=seed),
        "brier": family_bootstrap({"p": p, "y": y.astype(float)},
                                  lambda p, y: float(np.mean((p - y) ** 2)) if p.size
                                  else math.nan, groups, n_resamples=n_resamples, seed=seed),
    }


def repair_rate(repairs: pd.DataFrame) -> dict[str, Any]:
    """Share of failing runs whose top suggested intervention, re-run, trained healthily
    (exact interval). ``repairs`` has one row per failing run with a bool ``repaired``
    (False when the method suggested nothing)."""
    return _prop(repairs["repaired"])
