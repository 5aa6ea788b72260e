"""Estimation: the network's conditional tables and the calibrator, from labelled runs.

pgmpy's ``BayesianEstimator`` estimates every table with the rules' Dirichlet pseudo-counts
(:mod:`causal_models.structure`) and per-run weights; the calibrator is fitted on
out-of-family predictions of a grouped cross-validation (:mod:`causal_models.calibration`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import pandas as pd

from causal_models.backend import import_pgmpy, new_network, variable_elimination
from causal_models.calibration import Calibrator, fit_calibrator
from causal_models.posterior import joint_posterior
from causal_models.structure import Structure
from neuraldbg.knobs import KNOBS
from neuraldbg.records import HEALTHY

__all__ = ["is_plain", "family_weights", "estimate_tables", "fit_out_of_family_calibrator"]

#: Fewer plain held-out runs than this and the calibrator is fitted on every held-out run.
MIN_PLAIN_RUNS = 10


def is_plain(ground_truth: dict[str, Any]) -> bool:
    """A run of the scenario as defined: no knob changed, default severity (when known)."""
    knobs = ground_truth.get("knobs") or {}
    changed = any(v is not None and (KNOBS[k].kind != "multiplier" or v != 1.0)
                  for k, v in knobs.items() if k in KNOBS)
    default = ground_truth.get("default_severity")
    off_default = default is not None and ground_truth.get("severity") != default
    return not changed and not off_default


def family_weights(families: Sequence[str], balance: Literal["family", "none"]) -> np.ndarray:
    """Per-run fitting weights: every family counts the same (``"family"``) or every run."""
    if balance == "none":
        return np.ones(len(families))
    counts = pd.Series(families).value_counts()
    w = np.array([1.0 / counts[f] for f in families])
    return w * len(families) / w.sum()


def estimate_tables(structure: Structure, data: pd.DataFrame, weights: np.ndarray) -> Any:
    """The network with every table estimated from ``data`` (Dirichlet priors, weighted).

    Raises
    ------
    ValueError
        If a column holds a state outside its node's states.
    """
    _, est, _, _ = import_pgmpy()
    model = new_network(structure.states, structure.edges)
    frame = data.reindex(columns=list(structure.states)).copy()
    for node, states in structure.states.items():
        bad = ~frame[node].isin(states)
        if bad.any():
            raise ValueError(f"Node {node!r} got states {sorted(set(frame[node][bad]))} "
                             f"outside its states {list(states)}.")
    frame["_weight"] = weights
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimator = est.BayesianEstimator(model, frame, state_names=dict(structure.states))
        cpds = [estimator.estimate_cpd(node, prior_type="dirichlet",
                                       pseudo_counts=structure.prior[node], weighted=True)
                for node in structure.states]
    model.add_cpds(*cpds)
    return model


def fit_out_of_family_calibrator(
    structure: Structure, data: pd.DataFrame, weights: np.ndarray, families: list[str],
    plain: np.ndarray, *, method: Literal["temperature", "isotonic", "none"],
    n_folds: int | None,
) -> Calibrator:
    """Fit the calibrator on out-of-family predictions of a grouped cross-validation.

    Every run is fitted on, but only the *plain* held-out runs (the scenario as defined, no
    knob changed, default severity) are predicted and calibrated on: those are what a
    reasoner meets in use (and what the benchmark scores), while mild severities and knob
    sweeps exist to teach the tables; calibrated on every held-out run, the confidence of
    a healthy verdict on plain runs came out 0.87 where all of them were right. Falls back
    to all held-out runs when fewer than :data:`MIN_PLAIN_RUNS` are plain. With a few dozen
    plain runs the calibrator bounds its confidences by the rule of succession
    (:func:`causal_models.calibration.fit_calibrator`).

    Parameters
    ----------
    structure : Structure
    data : pandas.DataFrame
        One row per run: every node's state.
    weights : numpy.ndarray
        Per-run fitting weights.
    families : list of str
        Each run's family: the folds group by it.
    plain : numpy.ndarray of bool
        Which runs are plain.
    method : {"temperature", "isotonic", "none"}
    n_folds : int or None
        Folds; None: one per family.
    """
    classes = structure.states["failure_type"]
    root_causes = structure.states["root_cause"]
    groups = sorted(set(families))
    if method == "none" or len(groups) < 2:
        return fit_calibrator("none", np.ones((1, len(classes))), np.zeros(1, int))
    k = len(groups) if n_folds is None else min(n_folds, len(groups))
    fam = np.array(families)
    fold_of = {g: i % k for i, g in enumerate(groups)}
    target = plain if plain.sum() >= MIN_PLAIN_RUNS else np.ones(len(data), dtype=bool)
    probs = np.zeros((len(data), len(classes)))
    for fold in range(k):
        test = np.array([fold_of[f] == fold for f in fam])
        if test.all() or not test.any():
            continue
        sub = estimate_tables(structure, data[~test].reset_index(drop=True), weights[~test])
        scored = test & target
        evidence = data[scored][structure.observed_nodes()].to_dict("records")
        if evidence:
            engine = variable_elimination(sub)
            probs[scored] = np.stack([joint_posterior(engine, ev, classes, root_causes)
                                      for ev in evidence]).sum(axis=2)
    index = {c: i for i, c in enumerate(classes)}
    y = np.array([index[v] for v in data["failure_type"]])
    keep = target & (probs.sum(axis=1) > 0)
    probs, y = probs[keep], y[keep]
    return fit_calibrator(method, probs, y, healthy=index[HEALTHY])
