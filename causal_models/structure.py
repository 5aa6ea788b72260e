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
        v  (the last slice's loss, gradient and activation states; the output gradient before;
        |   failure_unseen <- root_cause, a failure those states do not show)
    failure_type  ->  run evidence (progress, spikes, grad_ratio), the rules' verdict

The rules decide which edges exist (a cause's fault node hangs on the parents its rule
names) and give every conditional table its Dirichlet pseudo-counts: a cause's rule gives
P(fault | parents); the signatures of the failure modes a cause produces give P(slice state
| root cause), tilted toward the previous slice's state (persistence) and the neighbour
block's (propagation); the same signatures, inverted by Bayes' rule, give P(failure type |
last slice). Zoo traces then update those counts (:mod:`causal_models.network`). The root
cause reaches the failure through the slices, and directly only through :data:`UNSEEN`, the
failure the recorded states do not show: ``do()`` on a knob changes the predicted dynamics,
and the failure follows from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from causal_models.bins import (
    ACT_STATES,
    GRAD_STATES,
    LOSS_STATES,
)
from causal_models.discretize import slice_node
from causal_models.priors import NO_CAUSE, PRIOR_SHAPE, NodeTables, normalised, pseudo_counts
from causal_models.registry import (
    CONTEXT_NODES,
    KNOB_NODES,
    CauseFragment,
    FailureMode,
    code_bug_failure_types,
    list_failure_modes,
    list_root_causes,
)
from causal_models.sensors import (
    add_cause_evidence,
    add_knob_evidence,
    add_rule_nodes,
    add_run_evidence,
    check_signs,
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
    "UNSEEN",
    "failure_unseen",
]

#: Latent knob-level node -> the multiplicative knob that moves it (from :data:`KNOBS`).
LEVEL_NODES: dict[str, str] = {k.node: k.name for k in KNOBS.values() if k.kind == "multiplier"}
#: Decades of the knob per level step (from :data:`KNOBS`).
LEVEL_WIDTH: dict[str, float] = {k.node: float(k.level_width or 1.0) for k in KNOBS.values()
                                 if k.kind == "multiplier"}
#: The failure the layer states do not show: a latent binary node, child of the root cause and
#: parent of the failure type beside the last slice's states. A run can fail while every
#: block state of its last slices reads healthy (a recurrent net at a rate far too high whose
#: loss rises and falls back to chance, a stall a code bug makes); without this node the
#: failure type hangs on those healthy states alone, its noise carries the failure, and no
#: change of root cause can move it: ``what_if`` answered 0.99 for tenfold cuts that re-run
#: healthy. Through it the cause reaches the failure directly where the states say nothing.
UNSEEN = "failure_unseen"


def unmodelled_causes() -> list[str]:
    """Causes of the vocabulary with no registered fault fragment.

    Bugs in the training code (a forgotten ``zero_grad()``, a softmax before a logits loss,
    a detached tensor, ...) that no knob drives: they are states of ``root_cause`` without a
    fault node, so they act on the layer states like any cause, the rules' verdict senses
    them, and the data give them their tables; their prior signature is the failure types
    their mechanism ends in (:func:`causal_models.registry.register_code_bug`; every failure
    type alike when none is declared). Read from the vocabulary at call time.
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
        ``fault``, ``root_cause``, ``cause_evidence``, ``failure_type``, ``rule_evidence``,
        ``run_evidence``, ``slice`` or ``mediator`` (:data:`UNSEEN`).
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
                         "run_evidence", "cause_evidence")]


def _cause_emission(produce: dict[str, float], by_mode: dict[str, FailureMode],
                    ft_states: tuple[str, ...], kind: str, where: tuple[str, ...],
                    states: tuple[str, ...]) -> np.ndarray:
    """P(slice state | root cause) from the rules.

    The signatures of the failure modes the
    cause produces, mixed by the cause's weights (``PRIOR_SHAPE.emission_floor`` for the
    others).
    """
    mix = normalised(produce, ft_states, PRIOR_SHAPE.emission_floor)
    return sum(w * np.array(by_mode[ft].weights(kind, where, states))
               for ft, w in zip(ft_states, mix, strict=False))


def _signature_tables(where_of: dict[str, tuple[str, ...]], states: dict[str, tuple[str, ...]],
                      by_mode: dict[str, FailureMode], ft_states: tuple[str, ...]
                      ) -> dict[str, dict[str, np.ndarray]]:
    """Node -> its state -> the signature weight of that state under each failure type."""
    tables = {}
    for node, where in where_of.items():
        kind, sts = node.split("@")[0].split("[")[0], states[node]
        per_ft = [by_mode[ft].weights(kind, where, sts) for ft in ft_states]
        tables[node] = {x: np.array([w[i] for w in per_ft]) for i, x in enumerate(sts)}
    return tables


def _failure_row(last: dict[str, str], tables: dict[str, dict[str, np.ndarray]],
                 n_failure_types: int) -> np.ndarray:
    """Prior P(failure type | the last slice's states).

    The failure modes' signatures (:func:`_signature_tables`) inverted by Bayes' rule under a
    uniform prior over failure types (the failure type is what those states end in, so it is
    their child).
    """
    score = np.ones(n_failure_types)
    for node, state in last.items():
        score *= tables[node][state]
    return score / score.sum()


def _add_roots(nodes: NodeTables, causes: list[CauseFragment]) -> None:
    """Knobs (some latent levels), context and the causes' latent traits: the roots."""
    for node, sts in KNOB_NODES.items():
        weights = {"ok": PRIOR_SHAPE.level_ok} if node in LEVEL_NODES else {}
        nodes.add(node, sts, (), "latent_knob" if node in LEVEL_NODES else "knob",
                  lambda w=weights, s=sts: normalised(w, s, 1.0))
    for node, sts in CONTEXT_NODES.items():
        nodes.add(node, sts, (), "context", lambda s=sts: np.ones(len(s)))
    for cause in causes:
        for trait, sts in cause.traits.items():
            nodes.add(trait, tuple(sts), (), "trait",
                      lambda s=tuple(sts): normalised({s[0]: PRIOR_SHAPE.trait_normal}, s, 1.0))


def _add_faults(nodes: NodeTables, causes: list[CauseFragment]) -> None:
    """One binary fault node per cause, its rule as prior P(fault | parents)."""
    clamp = PRIOR_SHAPE.rule_clamp
    for cause in causes:
        nodes.add(cause.fault_node, ("no", "yes"), tuple(sorted(cause.parents)), "fault",
                  lambda c=cause, **kw: (lambda p: np.array([1.0 - p, p]))(
                      float(min(max(c.rule(**kw), clamp), 1 - clamp))))


def _add_root_cause(nodes: NodeTables, causes: list[CauseFragment]) -> tuple[str, ...]:
    """The root cause: the present fault with the highest priority (split by priority)."""
    fault_nodes = tuple(sorted(c.fault_node for c in causes))
    by_fault = {c.fault_node: c for c in causes}
    rc_states = root_cause_states()

    def rc_row(**kw: str) -> np.ndarray:
        active = [by_fault[f] for f in fault_nodes if kw[f] == "yes"]
        w = {c.name: c.priority for c in active} if active else {NO_CAUSE: 1.0}
        return normalised(w, rc_states, PRIOR_SHAPE.cause_floor)

    nodes.add("root_cause", rc_states, fault_nodes, "root_cause", rc_row)
    return rc_states


@dataclass(frozen=True, slots=True)
class _SliceNode:
    """One slice node's prior: what it is, where it sits and what tilts it.

    Its kind, place (``early``/``late``, ``input``/``output``), states, and the
    previous-slice and neighbour-block nodes that tilt its prior.
    """

    kind: str
    where: tuple[str, ...]
    states: tuple[str, ...]
    prev: str | None
    neighbour: str | None


def _slice_row(spec: _SliceNode, produce: dict[str, dict[str, float]],
               mode_of: dict[str, FailureMode], ft_states: tuple[str, ...],
               persistence: float, coupling: float) -> Any:
    def row(**kw: str) -> np.ndarray:
        base = _cause_emission(produce[kw["root_cause"]], mode_of, ft_states,
                               spec.kind, spec.where, spec.states)
        tilt = np.ones(len(spec.states))
        if spec.prev is not None:
            tilt[spec.states.index(kw[spec.prev])] *= persistence
        if spec.neighbour is not None:
            tilt[spec.states.index(kw[spec.neighbour])] *= coupling
        return base * tilt

    return row


def _slice_spec(kind: str, t: int, b: int | None, n_slices: int, n_blocks: int) -> _SliceNode:
    # one slice (run level only) holds the whole run, its failure included: "late"
    when = "early" if t < max(1, n_slices - 2) and t < n_slices - 1 else "late"
    neighbour = None
    if kind == "grad" and b is not None and b < n_blocks - 1:
        neighbour = slice_node(kind, t, b + 1)  # gradients flow output -> input
    if kind == "act" and b is not None and b > 0:
        neighbour = slice_node(kind, t, b - 1)  # activations flow input -> output
    where = (when,) if b is None else (when, "output" if b == n_blocks - 1 else "input")
    states = {"loss": LOSS_STATES, "grad": GRAD_STATES, "act": ACT_STATES}[kind]
    return _SliceNode(kind, where, states, slice_node(kind, t - 1, b) if t > 0 else None,
                      neighbour)


def _add_slices(nodes: NodeTables, n_slices: int, n_blocks: int,
                produce: dict[str, dict[str, float]], mode_of: dict[str, FailureMode],
                ft_states: tuple[str, ...], persistence: float, coupling: float) -> None:
    """Every slice node: a child of the root cause, its previous slice and its upstream block."""
    for t in range(n_slices):
        for kind in ("loss", "grad", "act"):
            for b in ([None] if kind == "loss" else range(n_blocks)):
                spec = _slice_spec(kind, t, b, n_slices, n_blocks)
                ps = ["root_cause", *(p for p in (spec.prev, spec.neighbour) if p)]
                nodes.add(slice_node(kind, t, b), spec.states, tuple(sorted(ps)), "slice",
                          _slice_row(spec, produce, mode_of, ft_states, persistence,
                                     coupling))


def _add_failure_type(nodes: NodeTables, n_slices: int, n_blocks: int,
                      mode_of: dict[str, FailureMode], ft_states: tuple[str, ...]) -> None:
    """The failure type, a child of the last slice's states and of the gradient lead.

    The output block's gradient one slice before the last: gradients that grew before the
    loss turned non-finite are what tells exploding gradients from a divergence
    (CONTRACT.md, vocabularies). A single slice (run level only) has no lead.
    """
    last = n_slices - 1
    ft_parents = [slice_node("loss", last)] + [slice_node(k, last, b) for k in ("grad", "act")
                                               for b in range(n_blocks)]
    lead = slice_node("grad", last - 1, n_blocks - 1) if n_slices > 1 else None
    if lead is not None:
        ft_parents.append(lead)
    where_of: dict[str, tuple[str, ...]] = {n: ("late",) if n.startswith("loss") else (
        "late", "output" if n.endswith(f"[{n_blocks - 1}]@{last}") else "input")
        for n in ft_parents}
    if lead is not None:
        where_of[lead] = ("early" if last - 1 < max(1, n_slices - 2) else "late", "output")
    # one table per parent, not one signature lookup per parent configuration (81,920 rows)
    tables = _signature_tables(where_of, nodes.states, mode_of, ft_states)
    healthy = ft_states.index(HEALTHY)

    def ft_row(**kw: str) -> np.ndarray:
        unseen = kw.pop(UNSEEN)
        row = _failure_row(kw, tables, len(ft_states))
        if unseen == "yes":  # a failure all the same: the failure types as the states rank them
            row = row.copy()
            row[healthy] = 0.0
            row = row / row.sum()
            row[healthy] = PRIOR_SHAPE.rule_miss
        return row

    nodes.add("failure_type", ft_states, tuple(sorted([*ft_parents, UNSEEN])), "failure_type",
              ft_row)


def _add_unseen(nodes: NodeTables, rc_states: tuple[str, ...]) -> None:
    """:data:`UNSEEN`, a child of the root cause: rare under any cause, never without one."""
    def row(root_cause: str) -> np.ndarray:
        p = PRIOR_SHAPE.rule_miss if root_cause == NO_CAUSE else PRIOR_SHAPE.unseen
        return np.array([1.0 - p, p])

    nodes.add(UNSEEN, ("no", "yes"), ("root_cause",), "mediator", row)


def failure_unseen(structure: Structure, states: dict[str, str], failure_type: str) -> str:
    """The :data:`UNSEEN` label of a fitting run (``fit`` only).

    ``"yes"`` when the run failed (``failure_type`` is not healthy) while the signatures rank
    its last slice's states healthy first (the prior of ``failure_type`` given those states
    and ``UNSEEN = "no"``), else ``"no"``.
    """
    if failure_type == HEALTHY:
        return "no"
    parents = structure.parents["failure_type"]
    index = [structure.states[p].index("no" if p == UNSEEN else states[p]) for p in parents]
    column = int(np.ravel_multi_index(index, [len(structure.states[p]) for p in parents]))
    prior = structure.prior["failure_type"][:, column]
    ft_states = structure.states["failure_type"]
    return "yes" if ft_states[int(np.argmax(prior))] == HEALTHY else "no"


def _produced(causes: list[CauseFragment], ft_states: tuple[str, ...]
              ) -> dict[str, dict[str, float]]:
    """Root-cause state -> the failure types it produces, with weights."""
    produce = {c.name: dict(c.failure_types) for c in causes}
    produce[NO_CAUSE] = {HEALTHY: 1.0}
    for name in unmodelled_causes():  # a code bug: its declared failures, else any failure
        produce[name] = code_bug_failure_types(name) or {
            ft: 1.0 for ft in ft_states if ft != HEALTHY}
    return produce


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

    Raises
    ------
    ValueError
        If a registered cause gives signs on a node that is not knob or run evidence.
    """
    causes = list_root_causes()
    modes = list_failure_modes()
    check_signs(causes)
    mode_of = {m.name: m for m in modes}
    ft_states = tuple(m.name for m in modes)
    nodes = NodeTables()
    _add_roots(nodes, causes)
    add_knob_evidence(nodes, causes)
    _add_faults(nodes, causes)
    rc_states = _add_root_cause(nodes, causes)
    add_cause_evidence(nodes, rc_states)
    if rule_evidence:
        add_rule_nodes(nodes, ft_states, rc_states, rule_trust)
    add_run_evidence(nodes, causes, mode_of)
    _add_slices(nodes, n_slices, n_blocks, _produced(causes, ft_states), mode_of, ft_states,
                persistence, coupling)
    _add_unseen(nodes, rc_states)
    _add_failure_type(nodes, n_slices, n_blocks, mode_of, ft_states)
    prior = {node: pseudo_counts(node, nodes.states[node], nodes.parents[node], nodes.states,
                          nodes.rows[node], prior_strength)
             for node in nodes.states}
    return Structure(states=nodes.states, parents=nodes.parents, roles=nodes.roles,
                     prior=prior, n_slices=n_slices, n_blocks=n_blocks)
