"""The contract's ranked hypotheses from a fitted reasoner's posterior.

One hypothesis per (failure type, root cause) pair worth naming, with the origin layer and
step placed by :func:`causal_models.origin.locate_origin` and the rules' first event of the
same failure (read as a sensor), and an honest ``unknown`` when the evidence shows a failure
but does not single out its cause (:func:`name_undetermined_cause`). A failure whose type the
evidence does not single out is still a failure (:func:`name_undetermined_type`).

Causes are ranked by their posterior, never by the order the vocabulary lists them: two
causes whose probabilities given the failure are equal (:func:`tied_causes`: their tables
still hold the same prior, no data told them apart) are a tie, which the top hypothesis
reports in ``metadata["cause_resolution"] = "tie"`` and ``metadata["tied_causes"]`` (the keys
the heuristic uses), naming the failure with ``unknown`` and keeping each tied cause below
0.5.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from causal_models.fitted import FittedModel, check_is_fitted
from causal_models.origin import locate_origin
from causal_models.posterior import joint_posterior
from causal_models.sensors import stated_evidence
from causal_models.structure import NO_CAUSE, unmodelled_causes
from neuraldbg.records import HEALTHY, Hypothesis
from neuraldbg.trace import Trace

__all__ = ["explain", "name_undetermined_cause", "name_undetermined_type",
           "cause_given_failure", "tied_causes",
           "TIE_TOLERANCE", "reached_by_exclusion"]

#: Causes listed under each failure type (at most), and the conditional probability a cause
#: after the first needs to be listed.
MAX_CAUSES = 3
MIN_CAUSE_SHARE = 0.05
#: Relative difference below which two causes' probabilities given the failure are equal
#: (floating-point noise of the same table values summed in another order).
TIE_TOLERANCE = 1e-6
#: The highest confidence a cause tied with another keeps: just below a claim.
_BELOW_CLAIM = float(np.nextafter(0.5, 0.0))


def reached_by_exclusion() -> frozenset[str]:
    """Causes the network reaches by exclusion unless the rules' sensor names them.

    The causes no knob drives (:func:`causal_models.structure.unmodelled_causes`, read at
    call time): bugs in the training code, ``data_problem`` among them. The network senses
    them through the rules' verdict, which reads each one's own signature (weights that
    move as in healthy training while the loss sits at chance; gradients that grow like a
    running sum); its slice states are shared with every other cause. Where the rules'
    sensor names something else or abstains, the network's share for such a cause is
    elimination, and it stays below a claim (:func:`name_undetermined_cause`). A helper's
    Transformer and accumulation runs whose cause lay outside the vocabulary were named
    ``data_problem`` at 0.54-0.58; an MLP stalling on shuffled labels under Adam at 1e-2,
    its units dead, was named ``missing_zero_grad`` at 0.55 (the rules said ``unknown``).
    """
    return frozenset(unmodelled_causes())


#: The rules' sensor of the cause they name.
_RULE_CAUSE = "rule_cause"


def tied_causes(cond: np.ndarray, root_causes: np.ndarray) -> list[str]:
    """The causes tied for the top of ``cond`` (P(cause | failure)), or ``[]`` when one leads.

    Parameters
    ----------
    cond : numpy.ndarray
        :func:`cause_given_failure` of one failure type.
    root_causes : numpy.ndarray
        The root-cause states in column order.
    """
    named = [j for j in np.argsort(-cond, kind="stable") if root_causes[j] != NO_CAUSE]
    if len(named) < 2 or not cond[named[0]] > 0:
        return []
    top = float(cond[named[0]])
    tied = [str(root_causes[j]) for j in named if top - float(cond[j]) <= TIE_TOLERANCE * top]
    return tied if len(tied) > 1 else []


def _undetermined_reason(top: Hypothesis, p_ft: float, tied: list[str],
                         excluded: bool) -> str:
    """Why :func:`name_undetermined_cause` named ``top``'s failure ``unknown``."""
    why = (f"{', '.join(tied)} are tied at {top.confidence:.2f}" if tied else
           f"the most probable, {top.root_cause}, has {top.confidence:.2f}")
    if excluded and not tied:
        why += " by elimination, which the rules that read its own signature did not name"
    return (f"the evidence shows {top.failure_type} (posterior {p_ft:.2f}) but does not "
            f"single out its cause: {why}")


def name_undetermined_cause(hyps: list[Hypothesis]) -> list[Hypothesis]:
    """Name a failure whose cause the evidence does not single out ``unknown``.

    A failure the evidence shows, with no cause the evidence singles out, is named with
    ``root_cause="unknown"`` at the failure type's posterior; the candidate causes
    stay listed at their joint posterior (each below 0.5 then). So is a failure whose most
    probable cause is one of :func:`reached_by_exclusion` the rules' sensor did not name
    (``metadata["cause_by_exclusion"]``). When the most probable
    cause is already the ``unknown`` state (the leak: the rules abstain, no registered cause
    fits), that hypothesis is the one lifted to the failure type's posterior: a failure shown
    at 0.92 whose cause is unknown is a failure, not a healthy run. Causes tied at the top
    (``metadata["tied_causes"]``) never single one out: the failure is named ``unknown`` and
    each tied cause stays below 0.5.
    """
    top = hyps[0]
    # the failure being claimed: its type's posterior, or the run's P(failure) when the
    # type itself is undetermined (name_undetermined_type)
    p_ft = float(top.metadata.get("p_failure_claimed", top.metadata["p_failure_type"]))
    tied = top.metadata.get("tied_causes") or []
    excluded = [top.root_cause] if top.metadata.get("cause_by_exclusion") else []
    if p_ft < 0.5 or (top.confidence >= 0.5 and not tied and not excluded):
        return hyps
    capped = set(tied) | set(excluded)
    hyps = [h if h.root_cause not in capped or h.failure_type != top.failure_type
            else dataclasses.replace(h, confidence=min(h.confidence, _BELOW_CLAIM))
            for h in hyps]
    candidates = {h.root_cause: round(h.confidence, 4) for h in hyps
                  if h.failure_type == top.failure_type}
    unknown = Hypothesis(
        failure_type=top.failure_type, root_cause="unknown",
        origin_layer=top.origin_layer, origin_step=top.origin_step, confidence=p_ft,
        metadata={**top.metadata, "p_root_cause_given_failure": None, "p_joint": None,
                  "cause_undetermined": candidates,
                  "reason": _undetermined_reason(top, p_ft, tied, bool(excluded))})
    rest = hyps[1:] if top.root_cause == "unknown" else hyps
    return [unknown, *rest]


def name_undetermined_type(hyps: list[Hypothesis], p_failure: float,
                           cause_share: dict[str, float]) -> list[Hypothesis]:
    """Claim a failure whose type the evidence does not single out, by its likeliest type.

    The evidence can show a failure (P(any failure) >= 0.5) and split it over failure types
    none of which reaches 0.5: a GRU whose features were detached read plateau 0.49,
    vanishing gradients 0.24, dead units 0.22, healthy 0.01, and read type by type no
    hypothesis reached 0.5, so the run was judged healthy at 0.62. The top hypothesis keeps
    its type (the most probable) and cause, and claims P(the run fails from that cause), its
    P(failure) times P(cause | the run fails), as a run judged healthy carries P(any failure)
    on each hypothesis; the types' posteriors are in ``metadata["failure_type_undetermined"]``
    and ``metadata["p_failure_type"]`` stays the type's own. A cause that is undetermined too
    is named ``unknown`` at P(failure) (:func:`name_undetermined_cause`).

    Parameters
    ----------
    hyps : list of Hypothesis
        The ranked hypotheses of a run judged failing.
    p_failure : float
        P(any failure) (calibrated).
    cause_share : dict of str to float
        P(root cause | the run fails), over every failure type.
    """
    top = hyps[0]
    if p_failure < 0.5 or float(top.metadata["p_failure_type"]) >= 0.5:
        return hyps
    types: dict[str, float] = {}
    for h in hyps:
        types.setdefault(h.failure_type, round(float(h.metadata["p_failure_type"]), 4))
    claim = min(1.0, p_failure * cause_share.get(top.root_cause, 0.0))
    lifted = dataclasses.replace(top, confidence=max(top.confidence, claim), metadata={
        **top.metadata, "p_failure_claimed": p_failure, "failure_type_undetermined": types,
        "p_root_cause_given_failure": cause_share.get(top.root_cause, 0.0),
        "reason": (f"the evidence shows a failure (posterior {p_failure:.2f}) but does not "
                   f"single out its type: {top.failure_type} is the most probable at "
                   f"{float(top.metadata['p_failure_type']):.2f}")})
    return [lifted, *hyps[1:]]


def cause_given_failure(joint_row: np.ndarray, root_causes: np.ndarray) -> np.ndarray:
    """P(root cause | failure type, the run fails) from one failure type's joint row.

    ``none`` is the root cause of a healthy run: a run that fails has a cause, registered
    or ``unknown``. The network cannot say so itself (the failure type is a child of the
    slice states, not of the root cause), so where a failure shows with slices that look
    healthy, part of the joint lies on (that failure, ``none``); it is evidence for no
    cause, and the causes are conditioned on the run failing (that mass set to zero and the
    row renormalised). The ``unknown`` state keeps its share like any cause.

    Parameters
    ----------
    joint_row : numpy.ndarray
        P(failure type = f, root cause) for one failing ``f``, shape ``(n_root_causes,)``.
    root_causes : numpy.ndarray
        The root-cause states in column order.

    Returns
    -------
    numpy.ndarray
        Same shape, zero at ``none``, summing to 1 (all zeros when no cause has mass).
    """
    row = np.where(root_causes == NO_CAUSE, 0.0, np.clip(joint_row, 0.0, None))
    total = float(row.sum())
    return row / total if total > 0 else row


def _pairs_when_healthy(model: FittedModel, joint: np.ndarray,
                        healthy: int) -> list[tuple[int, int]]:
    """Pairs to list for a run judged healthy.

    The causes by their joint posterior with any failure (summed over failure types), each
    under its most probable failure type.
    """
    failing = np.delete(np.arange(len(model.classes_)), healthy)
    by_cause = joint[failing].sum(axis=0)
    return [(int(failing[np.argmax(joint[failing, j])]), j)
            for j in np.argsort(-by_cause, kind="stable")
            if model.root_causes_[j] != NO_CAUSE][:MAX_CAUSES]


def _pairs_when_failing(model: FittedModel, joint: np.ndarray, marginal: np.ndarray,
                        healthy: int) -> list[tuple[int, int]]:
    """Judged failing: each probable failure type with its most probable causes."""
    pairs: list[tuple[int, int]] = []
    for i in np.argsort(-marginal, kind="stable"):
        if i == healthy or (pairs and marginal[i] < model.min_confidence):
            continue  # the most probable failure type is always listed
        cond = cause_given_failure(joint[i], model.root_causes_)
        ranked = [j for j in np.argsort(-cond, kind="stable")
                  if model.root_causes_[j] != NO_CAUSE][:MAX_CAUSES]
        pairs += [(int(i), j) for r, j in enumerate(ranked)
                  if not r or cond[j] >= MIN_CAUSE_SHARE]
    return pairs


def explain(model: FittedModel, trace: Trace) -> list[Hypothesis]:
    """Ranked hypotheses with posterior confidences (the contract's ``Hypothesis`` list).

    See :meth:`causal_models.network.ProbabilisticReasoner.explain` for what each
    confidence means.

    Parameters
    ----------
    model : FittedModel
    trace : Trace

    Returns
    -------
    list of Hypothesis
        Empty or all below 0.5 when the run is judged healthy.
    """
    check_is_fitted(model)
    disc = model.observe(trace)
    evidence = stated_evidence(disc.states, model.structure_.observed_nodes())
    raw = joint_posterior(model.inference(), evidence, model.classes_, model.root_causes_)
    joint = model.calibrate_joint(raw[None])[0]
    marginal = joint.sum(axis=1)
    healthy = list(model.classes_).index(HEALTHY)
    p_healthy = float(marginal[healthy])
    judged_healthy = int(np.argmax(marginal)) == healthy
    pairs = (_pairs_when_healthy(model, joint, healthy) if judged_healthy
             else _pairs_when_failing(model, joint, marginal, healthy))
    origins: dict[str, Any] = {}
    hyps: list[Hypothesis] = []
    by_exclusion = reached_by_exclusion()
    for i, j in pairs:
        ft = str(model.classes_[i])
        p_ft = min(1.0, max(0.0, float(marginal[i])))
        cond = cause_given_failure(joint[i], model.root_causes_)
        tied = [] if judged_healthy else tied_causes(cond, model.root_causes_)
        cause = str(model.root_causes_[j])
        tie: dict[str, Any] = ({"cause_resolution": "tie", "tied_causes": tied}
                               if cause in tied else {})
        if cause in by_exclusion and evidence.get(_RULE_CAUSE, cause) != cause:
            tie["cause_by_exclusion"] = True
        # judged healthy, every hypothesis carries P(the run fails at all); judged
        # failing, a hypothesis claims its failure type *and* its cause: P(failure type)
        # times P(cause | that failure, the run fails)
        conf = (min(1.0, max(0.0, 1.0 - p_healthy)) if judged_healthy
                else min(1.0, max(0.0, p_ft * float(cond[j]))))
        if ft not in origins:
            origins[ft] = locate_origin(trace, disc, ft)
            if ft in disc.events:
                # two blocks and two slices cannot place an onset at module and step
                # resolution: the first event of the same failure the rules' extractor
                # found is read as a sensor of it (the propagation path stays the
                # network's blocks)
                layer, step = disc.events[ft]
                origins[ft] = (layer, int(step), origins[ft][2])
        layer, step, path = origins[ft]
        hyps.append(Hypothesis(
            failure_type=ft, root_cause=cause, origin_layer=layer,
            origin_step=step, confidence=conf,
            metadata={"method": "probabilistic", "p_failure_type": p_ft,
                      "p_root_cause_given_failure": float(cond[j]),
                      "p_joint": float(joint[i, j]), "p_healthy": p_healthy,
                      "propagation_path": path, "onset_step": disc.onset_step,
                      "slices": [list(s) for s in disc.slices],
                      "evidence": dict(evidence), **tie}))
    if not judged_healthy and hyps:
        hyps = name_undetermined_type(hyps, 1.0 - p_healthy,
                                      _cause_share(model, joint, healthy))
        hyps = name_undetermined_cause(hyps)
    return sorted(hyps, key=lambda h: -h.confidence)


def _cause_share(model: FittedModel, joint: np.ndarray, healthy: int) -> dict[str, float]:
    """P(root cause | the run fails), over every failure type (each read as explain reads it)."""
    total = np.zeros(len(model.root_causes_))
    for i in range(len(model.classes_)):
        if i != healthy:
            total += cause_given_failure(joint[i], model.root_causes_) * float(joint[i].sum())
    mass = float(total.sum())
    if mass <= 0:
        return {}
    return {str(c): float(v) / mass for c, v in zip(model.root_causes_, total, strict=False)}
