"""Registry of failure modes and root causes: how a researcher extends the causal model.

A **failure mode** is a state of the ``failure_type`` node. Its network fragment is its
*signature*: which discrete states it produces in the time slices (gradient, activation and
loss states, optionally by position: ``input``/``output`` blocks, ``early``/``late`` slices).
The signature becomes the Dirichlet pseudo-counts of the slice nodes' tables.

A **root cause** is a state of the ``root_cause`` node. Its network fragment is a binary
*fault node* ``fault:<name>`` whose parents are knob, context or latent trait nodes (a cause
may declare new latent traits), with its *rule* (the prior probability that the fault is
present for each configuration of those parents), the failure modes it produces, the knob
that repairs it and the failure-zoo family that exemplifies it.

Both are registered by decorator, reject duplicate names, and list the known names on a
miss::

    from causal_models.registry import register_root_cause

    @register_root_cause(
        "weight_decay_too_high",
        parents=("decay_level",),
        traits={"decay_level": ("ok", "high")},
        failure_types={"training_plateau": 1.0},
        family="mlp_weight_decay",
    )
    def _decay_rule(decay_level: str) -> float:
        return 0.9 if decay_level == "high" else 0.01

The core (:mod:`causal_models.structure`) reads the registry when a network is built, so a
registered cause is part of every model fitted afterwards; no core file is edited.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from neuraldbg.records import extend_vocabulary, retract_vocabulary
from neuraldbg.registry_base import Registry, UnknownNameError

__all__ = [
    "FailureMode",
    "CauseFragment",
    "register_failure_mode",
    "register_root_cause",
    "unregister",
    "get_failure_mode",
    "get_root_cause",
    "list_failure_modes",
    "list_root_causes",
    "register_code_bug",
    "code_bug_failure_types",
    "KNOB_NODES",
    "CONTEXT_NODES",
]

#: Knob nodes of the network and their states. ``*_level`` nodes are latent: the level of the
#: knob relative to what this run tolerates, one state per ``LEVEL_WIDTH`` decades.
KNOB_NODES: dict[str, tuple[str, ...]] = {
    "lr_level": ("very_low", "low", "ok", "high", "very_high"),
    "init_level": ("very_small", "small", "ok", "large", "very_large"),
    "input_level": ("ok", "large", "very_large"),
    "activation": ("relu", "leaky_relu", "gelu", "tanh", "sigmoid", "other"),
    "normalization": ("none", "batch", "layer"),
    # how much of the run a gradient-norm clip caps: nothing, its peaks, most steps
    "clipping": ("none", "peaks", "tight"),
}
#: Observed context nodes (architecture facts that no knob changes).
CONTEXT_NODES: dict[str, tuple[str, ...]] = {
    "depth": ("shallow", "deep"),
    "lr_schedule": ("steady", "spike"),
    "arch": ("feedforward", "convolutional", "recurrent", "attention"),
    # how far a stack of sigmoid units with this depth and weight gain would shrink the
    # backward signal (causal_models.evidence.sigmoid_decay)
    "sigmoid_decay": ("mild", "strong", "severe"),
    # whether the optimizer's step grows with the gradient (SGD) or is bounded by the rate
    # (Adam and its kin: causal_models.evidence.observe_stack)
    "optimizer": ("sgd", "adaptive"),
}


@dataclass(frozen=True, slots=True)
class FailureMode:
    """A failure mode (a state of the ``failure_type`` node) and its evidence signature.

    Attributes
    ----------
    name : str
        The failure type, e.g. ``"exploding_gradients"``.
    signature : dict
        Key ``"<kind>[.<where>...]"`` with kind in {``grad``, ``act``, ``loss``,
        ``progress``, ``spikes``} and where in {``input``, ``output``, ``early``, ``late``}
        (slice nodes only) -> weights over that node's states. The
        most specific key that matches a node wins; unnamed states get weight ``floor``.
    description : str
        One line for reports.
    family : str or None
        A failure-zoo family that exemplifies it.
    floor : float
        Weight of a state the signature does not name.
    """

    name: str
    signature: Mapping[str, Mapping[str, float]]
    description: str = ""
    family: str | None = None
    floor: float = 0.05

    def weights(self, kind: str, where: tuple[str, ...], states: tuple[str, ...]) -> list[float]:
        """Normalised signature weights of a slice node of ``kind`` at position ``where``."""
        best: Mapping[str, float] | None = None
        best_score = -1
        for key, weights in self.signature.items():
            parts = key.split(".")
            if parts[0] != kind or not set(parts[1:]) <= set(where):
                continue
            if len(parts) > best_score:
                best, best_score = weights, len(parts)
        raw = [float(best.get(s, self.floor)) if best else 1.0 for s in states]
        total = sum(raw)
        return [r / total for r in raw]


@dataclass(frozen=True, slots=True)
class CauseFragment:
    """A root cause (a state of the ``root_cause`` node) and its network fragment.

    Attributes
    ----------
    name : str
        The cause, e.g. ``"learning_rate_too_high"``.
    rule : callable
        ``rule(**parent_states) -> float``: prior probability that the fault is present for
        one configuration of ``parents`` (the rule's structural prior).
    parents : tuple of str
        Parents of the fault node: knob, context or trait nodes.
    failure_types : dict of str to float
        Failure modes this cause produces, with relative weights.
    traits : dict of str to tuple of str
        Latent trait nodes this fragment adds, with their states; the first is "normal".
    knob : str or None
        The contract knob that repairs the cause (``lr_scale``, ``activation``, ...).
    family : str or None
        A failure-zoo family that exemplifies it.
    priority : float
        Weight of this cause when several faults are present at once.
    label : callable or None
        ``label(ground_truth) -> {trait: state}`` for fitting; by default a trait takes its
        second state when the run's true root cause is this cause, else its first.
    description : str
        One line for reports.
    signs : dict
        Knob-evidence node (``fwd_gain``, ``update``, ``input_mag``, ...) or run-evidence
        node (``spikes``, ``progress``, ``grad_ratio``) -> weights over its states, for
        evidence the fault produces itself: the fault node becomes a parent of that node, so
        the evidence can be explained by the fault instead of by a knob level (a residual
        stack without normalization grows the forward gain as a too-large init does) or by
        the failure type alone (a recurrence without clipping bursts whether or not the loss
        stalls).
    """

    name: str
    rule: Callable[..., float]
    parents: tuple[str, ...] = ()
    failure_types: Mapping[str, float] = field(default_factory=dict)
    traits: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    knob: str | None = None
    family: str | None = None
    priority: float = 1.0
    label: Callable[[dict[str, Any]], dict[str, str]] | None = None
    description: str = ""
    signs: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @property
    def fault_node(self) -> str:
        """Name of this cause's fault node."""
        return f"fault:{self.name}"

    def trait_labels(self, ground_truth: dict[str, Any]) -> dict[str, str]:
        """States of this fragment's trait nodes for a fitting run (reads ground truth)."""
        if self.label is not None:
            return dict(self.label(ground_truth))
        mine = ground_truth.get("root_cause") == self.name
        return {t: (states[1] if mine and len(states) > 1 else states[0])
                for t, states in self.traits.items()}


_SIGNATURE_KINDS = ("grad", "act", "loss", "progress", "spikes", "grad_ratio")
_FAILURE_MODES: Registry[FailureMode] = Registry("failure mode")
_ROOT_CAUSES: Registry[CauseFragment] = Registry("root cause")
_CODE_BUGS: Registry[dict[str, float]] = Registry("code bug")


def register_failure_mode(
    name: str, *, signature: Mapping[str, Mapping[str, float]], description: str = "",
    family: str | None = None, floor: float = 0.05,
) -> FailureMode:
    """Register a failure mode (a new state of ``failure_type``) with its evidence signature.

    Parameters
    ----------
    name : str
        New failure type name.
    signature : dict
        See :class:`FailureMode`.
    description : str, default=""
    family : str, optional
        Failure-zoo family exemplifying it.
    floor : float, default=0.05

    Returns
    -------
    FailureMode

    Raises
    ------
    DuplicateNameError
        If ``name`` is already registered (a ``ValueError``).
    ValueError
        If the signature names an unknown node kind.
    """
    _FAILURE_MODES.check_new(name)
    for key in signature:
        kind = key.split(".")[0]
        if kind not in _SIGNATURE_KINDS:
            raise ValueError(f"Signature key {key!r} of failure mode {name!r} must start with "
                             f"one of {list(_SIGNATURE_KINDS)} (e.g. 'grad.input.late').")
    mode = _FAILURE_MODES.add(name, FailureMode(name, dict(signature), description, family,
                                                floor))
    extend_vocabulary(failure_types=(name,))
    return mode


def register_root_cause(
    name: str, *, parents: tuple[str, ...] = (), failure_types: Mapping[str, float],
    traits: Mapping[str, tuple[str, ...]] | None = None, knob: str | None = None,
    family: str | None = None, priority: float = 1.0,
    label: Callable[[dict[str, Any]], dict[str, str]] | None = None, description: str = "",
    signs: Mapping[str, Mapping[str, float]] | None = None,
) -> Callable[[Callable[..., float]], Callable[..., float]]:
    """Decorator registering a root cause; the decorated function is its rule.

    Parameters
    ----------
    name : str
        New root-cause name.
    parents : tuple of str, default=()
        Parents of the fault node: names in :data:`KNOB_NODES`, :data:`CONTEXT_NODES`, or
        traits declared here or by another registered cause.
    failure_types : dict of str to float
        Failure modes produced, with weights; each must be a registered failure mode.
    traits : dict, optional
        New latent trait nodes and their states.
    knob, family, priority, label, description, signs
        See :class:`CauseFragment` (``signs`` keys are checked when a network is built).

    Returns
    -------
    callable
        The decorator; it returns the rule unchanged.

    Raises
    ------
    DuplicateNameError
        If ``name`` is taken (a ``ValueError``).
    ValueError
        If a parent is unknown or a failure type is not registered.
    """
    _ROOT_CAUSES.check_new(name)
    traits = dict(traits or {})
    known_nodes = {**KNOB_NODES, **CONTEXT_NODES, **traits}
    for rc in _ROOT_CAUSES.values():
        known_nodes.update(rc.traits)
    for p in parents:
        if p not in known_nodes:
            raise ValueError(f"Unknown parent {p!r} for root cause {name!r}. Valid parents are: "
                             f"{sorted(known_nodes)} (or declare it in traits=...).")
    for ft in failure_types:
        if ft not in _FAILURE_MODES:
            raise ValueError(f"Root cause {name!r} names unknown failure mode {ft!r}. Known "
                             f"failure modes: {sorted(_FAILURE_MODES)}. Register it first.")

    def decorator(rule: Callable[..., float]) -> Callable[..., float]:
        _ROOT_CAUSES.add(name, CauseFragment(
            name, rule, tuple(parents), dict(failure_types), traits, knob, family, priority,
            label, description, {k: dict(v) for k, v in (signs or {}).items()}))
        extend_vocabulary(root_causes=(name,))
        return rule

    return decorator


def unregister(name: str) -> None:
    """Remove a registered failure mode, root cause or code-bug declaration.

    For tests and interactive work. A code bug's name stays in the vocabulary (it is the
    contract's): only its declared failure types go, so it produces any failure alike.

    Raises
    ------
    UnknownNameError
        If ``name`` is none of these (a ``KeyError``); the message lists the kinds' names.
    """
    if name in _ROOT_CAUSES:
        _ROOT_CAUSES.unregister(name)
    elif name in _FAILURE_MODES:
        _FAILURE_MODES.unregister(name)
    elif name in _CODE_BUGS:
        _CODE_BUGS.unregister(name)
        return
    else:
        raise UnknownNameError(
            f"{name!r} is not registered as a failure mode or a root cause. Known failure "
            f"modes are: {sorted(_FAILURE_MODES)}; known root causes are: {sorted(_ROOT_CAUSES)}.")
    retract_vocabulary(name)


def get_failure_mode(name: str) -> FailureMode:
    """The registered failure mode ``name``; ``UnknownNameError`` (a KeyError) on a miss."""
    return _FAILURE_MODES.get(name)


def get_root_cause(name: str) -> CauseFragment:
    """The registered root cause ``name``; ``UnknownNameError`` (a KeyError) on a miss."""
    return _ROOT_CAUSES.get(name)


def list_failure_modes() -> list[FailureMode]:
    """Registered failure modes, the healthy state first, in registration order."""
    return _FAILURE_MODES.values()


def list_root_causes() -> list[CauseFragment]:
    """Registered root causes in registration order."""
    return _ROOT_CAUSES.values()


def register_code_bug(name: str, *, failure_types: Mapping[str, float]) -> None:
    """Declare the failure types a bug in the training code produces (its prior signature).

    A code bug (a forgotten ``zero_grad()``, a softmax before a logits loss, ...) is a state
    of ``root_cause`` without a fault node: no knob drives it (see
    :func:`causal_models.structure.unmodelled_causes`). Its mechanism still says which
    failures it ends in; that is the prior of its slice states, which the data outweigh
    where a family shows the bug. A bug not declared here gets every failure type alike.

    Parameters
    ----------
    name : str
        A root cause of the vocabulary without a registered fault fragment.
    failure_types : dict of str to float
        Registered failure modes and their relative weights.

    Raises
    ------
    DuplicateNameError
        If ``name`` is already declared (a ``ValueError``).
    ValueError
        If ``name`` has a fault fragment or a failure type is not registered.
    """
    _CODE_BUGS.check_new(name)
    if name in _ROOT_CAUSES:
        raise ValueError(f"{name!r} is a registered root cause with a fault node; a code bug "
                         "is a cause no knob drives. Unregister it first or pick another name.")
    for ft in failure_types:
        if ft not in _FAILURE_MODES:
            raise ValueError(f"Code bug {name!r} names unknown failure mode {ft!r}. Known "
                             f"failure modes: {sorted(_FAILURE_MODES)}. Register it first.")
    _CODE_BUGS.add(name, dict(failure_types))


def code_bug_failure_types(name: str) -> dict[str, float] | None:
    """The failure types declared for code bug ``name``, or None when it has none."""
    return dict(_CODE_BUGS.get(name)) if name in _CODE_BUGS else None
