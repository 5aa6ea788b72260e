"""Hypothesis Generator: abductive rules from compressed events to ranked explanations.

Last stage of the heuristic Post-Mortem Reasoner (symptoms -> **hypotheses**). It resolves
overlapping symptoms, attaches the candidate root causes with their support
(:mod:`neuraldbg.causes`) and gives each hypothesis a confidence.

Confidence
----------
A symptom's probability ``P(symptom) = strength x consistency x impact`` is defined in
:mod:`neuraldbg.symptoms`.

Overlapping symptoms are resolved as the contract's vocabulary says ("a hypothesis names
the mechanism nearest the cause"): exploding gradients when the gradient norm crossed 100x
its baseline before the loss turned non-finite (or blew up, if it never did) and no
learning-rate jump preceded the blow-up; loss divergence otherwise. The chosen one keeps
its probability and the other is halved; a symptom that a prior one
explains (dead or saturated units blocking the gradient upstream, an instability killing
units, any failure stalling the loss) is discounted by ``(1 - 0.8 x P(explaining) x w)``:
at most 80% explained away, so a strong symptom with a weak explanation keeps weight, and
``w = min(1, consistency(explaining) / consistency(explained))`` so that a transient
instability does not explain away a failure that lasts to the end (``w = 1`` for a
plateau, which the vocabulary keeps for stalls with healthy gradients).

Each hypothesis pairs a symptom with one cause::

    confidence = P(symptom) x (1 - 0.4 x (1 - support(cause) / support(best cause)))

over the candidate causes plus "unknown" (whose support is the chance that no candidate
holds, ``prod(1 - support)``, or the support a rule gives a cause outside the vocabulary). The
coefficients (0.5, 0.8, 0.4, ...) are the fields of :class:`HypothesisWeights`.
The best-supported cause carries the symptom's probability, so an ambiguous cause never
makes a clear failure look healthy; weaker alternatives follow in the order of their
support, down to 0.6 x P(symptom), and every alternative, "unknown" included, stays below
0.5 (``ThresholdConfig.unsure_cap``): one symptom claims one cause, so a user is never told
two causes with confidence, nor a cause and "no known cause" for the same failure. No
constant lets a cause outrank a symptom with stronger evidence.

An honest "unknown" (:func:`rank_causes`): causes are ordered by their support, never by
the order they were listed in. When "unknown" is the best supported, or when the two best
specific causes lie within ``ThresholdConfig.cause_tie_margin`` of each other (the evidence
does not tell them apart), "unknown" carries the symptom and every specific cause is capped
at ``ThresholdConfig.unsure_cap`` (< 0.5, the level at which the contract makes a cause a
claim); ``metadata["cause_resolution"]`` says which (``"evidence"``, ``"unknown"`` or
``"tie"``) and ``metadata["tied_causes"]`` names the tied causes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from neuraldbg.causes import score_causes
from neuraldbg.compressor import Compression
from neuraldbg.events import LossDynamics
from neuraldbg.records import Hypothesis
from neuraldbg.run_facts import RunFacts
from neuraldbg.states import StateTable
from neuraldbg.symptoms import Symptom
from neuraldbg.thresholds import require_positive_fields

__all__ = ["HypothesisWeights", "RankedCause", "resolve_overlaps", "generate_hypotheses",
           "rank_causes", "rank_root_causes"]
_MAX_PATH = 50
_MAX_COUPLED = 10

# Which symptom explains which (the explained one is discounted when it starts no earlier).
_EXPLAINS: dict[str, tuple[str, ...]] = {
    "exploding_gradients": ("dead_neurons", "saturated_activations", "vanishing_gradients",
                            "training_plateau"),
    "loss_divergence": ("dead_neurons", "saturated_activations", "vanishing_gradients",
                        "training_plateau"),
    "dead_neurons": ("vanishing_gradients", "training_plateau"),
    "saturated_activations": ("vanishing_gradients", "training_plateau"),
    "vanishing_gradients": ("training_plateau",),
}
_CAUSAL_ORDER = ("exploding_gradients", "loss_divergence", "dead_neurons",
                 "saturated_activations", "vanishing_gradients", "training_plateau")


def _clean(value: Any) -> Any:
    """JSON-friendly copy: numpy scalars to Python, non-finite floats to strings."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return round(v, 6) if math.isfinite(v) and abs(v) >= 1e-3 else (
            v if math.isfinite(v) else str(v))
    return value


@dataclass(frozen=True, slots=True)
class RankedCause:
    """A root cause ranked over all hypotheses of a run.

    Attributes
    ----------
    root_cause : str
    confidence : float
        Highest confidence of a hypothesis naming it.
    failure_types : tuple of str
        Symptoms it explains, most confident first.
    evidence : dict
        The evidence of its most confident hypothesis.
    """

    root_cause: str
    confidence: float
    failure_types: tuple[str, ...]
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form."""
        return {"root_cause": self.root_cause, "confidence": self.confidence,
                "failure_types": list(self.failure_types), "evidence": dict(self.evidence)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankedCause:
        """Inverse of :meth:`to_dict`."""
        return cls(data["root_cause"], float(data["confidence"]),
                   tuple(data.get("failure_types", ())), dict(data.get("evidence", {})))


@dataclass(frozen=True, slots=True)
class HypothesisWeights:
    """The coefficients of overlap resolution and of a hypothesis' confidence.

    Each with the reason for its value; the formulas are in the module docstring.

    Attributes
    ----------
    overlap_discount : float, default=0.5
        Factor on the probability of the one of exploding gradients and loss divergence that
        does not name the mechanism nearest the cause: it is still measured, so it keeps
        half rather than vanishing.
    explain_share : float, default=0.8
        Largest share of a symptom's probability another symptom can explain away, so that
        a strongly measured symptom keeps weight when its explanation is itself weak.
    alternative_drop : float, default=0.4
        ``confidence = P(symptom) x (1 - drop x (1 - support / best support))``: the
        weakest alternative cause keeps 0.6 of the symptom's probability, so an alternative
        stays visible below the carrier without ever outranking it.
    alternative_floor : float, default=0.25
        Alternatives supported less than this share of the best cause are left out: at a
        quarter of the evidence they are noise next to the carrier.
    ratio_guard : float, default=1e-9
        Denominators of a consistency ratio or a support share are at least this (a zero
        consistency or support would divide by zero).
    """

    overlap_discount: float = 0.5
    explain_share: float = 0.8
    alternative_drop: float = 0.4
    alternative_floor: float = 0.25
    ratio_guard: float = 1e-9

    def __post_init__(self) -> None:
        """Reject a non-positive or non-numeric coefficient (the message names it)."""
        require_positive_fields(self)


_DEFAULT_WEIGHTS = HypothesisWeights()


def resolve_overlaps(symptoms: list[Symptom], dyn: LossDynamics, facts: RunFacts,
                     states: StateTable, weights: HypothesisWeights | None = None) -> None:
    """Apply the contract's vocabulary rules in place (see the module docstring)."""
    w = weights or _DEFAULT_WEIGHTS
    by = {s.failure_type: s for s in symptoms}
    exp, div = by.get("exploding_gradients"), by.get("loss_divergence")
    if exp is not None and div is not None:
        _explosion_or_divergence(exp, div, dyn, facts, states.config.lr_jump_window, w)
    _explain_away(by, states.module_names, w)
    # Dead units after an instability: the instability's cause is a candidate cause.
    dead = by.get("dead_neurons")
    unstable = [by[k].probability for k in ("exploding_gradients", "loss_divergence")
                if k in by and by[k].origin_step <= (dead.origin_step if dead else -1)]
    if dead is not None and unstable:
        dead.extra["upstream_instability"] = max(unstable)


def _explosion_or_divergence(exp: Symptom, div: Symptom, dyn: LossDynamics, facts: RunFacts,
                             lr_jump_window: int, w: HypothesisWeights) -> None:
    """Keep the one nearest the cause; discount the other."""
    # The lead is measured against the loss turning non-finite (the contract's words),
    # or against its blow-up when it never does.
    t_loss = next((s for s in (dyn.nonfinite_step, dyn.blowup_step) if s is not None),
                  div.origin_step)
    # Spikes do not count as a lead: only growth by orders of magnitude does.
    growth_onset = exp.evidence.get("growth_onset")
    t_grad = growth_onset if growth_onset is not None else t_loss
    # A learning-rate jump just before the gradients grew or the loss blew up triggered
    # them: the gradients did not lead on their own.
    refs = [t for t in (t_grad, dyn.blowup_step, dyn.nonfinite_step) if t is not None]
    jump = any(r - lr_jump_window <= s <= r for s in facts.lr_jump_steps for r in refs)
    lead = t_grad < t_loss and not jump
    winner, loser = (exp, div) if lead else (div, exp)
    loser.discount *= w.overlap_discount
    loser.explained_by[winner.failure_type] = winner.probability
    for s in (exp, div):
        s.evidence["gradient_lead_steps"] = t_loss - t_grad
        s.evidence["lr_jump_before_blowup"] = jump


def _explain_away(by: dict[str, Symptom], names: list[str], w: HypothesisWeights) -> None:
    """Discount each symptom that an earlier one explains, in causal order."""
    for cause in _CAUSAL_ORDER:
        a = by.get(cause)
        if a is None:
            continue
        for effect in _EXPLAINS.get(cause, ()):
            b = by.get(effect)
            # A stall is judged on the whole run: a later failure can explain it too.
            if b is None or b is a or (b.origin_step < a.origin_step
                                       and effect != "training_plateau"):
                continue
            blocks = cause in ("dead_neurons", "saturated_activations")
            if blocks and effect == "vanishing_gradients":
                # Only a block downstream of (or at) the vanished layers explains them. Dead
                # units block in every layer the death reached (a ReLU MLP whose biases all
                # start at -5 dies in each hidden layer: the last one zeroes every gradient
                # upstream of it); saturation is judged at its origin, as the vocabulary
                # names a deep sigmoid stack's stall vanishing gradients.
                blocked = [a.origin_layer]
                if cause == "dead_neurons" and a.propagation is not None:
                    blocked += list(a.propagation.path)
                at = [names.index(x) for x in blocked if x in names]
                if b.origin_layer in names and at and names.index(b.origin_layer) > max(at):
                    continue
            pa = a.probability
            # A transient instability does not explain away a failure that lasts to the
            # end (a layer it killed): weight by relative persistence. A plateau is always
            # fully explained: the vocabulary keeps it for stalls with healthy gradients.
            weight = 1.0 if effect == "training_plateau" else min(
                1.0, a.consistency / max(b.consistency, w.ratio_guard))
            b.discount *= 1.0 - w.explain_share * pa * weight
            b.explained_by[cause] = pa


def _coupled_for(layer: str, comp: Compression) -> list[dict[str, Any]]:
    rel = [c for c in comp.coupled if layer in (c.cause.module_name, c.effect.module_name)]
    return [{"cause": c.cause.module_name, "cause_kind": c.cause.kind, "effect":
             c.effect.module_name, "effect_kind": c.effect.kind, "step_gap": c.step_gap,
             "relation": c.relation, "step": c.cause.step} for c in rel[:_MAX_COUPLED]]


def generate_hypotheses(symptoms: list[Symptom], comp: Compression, facts: RunFacts,
                        states: StateTable, *, min_confidence: float = 0.05,
                        max_causes: int = 3, weights: HypothesisWeights | None = None
                        ) -> list[Hypothesis]:
    """Pair each symptom with its candidate causes; highest confidence first."""
    cfg, w = states.config, weights or _DEFAULT_WEIGHTS
    first_step = int(states.steps[0]) if len(states.steps) else 0
    out: list[Hypothesis] = []
    for sym in symptoms:
        p_sym = sym.probability
        if p_sym < min_confidence:
            continue
        causes = score_causes(sym.failure_type, onset=sym.origin_step, first_step=first_step,
                              facts=facts, cfg=cfg, extra=sym.extra)
        kept, resolution, tied = rank_causes(causes, cfg.cause_tie_margin, max_causes,
                                             keep_share=w.alternative_floor)
        prop = sym.propagation
        base_meta = {
            "propagation": (None if prop is None else
                            {**prop.to_dict(), "path": list(prop.path[:_MAX_PATH]),
                             "path_steps": list(prop.path_steps[:_MAX_PATH])}),
            "coupled": _coupled_for(sym.origin_layer, comp),
            "evidence": sym.evidence,
            "cause_support": {c: s for c, (s, _) in causes.items()},
            "cause_resolution": resolution,
            "tied_causes": tied,
            "explained_by": sym.explained_by,
        }
        best = max(kept[0][1], w.ratio_guard)
        for i, (cause, support, cause_ev) in enumerate(kept):
            share = 1.0 if i == 0 else min(1.0, support / best)
            conf = p_sym * (1.0 - w.alternative_drop * (1.0 - share))
            if i > 0:  # the carrier is the only cause claimed, "unknown" included
                conf = min(conf, cfg.unsure_cap)
            hint = cause_ev.get("hint")
            meta = {**base_meta, **({"hint": hint} if hint else {}),
                    "cause_evidence": cause_ev, "confidence_terms": {
                "strength": sym.strength, "consistency": sym.consistency,
                "impact": sym.impact, "discount": sym.discount,
                "cause_support_relative": share}}
            out.append(Hypothesis(sym.failure_type, cause, sym.origin_layer, int(sym.origin_step),
                                  float(round(conf, 6)), _clean(meta)))
    out.sort(key=lambda h: (-h.confidence, h.origin_step))
    return out


def rank_causes(causes: dict[str, tuple[float, dict[str, Any]]], tie_margin: float,
                max_causes: int, *, keep_share: float = 0.25
                ) -> tuple[list[tuple[str, float, dict[str, Any]]], str, list[str]]:
    """Order the candidate causes of one symptom, the one that carries it first.

    ``unknown`` competes with its support: the chance that no candidate holds,
    ``prod(1 - support)``, or the support :func:`~neuraldbg.causes.score_causes` gives it
    for a cause outside the vocabulary, whichever is larger. Causes are ordered by support,
    never by the order they were listed in: when the best two specific causes lie within
    ``tie_margin`` of each other (and above ``unknown``) the evidence does not tell them
    apart, so ``unknown`` carries the symptom and the tie is reported.

    Returns
    -------
    kept : list of (cause, support, evidence)
        At most ``max_causes``, the carrier first, then by support down to ``keep_share``
        of the best (:attr:`HypothesisWeights.alternative_floor`).
    resolution : {"evidence", "unknown", "tie"}
        What decided the carrier: a specific cause best supported, ``unknown`` best
        supported, or a tie between specific causes.
    tied : list of str
        The tied causes (empty unless ``resolution == "tie"``).
    """
    causes = dict(causes)
    own_unknown, unknown_ev = causes.pop("unknown", (0.0, {}))
    specific = sorted(((c, s, ev) for c, (s, ev) in causes.items()),
                      key=lambda t: (-t[1], t[0]))
    unknown = max(float(np.prod([1.0 - s for _, s, _ in specific])), own_unknown)
    tied: list[str] = []
    if specific and specific[0][1] > unknown:
        top = specific[0][1]
        tied = [c for c, s, _ in specific if top - s < tie_margin]
        resolution = "tie" if len(tied) > 1 else "evidence"
    else:
        resolution = "unknown"
    if resolution != "tie":
        tied = []
    entry = ("unknown", unknown, unknown_ev)
    if resolution == "evidence":
        ranked = specific[:1] + sorted(specific[1:] + [entry], key=lambda t: (-t[1], t[0]))
    else:
        ranked = [entry] + specific
    best = max(max(r[1] for r in ranked), 1e-9)
    head, rest = ranked[0], [r for r in ranked[1:] if r[1] >= keep_share * best]
    return [head, *rest][:max_causes], resolution, tied


def rank_root_causes(hypotheses: list[Hypothesis]) -> list[RankedCause]:
    """Root causes over all hypotheses, each at its best confidence, highest first."""
    best: dict[str, list[Hypothesis]] = {}
    for h in hypotheses:
        best.setdefault(h.root_cause, []).append(h)
    out = []
    for cause, hs in best.items():
        hs.sort(key=lambda h: -h.confidence)
        types = tuple(dict.fromkeys(h.failure_type for h in hs))
        out.append(RankedCause(cause, hs[0].confidence, types,
                             dict(hs[0].metadata.get("cause_evidence", {}))))
    out.sort(key=lambda r: -r.confidence)
    return out
