"""Node mechanisms as inverse CDFs: noise abduction and prediction through the slices.

Every non-fault node of the network is read as the canonical mechanism
``X = F^-1(U | parents)`` of its conditional table (the inverse CDF in the node's state
order), with ``U ~ Uniform(0, 1)`` its exogenous noise. Abduction keeps the interval of ``U``
that gives the state the run showed under the parents it had (:meth:`Table.noise_interval`);
prediction reads the node under new parents with the same noise (:meth:`Table.under`,
:func:`failure_under`). A discrete table does not identify its noise; this choice keeps a
node's state whenever its parents keep theirs, which is what makes a no-op exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from causal_models.backend import network_cache
from causal_models.discretize import slice_node
from causal_models.fitted import FittedModel
from causal_models.structure import NO_CAUSE, Structure

__all__ = ["Table", "table_of", "slice_order", "root_cause_under", "failure_under",
           "SAMPLES", "SEED"]


class Table:
    """A conditional table as a plain array, for the counterfactual's many column reads."""

    def __init__(self, cpd: Any) -> None:
        self.node = cpd.variables[0]
        self.parents = list(cpd.variables[1:])
        self.states = list(cpd.state_names[self.node])
        self.values = np.asarray(cpd.get_values(), dtype=float)
        self.index = {p: {s: i for i, s in enumerate(cpd.state_names[p])}
                      for p in self.parents}
        self.cards = [len(cpd.state_names[p]) for p in self.parents]

    def column(self, assignment: dict[str, str]) -> np.ndarray:
        """P(node | parents = assignment)."""
        col = 0
        for p, card in zip(self.parents, self.cards, strict=False):
            col = col * card + self.index[p][assignment[p]]
        return self.values[:, col]

    def noise_interval(self, state: str, assignment: dict[str, str]) -> tuple[float, float]:
        """Abduction of the node's exogenous noise ``U ~ Uniform(0, 1)``.

        Under the canonical mechanism ``X = F^-1(U | parents)`` (the table's inverse CDF in its
        state order): the
        interval of ``U`` that gives ``state`` under the factual ``assignment``.
        """
        probs = self.column(assignment)
        i = self.states.index(state)
        lo = float(probs[:i].sum())
        return lo, lo + float(probs[i])

    def under(self, interval: tuple[float, float], assignment: dict[str, str]) -> np.ndarray:
        """Distribution of the node under the counterfactual ``assignment`` of its parents.

        Its noise is uniform on the abducted ``interval``: the share of the interval each
        state's inverse-CDF range covers.
        """
        probs = self.column(assignment)
        hi_edges = np.cumsum(probs)
        lo_edges = hi_edges - probs
        lo, hi = interval
        if hi - lo <= 1e-15:
            share = np.where((lo_edges <= lo) & (lo < hi_edges), 1.0, 0.0)
        else:
            overlap = np.clip(np.minimum(hi, hi_edges) - np.maximum(lo, lo_edges), 0.0, None)
            share = overlap / overlap.sum()
        return share


def table_of(network: Any, node: str) -> Table:
    """The node's conditional table as a :class:`Table` (built once per network)."""
    tables = network_cache(network).setdefault("tables", {})
    if node not in tables:
        tables[node] = Table(network.get_cpds(node))
    return tables[node]


def slice_order(structure: Structure) -> list[list[str]]:
    """The slice nodes, slice by slice.

    Each slice in an order where every node follows its parents in the slice: the loss, the
    gradients from the output block down, the
    activations upward.
    """
    order = []
    for t in range(structure.n_slices):
        order.append([slice_node("loss", t)]
                     + [slice_node("grad", t, b) for b in reversed(range(structure.n_blocks))]
                     + [slice_node("act", t, b) for b in range(structure.n_blocks)])
    return order


#: Noise samples per node in the counterfactual prediction through the slices (stratified,
#: from a fixed seed: the answer is deterministic; its Monte Carlo error is about 0.02).
SAMPLES = 512
SEED = 20261203


def _stratified(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` points of Uniform(0, 1), one in each of ``n`` equal strata, in random order."""
    return (rng.permutation(n) + rng.random(n)) / n


def _inverse_cdf(table: Table, cols: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """State indices ``F^-1(U | parents)`` for each sample's parent column and noise."""
    cum = np.cumsum(table.values[:, cols].T, axis=1)
    return np.minimum((noise[:, None] >= cum).sum(axis=1), len(table.states) - 1)


def _columns(table: Table, known: dict[str, np.ndarray], n: int) -> np.ndarray:
    """Each sample's parent-configuration column of ``table`` (``known``: state indices)."""
    cols = np.zeros(n, dtype=np.int64)
    for p, card in zip(table.parents, table.cards, strict=False):
        cols = cols * card + known[p]
    return cols


def root_cause_under(reasoner: FittedModel, cause: str, q_new: dict[str, float],
                      q_old: dict[str, float]) -> dict[str, float]:
    """The root cause after the action, in the stratum where it was ``cause``.

    The run's own fault persists with the share of its mass the action keeps
    (``min(p, p') / p`` under the threshold mechanism), another fault appears with the mass
    the action adds to it; the root cause stays ``cause`` unless its fault goes or another
    appears, and is otherwise read from the root-cause table under the acted faults. An
    action that moves nothing keeps the root cause exactly.
    """
    network = reasoner.network_
    rc_cpd = network.get_cpds("root_cause")
    own = f"fault:{cause}" if f"fault:{cause}" in q_new else None
    keep = 1.0 if own is None else min(1.0, q_new[own] / max(q_old[own], 1e-12))
    stay = keep
    for fault in q_new:
        if fault != own:
            appear = max(0.0, q_new[fault] - q_old[fault]) / max(1.0 - q_old[fault], 1e-12)
            stay *= 1.0 - min(1.0, appear)
    if stay >= 1.0 - 1e-12:
        return {cause: 1.0}
    weights = np.ones(1)
    for parent in rc_cpd.variables[1:]:
        q = q_new[parent] if parent != own else keep
        bern = np.array([1 - q, q]) if rc_cpd.state_names[parent][0] == "no" else np.array(
            [q, 1 - q])
        weights = np.kron(weights, bern)
    p_rc = rc_cpd.get_values() @ weights
    names = list(rc_cpd.state_names["root_cause"])
    p_rc[names.index(cause)] = 0.0
    # a cause without a fault node (a bug in the training code) is exogenous: no knob
    # drives it, so an action can remove the run's cause but never put such a bug in
    for i, name in enumerate(names):
        if f"fault:{name}" not in q_new and name != NO_CAUSE:
            p_rc[i] = 0.0
    if p_rc.sum() <= 0:
        return {cause: 1.0}
    p_rc = (1.0 - stay) * p_rc / p_rc.sum()
    out = {n: float(v) for n, v in zip(names, p_rc, strict=False) if v > 1e-9}
    out[cause] = out.get(cause, 0.0) + stay
    return out


def failure_under(reasoner: FittedModel, evidence: dict[str, str],
                   cause: str, p_ft: np.ndarray, new_causes: dict[str, float]) -> np.ndarray:
    """P(failure type) after the action in one root-cause stratum.

    Every slice node keeps its exogenous noise ``U``, abducted under the canonical mechanism
    ``X = F^-1(U | parents)`` (the table's inverse CDF in its state order): uniform on the
    interval that gives the observed state under the factual parents (root cause ``cause``).
    Under each new root cause the slices are recomputed in order (slice ``t`` from slice
    ``t - 1``, gradients from the output block down, activations upward), and the failure
    type from the last slice, its noise abducted from its posterior ``p_ft`` in the stratum
    (``classes_`` order). Stratified samples of the noise stand for the uniform intervals.
    A root cause the action keeps leaves every node, and so ``p_ft``, exactly as it was.
    """
    network = reasoner.network_
    nodes = [n for nodes in slice_order(reasoner.structure_) for n in nodes]
    rng = np.random.default_rng(SEED)
    n = SAMPLES
    noise: dict[str, np.ndarray] = {}
    for node in nodes:  # 1. abduction of every slice node's noise
        table = table_of(network, node)
        lo, hi = table.noise_interval(evidence[node], {
            p: (cause if p == "root_cause" else evidence[p]) for p in table.parents})
        noise[node] = lo + _stratified(rng, n) * (hi - lo)
    ft = table_of(network, "failure_type")
    classes = list(reasoner.classes_)
    order = [classes.index(s) for s in ft.states]
    probs = np.asarray(p_ft, dtype=float)[order]
    drawn = np.minimum(np.searchsorted(np.cumsum(probs / probs.sum()), _stratified(rng, n),
                                       side="right"), len(probs) - 1)
    factual = {p: evidence[p] for p in ft.parents}
    bounds = np.array([ft.noise_interval(state, factual) for state in ft.states])
    noise_ft = bounds[drawn, 0] + rng.random(n) * (bounds[drawn, 1] - bounds[drawn, 0])
    observed = {p: np.full(n, idx[evidence[p]], dtype=np.int64)
                for table in map(lambda x: table_of(network, x), [*nodes, "failure_type"])
                for p, idx in table.index.items() if p in evidence}
    out = np.zeros(len(classes))
    for new_cause, weight in new_causes.items():
        if new_cause == cause:
            out += weight * p_ft
            continue
        known = dict(observed)
        for node in nodes:  # 2.-3. action on the root cause, prediction through the slices
            table = table_of(network, node)
            known["root_cause"] = np.full(n, table.index["root_cause"][new_cause],
                                          dtype=np.int64)
            known[node] = _inverse_cdf(table, _columns(table, known, n), noise[node])
        outcome = _inverse_cdf(ft, _columns(ft, known, n), noise_ft)
        shares = np.bincount(outcome, minlength=len(ft.states)) / n
        out += weight * np.array([shares[ft.states.index(c)] for c in classes])
    return out
