"""The building blocks of the rules' priors: the network under construction and its rows.

Every conditional table's prior is ``prior_strength`` pseudo-observations per parent
configuration, spread by a *row*: a function of the parents' states giving weights over the
node's states (:func:`pseudo_counts`). :class:`NodeTables` collects each node's states,
parents, role and row while :func:`causal_models.structure.build_structure` runs;
:class:`PriorShape` holds the weights and floors the registered rules leave open.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["NO_CAUSE", "PriorShape", "PRIOR_SHAPE", "NodeTables", "normalised",
           "pseudo_counts"]

#: Root-cause state of a healthy run.
NO_CAUSE = "none"


@dataclass(frozen=True, slots=True)
class PriorShape:
    """The numbers that shape the rules' priors where no rule names a value.

    Every table's prior is ``prior_strength`` pseudo-observations per parent configuration
    spread by a row of weights; these are the weights and floors of the rows that the
    registered rules and signatures leave open.

    Attributes
    ----------
    level_ok : float, default=4.0
        Weight of the ``ok`` state of a latent knob level (``lr_level``, ``init_level``,
        ``input_level``) against 1 for each other level: most runs sit at a level they
        tolerate.
    trait_normal : float, default=8.0
        Weight of a latent trait's first (normal) state against 1 for the others: a cause's
        trait is rare a priori.
    evidence_floor : float, default=0.05
        Weight of a knob-evidence state the level's row does not name: any level may show
        any evidence, rarely.
    rule_clamp : float, default=1e-3
        A cause's rule is clamped to ``[rule_clamp, 1 - rule_clamp]``: no fault is certain or
        impossible before the data speak.
    cause_floor : float, default=0.01
        Weight of a root-cause state no present fault names (priority-weighted otherwise).
    emission_floor : float, default=0.02
        Weight of a failure type a cause does not produce, in the mixture of signatures that
        gives P(slice state | root cause).
    strength_floor : float, default=0.01
        Weight of a ``rule_strength`` grade that :data:`_STRENGTH_PRIOR` does not name.
    rule_miss : float, default=1e-3
        P(the rules name a failure type or a cause that their own grade rules out): a
        silent verdict under a failure, a healthy verdict naming a cause. Also the weight
        left to "healthy" when a run fails though its layer states do not show it, and
        P(that happens) with no cause.
    unseen : float, default=0.1
        P(a cause's failure does not show in the last slice's layer states)
        (:data:`causal_models.structure.UNSEEN`); the data outweigh it.
    """

    level_ok: float = 4.0
    trait_normal: float = 8.0
    evidence_floor: float = 0.05
    rule_clamp: float = 1e-3
    cause_floor: float = 0.01
    emission_floor: float = 0.02
    strength_floor: float = 0.01
    rule_miss: float = 1e-3
    unseen: float = 0.1


#: The shape used by :func:`causal_models.structure.build_structure`.
PRIOR_SHAPE = PriorShape()


@dataclass(slots=True)
class NodeTables:
    """The network under construction: per node its states, parents, role and prior row."""

    states: dict[str, tuple[str, ...]] = field(default_factory=dict)
    parents: dict[str, tuple[str, ...]] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    rows: dict[str, Any] = field(default_factory=dict)

    def add(self, node: str, states: tuple[str, ...], parents: tuple[str, ...], role: str,
            row: Any) -> None:
        """Add ``node``; ``row(**parent_states)`` gives its prior weights over ``states``."""
        self.states[node], self.parents[node], self.roles[node] = states, parents, role
        self.rows[node] = row


def normalised(weights: dict[str, float], states: tuple[str, ...], floor: float) -> np.ndarray:
    """Weights over ``states`` (``floor`` for a state ``weights`` does not name), summing to 1."""
    raw = np.array([float(weights.get(s, floor)) for s in states])
    return raw / raw.sum()


def pseudo_counts(node: str, states: tuple[str, ...], parents: tuple[str, ...],
           all_states: dict[str, tuple[str, ...]], row: Any, strength: float) -> np.ndarray:
    """Pseudo-counts from ``row(**parent_states) -> probabilities over states``."""
    configs = list(itertools.product(*(all_states[p] for p in parents))) if parents else [()]
    cols = [np.asarray(row(**dict(zip(parents, cfg, strict=False))), dtype=float)
            for cfg in configs]
    arr = np.stack(cols, axis=1)
    arr = arr / arr.sum(axis=0, keepdims=True)
    return strength * arr
