"""Aggregate a benchmark's per-run records into the metrics of every method.

Per method label: every diagnosis metric with bootstrap intervals (:func:`metrics.summarize`)
and the repair rate; per fitted split: counterfactual validity; per pair (heuristic,
probabilistic split): McNemar's exact test on failure accuracy and cause AC@1, run by run.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from benchmarks import metrics as M
from neuraldbg.records import HEALTHY

__all__ = ["compute_metrics"]


def _label(method: str, split: str) -> str:
    return method if split == "none" else f"{method}[{split}]"


def compute_metrics(result: Any, *, seed: int = 0) -> dict[str, Any]:
    """Every metric per method label, counterfactual validity, repair rates and McNemar."""
    suite, rec = result.suite, result.records
    n = suite.n_resamples
    out: dict[str, Any] = {"suite": suite.to_dict(), "notes": result.notes, "methods": {},
                           "counterfactual_validity": {}, "mcnemar": {}}
    if rec.empty:
        return out
    ok = rec[rec["error"] == ""] if "error" in rec.columns else rec
    for label, g in ok.groupby("label", sort=True):
        m = M.summarize(g, n_resamples=n, seed=seed)
        reps = result.repairs
        if not reps.empty:
            rg = reps[reps["label"] == label]
            if len(rg):
                m["repair_rate"] = M.repair_rate(rg, n_resamples=n, seed=seed)
        m["explain_median_s"] = {"value": float(np.median(g["explain_s"])), "low": math.nan,
                                 "high": math.nan, "n": int(len(g))}
        out["methods"][label] = m
    cf = result.counterfactuals
    if not cf.empty:
        good = cf[cf["actual_failure"].notna() & cf["p_failure"].notna()]
        for split, g in good.groupby("split"):
            v = M.counterfactual_validity(g.assign(actual_failure=g["actual_failure"].astype(bool)),
                                          n_resamples=n, seed=seed)
            v["base_rate_failed"] = float(g["actual_failure"].astype(float).mean())
            v["expected_agrees_with_rerun"] = float(np.mean(
                (g["expected"] != HEALTHY) == g["actual_failure"].astype(bool)))
            out["counterfactual_validity"][_label("probabilistic", split)] = v
    labels = sorted(ok["label"].unique())
    pairs = [(a, b) for a in labels for b in labels
             if a == "heuristic" and b.startswith("probabilistic[")]
    for a, b in pairs:
        for metric, col in (("failure_accuracy", "failure_correct"), ("cause_ac@1", "cause_hit")):
            ga = ok[ok["label"] == a].set_index("run")
            gb = ok[ok["label"] == b].set_index("run")
            common = ga.index.intersection(gb.index)
            if col == "cause_hit":
                common = common[(ga.loc[common, "true_failure"] != HEALTHY).to_numpy()]
                xa = ga.loc[common, "cause_rank"].astype(float).to_numpy() == 1
                xb = gb.loc[common, "cause_rank"].astype(float).to_numpy() == 1
            else:
                xa = ga.loc[common, col].astype(bool).to_numpy()
                xb = gb.loc[common, col].astype(bool).to_numpy()
            out["mcnemar"][f"{a} vs {b}: {metric}"] = {**M.mcnemar_test(xa, xb),
                                                       "n": int(len(common))}
    return out
