"""Interventions and counterfactuals on a fitted :class:`ProbabilisticReasoner`.

``intervene(do={node: state})`` answers P(failure_type | do(...)) on the network through
pgmpy's ``CausalInference`` (graph surgery on a copy, adjustment where needed).

``what_if(trace, lr_scale=0.1, ...)`` answers for *one* run in Pearl's three steps, on the
twin network, through the whole causal chain knobs -> faults -> root cause -> layer states of
every slice -> failure type:

1. **Abduction**: the exogenous noise of every node, from everything the trace shows. A
   fault node is a monotone threshold mechanism, ``F = [U < p(parents)]``; its posterior and
   that of its unobserved parents (the latent knob levels ``lr_level``, ``init_level``,
   ``input_level``, the causes' latent traits) pin down where this run's ``U`` lies. Every
   other node (the root cause, each slice's loss, gradient and activation states, the
   failure type) is the canonical mechanism ``X = F^-1(U | parents)`` of its table (the
   inverse CDF in the node's state order), so its noise is uniform on the interval that
   gives the state the run showed under the parents it had. (A discrete table does not
   identify its noise; this canonical choice is the one that keeps a node's state whenever
   its parents keep theirs, which is what makes a no-op exact.)
2. **Action**: the knobs change. A multiplier moves a level by ``log10(k) / LEVEL_WIDTH``
   level steps from where the run sits inside its level (:func:`_landing`); an activation
   or normalization setting replaces that node's state; ``grad_clip=c`` sets the clipping
   node from how many of the run's recorded gradient norms ``c`` would cap (none: a clip
   above them all changes nothing; the peaks; or most steps).
3. **Prediction**, with the same noise: a fault present in the run stays with probability
   ``min(p, p') / p`` and an absent one appears with ``max(0, p' - p) / (1 - p)``
   (:func:`_faults_under`); the run's root cause stays unless its fault goes or another
   appears (:func:`_root_cause_under`); under a new root cause the slice states are
   recomputed slice by slice and the failure type from the last slice
   (:func:`_failure_under`, stratified noise samples from a fixed seed).

The faults are dependent given the evidence (a failing run has one root cause, which
explains the other faults away), so the abduction is stratified by the posterior root cause,
and the strata are mixed by their posterior weights.

Consistency. The factual answer is the network's posterior, and the counterfactual is that
posterior with each stratum's prediction in place of its factual share; both go through the
same calibration map, so they are on one scale, and an action that moves nothing (a
multiplier of 1, a clip above every recorded gradient norm, the run's own activation)
returns ``p_failure == p_failure_factual`` exactly.
"""

from __future__ import annotations

import math
import warnings
import weakref
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from causal_models import placement
from causal_models.discretize import slice_node
from causal_models.evidence import sigmoid_decay_state
from causal_models.registry import KNOB_NODES
from causal_models.structure import LEVEL_NODES, LEVEL_WIDTH, NO_CAUSE
from neuraldbg.knobs import validate_knobs
from neuraldbg.records import HEALTHY
from neuraldbg.trace import Trace

if TYPE_CHECKING:
    from causal_models.network import ProbabilisticReasoner

__all__ = ["Counterfactual", "intervene", "what_if"]

_METHOD = "abduction-action-prediction (twin network through the slices)"
#: Root-cause strata below this posterior weight are left out of the abduction.
_MIN_STRATUM = 0.01


@dataclass(frozen=True, slots=True)
class Counterfactual:
    """The answer of ``what_if``: the run as it happened against the run under the knobs.

    Attributes
    ----------
    knobs : dict
        The intervention as asked (contract knob names).
    p_failure_factual : float
        P(the run fails) given the trace, as it happened (calibrated posterior).
    p_failure : float
        P(the run fails) under the intervention.
    failure_type : str
        Most likely outcome under the intervention (a failure type, or ``"healthy"``).
    p_failure_types : dict of str to float
        Distribution over outcomes under the intervention.
    p_failure_types_factual : dict of str to float
        Posterior over outcomes for the run as it happened.
    metadata : dict
        The three steps: ``abduction`` (posterior over latent nodes), ``action`` (node states
        set or level moves) and ``prediction`` details.
    """

    knobs: dict[str, Any]
    p_failure_factual: float
    p_failure: float
    failure_type: str
    p_failure_types: dict[str, float] = field(default_factory=dict)
    p_failure_types_factual: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Counterfactual:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


# Per-network caches, keyed by the network object's identity: pgmpy's DAG hashes and compares
# by structure, so two fitted models with the same graph (every fold of a benchmark) would
# share a WeakKeyDictionary entry and answer with each other's tables.
_CACHES: dict[int, dict[str, Any]] = {}


def _cache(network: Any) -> dict[str, Any]:
    key = id(network)
    if key not in _CACHES:
        _CACHES[key] = {}
        weakref.finalize(network, _CACHES.pop, key, None)
    return _CACHES[key]


def _causal_inference(reasoner: ProbabilisticReasoner) -> Any:
    """The fitted network's pgmpy ``CausalInference``, built once per network."""
    cache = _cache(reasoner.network_)
    if "causal" not in cache:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pgmpy.inference import CausalInference

            cache["causal"] = CausalInference(reasoner.network_)
    return cache["causal"]


def _query_do(reasoner: ProbabilisticReasoner, do: dict[str, str],
              evidence: dict[str, str] | None) -> np.ndarray:
    engine = _causal_inference(reasoner)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        factor = engine.query(["failure_type"], do=do, evidence=evidence or None,
                              show_progress=False)
    names = factor.state_names["failure_type"]
    values = np.asarray(factor.values, dtype=float)
    values = values / values.sum()
    return np.array([values[names.index(c)] for c in reasoner.classes_])


def intervene(reasoner: ProbabilisticReasoner, do: dict[str, str],
              evidence: dict[str, str] | None = None) -> pd.Series:
    """P(failure_type | do(node = state, ...), evidence) on the fitted network.

    Parameters
    ----------
    reasoner : ProbabilisticReasoner
        Fitted.
    do : dict of str to str
        Nodes to set and their states: knob nodes (``lr_level``, ``init_level``,
        ``input_level``, ``activation``, ``normalization``, ``clipping``), context, traits,
        fault nodes, ``root_cause``, or a layer state of one slice (``grad[0]@1``: graph
        surgery cuts the node from its parents, so the failure downstream moves and the
        causes upstream do not).
    evidence : dict of str to str, optional
        Observed states of other nodes.

    Returns
    -------
    pandas.Series
        Probabilities indexed by ``classes_``.

    Raises
    ------
    ValueError
        For an unknown node or state (the message lists the valid ones).
    """
    reasoner._check_fitted()
    states = reasoner.structure_.states
    allowed = [n for n, r in reasoner.structure_.roles.items()
               if r in ("knob", "latent_knob", "context", "trait", "fault", "root_cause",
                        "slice")]
    for node, value in {**do, **(evidence or {})}.items():
        if node not in states:
            raise ValueError(f"Unknown node {node!r}. Nodes that can be set: {allowed}.")
        if value not in states[node]:
            raise ValueError(f"Invalid state {value!r} for node {node!r}. Valid states are: "
                             f"{list(states[node])}.")
    for node in do:
        if node in (evidence or {}):
            raise ValueError(f"{node!r} is both set by do() and observed in evidence; "
                             "an intervened node is not evidence. Drop it from one of them.")
        if node not in allowed:
            raise ValueError(f"do() on {node!r} is not supported. Nodes that can be set: "
                             f"{allowed}.")
    return pd.Series(_query_do(reasoner, dict(do), evidence), index=reasoner.classes_,
                     name="p")


def _landing(states: tuple[str, ...], state: str, offset: float, steps: float
             ) -> dict[str, float]:
    """Where a run in level ``state`` lands when its knob moves by ``steps`` level steps.

    Abduction placed the run in ``state``, at ``offset`` level steps from the level's centre
    (:func:`causal_models.placement.offset`, within +-0.5). Its exact position is uncertain:
    uniform over the part of the level that lies within half a level of that place. The move
    shifts that interval, and each level gets the share of it that falls inside the level
    (the end levels take what falls beyond them). A move of 0 keeps the run in ``state``
    exactly, so an action that does not move the knob changes nothing; the answer is
    continuous and monotone in ``steps``; with ``offset`` 0 it is the linear split between the
    two nearest levels.
    """
    i = states.index(state)
    lo, hi = i - 0.5 + max(offset, 0.0), i + 0.5 + min(offset, 0.0)
    lo, hi = lo + steps, hi + steps
    width = hi - lo
    out: dict[str, float] = {}
    last = len(states) - 1
    for j, name in enumerate(states):
        left = -math.inf if j == 0 else j - 0.5
        right = math.inf if j == last else j + 0.5
        if width <= 1e-12:
            share = 1.0 if left <= lo < right else 0.0
        else:
            share = max(0.0, min(hi, right) - max(lo, left)) / width
        if share > 0:
            out[name] = share
    return out


def _joint(reasoner: ProbabilisticReasoner, variables: list[str],
           evidence: dict[str, str]) -> tuple[list[str], dict[str, list[str]], np.ndarray]:
    """Normalised joint posterior of ``variables`` (VE): (order, state names, values)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        factor = reasoner._engine().query(variables, evidence=evidence, joint=True,
                                          show_progress=False)
    factor = factor.copy()
    factor.normalize()
    return list(factor.variables), dict(factor.state_names), np.asarray(factor.values)


def _p_yes(cpd: Any, assignment: dict[str, str]) -> float:
    """P(fault = yes | parents = assignment) from a fault node's table."""
    parents = list(cpd.variables[1:])
    values = cpd.get_values()
    col = 0
    for p in parents:
        col = col * len(cpd.state_names[p]) + cpd.state_names[p].index(assignment[p])
    yes = cpd.state_names[cpd.variables[0]].index("yes")
    return float(values[yes, col])


def _cf_yes(factual: int, p: float, p_new: float) -> float:
    """P(fault present after the action | factual state) under ``F = [U < p]``."""
    p = min(max(p, 1e-9), 1 - 1e-9)
    if factual:
        return min(p, p_new) / p
    return max(0.0, p_new - p) / (1.0 - p)


def _clipping_under(trace: Trace, clip: float, evidence: dict[str, str],
                    reasoner: ProbabilisticReasoner) -> str:
    """State of the ``clipping`` node had the run's total gradient norm been clipped at ``c``.

    Compared with the run's recorded norms (:func:`causal_models.evidence.
    clip_share`), a clip above every norm changes nothing, one that caps the bursts only
    is ``peaks``, one that caps most steps ``tight``.

    A run already clipped at ``c0`` recorded its norms after that cap: a looser ``clip``
    cannot be judged from them, and keeps the run's observed clipping state.
    """
    from causal_models.evidence import clip_share, clipping_state

    bins = reasoner.bins
    configured = (trace.meta.get("config") or {}).get("grad_clip")
    if isinstance(configured, (int, float)) and configured > 0 and clip > configured:
        return evidence.get("clipping", "none")
    norms = trace.steps["grad_norm"].to_numpy(dtype=float) if "grad_norm" in trace.steps \
        else np.zeros(0)
    if not norms.size:
        return "peaks"
    return clipping_state(clip_share(norms, clip, bins), bins)


def _faults_under(reasoner: ProbabilisticReasoner, faults: list[str],
                  abduct_on: dict[str, str], evidence: dict[str, str], acted: dict[str, str],
                  moves: dict[str, float], latent: set[str], features: dict[str, float]
                  ) -> tuple[dict[str, float], dict[str, float]]:
    """Abduction on ``abduct_on``, then action and prediction of each fault node.

    Returns the faults' probabilities after the action and in the run.
    """
    network = reasoner.network_
    q_new: dict[str, float] = {}
    q_old: dict[str, float] = {}
    for fault in faults:
        cpd = network.get_cpds(fault)
        parents = list(cpd.variables[1:])
        hidden = [p for p in parents if p in latent]
        # 1. Abduction: joint posterior of the fault and its unobserved parents.
        order, names, values = _joint(reasoner, [fault, *hidden], abduct_on)
        observed = {p: evidence[p] for p in parents if p not in latent}
        after = {p: acted.get(p, v) for p, v in observed.items()}
        total = 0.0
        present = 0.0
        for idx in np.ndindex(values.shape):
            w = float(values[idx])
            if w < 1e-9:
                continue
            state = {v: names[v][i] for v, i in zip(order, idx, strict=False)}
            f = int(state[fault] == "yes")
            present += w * f
            p = _p_yes(cpd, {**observed, **{h: state[h] for h in hidden}})
            # 3. Prediction for this fault: move the hidden levels, keep the run's U.
            options: list[tuple[dict[str, str], float]] = [({}, 1.0)]
            for h in hidden:
                # the run's place inside its level decides where a multiplier lands it
                dist = (_landing(KNOB_NODES[h], state[h], placement.offset(
                    reasoner, h, state[h], features, evidence), moves[h]) if h in moves
                    else {state[h]: 1.0})
                options = [({**a, h: s}, wa * ws) for a, wa in options
                           for s, ws in dist.items() if ws > 0]
            for assign, wa in options:
                total += w * wa * _cf_yes(f, p, _p_yes(cpd, {**after, **assign}))
        q_new[fault], q_old[fault] = total, present

    return q_new, q_old


class _Table:
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


def _table(network: Any, node: str) -> _Table:
    tables = _cache(network).setdefault("tables", {})
    if node not in tables:
        tables[node] = _Table(network.get_cpds(node))
    return tables[node]


def slice_order(structure: Any) -> list[list[str]]:
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
_SAMPLES = 512
_SEED = 20261203


def _stratified(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` points of Uniform(0, 1), one in each of ``n`` equal strata, in random order."""
    return (rng.permutation(n) + rng.random(n)) / n


def _inverse_cdf(table: _Table, cols: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """State indices ``F^-1(U | parents)`` for each sample's parent column and noise."""
    cum = np.cumsum(table.values[:, cols].T, axis=1)
    return np.minimum((noise[:, None] >= cum).sum(axis=1), len(table.states) - 1)


def _columns(table: _Table, known: dict[str, np.ndarray], n: int) -> np.ndarray:
    """Each sample's parent-configuration column of ``table`` (``known``: state indices)."""
    cols = np.zeros(n, dtype=np.int64)
    for p, card in zip(table.parents, table.cards, strict=False):
        cols = cols * card + known[p]
    return cols


def _root_cause_under(reasoner: ProbabilisticReasoner, cause: str, q_new: dict[str, float],
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


def _failure_under(reasoner: ProbabilisticReasoner, evidence: dict[str, str],
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
    rng = np.random.default_rng(_SEED)
    n = _SAMPLES
    noise: dict[str, np.ndarray] = {}
    for node in nodes:  # 1. abduction of every slice node's noise
        table = _table(network, node)
        lo, hi = table.noise_interval(evidence[node], {
            p: (cause if p == "root_cause" else evidence[p]) for p in table.parents})
        noise[node] = lo + _stratified(rng, n) * (hi - lo)
    ft = _table(network, "failure_type")
    classes = list(reasoner.classes_)
    order = [classes.index(s) for s in ft.states]
    probs = np.asarray(p_ft, dtype=float)[order]
    drawn = np.minimum(np.searchsorted(np.cumsum(probs / probs.sum()), _stratified(rng, n),
                                       side="right"), len(probs) - 1)
    factual = {p: evidence[p] for p in ft.parents}
    bounds = np.array([ft.noise_interval(state, factual) for state in ft.states])
    noise_ft = bounds[drawn, 0] + rng.random(n) * (bounds[drawn, 1] - bounds[drawn, 0])
    observed = {p: np.full(n, idx[evidence[p]], dtype=np.int64)
                for table in map(lambda x: _table(network, x), [*nodes, "failure_type"])
                for p, idx in table.index.items() if p in evidence}
    out = np.zeros(len(classes))
    for new_cause, weight in new_causes.items():
        if new_cause == cause:
            out += weight * p_ft
            continue
        known = dict(observed)
        for node in nodes:  # 2.-3. action on the root cause, prediction through the slices
            table = _table(network, node)
            known["root_cause"] = np.full(n, table.index["root_cause"][new_cause],
                                          dtype=np.int64)
            known[node] = _inverse_cdf(table, _columns(table, known, n), noise[node])
        outcome = _inverse_cdf(ft, _columns(ft, known, n), noise_ft)
        shares = np.bincount(outcome, minlength=len(ft.states)) / n
        out += weight * np.array([shares[ft.states.index(c)] for c in classes])
    return out


def what_if(reasoner: ProbabilisticReasoner, trace: Trace, **knobs: Any) -> Counterfactual:
    """P(failure) of this run had the knobs been different (abduction, action, prediction).

    Answers from the recorded trace and the fitted network; nothing is re-trained.

    Parameters
    ----------
    reasoner : ProbabilisticReasoner
        Fitted.
    trace : Trace
        The run as it happened.
    **knobs
        Contract knobs, relative to the run: ``lr_scale``, ``init_scale``, ``input_scale``,
        ``grad_clip``, ``activation``, ``normalization``.

    Returns
    -------
    Counterfactual

    Raises
    ------
    ValueError
        For an unknown knob or value (the message lists the valid ones).
    """
    reasoner._check_fitted()
    changes = validate_knobs(**knobs)
    structure = reasoner.structure_
    roles = structure.roles
    evidence = reasoner.evidence(trace)
    features = dict(reasoner._discretize(trace).features)
    rates = trace.steps["lr"].to_numpy(dtype=float) if "lr" in trace.steps else np.zeros(0)
    rates = rates[np.isfinite(rates) & (rates > 0)]
    features["lr_peak"] = float(np.log10(rates.max() / np.median(rates))) if rates.size \
        else math.nan
    classes = list(reasoner.classes_)
    healthy = classes.index(HEALTHY)
    latent = {n for n, r in roles.items() if r in ("latent_knob", "trait")}

    # 2. Action (the node states under the intervention), set up first: abduction needs
    # to know which parents move.
    acted: dict[str, str] = {}
    if "grad_clip" in changes:
        acted["clipping"] = _clipping_under(trace, changes["grad_clip"], evidence, reasoner)
    if "activation" in changes:
        acted["activation"] = changes["activation"]
    if "normalization" in changes:
        acted["normalization"] = changes["normalization"]
    moves = {node: math.log10(changes[knob]) / LEVEL_WIDTH[node]
             for node, knob in LEVEL_NODES.items() if knob in changes}
    if "init_scale" in changes and "sigmoid_decay" in evidence:
        # scaled weights scale every hidden layer's gain
        decades = features.get("sigmoid_decay", math.nan) + features.get(
            "hidden_layers", 0.0) * math.log10(changes["init_scale"])
        if math.isfinite(decades):
            acted["sigmoid_decay"] = sigmoid_decay_state(decades, reasoner.bins)

    # A knob at its factual value moves nothing: a multiplier of 1, a clip that never
    # bites, a setting the run already had.
    moves = {n: v for n, v in moves.items() if v != 0.0}
    acted = {n: v for n, v in acted.items() if evidence.get(n) != v}
    no_op = not (moves or acted)
    raw = reasoner.raw_proba(trace)
    faults = sorted(n for n, r in roles.items() if r == "fault")
    abduction: dict[str, Any] = {}
    prediction: dict[str, Any] = {}
    if no_op:
        shift = np.zeros(len(classes))
    else:
        shift, abduction, prediction = _twin(reasoner, faults, evidence, acted, moves, latent,
                                             features)
    # The counterfactual is the factual posterior with each stratum's prediction in place of
    # its factual share; both go through the same calibration map.
    cf_raw = np.clip(raw + shift, 0.0, None)
    cf_raw = cf_raw / cf_raw.sum()
    factual = reasoner.calibrator_.transform(raw[None])[0]
    predicted = factual if no_op else reasoner.calibrator_.transform(cf_raw[None])[0]
    return Counterfactual(
        knobs=dict(knobs),
        p_failure_factual=float(1.0 - factual[healthy]),
        p_failure=float(1.0 - predicted[healthy]),
        failure_type=str(classes[int(np.argmax(predicted))]),
        p_failure_types={c: float(p) for c, p in zip(classes, predicted, strict=False)},
        p_failure_types_factual={c: float(p) for c, p in zip(classes, factual, strict=False)},
        metadata={
            "method": _METHOD,
            "abduction": abduction,
            "action": {**acted, **{f"{n} (level steps)": round(v, 3)
                                   for n, v in moves.items()}},
            "prediction": prediction,
            "no_op": no_op,
            "raw_p_failure_factual": float(1.0 - raw[healthy]),
            "raw_p_failure": float(1.0 - cf_raw[healthy]),
        })


def _twin(reasoner: ProbabilisticReasoner, faults: list[str], evidence: dict[str, str],
          acted: dict[str, str], moves: dict[str, float], latent: set[str],
          features: dict[str, float]
          ) -> tuple[np.ndarray, dict[str, Any], dict[str, Any]]:
    """Abduction, action and prediction on the twin network, stratified by root cause.

    The faults are dependent given the evidence (co-parents of the root cause: a failing run
    has one cause, which explains the others away), so abduction is stratified by the root
    cause: within each posterior root-cause state the faults are treated as independent.
    In each stratum the action moves the faults (:func:`_faults_under`), the faults move the
    root cause (:func:`_root_cause_under`), the root cause moves the slice states and those
    the failure type (:func:`_failure_under`), every node keeping its abducted noise.

    Returns
    -------
    shift : numpy.ndarray
        Counterfactual minus factual P(failure type), summed over the strata with posterior
        weight >= ``_MIN_STRATUM`` (``classes_`` order); the lighter strata are left as they
        are.
    abduction : dict
        The root-cause strata's posterior weights and, per stratum, the faults' posteriors.
    prediction : dict
        Per stratum: the faults and the root cause after the action, and P(failure).
    """
    _, names, values = _joint(reasoner, ["root_cause"], evidence)
    classes = list(reasoner.classes_)
    shift = np.zeros(len(classes))
    abduction: dict[str, Any] = {"root_cause": {}, "p_fault": {}}
    prediction: dict[str, Any] = {"p_fault": {}, "root_cause": {}, "p_failure": {}}
    for cause, weight in zip(names["root_cause"], values, strict=False):
        weight = float(weight)
        if weight < _MIN_STRATUM:
            continue
        stratum = {**evidence, "root_cause": str(cause)}
        q_new, q_old = _faults_under(reasoner, faults, stratum, evidence, acted, moves, latent,
                                     features)
        new_causes = _root_cause_under(reasoner, str(cause), q_new, q_old)
        _, ft_names, ft_values = _joint(reasoner, ["failure_type"], stratum)
        p_ft = np.array([ft_values[ft_names["failure_type"].index(c)] for c in classes])
        after = _failure_under(reasoner, evidence, str(cause), p_ft, new_causes)
        shift += weight * (after - p_ft)
        key = str(cause)
        abduction["root_cause"][key] = round(weight, 4)
        abduction["p_fault"][key] = {f: round(q_old[f], 4) for f in faults if q_old[f] >= 0.01}
        prediction["p_fault"][key] = {f: round(q_new[f], 4) for f in faults
                                      if max(q_new[f], q_old[f]) >= 0.01}
        prediction["root_cause"][key] = {r: round(w, 4) for r, w in new_causes.items()
                                         if w >= 0.001}
        prediction["p_failure"][key] = round(float(1.0 - after[classes.index(HEALTHY)]), 4)
    return shift, abduction, prediction
