"""Frozen records that flow between the reasoning stages: events and hypotheses.

They hold data and ``to_dict``/``from_dict``, nothing more, and never a live tensor.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from neuraldbg.registry_base import Registry

__all__ = [
    "FAILURE_TYPES",
    "ROOT_CAUSES",
    "HEALTHY",
    "Event",
    "Hypothesis",
    "failure_types",
    "root_causes",
    "extend_vocabulary",
    "retract_vocabulary",
]

#: Symptoms a hypothesis can name (the contract's vocabulary).
FAILURE_TYPES: tuple[str, ...] = (
    "vanishing_gradients",
    "exploding_gradients",
    "dead_neurons",
    "saturated_activations",
    "loss_divergence",
    "training_plateau",
)
#: Label of a run without failure (ground truth and counterfactual outcomes).
HEALTHY = "healthy"
#: Causes a hypothesis can name; extensions may register more (:func:`extend_vocabulary`).
ROOT_CAUSES: tuple[str, ...] = (
    "learning_rate_too_high",
    "learning_rate_too_low",
    "init_scale_too_large",
    "init_scale_too_small",
    "saturating_activation",
    "negative_bias_init",
    "unnormalized_inputs",
    "missing_normalization",
    "missing_gradient_clipping",
    "missing_zero_grad",
    "loss_output_mismatch",
    "unscaled_targets",
    "symmetric_init",
    "data_problem",
    "gradient_blocked",
    "unknown",
)
#: Failure types extensions added (causal_models' failure modes), in registration order.
EXTRA_FAILURE_TYPES: Registry[None] = Registry("added failure type")
#: Root causes extensions added, in registration order.
EXTRA_ROOT_CAUSES: Registry[None] = Registry("added root cause")


def failure_types() -> tuple[str, ...]:
    """The failure types a hypothesis can name now: the contract's, then registered ones."""
    return FAILURE_TYPES + tuple(n for n in EXTRA_FAILURE_TYPES if n not in FAILURE_TYPES)


def root_causes() -> tuple[str, ...]:
    """The root causes a hypothesis can name now: the contract's, then registered ones."""
    return ROOT_CAUSES + tuple(n for n in EXTRA_ROOT_CAUSES if n not in ROOT_CAUSES)


def extend_vocabulary(*, failure_types: tuple[str, ...] = (),
                      root_causes: tuple[str, ...] = ()) -> None:
    """Add names to the vocabulary (an extension's failure types and root causes).

    Code that validates labels reads :func:`failure_types` / :func:`root_causes` at call
    time, so it accepts the added names from then on. Adding a name twice is harmless.

    Parameters
    ----------
    failure_types : tuple of str
        Failure types to add (``"healthy"`` is a label, not a failure type: skipped).
    root_causes : tuple of str
        Root causes to add.
    """
    for name in failure_types:
        if name != HEALTHY and name not in EXTRA_FAILURE_TYPES:
            EXTRA_FAILURE_TYPES.add(name, None)
    for name in root_causes:
        if name not in EXTRA_ROOT_CAUSES:
            EXTRA_ROOT_CAUSES.add(name, None)


def retract_vocabulary(name: str) -> None:
    """Remove a name an extension added; the contract's own names stay."""
    EXTRA_FAILURE_TYPES.discard(name)
    EXTRA_ROOT_CAUSES.discard(name)


def _keys(data: dict[str, Any], limit: int = 4) -> str:
    """``{a, b, c, +2 more}``: a dict named by its keys, for one-line reprs."""
    names = list(data)
    shown = ", ".join(str(k) for k in names[:limit])
    more = f", +{len(names) - limit} more" if len(names) > limit else ""
    return "{" + shown + more + "}"


@dataclass(frozen=True, slots=True, repr=False)
class Event:
    """A semantic event: a layer (or the loss) changed health state at a step.

    Attributes
    ----------
    kind : str
        What happened, e.g. ``"gradient_vanishing"``, ``"activation_dead"``, ``"loss_nonfinite"``.
    module_name : str
        Qualified module name, or ``"<loss>"`` for loss events.
    step : int
        Step of the transition (or of the first observation of an already unhealthy layer).
    from_state : str
        State before the transition (``"unobserved"`` for a first observation).
    to_state : str
        State after it.
    evidence : dict
        Measured values behind the event (statistic, value, threshold, baseline).
    """

    kind: str
    module_name: str
    step: int
    from_state: str
    to_state: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        """One line: kind, module, step and transition (the evidence is summarised)."""
        return (f"Event({self.kind} in {self.module_name!r} at step {self.step}: "
                f"{self.from_state} -> {self.to_state}, evidence: {_keys(self.evidence)})")

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (JSON-compatible when the evidence is)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


@dataclass(frozen=True, slots=True, repr=False)
class Hypothesis:
    """One explanation of a failure (the contract's ``Hypothesis``).

    Attributes
    ----------
    failure_type : str
        The symptom, from :data:`FAILURE_TYPES`.
    root_cause : str
        The cause, from :data:`ROOT_CAUSES` or a registered extension (``"unknown"`` allowed).
    origin_layer : str
        Qualified module name where the failure first appeared.
    origin_step : int
        Step where the failure first appeared in that layer.
    confidence : float
        In [0, 1]; a posterior probability for the probabilistic method.
    metadata : dict
        Causal metadata: propagation path, coupled events, evidence.
    """

    failure_type: str
    root_cause: str
    origin_layer: str
    origin_step: int
    confidence: float
    metadata: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        """One line: the claim and its confidence; the metadata only by its keys."""
        return (f"Hypothesis({self.failure_type}, cause={self.root_cause}, "
                f"origin={self.origin_layer!r} at step {self.origin_step}, "
                f"confidence={self.confidence:.3f}, metadata: {_keys(self.metadata)})")

    def __str__(self) -> str:
        """The claim in words.

        For example ``dead_neurons caused by negative_bias_init, from layer '1' at step 3
        (confidence 0.91)``.
        """
        cause = ("cause unknown" if self.root_cause == "unknown"
                 else f"caused by {self.root_cause}")
        return (f"{self.failure_type} {cause}, from layer {self.origin_layer!r} at step "
                f"{self.origin_step} (confidence {self.confidence:.2f})")

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (JSON-compatible when the metadata is)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Hypothesis:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)
