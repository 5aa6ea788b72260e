"""Causal Compressor: from many events to first occurrences, origins and coupled failures.

Third stage of the heuristic Post-Mortem Reasoner (events -> **compression** -> hypotheses).
A failing run produces an event in every layer the failure reaches; the compressor keeps
what a diagnosis needs:

- the first occurrence of each kind of event;
- the propagation of each failure kind: the layer that *produced* it and the layers that
  merely *passed it on*. For dead units and saturation the origin is the layer that failed
  first; onsets within ``window`` steps of the first count as simultaneous (sampling and
  noise make a few steps meaningless), and among those the most severely affected layer
  (largest median share from its onset on) is the producer, ties going to forward order
  (an activation failure travels forward). For a
  non-finite forward pass it is the first non-finite module in forward order at the first
  such step. For vanishing gradients it is where the decay starts: when one module boundary
  accounts for most of the gradient's decay (a dead or saturated layer, a tiny layer) that
  module is the origin; when the decay is spread evenly over many layers (a deep sigmoid
  stack) no single layer produces it, and the origin is the first layer of the vanished
  region, where the failure shows;
- coupled failures: onsets in different layers within ``window`` steps of each other, each
  pair ordered cause before effect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from neuraldbg.events import LOSS, MODEL
from neuraldbg.records import Event
from neuraldbg.states import StateTable
from neuraldbg.thresholds import ThresholdConfig

__all__ = [
    "Propagation",
    "CoupledFailure",
    "Compression",
    "first_occurrences",
    "trace_propagation",
    "couple_onsets",
    "compress",
    "failure_onsets",
    "FAILURE_KINDS",
    "NONFINITE",
]

#: Event kinds that mark a module entering a failure state.
FAILURE_KINDS: tuple[str, ...] = (
    "gradient_vanishing",
    "gradient_exploding",
    "gradient_saturated",
    "activation_dead",
    "activation_saturated",
    "activation_anomalous",
)
#: Pseudo-kind of the first non-finite forward pass (from the NaN/Inf counts).
NONFINITE = "activation_nonfinite"

# (cause kind, effect kind) pairs with a known mechanism, and its name.
_MECHANISMS: dict[tuple[str, str], str] = {
    ("activation_dead", "gradient_vanishing"): "blocks_gradient",
    ("activation_saturated", "gradient_vanishing"): "blocks_gradient",
    ("activation_saturated", "gradient_saturated"): "blocks_gradient",
    ("gradient_exploding", "activation_anomalous"): "destabilises",
    ("gradient_exploding", "activation_dead"): "destabilises",
    ("gradient_exploding", "activation_saturated"): "destabilises",
    ("activation_anomalous", "gradient_exploding"): "amplifies",
}


@dataclass(frozen=True, slots=True)
class Propagation:
    """How one kind of failure spread through the network.

    Attributes
    ----------
    kind : str
        Event kind (``"gradient_vanishing"``, ``"activation_dead"``, ...).
    origin_layer : str
        The module that produced the failure.
    origin_step : int
        Step of its onset there.
    path : tuple of str
        Modules that passed it on, in the order the failure travelled (forward for
        activations, backward for gradients), the origin excluded.
    path_steps : tuple of int
        Onset step in each module of ``path``.
    evidence : dict
        How the origin was chosen (``rule``) and the numbers behind it.
    """

    kind: str
    origin_layer: str
    origin_step: int
    path: tuple[str, ...] = ()
    path_steps: tuple[int, ...] = ()
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form."""
        return {"kind": self.kind, "origin_layer": self.origin_layer,
                "origin_step": self.origin_step, "path": list(self.path),
                "path_steps": list(self.path_steps), "evidence": dict(self.evidence)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Propagation:
        """Inverse of :meth:`to_dict`."""
        return cls(data["kind"], data["origin_layer"], data["origin_step"],
                   tuple(data.get("path", ())), tuple(data.get("path_steps", ())),
                   dict(data.get("evidence", {})))


@dataclass(frozen=True, slots=True, repr=False)
class CoupledFailure:
    """Two failure onsets in different layers within a window, cause first.

    Attributes
    ----------
    cause : Event
    effect : Event
    step_gap : int
        ``effect.step - cause.step`` (>= 0).
    relation : str
        ``"propagates"`` (same kind of failure), a named mechanism (``"blocks_gradient"``,
        ``"destabilises"``, ``"amplifies"``) or ``"co_occurs"``.
    """

    cause: Event
    effect: Event
    step_gap: int
    relation: str

    def __repr__(self) -> str:
        """One line: cause event, relation, effect event and the gap between them."""
        return (f"CoupledFailure({self.cause.kind} in {self.cause.module_name!r} at step "
                f"{self.cause.step} -[{self.relation}, +{self.step_gap} steps]-> "
                f"{self.effect.kind} in {self.effect.module_name!r} at step "
                f"{self.effect.step})")

    def __str__(self) -> str:
        """The pair in words."""
        return (f"{self.cause.kind} in {self.cause.module_name} (step {self.cause.step}) "
                f"{self.relation.replace('_', ' ')} {self.effect.kind} in "
                f"{self.effect.module_name} (step {self.effect.step}, {self.step_gap} steps "
                "later)")

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form."""
        return {"cause": self.cause.to_dict(), "effect": self.effect.to_dict(),
                "step_gap": self.step_gap, "relation": self.relation}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CoupledFailure:
        """Inverse of :meth:`to_dict`."""
        return cls(Event.from_dict(data["cause"]), Event.from_dict(data["effect"]),
                   int(data["step_gap"]), str(data["relation"]))


@dataclass(frozen=True)
class Compression:
    """Output of :func:`compress`."""

    first: dict[str, Event]
    propagation: dict[str, Propagation]
    coupled: list[CoupledFailure]
    onsets: list[Event]


def _index(event: Event) -> int:
    idx = event.evidence.get("forward_index", -1)
    return idx if isinstance(idx, int) else -1


def first_occurrences(events: list[Event]) -> dict[str, Event]:
    """Earliest event of each kind (ties: first in forward order).

    Parameters
    ----------
    events : list of Event

    Returns
    -------
    dict of str to Event
    """
    first: dict[str, Event] = {}
    for ev in events:
        cur = first.get(ev.kind)
        if cur is None or (ev.step, _index(ev)) < (cur.step, _index(cur)):
            first[ev.kind] = ev
    return first


def failure_onsets(events: list[Event]) -> list[Event]:
    """First entry of each module into each failure state (module events only)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for ev in sorted(events, key=lambda e: (e.step, _index(e))):
        if ev.kind not in FAILURE_KINDS or ev.module_name in (LOSS, MODEL):
            continue
        key = (ev.module_name, ev.kind)
        if key not in seen:
            seen.add(key)
            out.append(ev)
    return out


def _vanishing_origin(onsets: list[Event], states: StateTable) -> Propagation:
    s0 = min(e.step for e in onsets)
    at0 = sorted((e for e in onsets if e.step == s0), key=_index)
    row = int(np.searchsorted(states.steps, s0))
    g = states.measures["out_grad_norm"][row]
    region = [_index(e) for e in at0]
    deepest = min(region)
    with np.errstate(divide="ignore", invalid="ignore"):
        logg = np.log10(np.clip(np.where(np.isfinite(g), g, np.nan), 1e-30, None))
    # Decay across each boundary k-1 -> k: how much smaller the gradient at the input of
    # module k is than at its output (module k attenuates).
    top = (int(np.nanargmax(np.where(np.isnan(logg), -np.inf, logg)))
           if np.isfinite(logg).any() else -1)
    rule, origin, drops = "first_vanished_layer", deepest, {}
    if top > deepest:
        d = logg[deepest + 1: top + 1] - logg[deepest: top]
        d = np.nan_to_num(d, nan=0.0)
        total = logg[top] - logg[deepest]
        if np.isfinite(total) and total > 0 and len(d):
            k = int(np.argmax(d))
            share = float(d[k] / total)
            drops = {"total_decades": round(float(total), 3),
                     "largest_drop_decades": round(float(d[k]), 3),
                     "largest_drop_share": round(share, 3),
                     "largest_drop_layer": states.module_names[deepest + 1 + k]}
            if share >= 0.5 and d[k] >= 2.0:
                rule, origin = "concentrated_decay", deepest + 1 + k
    name = states.module_names[origin]
    rest = sorted((e for e in onsets if e.module_name != name),
                  key=lambda e: (e.step, -_index(e)))  # gradients travel backward
    return Propagation("gradient_vanishing", name, s0, tuple(e.module_name for e in rest),
                       tuple(e.step for e in rest), {"rule": rule, **drops})


def _nonfinite_origin(states: StateTable) -> Propagation | None:
    # Forward pass only: gradients turn NaN in the same step as a NaN loss, from the loss.
    nf = states.measures["act_nonfinite"]
    rows = np.flatnonzero(nf.any(axis=1))
    if not len(rows):
        return None
    r = int(rows[0])
    cols = np.flatnonzero(nf[r])
    first_bad = np.argmax(nf, axis=0)
    later = [int(c) for c in np.flatnonzero(nf.any(axis=0)) if int(c) != int(cols[0])]
    later.sort(key=lambda c: (first_bad[c], c))
    return Propagation(NONFINITE, states.module_names[int(cols[0])], int(states.steps[r]),
                       tuple(states.module_names[c] for c in later),
                       tuple(int(states.steps[first_bad[c]]) for c in later),
                       {"rule": "first_nonfinite_in_forward_order",
                        "n_nonfinite_at_onset": int(len(cols))})


_SEVERITY = {"activation_dead": "act_frac_dead", "activation_saturated": "act_frac_saturated"}


def _severity(states: StateTable, ev: Event, column: str) -> float:
    row = int(np.searchsorted(states.steps, ev.step))
    tail = states.measures[column][row:, _index(ev)]
    tail = tail[np.isfinite(tail)]
    return float(np.median(tail)) if len(tail) else 0.0


def trace_propagation(onsets: list[Event], states: StateTable, window: int | None = None
                      ) -> dict[str, Propagation]:
    """Origin and path of each failure kind present in ``onsets``.

    Parameters
    ----------
    onsets : list of Event
        First entries into failure states (:func:`failure_onsets`).
    states : StateTable
        The classified states (their ``config`` holds the default window).
    window : int, optional
        Activation-failure onsets this close to the first count as simultaneous;
        ``states.config.window`` (:class:`~neuraldbg.thresholds.ThresholdConfig`) when omitted.

    Returns
    -------
    dict of str to Propagation
        Keyed by event kind, plus ``"activation_nonfinite"`` when the forward pass turned
        non-finite.
    """
    window = states.config.window if window is None else window
    by_kind: dict[str, list[Event]] = {}
    for ev in onsets:
        by_kind.setdefault(ev.kind, []).append(ev)
    out: dict[str, Propagation] = {}
    for kind, evs in by_kind.items():
        if kind == "gradient_vanishing":
            out[kind] = _vanishing_origin(evs, states)
            continue
        backward = kind.startswith("gradient")
        first = min(evs, key=lambda e: (e.step, _index(e)))
        evidence: dict[str, Any] = {"rule": "earliest_then_forward_order"}
        if kind in _SEVERITY:
            column = _SEVERITY[kind]
            near = [e for e in evs if e.step <= first.step + window]
            sev = {e.module_name: _severity(states, e, column) for e in near}
            best = max(near, key=lambda e: (round(sev[e.module_name], 3), -e.step, -_index(e)))
            if best is not first:
                evidence = {"rule": "most_severe_within_window", "window": window,
                            "severity": {k: round(v, 3) for k, v in sev.items()}}
            first = best
        rest = sorted((e for e in evs if e is not first),
                      key=lambda e: (e.step, -_index(e) if backward else _index(e)))
        out[kind] = Propagation(kind, first.module_name, first.step,
                                tuple(e.module_name for e in rest), tuple(e.step for e in rest),
                                evidence)
    nf = _nonfinite_origin(states)
    if nf is not None:
        out[NONFINITE] = nf
    return out


def _order(a: Event, b: Event) -> tuple[Event, Event]:
    """(cause, effect) for two onsets."""
    if a.step != b.step:
        return (a, b) if a.step < b.step else (b, a)
    a_act, b_act = a.kind.startswith("activation"), b.kind.startswith("activation")
    if a_act != b_act:  # activations are computed before gradients and block them
        return (a, b) if a_act else (b, a)
    if a_act:  # forward: the earlier module feeds the later one
        return (a, b) if _index(a) <= _index(b) else (b, a)
    return (a, b) if _index(a) >= _index(b) else (b, a)  # backward: output side first


def couple_onsets(events: list[Event], window: int | None = None
                            ) -> list[CoupledFailure]:
    """Failure onsets in different layers within ``window`` steps, ordered cause before effect.

    Parameters
    ----------
    events : list of Event
        Events of a run (only module onsets into failure states are paired).
    window : int, optional
        Largest step gap between the two onsets; ``ThresholdConfig().window`` when omitted.

    Returns
    -------
    list of CoupledFailure
        Sorted by the cause's step, then the effect's.

    Raises
    ------
    ValueError
        If ``window`` is not a non-negative integer.
    """
    window = ThresholdConfig().window if window is None else window
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
        raise ValueError(f"window must be a non-negative integer (steps), got {window!r}.")
    onsets = failure_onsets(events)
    steps = np.array([e.step for e in onsets], dtype=np.int64)
    out = []
    for i, a in enumerate(onsets):
        hi = int(np.searchsorted(steps, a.step + window, side="right"))
        for b in onsets[i + 1: hi]:
            if b.module_name == a.module_name:
                continue
            cause, effect = _order(a, b)
            relation = ("propagates" if cause.kind == effect.kind
                        else _MECHANISMS.get((cause.kind, effect.kind), "co_occurs"))
            out.append(CoupledFailure(cause, effect, effect.step - cause.step, relation))
    out.sort(key=lambda c: (c.cause.step, c.effect.step, _index(c.cause), _index(c.effect)))
    return out


def compress(events: list[Event], states: StateTable, window: int | None = None
             ) -> Compression:
    """Run the whole compressor.

    Parameters
    ----------
    events : list of Event
        Events of the run (:func:`neuraldbg.events.extract_events`).
    states : StateTable
        The classified states.
    window : int, optional
        Steps within which onsets are simultaneous or coupled; ``states.config.window``
        when omitted.

    Returns
    -------
    Compression
    """
    window = states.config.window if window is None else window
    onsets = failure_onsets(events)
    return Compression(first=first_occurrences(events),
                       propagation=trace_propagation(onsets, states, window),
                       coupled=couple_onsets(events, window), onsets=onsets)

