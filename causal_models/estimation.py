"""Estimation: the network's conditional tables and the calibrator, from labelled runs.

pgmpy's ``BayesianEstimator`` estimates every table with the rules' Dirichlet pseudo-counts
(:mod:`causal_models.structure`) and per-run weights; the calibrator is fitted on
out-of-family predictions of a grouped cross-validation (:mod:`causal_models.calibration`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import pandas as pd

from causal_models.backend import import_pgmpy, new_network, variable_elimination
from causal_models.calibration import Calibrator, fit_calibrator
from causal_models.posterior import joint_posterior
from causal_models.sensors import stated_evidence
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

    Each table is what pgmpy's ``BayesianEstimator.estimate_cpd(node, prior_type="dirichlet",
    pseudo_counts=structure.prior[node], weighted=True)`` returns, to the last bit (the
    weighted counts are summed as pandas' grouped sum does, with Kahan compensation, in row
    order), but counted for every node in one pass over the rows instead of one pandas
    group-by per node: pgmpy's counting was 60% of a fit's time.

    Raises
    ------
    ValueError
        If a column holds a state outside its node's states.
    """
    return _network_from_codes(structure, _state_codes(structure, data), weights)


def _network_from_codes(structure: Structure, codes: dict[str, np.ndarray],
                        weights: np.ndarray) -> Any:
    """:func:`estimate_tables` on the rows' state indices (:func:`_state_codes`)."""
    _, _, _, tabular_cpd = import_pgmpy(estimators=False)
    model = new_network(structure.states, structure.edges)
    parents = {node: sorted(structure.parents[node]) for node in structure.states}
    counts = _weighted_counts(structure, codes, parents, np.asarray(weights, dtype=float))
    cpds = []
    for node, states in structure.states.items():
        ps = parents[node]
        cpd = tabular_cpd(node, len(states), counts[node] + np.array(structure.prior[node]),
                          evidence=ps, evidence_card=[len(structure.states[p]) for p in ps],
                          state_names={v: structure.states[v] for v in (node, *ps)})
        cpd.normalize()
        cpds.append(cpd)
    model.add_cpds(*cpds)
    return model


def _state_codes(structure: Structure, data: pd.DataFrame) -> dict[str, np.ndarray]:
    """Each node's column as indices into its states.

    Raises
    ------
    ValueError
        If a column holds a state outside its node's states (or is missing).
    """
    frame = data.reindex(columns=list(structure.states))
    codes = {}
    for node, states in structure.states.items():
        column = frame[node]
        code = pd.Index(states).get_indexer(column).astype(np.int64)
        if (code < 0).any():
            raise ValueError(f"Node {node!r} got states {sorted(set(column[code < 0]), key=str)} "
                             f"outside its states {list(states)}.")
        codes[node] = code
    return codes


def _weighted_counts(structure: Structure, codes: dict[str, np.ndarray],
                     parents: dict[str, list[str]], weights: np.ndarray
                     ) -> dict[str, np.ndarray]:
    """Per node, the summed weights of the rows in each (state, parent configuration) cell.

    Shape ``(n_states, prod(parent cards))``, parent configurations in ``itertools.product``
    order of ``parents[node]``. Every node's cells lie side by side in one flat array; each
    row adds its weight to one cell per node with Kahan's compensated summation, row after
    row, as pandas' grouped sum does (so the sums are pgmpy's to the last bit).
    """
    nodes = list(structure.states)
    shapes, offsets, start = {}, {}, 0
    cells = np.zeros((len(weights), len(nodes)), dtype=np.int64)  # (n_rows, n_nodes)
    for j, node in enumerate(nodes):
        cards = [len(structure.states[node]), *(len(structure.states[p]) for p in parents[node])]
        shapes[node], offsets[node] = (cards[0], int(np.prod(cards[1:], dtype=int))), start
        cell = np.ravel_multi_index([codes[node], *(codes[p] for p in parents[node])], cards)
        cells[:, j] = start + cell
        start += int(np.prod(cards, dtype=int))
    total, compensation = np.zeros(start), np.zeros(start)
    for row, weight in zip(cells, weights, strict=True):
        y = weight - compensation[row]
        t = total[row] + y
        compensation[row] = (t - total[row]) - y
        total[row] = t
    return {node: total[offsets[node]:offsets[node] + shapes[node][0] * shapes[node][1]]
            .reshape(shapes[node]) for node in nodes}


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
    codes = _state_codes(structure, data)
    for fold in range(k):
        test = np.array([fold_of[f] == fold for f in fam])
        if test.all() or not test.any():
            continue
        sub = _network_from_codes(structure, {n: c[~test] for n, c in codes.items()},
                                  weights[~test])
        scored = test & target
        evidence = [stated_evidence(row, structure.observed_nodes())
                    for row in data[scored][structure.observed_nodes()].to_dict("records")]
        if evidence:
            engine = variable_elimination(sub)
            probs[scored] = np.stack([joint_posterior(engine, ev, classes, root_causes)
                                      for ev in evidence]).sum(axis=2)
    index = {c: i for i, c in enumerate(classes)}
    y = np.array([index[v] for v in data["failure_type"]])
    keep = target & (probs.sum(axis=1) > 0)
    probs, y = probs[keep], y[keep]
    return fit_calibrator(method, probs, y, healthy=index[HEALTHY])
