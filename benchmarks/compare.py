"""Aggregate a benchmark's per-run records into the metrics of every method.

Per method label: every diagnosis metric with its interval (:func:`metrics.summarize`) and
the repair rate; per fitted split: counterfactual validity of ``what_if``, beside two
counterfactual baselines scored on the same re-runs (:data:`CF_BASELINES`); per pair
(heuristic, probabilistic split): McNemar's exact test on failure accuracy and cause AC@1.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from benchmarks import metrics as M
from benchmarks.repair import FIX_BY_CAUSE
from neuraldbg.records import HEALTHY

__all__ = ["compute_metrics", "CF_BASELINES", "table_predicts_fixed", "canonical_order"]

#: Counterfactual baselines ``what_if`` must beat on balanced accuracy (docs/evaluation.md).
CF_BASELINES: dict[str, str] = {
    "fix table": "P(failure) 0 when the change moves the knob the way the fixed table "
                 "(benchmarks.repair.FIX_BY_CAUSE) fixes the run's true cause, else 1",
    "nothing fixes it": "P(failure) 1 for every change",
}


def _direction(knob: str, value: Any) -> Any:
    """Which way a knob change goes: below/above 1 for scales, "on" for a clip, the value
    for a categorical knob."""
    if knob.endswith("_scale"):
        return "down" if float(value) < 1.0 else "up"
    if knob == "grad_clip":
        return "on" if value is not None else "off"
    return value


def table_predicts_fixed(knobs: dict[str, Any], true_cause: str) -> bool:
    """The fixed table's answer: the change fixes the run when it moves the knob of the
    cause's table fix in the same direction (``lr_scale`` 0.2 for a table fix of 0.1)."""
    fix = FIX_BY_CAUSE.get(true_cause) or {}
    return bool(fix) and set(knobs) == set(fix) and all(
        _direction(k, knobs[k]) == _direction(k, v) for k, v in fix.items())


#: Notes that are times: written under ``timings`` in metrics.json, the one key that differs
#: between two runs of the same commit (``python -m benchmarks.same_result`` ignores it).
TIMING_NOTES: tuple[str, ...] = ("wall_s", "total_wall_s", "workers", "backend", "cpu_s")

#: Packages whose versions decide the numbers (recorded in metrics.json).
_VERSIONED = ("torch", "numpy", "scipy", "pandas", "pyarrow", "scikit-learn", "pgmpy",
              "networkx", "dowhy", "matplotlib")


def provenance(zoo_fingerprint: str | None = None) -> dict[str, Any]:
    """What produced a result: commit (and whether the tree had uncommitted changes), Python,
    platform, package versions, zoo fingerprint. Seeds and suite are under ``suite``."""
    import platform
    import subprocess
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    from experiments.cpu_paths import cpu_paths

    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                                  timeout=30, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    versions = {}
    for pkg in _VERSIONED:
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    # results/ and papers/ are outputs of the benchmark: not "uncommitted code"
    dirty = [ln for ln in git("status", "--porcelain").splitlines()
             if not ln[3:].startswith(("results/", "papers/"))]
    return {"commit": git("rev-parse", "HEAD") or None, "uncommitted_changes": len(dirty),
            "python": platform.python_version(), "machine": platform.machine(),
            "system": platform.system(), "versions": versions,
            "zoo_fingerprint": zoo_fingerprint, "torch_threads_per_run": 1,
            "deterministic_algorithms": True, "cpu_paths": cpu_paths()}


def canonical_order(frame: Any, keys: tuple[str, ...]) -> Any:
    """``frame`` sorted by ``keys`` (those present), index reset: the harness gathers rows in
    the order its tasks were split over the workers, and a sum over rows in another order can
    differ in the last bit."""
    present = [k for k in keys if k in frame.columns]
    if frame.empty or not present:
        return frame
    return frame.sort_values(present, kind="stable").reset_index(drop=True)


def _label(method: str, split: str) -> str:
    return method if split == "none" else f"{method}[{split}]"


def compute_metrics(result: Any, *, seed: int = 0) -> dict[str, Any]:
    """Every metric per method label, counterfactual validity, repair rates and McNemar."""
    # one row order whatever the worker count (float sums depend on the order of the terms)
    suite, rec = result.suite, canonical_order(result.records, ("label", "run"))
    n = suite.n_resamples
    notes = {k: v for k, v in result.notes.items() if k not in TIMING_NOTES}
    out: dict[str, Any] = {"suite": suite.to_dict(), "notes": notes, "methods": {},
                           "counterfactual_validity": {}, "mcnemar": {},
                           "provenance": provenance(result.notes.get("zoo_fingerprint")),
                           "timings": {k: result.notes[k] for k in TIMING_NOTES
                                       if k in result.notes} | {"explain_median_s": {}}}
    if rec.empty:
        return out
    ok = rec[rec["error"] == ""] if "error" in rec.columns else rec
    for label, g in ok.groupby("label", sort=True):
        m = M.summarize(g, n_resamples=n, seed=seed)
        reps = result.repairs
        if not reps.empty:
            rg = reps[reps["label"] == label]
            if len(rg):
                m["repair_rate"] = M.repair_rate(rg)
        out["timings"]["explain_median_s"][label] = float(np.median(g["explain_s"]))
        out["methods"][label] = m
    cf = canonical_order(result.counterfactuals, ("split", "run", "knobs"))
    if not cf.empty:
        good = cf[cf["actual_failure"].notna() & cf["p_failure"].notna()]
        good = good.assign(actual_failure=good["actual_failure"].astype(bool))
        for split, g in good.groupby("split"):
            v = M.counterfactual_validity(g, n_resamples=n, seed=seed)
            v["base_rate_failed"] = float(g["actual_failure"].astype(float).mean())
            v["expected_agrees_with_rerun"] = float(np.mean(
                (g["expected"] != HEALTHY) == g["actual_failure"].astype(bool)))
            out["counterfactual_validity"][_label("probabilistic", split)] = v
        # the baselines answer the same (run, change) cases; one split's cases suffice
        first = good[good["split"] == good["split"].min()] if len(good) else good
        if len(first):
            cause = ok.drop_duplicates("run").set_index("run")["true_cause"]
            fixed = [table_predicts_fixed(json.loads(k), str(cause.get(r, "")))
                     for k, r in zip(first["knobs"], first["run"], strict=True)]
            out["counterfactual_validity"]["fix table"] = M.counterfactual_validity(
                first.assign(p_failure=[0.0 if f else 1.0 for f in fixed]),
                n_resamples=n, seed=seed)
            out["counterfactual_validity"]["nothing fixes it"] = M.counterfactual_validity(
                first.assign(p_failure=1.0), n_resamples=n, seed=seed)
    labels = sorted(ok["label"].unique())
    pairs = [(a, b) for a in labels for b in labels
             if a == "heuristic" and b.startswith("probabilistic[") and "/" not in b]
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
