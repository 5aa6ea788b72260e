"""Node mechanisms: noise abduction and prediction through the slices.

Every slice node, the failure the slices do not show (``UNSEEN``) and the failure type is
read as the Gumbel-max mechanism
``X = argmax_j (log P(j | parents) + G_j)`` of its conditional table, with ``G_j``
independent standard Gumbels its exogenous noise (Oberst and Sontag 2019). Abduction draws
the ``G`` that give the state the run showed under the parents it had
(:func:`posterior_gumbels`); prediction reads the node under new parents with the same noise
(:func:`failure_under`). A discrete table does not identify its noise. The inverse CDF in a
declared state order was this module's first choice and makes the answer depend on that
order: a run that diverged abducts noise at the top of the CDF, and under a healthy root
cause that noise still lands on whichever failure sits last (``training_plateau``), 0.29 of
P(failure) in a world with every layer healthy. The Gumbel-max mechanism has no order and
is counterfactually stable: a state the new parents make relatively more likely than the
observed one is not chosen over it by chance. Both keep a node's state whenever its parents
keep theirs, which is what makes a no-op exact.

References
----------
Oberst, M. and Sontag, D. (2019). Counterfactual off-policy evaluation with Gumbel-max
structural causal models. ICML.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from causal_models.backend import network_cache
from causal_models.discretize import slice_node
from causal_models.fitted import FittedModel
from causal_models.structure import NO_CAUSE, UNSEEN, Structure

__all__ = ["Table", "table_of", "slice_order", "root_cause_under", "failure_under",
           "posterior_gumbels", "gumbel_max",
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


#: Noise samples per node in the counterfactual prediction through the slices (from a fixed
#: seed: the answer is deterministic; its Monte Carlo error on a P(failure) is about 0.005).
SAMPLES = 4096
SEED = 20261203
#: Log-probability standing for a zero table entry (a state its parents rule out).
_LOG_ZERO = -700.0


def _stratified(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` points of Uniform(0, 1), one in each of ``n`` equal strata, in random order."""
    return (rng.permutation(n) + rng.random(n)) / n


def _log(probs: np.ndarray) -> np.ndarray:
    """Natural log of table entries, a zero entry read as ``_LOG_ZERO``."""
    return np.log(np.clip(probs, math.exp(_LOG_ZERO), None))


def posterior_gumbels(rng: np.random.Generator, logits: np.ndarray,
                       observed: np.ndarray) -> np.ndarray:
    """Gumbel noise of a Gumbel-max mechanism given the state it produced.

    The mechanism is ``X = argmax_j (logits_j + G_j)`` with ``G_j`` independent standard
    Gumbels. Given that it produced ``observed``, the maximum ``M`` is a Gumbel located at
    ``logsumexp(logits)``, independent of which state won, and every other state's
    ``logits_j + G_j`` is a Gumbel located at ``logits_j`` truncated below ``M`` (Oberst and
    Sontag 2019, "top-down" sampling).

    Parameters
    ----------
    rng : numpy.random.Generator
    logits : numpy.ndarray of shape (n, n_states)
        Log-probabilities of the states under each sample's factual parents.
    observed : numpy.ndarray of shape (n,)
        The state each sample showed (index).

    Returns
    -------
    numpy.ndarray of shape (n, n_states)
        The abducted ``G``.
    """
    n, k = logits.shape
    top = np.logaddexp.reduce(logits, axis=1) - np.log(-np.log(_stratified(rng, n)))
    below = np.stack([_stratified(rng, n) for _ in range(k)], axis=1)
    tied = logits - np.log(np.exp(logits - top[:, None]) - np.log(below))
    rows = np.arange(n)
    tied[rows, observed] = top
    return tied - logits


def gumbel_max(logits: np.ndarray, gumbels: np.ndarray) -> np.ndarray:
    """State indices ``argmax_j (logits_j + G_j)`` per sample."""
    return np.argmax(logits + gumbels, axis=1)


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
    appears, and is otherwise read from the root-cause table under the acted faults. A
    cause without a fault node (a bug in the training code) never goes: where the faults
    that appeared leave no cause, it is still the run's. An action that moves nothing keeps
    the root cause exactly.
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
    if own is None and cause != NO_CAUSE:
        # the run's cause is a bug no knob removes: it still acts where the faults that
        # appeared do not take over, so their share on "none" stays with it (else raising
        # the learning rate would heal a bug's run: 0.99 -> 0.88 on the missing-zero-grad
        # stratum of dead_relu_high_lr)
        p_rc[names.index(cause)] += p_rc[names.index(NO_CAUSE)]
        p_rc[names.index(NO_CAUSE)] = 0.0
    out = {n: float(v) for n, v in zip(names, p_rc, strict=False) if v > 1e-9}
    out[cause] = out.get(cause, 0.0) + stay
    return out


def failure_under(reasoner: FittedModel, evidence: dict[str, str],
                  cause: str, p_ft: np.ndarray, new_causes: dict[str, float]) -> np.ndarray:
    """P(failure type) after the action in one root-cause stratum.

    Every slice node keeps its exogenous noise, abducted under the Gumbel-max mechanism
    ``X = argmax_j (log P(j | parents) + G_j)`` from the state it showed under the factual
    parents (root cause ``cause``). Under each new root cause the slices are recomputed in
    order (slice ``t`` from slice ``t - 1``, gradients from the output block down, activations
    upward), and the failure type from the last slice, its observed state drawn from its
    posterior ``p_ft`` in the stratum (``classes_`` order). A root cause the action keeps
    leaves every node, and so ``p_ft``, exactly as it was.
    """
    network = reasoner.network_
    nodes = [n for nodes in slice_order(reasoner.structure_) for n in nodes]
    ft = table_of(network, "failure_type")
    observed = {p: np.full(SAMPLES, idx[evidence[p]], dtype=np.int64)
                for table in map(lambda x: table_of(network, x), [*nodes, "failure_type"])
                for p, idx in table.index.items() if p in evidence}
    noise = _abduct_slices(reasoner, nodes, evidence, cause, p_ft, observed)
    unseen = table_of(network, UNSEEN)
    classes = list(reasoner.classes_)
    out = np.zeros(len(classes))
    for new_cause, weight in new_causes.items():
        if new_cause == cause:
            out += weight * p_ft
            continue
        known = dict(observed)
        for node in nodes:  # 2.-3. action on the root cause, prediction through the slices
            table = table_of(network, node)
            known["root_cause"] = np.full(SAMPLES, table.index["root_cause"][new_cause],
                                          dtype=np.int64)
            logits = _log(table.values[:, _columns(table, known, SAMPLES)].T)
            known[node] = gumbel_max(logits, noise[node])
        logits = np.tile(_log(unseen.column({"root_cause": new_cause})), (SAMPLES, 1))
        known[UNSEEN] = gumbel_max(logits, noise[UNSEEN])
        logits = _log(ft.values[:, _columns(ft, known, SAMPLES)].T)
        outcome = gumbel_max(logits, noise["failure_type"])
        shares = np.bincount(outcome, minlength=len(ft.states)) / SAMPLES
        out += weight * np.array([shares[ft.states.index(c)] for c in classes])
    return out


def _abduct_slices(reasoner: FittedModel, nodes: list[str], evidence: dict[str, str],
                   cause: str, p_ft: np.ndarray, observed: dict[str, np.ndarray]
                   ) -> dict[str, np.ndarray]:
    """1. Abduction: the Gumbel noise of the slice nodes, ``UNSEEN`` and the failure type.

    Each slice node showed its state in ``evidence`` under its factual parents (root cause
    ``cause``); the failure type's state is drawn from ``p_ft`` (stratified, in
    ``classes_`` order), and the latent ``UNSEEN`` from its posterior given that failure
    type, the cause and the last slice's factual states,
    ``P(u | cause) P(failure type | states, u)``.
    """
    network = reasoner.network_
    rng = np.random.default_rng(SEED)
    noise: dict[str, np.ndarray] = {}
    factual = {**observed,
               "root_cause": np.full(SAMPLES, table_of(network, nodes[0]).index["root_cause"][
                   cause], dtype=np.int64)}
    for node in nodes:
        table = table_of(network, node)
        cols = _columns(table, factual, SAMPLES)
        logits = _log(table.values[:, cols].T)
        noise[node] = posterior_gumbels(rng, logits, factual[node])
    ft = table_of(network, "failure_type")
    classes = list(reasoner.classes_)
    probs = np.asarray(p_ft, dtype=float)[[classes.index(s) for s in ft.states]]
    drawn = np.minimum(np.searchsorted(np.cumsum(probs / probs.sum()), _stratified(
        rng, SAMPLES), side="right"),
                       len(probs) - 1)
    unseen = table_of(network, UNSEEN)
    prior = unseen.column({"root_cause": cause})
    like = np.stack([ft.values[drawn, _columns(ft, {**factual, UNSEEN: np.full(
        SAMPLES, k, dtype=np.int64)}, SAMPLES)] for k in range(len(unseen.states))], axis=1)
    post = prior[None, :] * like
    post /= np.clip(post.sum(axis=1, keepdims=True), 1e-300, None)
    factual[UNSEEN] = np.minimum((post.cumsum(axis=1) < _stratified(rng, SAMPLES)[:, None])
                                 .sum(axis=1), len(unseen.states) - 1).astype(np.int64)
    noise[UNSEEN] = posterior_gumbels(rng, np.tile(_log(prior), (SAMPLES, 1)), factual[UNSEEN])
    logits = _log(ft.values[:, _columns(ft, factual, SAMPLES)].T)
    noise["failure_type"] = posterior_gumbels(rng, logits, drawn)
    return noise
