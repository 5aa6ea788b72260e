"""Structure: the registered rules become the network's nodes, edges and Dirichlet priors.

The time-sliced network, unrolled to ``n_slices`` slices over ``n_blocks`` layer blocks,
in the causal direction (knobs cause the dynamics, the failure is what the dynamics end in)::

    knobs (lr_level, init_level, input_level, activation, normalization, clipping)
    context (depth, arch, ...), latent traits of registered causes
        |                                    knob evidence: update, lr_config <- lr_level,
        v                                    fwd_gain <- init_level, input_mag <- input_level
    fault:<cause> (one binary node per registered cause, parents from its rule)
        |
        v
    root_cause (the active mechanism: the present fault of highest priority)
        |
        v  (every slice node)
    loss@t    <- root_cause, loss@t-1                     persistence across slices
    grad[b]@t <- root_cause, grad[b]@t-1, grad[b+1]@t     gradients flow output -> input
    act[b]@t  <- root_cause, act[b]@t-1,  act[b-1]@t      activations flow input -> output
        |
        v  (the last slice's loss, gradient and activation states; the output gradient before)
    failure_type  ->  run evidence (progress, spikes, grad_ratio), the rules' verdict

The rules decide which edges exist (a cause's fault node hangs on the parents its rule
names) and give every conditional table its Dirichlet pseudo-counts: a cause's rule gives
P(fault | parents); the signatures of the failure modes a cause produces give P(slice state
| root cause), tilted toward the previous slice's state (persistence) and the neighbour
block's (propagation); the same signatures, inverted by Bayes' rule, give P(failure type |
last slice). Zoo traces then update those counts (:mod:`causal_models.network`). Since the
root cause reaches the failure only through the slices, ``do()`` on a knob changes the
predicted dynamics, and the failure follows from them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from causal_models.discretize import (
    ACT_STATES,
    GAIN_STATES,
    GRAD_RATIO_STATES,
    GRAD_STATES,
    INIT_CONFIG_STATES,
    INPUT_CONFIG_STATES,
    INPUT_STATES,
    LOSS_STATES,
    LR_CONFIG_STATES,
    PROGRESS_STATES,
    SPIKE_STATES,
    UPDATE_STATES,
    slice_node,
)
from causal_models.evidence import RULE_STRENGTH_STATES
from causal_models.registry import (
    CONTEXT_NODES,
    KNOB_NODES,
    list_failure_modes,
    list_root_causes,
)
from neuraldbg.knobs import KNOBS
from neuraldbg.records import HEALTHY
from neuraldbg.records import root_causes as vocabulary_root_causes

__all__ = [
    "Structure",
    "unmodelled_causes",
    "root_cause_states",
    "build_structure",
    "LEVEL_NODES",
    "LEVEL_WIDTH",
    "NO_CAUSE",
]

#: Root-cause state of a healthy run.
NO_CAUSE = "none"
#: Latent knob-level node -> the multiplicative knob that moves it (from :data:`KNOBS`).
LEVEL_NODES: dict[str, str] = {k.node: k.name for k in KNOBS.values() if k.kind == "multiplier"}
#: Decades of the knob per level step (from :data:`KNOBS`).
LEVEL_WIDTH: dict[str, float] = {k.node: float(k.level_width or 1.0) for k in KNOBS.values()
                                 if k.kind == "multiplier"}
# Knob evidence: node -> (parent, states, {parent state: {state: weight}}).
_KNOB_EVIDENCE: dict[str, tuple[str, tuple[str, ...], dict[str, dict[str, float]]]] = {
    "update": ("lr_level", UPDATE_STATES, {
        "very_low": {"tiny": 1.0, "small": 0.3}, "low": {"tiny": 0.6, "small": 1.0},
        "ok": {"small": 1.0, "normal": 1.0}, "high": {"normal": 0.6, "large": 1.0},
        "very_high": {"large": 1.0, "nonfinite": 0.3}}),
    "lr_config": ("lr_level", LR_CONFIG_STATES, {
        "very_low": {"low": 1.0, "unknown": 0.3}, "low": {"low": 1.0, "typical": 0.6,
                                                          "unknown": 0.3},
        "ok": {"typical": 1.0, "unknown": 0.3}, "high": {"typical": 0.6, "high": 1.0,
                                                         "unknown": 0.3},
        "very_high": {"high": 1.0, "unknown": 0.3}}),
    "fwd_gain": ("init_level", GAIN_STATES, {
        "very_small": {"shrinking": 1.0}, "small": {"shrinking": 1.0, "stable": 0.6},
        "ok": {"stable": 1.0}, "large": {"growing": 1.0, "stable": 0.6},
        "very_large": {"growing": 1.0}}),
    "init_config": ("init_level", INIT_CONFIG_STATES, {
        "very_small": {"small": 1.0, "default": 0.3, "unknown": 0.3},
        "small": {"small": 1.0, "default": 0.5, "unknown": 0.3},
        "ok": {"default": 1.0, "unknown": 0.3},
        "large": {"large": 1.0, "default": 0.5, "unknown": 0.3},
        "very_large": {"large": 1.0, "default": 0.3, "unknown": 0.3}}),
    "input_config": ("input_level", INPUT_CONFIG_STATES, {
        "ok": {"standardized": 1.0, "unknown": 0.3},
        "large": {"raw": 1.0, "standardized": 0.3, "unknown": 0.3},
        "very_large": {"raw": 1.0, "standardized": 0.2, "unknown": 0.3}}),
    "input_mag": ("input_level", INPUT_STATES, {
        "ok": {"normal": 1.0}, "large": {"large": 1.0, "normal": 0.5},
        "very_large": {"large": 1.0}}),
}
#: Run-level evidence on the failure (children of ``failure_type``; a cause's ``signs`` may
#: add its fault as a parent).
_RUN_EVIDENCE: dict[str, tuple[str, ...]] = {
    "progress": PROGRESS_STATES, "spikes": SPIKE_STATES, "grad_ratio": GRAD_RATIO_STATES}
#: Knob evidence that reads a steady learning rate (uninformative about the level a schedule
#: spike reaches: the node also hangs on ``lr_schedule``).
_STEADY_RATE_EVIDENCE: frozenset[str] = frozenset({"update", "lr_config"})
#: The rules' abstention ("no registered cause fits"), and its share of the rules' errors under
#: any true cause (they abstain about as often as they name a wrong cause).
_ABSTAIN = "unknown"
_ABSTAIN_SHARE = 0.5
_ROOT_PRIOR: dict[str, dict[str, float]] = {
    "lr_level": {"ok": 4.0}, "init_level": {"ok": 4.0}, "input_level": {"ok": 4.0},
}


def unmodelled_causes() -> list[str]:
    """Causes of the vocabulary with no registered fault fragment.

    Bugs in the training code (a forgotten ``zero_grad()``, a softmax before a logits loss,
    a detached tensor, ...) that no knob drives: they are states of ``root_cause`` without a
    fault node, so they act on the layer states like any cause, the rules' verdict senses
    them, and the data give them their tables (the rules give no signature: every failure
    type is equally likely a priori). Read from the vocabulary at call time.
    """
    known = {c.name for c in list_root_causes()}
    return [c for c in vocabulary_root_causes() if c not in known]


def root_cause_states() -> tuple[str, ...]:
    """States of ``root_cause``: no cause, the registered causes, the unmodelled ones."""
    return (NO_CAUSE, *(c.name for c in list_root_causes()), *unmodelled_causes())


@dataclass(frozen=True, slots=True)
class Structure:
    """Nodes, states, parents, roles and Dirichlet pseudo-counts of the network.

    Attributes
    ----------
    states : dict of str to tuple of str
        Node -> ordered states.
    parents : dict of str to tuple of str
        Node -> parents, sorted by name (pgmpy's column order for conditional tables).
    roles : dict of str to str
        Node -> role: ``knob``, ``latent_knob``, ``context``, ``trait``, ``knob_evidence``,
        ``fault``, ``root_cause``, ``failure_type``, ``rule_evidence``, ``run_evidence``
        or ``slice``.
    prior : dict of str to numpy.ndarray
        Node -> pseudo-counts, shape ``(n_states, prod(parent cards))``, parent configurations
        in ``itertools.product`` order of the sorted parents.
    n_slices, n_blocks : int
    """

    states: dict[str, tuple[str, ...]]
    parents: dict[str, tuple[str, ...]]
    roles: dict[str, str]
    prior: dict[str, np.ndarray]
    n_slices: int
    n_blocks: int

    @property
    def edges(self) -> list[tuple[str, str]]:
        """All edges (parent, child)."""
        return [(p, n) for n, ps in self.parents.items() for p in ps]

    def observed_nodes(self) -> list[str]:
        """Nodes whose states come from a trace (evidence at inference time)."""
        return [n for n, r in self.roles.items()
                if r in ("knob", "context", "knob_evidence", "slice", "rule_evidence",
                         "run_evidence")]


def _normalised(weights: dict[str, float], states: tuple[str, ...], floor: float) -> np.ndarray:
    raw = np.array([float(weights.get(s, floor)) for s in states])
    return raw / raw.sum()


def _table(node: str, states: tuple[str, ...], parents: tuple[str, ...],
           all_states: dict[str, tuple[str, ...]], row: Any, strength: float) -> np.ndarray:
    """Pseudo-counts from ``row(**parent_states) -> probabilities over states``."""
    configs = list(itertools.product(*(all_states[p] for p in parents))) if parents else [()]
    cols = [np.asarray(row(**dict(zip(parents, cfg, strict=False))), dtype=float)
            for cfg in configs]
    arr = np.stack(cols, axis=1)
    arr = arr / arr.sum(axis=0, keepdims=True)
    return strength * arr


#: Prior P(rule_strength | failure type): the rules name nothing on most healthy runs and back
#: most failures strongly (the fitted tables learn the real shares from the zoo).
_STRENGTH_PRIOR: dict[bool, dict[str, float]] = {
    False: {"none": 0.85, "weak": 0.08, "moderate": 0.04, "strong": 0.02, "certain": 0.01},
    True: {"none": 0.05, "weak": 0.05, "moderate": 0.1, "strong": 0.3, "certain": 0.5},
}
#: Prior probability that the rules' top failure type is the true one, per strength, as a
#: share of ``rule_trust`` (which applies to a ``certain`` verdict).
_STRENGTH_TRUST: dict[str, float] = {"weak": 0.55, "moderate": 0.65, "strong": 0.85,
                                     "certain": 1.0}


def _cause_emission(produce: dict[str, float], by_mode: dict[str, Any],
                    ft_states: tuple[str, ...], kind: str, where: tuple[str, ...],
                    states: tuple[str, ...]) -> np.ndarray:
    """P(slice state | root cause) from the rules.

    The signatures of the failure modes the
    cause produces, mixed by the cause's weights (a 0.02 floor for the others).
    """
    mix = _normalised(produce, ft_states, 0.02)
    return sum(w * np.array(by_mode[ft].weights(kind, where, states))
               for ft, w in zip(ft_states, mix, strict=False))


def _failure_row(last: dict[str, str], where_of: dict[str, tuple[str, ...]],
                 states: dict[str, tuple[str, ...]], by_mode: dict[str, Any],
                 ft_states: tuple[str, ...]) -> np.ndarray:
    """Prior P(failure type | the last slice's states).

    The failure modes' signatures inverted by Bayes' rule under a uniform prior over failure types
    (the failure type is
    what those states end in, so it is their child).
    """
    score = np.ones(len(ft_states))
    for node, state in last.items():
        kind = node.split("@")[0].split("[")[0]
        sts = states[node]
        score *= [by_mode[ft].weights(kind, where_of[node], sts)[sts.index(state)]
                  for ft in ft_states]
    return score / score.sum()


def _rule_nodes(states: dict[str, tuple[str, ...]], parents: dict[str, tuple[str, ...]],
                roles: dict[str, str], rows: dict[str, Any], ft_states: tuple[str, ...],
                rc_states: tuple[str, ...], rule_trust: float) -> None:
    """The rules' verdict as three nodes.

    How strongly they back their top hypothesis
    (``rule_strength`` <- failure_type), the failure type it names (``rule_failure`` <-
    failure_type, rule_strength) and its cause (``rule_cause`` <- root_cause, rule_failure).

    A verdict under the contract's 0.5 line still names a failure type and a cause; only a
    run where the rules name no hypothesis at all reads ``healthy`` / ``none``, so the one
    observation is not counted twice (once per node).
    """
    strengths = RULE_STRENGTH_STATES
    states["rule_strength"], parents["rule_strength"] = strengths, ("failure_type",)
    rows["rule_strength"] = (lambda **kw: _normalised(
        _STRENGTH_PRIOR[kw["failure_type"] != HEALTHY], strengths, 0.01))
    states["rule_failure"] = ft_states
    parents["rule_failure"] = ("failure_type", "rule_strength")
    named_ft = [x for x in ft_states if x != HEALTHY]

    def rule_failure_row(failure_type: str, rule_strength: str) -> np.ndarray:
        if rule_strength == strengths[0]:
            return np.array([1.0 if x == HEALTHY else 1e-3 for x in ft_states])
        if failure_type == HEALTHY:  # a hypothesis on a healthy run names any failure
            return np.array([1e-3 if x == HEALTHY else 1.0 for x in ft_states])
        trust = rule_trust * _STRENGTH_TRUST[rule_strength]
        return np.array([1e-3 if x == HEALTHY else trust if x == failure_type
                         else (1 - trust) / (len(named_ft) - 1) for x in ft_states])

    rows["rule_failure"] = rule_failure_row
    states["rule_cause"], parents["rule_cause"] = rc_states, ("root_cause", "rule_failure")
    named = [x for x in rc_states if x != NO_CAUSE]

    def rule_cause_row(root_cause: str, rule_failure: str) -> np.ndarray:
        if rule_failure == HEALTHY:
            return np.array([1.0 if x == NO_CAUSE else 1e-3 for x in rc_states])
        if root_cause in named and root_cause != _ABSTAIN and _ABSTAIN in named:
            # "unknown" from the rules is an abstention, as likely under any true cause:
            # not the evidence against it that naming another cause is
            abstain = (1 - rule_trust) * _ABSTAIN_SHARE
            other = (1 - rule_trust - abstain) / (len(named) - 2)
            return np.array([0.0 if x == NO_CAUSE else rule_trust if x == root_cause
                             else abstain if x == _ABSTAIN else other
                             for x in rc_states]) + 1e-3
        return np.array([0.0 if x == NO_CAUSE else rule_trust if x == root_cause
                         else (1 - rule_trust) / (len(named) - 1) for x in rc_states]) + 1e-3

    rows["rule_cause"] = rule_cause_row
    for node in ("rule_strength", "rule_failure", "rule_cause"):
        roles[node] = "rule_evidence"


def build_structure(*, n_slices: int = 4, n_blocks: int = 3, prior_strength: float = 5.0,
                    persistence: float = 4.0, coupling: float = 2.0,
                    rule_evidence: bool = True, rule_trust: float = 0.7) -> Structure:
    """Build the network's structure and priors from the registry.

    Parameters
    ----------
    n_slices, n_blocks : int
        Size of the unrolled network (see :func:`causal_models.discretize.discretize`).
    prior_strength : float, default=5.0
        Pseudo-observations per parent configuration of every table.
    persistence : float, default=4.0
        Prior odds multiplier for a slice node keeping its previous slice's state.
    coupling : float, default=2.0
        Prior odds multiplier for a slice node taking its upstream neighbour block's state.
    rule_evidence : bool, default=True
        Add ``rule_strength`` (child of ``failure_type``), ``rule_failure`` (child of
        ``failure_type`` and ``rule_strength``) and ``rule_cause`` (child of ``root_cause``
        and ``rule_failure``): the heuristic reasoner's graded verdict as a noisy sensor of
        the truth.
    rule_trust : float, default=0.7
        Prior probability that the rules name the true failure type / cause. Of the rest,
        half goes to the rules' abstention (``unknown``), as likely under any true cause.

    Returns
    -------
    Structure
    """
    causes = list_root_causes()
    modes = list_failure_modes()
    states: dict[str, tuple[str, ...]] = {}
    parents: dict[str, tuple[str, ...]] = {}
    roles: dict[str, str] = {}
    rows: dict[str, Any] = {}

    # Roots: knobs, context, traits.
    for node, sts in KNOB_NODES.items():
        states[node], parents[node] = sts, ()
        roles[node] = "latent_knob" if node in LEVEL_NODES else "knob"
        weights = _ROOT_PRIOR.get(node, {})
        rows[node] = (lambda w=weights, s=sts: _normalised(w, s, 1.0))
    for node, sts in CONTEXT_NODES.items():
        states[node], parents[node], roles[node] = sts, (), "context"
        rows[node] = (lambda s=sts: np.ones(len(s)))
    for cause in causes:
        for trait, sts in cause.traits.items():
            states[trait], parents[trait], roles[trait] = tuple(sts), (), "trait"
            rows[trait] = (lambda s=tuple(sts): _normalised({s[0]: 8.0}, s, 1.0))
    # Knob evidence.
    signed = {*_KNOB_EVIDENCE, *_RUN_EVIDENCE}
    for cause in causes:
        unknown = sorted(set(cause.signs) - signed)
        if unknown:
            raise ValueError(f"Root cause {cause.name!r} gives signs on {unknown}; valid "
                             f"evidence nodes for signs are: {sorted(signed)}.")
    for node, (parent, sts, table) in _KNOB_EVIDENCE.items():
        signs = {c.fault_node: c.signs[node] for c in causes if node in c.signs}
        states[node], roles[node] = sts, "knob_evidence"
        steady = node in _STEADY_RATE_EVIDENCE
        parents[node] = tuple(sorted((parent, *signs, *(("lr_schedule",) if steady else ()))))

        def evidence_row(_t: Any = table, _s: Any = sts, _p: Any = parent, _signs: Any = signs,
                         **kw: str) -> np.ndarray:
            # the knob level's table, joined (state-wise max) with the signs of the faults
            # present: either may produce the evidence
            weights = dict(_t[kw[_p]])
            if kw.get("lr_schedule") == "spike":
                # the configured rate and the early updates read the rate before a schedule
                # spike, not the level at its peak: any level may show any of their states
                weights = {x: max(row.get(x, 0.0) for row in _t.values())
                           for x in set().union(*_t.values())}
            for fault, sign in _signs.items():
                if kw[fault] == "yes":
                    weights = {x: max(weights.get(x, 0.0), sign.get(x, 0.0))
                               for x in set(weights) | set(sign)}
            return _normalised(weights, _s, 0.05)

        rows[node] = evidence_row
    # Fault nodes: one per cause, the cause's rule as prior.
    for cause in causes:
        node = cause.fault_node
        states[node], parents[node], roles[node] = ("no", "yes"), tuple(sorted(cause.parents)), \
            "fault"
        rows[node] = (lambda c=cause, **kw: (lambda p: np.array([1.0 - p, p]))(
            float(min(max(c.rule(**kw), 1e-3), 1 - 1e-3))))
    # Root cause: the present fault with the highest priority (split by priority).
    fault_nodes = tuple(sorted(c.fault_node for c in causes))
    by_fault = {c.fault_node: c for c in causes}
    rc_states = root_cause_states()
    states["root_cause"], parents["root_cause"], roles["root_cause"] = rc_states, fault_nodes, \
        "root_cause"

    def rc_row(**kw: str) -> np.ndarray:
        active = [by_fault[f] for f in fault_nodes if kw[f] == "yes"]
        w = {c.name: c.priority for c in active} if active else {NO_CAUSE: 1.0}
        return _normalised(w, rc_states, 0.01)

    rows["root_cause"] = rc_row
    # Failure type: a consequence of the last slice's states (see _failure_rows).
    ft_states = tuple(m.name for m in modes)
    produce = {c.name: dict(c.failure_types) for c in causes}
    produce[NO_CAUSE] = {HEALTHY: 1.0}
    for name in unmodelled_causes():  # no signature: the data decide
        produce[name] = {ft: 1.0 for ft in ft_states if ft != HEALTHY}
    by_mode = {m.name: m for m in modes}
    # The rules' verdict: a graded sensor of the failure type and of the cause.
    if rule_evidence:
        _rule_nodes(states, parents, roles, rows, ft_states, rc_states, rule_trust)

    # Run-level evidence on the failure, and on the faults that sign it.
    for node, sts in _RUN_EVIDENCE.items():
        signs = {c.fault_node: c.signs[node] for c in causes if node in c.signs}
        states[node], roles[node] = sts, "run_evidence"
        parents[node] = tuple(sorted(("failure_type", *signs)))

        def run_row(_n: Any = node, _s: Any = sts, _signs: Any = signs, **kw: str) -> np.ndarray:
            # the failure mode's signature, joined (state-wise max, on its own scale) with
            # the signs of the faults present: a fault may produce this evidence whatever
            # the failure it shows (bursts from a missing clip under a stalled loss)
            base = np.array(by_mode[kw["failure_type"]].weights(_n, (), _s))
            base = base / base.max()
            for fault, sign in _signs.items():
                if kw[fault] == "yes":
                    base = np.maximum(base, [sign.get(x, 0.0) for x in _s])
            return base / base.sum()

        rows[node] = run_row

    # Slice nodes.
    kinds = {"loss": LOSS_STATES, "grad": GRAD_STATES, "act": ACT_STATES}
    for t in range(n_slices):
        # one slice (run level only) holds the whole run, its failure included: "late"
        when = "early" if t < max(1, n_slices - 2) and t < n_slices - 1 else "late"
        for kind, sts in kinds.items():
            for b in ([None] if kind == "loss" else range(n_blocks)):
                node = slice_node(kind, t, b)
                ps = ["root_cause"]
                if t > 0:
                    ps.append(slice_node(kind, t - 1, b))
                neighbour = None
                if kind == "grad" and b is not None and b < n_blocks - 1:
                    neighbour = slice_node(kind, t, b + 1)
                if kind == "act" and b is not None and b > 0:
                    neighbour = slice_node(kind, t, b - 1)
                if neighbour:
                    ps.append(neighbour)
                where = (when,) if b is None else (
                    when, "output" if b == n_blocks - 1 else "input")
                prev = slice_node(kind, t - 1, b) if t > 0 else None
                states[node], parents[node], roles[node] = sts, tuple(sorted(ps)), "slice"

                def slice_row(_k: Any = kind, _w: Any = where, _s: Any = sts, _prev: Any = prev,
                              _nb: Any = neighbour,
                              **kw: str) -> np.ndarray:
                    base = _cause_emission(produce[kw["root_cause"]], by_mode, ft_states,
                                           _k, _w, _s)
                    tilt = np.ones(len(_s))
                    if _prev is not None:
                        tilt[_s.index(kw[_prev])] *= persistence
                    if _nb is not None:
                        tilt[_s.index(kw[_nb])] *= coupling
                    return base * tilt

                rows[node] = slice_row

    last = n_slices - 1
    # the last slice's states, and the output block's gradient one slice earlier: gradients
    # that grew before the loss turned non-finite are what tells exploding gradients from a
    # divergence (CONTRACT.md, vocabularies)
    ft_parents = [slice_node("loss", last)] + [slice_node(k, last, b) for k in ("grad", "act")
                                               for b in range(n_blocks)]
    lead = slice_node("grad", last - 1, n_blocks - 1) if n_slices > 1 else None
    if lead is not None:
        ft_parents.append(lead)
    states["failure_type"], roles["failure_type"] = ft_states, "failure_type"
    parents["failure_type"] = tuple(sorted(ft_parents))
    where_of: dict[str, tuple[str, ...]] = {n: ("late",) if n.startswith("loss") else (
        "late", "output" if n.endswith(f"[{n_blocks - 1}]@{last}") else "input")
        for n in ft_parents}
    if lead is not None:
        where_of[lead] = ("early" if last - 1 < max(1, n_slices - 2) else "late", "output")

    def ft_row(**kw: str) -> np.ndarray:
        return _failure_row(kw, where_of, states, by_mode, ft_states)

    rows["failure_type"] = ft_row

    prior = {}
    for node in states:
        strength = prior_strength
        prior[node] = _table(node, states[node], parents[node], states, rows[node], strength)
    return Structure(states=states, parents=parents, roles=roles, prior=prior,
                     n_slices=n_slices, n_blocks=n_blocks)
