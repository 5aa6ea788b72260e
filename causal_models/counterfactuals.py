"""Counterfactuals on a fitted reasoner (do() is in :mod:`causal_models.interventions`).

``what_if(trace, lr_scale=0.1, ...)`` answers for *one* run in Pearl's three steps, on the
twin network, through the whole causal chain knobs -> faults -> root cause -> layer states of
every slice -> failure type:

1. **Abduction**: the exogenous noise of every node, from everything the trace shows. A
   fault node is a monotone threshold mechanism, ``F = [U < p(parents)]``; its posterior and
   that of its unobserved parents (the latent knob levels ``lr_level``, ``init_level``,
   ``input_level``, the causes' latent traits) pin down where this run's ``U`` lies. Every
   other node is read through its table: the root cause from the faults
   (:func:`.root_cause_under`), and each slice's loss, gradient and activation states, the
   failure those states do not show and the failure type as Gumbel-max mechanisms
   ``X = argmax_j (log P(j | parents) + G_j)``, whose noise ``G`` is drawn given the state
   the run showed under the parents it had (:mod:`causal_models.mechanisms`). (A discrete
   table does not identify its noise; the Gumbel-max choice needs no order on the states
   and keeps a node's state whenever its parents keep theirs, which is what makes a no-op
   exact.)
2. **Action**: the knobs change. A multiplier moves a level by ``log10(k) / LEVEL_WIDTH``
   level steps from where the run sits inside its level (:func:`_landing`); an activation
   or normalization setting replaces that node's state; ``grad_clip=c`` sets the clipping
   node from how many of the run's recorded gradient norms ``c`` would cap (none: a clip
   above them all changes nothing; the peaks; or most steps).
3. **Prediction**, with the same noise: a fault present in the run stays with probability
   ``min(p, p') / p`` and an absent one appears with ``max(0, p' - p) / (1 - p)``
   (:func:`_faults_under`); the run's root cause stays unless its fault goes or another
   appears (:func:`.root_cause_under`); under a new root cause the slice states are
   recomputed slice by slice and the failure type from the last slice
   (:func:`.failure_under`, noise samples from a fixed seed).

The faults are dependent given the evidence (a failing run has one root cause, which
explains the other faults away), so the abduction is stratified by the posterior root cause,
and the strata are mixed by their posterior weights. A run that fails has a cause, as
``explain`` reads the posterior (:func:`.cause_given_failure`): the mass the network leaves
on a failure with root cause ``none``, a failure no knob could touch, goes to the causes in
proportion to their share of that failure (:func:`_strata`).

Consistency. The factual answer is the network's calibrated posterior, and the
counterfactual is that posterior with each stratum's prediction in place of its factual
share, both taken through the same calibration map (:func:`_shifted`), so they are on one
scale; an action that moves nothing (a multiplier of 1, a clip above every recorded
gradient norm, the run's own activation) returns ``p_failure == p_failure_factual`` exactly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from causal_models import placement
from causal_models.backend import normalised_joint
from causal_models.evidence import clip_share, clipping_state, sigmoid_decay_state
from causal_models.explanation import cause_given_failure
from causal_models.fitted import FittedModel, check_is_fitted
from causal_models.mechanisms import failure_under, root_cause_under
from causal_models.registry import KNOB_NODES
from causal_models.structure import LEVEL_NODES, LEVEL_WIDTH
from neuraldbg.knobs import validate_knobs
from neuraldbg.records import HEALTHY
from neuraldbg.trace import Trace

__all__ = ["Counterfactual", "what_if"]

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
        The outcome under the intervention: ``"healthy"`` when ``p_failure < 0.5``, else the
        most probable failure type.
    p_failure_types : dict of str to float
        Distribution over outcomes under the intervention.
    p_failure_types_factual : dict of str to float
        Posterior over outcomes for the run as it happened.
    metadata : dict
        The three steps: ``abduction`` (posterior over latent nodes), ``action`` (node states
        set or level moves) and ``prediction`` details; ``cause_shares``, P(root cause |
        the run fails), and ``cause_undetermined``, a sentence, when no known cause takes
        half of it (the answer then says little).
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


def _landing(states: tuple[str, ...], state: str, offset: float, steps: float
             ) -> dict[str, float]:
    """Where a run in level ``state`` lands when its knob moves by ``steps`` level steps.

    Abduction placed the run in ``state``, at ``offset`` level steps from the level's centre
    (:func:`causal_models.placement.offset`: within +-0.5, or beyond the centre of an end
    level on its open side). Its exact position is uncertain: uniform over the part of the
    level that lies within half a level of that place (an end level reaches to infinity on
    its open side). The move shifts that interval, and each level gets the share of it that
    falls inside the level (the end levels take what falls beyond them). A move of 0 keeps
    the run in ``state`` exactly, so an action that does not move the knob changes nothing;
    the answer is continuous and monotone in ``steps``; with ``offset`` 0 it is the linear
    split between the two nearest levels.
    """
    i = states.index(state)
    place = i + offset
    lo = place - 0.5 if i == 0 else max(i - 0.5, place - 0.5)
    hi = place + 0.5 if i == len(states) - 1 else min(i + 0.5, place + 0.5)
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


def _joint(reasoner: FittedModel, variables: list[str],
           evidence: dict[str, str]) -> tuple[list[str], dict[str, list[str]], np.ndarray]:
    """Normalised joint posterior of ``variables`` (VE): (order, state names, values)."""
    factor = normalised_joint(reasoner.inference(), variables, evidence)
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
                    reasoner: FittedModel) -> str:
    """State of the ``clipping`` node had the run's total gradient norm been clipped at ``c``.

    Compared with the run's recorded norms (:func:`causal_models.evidence.
    clip_share`), a clip above every norm changes nothing, one that caps the bursts only
    is ``peaks``, one that caps most steps ``tight``.

    A run already clipped at ``c0`` recorded its norms after that cap: its own clip or a
    looser one cannot be judged from them, and keeps the run's observed clipping state. On
    a run not clipped, a clip above every recorded (finite) norm never bites and keeps it
    too, however close to the largest norm it lies (``clip_share`` counts a norm from
    ``clip_engage`` of the clip as capped, which is for norms recorded at a cap).
    """
    bins = reasoner.bins
    factual = evidence.get("clipping", "none")
    configured = (trace.meta.get("config") or {}).get("grad_clip")
    cap = float(configured) if isinstance(configured, (int, float)) and configured > 0 else None
    if cap is not None and clip >= cap:
        return factual
    norms = trace.steps["grad_norm"].to_numpy(dtype=float) if "grad_norm" in trace.steps \
        else np.zeros(0)
    if not norms.size:
        return "peaks"
    finite = norms[np.isfinite(norms)]
    if cap is None and (not finite.size or clip > finite.max()):
        return factual
    return clipping_state(clip_share(norms, clip, bins), bins)


def _faults_under(reasoner: FittedModel, faults: list[str],
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
                    reasoner.placement_, h, state[h], features, evidence), moves[h]) if h in moves
                    else {state[h]: 1.0})
                options = [({**a, h: s}, wa * ws) for a, wa in options
                           for s, ws in dist.items() if ws > 0]
            for assign, wa in options:
                total += w * wa * _cf_yes(f, p, _p_yes(cpd, {**after, **assign}))
        q_new[fault], q_old[fault] = total, present

    return q_new, q_old


def _run_features(reasoner: FittedModel, trace: Trace) -> dict[str, float]:
    """The run's continuous features, with ``lr_peak``: decades of its peak rate over the median."""
    features = dict(reasoner.observe(trace).features)
    rates = trace.steps["lr"].to_numpy(dtype=float) if "lr" in trace.steps else np.zeros(0)
    rates = rates[np.isfinite(rates) & (rates > 0)]
    features["lr_peak"] = float(np.log10(rates.max() / np.median(rates))) if rates.size \
        else math.nan
    return features


def _action(reasoner: FittedModel, trace: Trace, changes: dict[str, Any],
            evidence: dict[str, str], features: dict[str, float]
            ) -> tuple[dict[str, str], dict[str, float]]:
    """The intervention as node states set (``acted``) and level moves (``moves``).

    A knob at its factual value moves nothing: a multiplier of 1, a clip that never bites,
    a setting the run already had.
    """
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
    moves = {n: v for n, v in moves.items() if v != 0.0}
    acted = {n: v for n, v in acted.items() if evidence.get(n) != v}
    return acted, moves


def what_if(reasoner: FittedModel, trace: Trace, **knobs: Any) -> Counterfactual:
    """P(failure) of this run had the knobs been different (abduction, action, prediction).

    Answers from the recorded trace and the fitted network; nothing is re-trained.

    Parameters
    ----------
    reasoner : FittedModel
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
    check_is_fitted(reasoner)
    changes = validate_knobs(**knobs)
    roles = reasoner.structure_.roles
    evidence = reasoner.evidence(trace)
    features = _run_features(reasoner, trace)
    classes = list(reasoner.classes_)
    healthy = classes.index(HEALTHY)
    latent = {n for n, r in roles.items() if r in ("latent_knob", "trait")}
    # 2. Action (the node states under the intervention), set up first: abduction needs
    # to know which parents move.
    acted, moves = _action(reasoner, trace, changes, evidence, features)
    no_op = not (moves or acted)
    raw = reasoner.raw_proba(trace)
    faults = sorted(n for n, r in roles.items() if r == "fault")
    abduction: dict[str, Any] = {}
    prediction: dict[str, Any] = {}
    strata = _strata(reasoner, evidence)
    moved: list[tuple[float, np.ndarray, np.ndarray]] = []
    if not no_op:
        moved, abduction, prediction = _twin(reasoner, faults, evidence, acted, moves, latent,
                                             features, strata)
    factual = reasoner.calibrator_.transform(raw[None])[0]
    cf_raw = _shifted(raw, moved)
    predicted = factual if no_op else _shifted(factual, [
        (w, *reasoner.calibrator_.transform(np.stack([before, after]))) for w, before, after
        in moved])
    return Counterfactual(
        knobs=dict(knobs),
        p_failure_factual=float(1.0 - factual[healthy]),
        p_failure=float(1.0 - predicted[healthy]),
        failure_type=_outcome(predicted, classes, healthy),
        p_failure_types={c: float(p) for c, p in zip(classes, predicted, strict=False)},
        p_failure_types_factual={c: float(p) for c, p in zip(classes, factual, strict=False)},
        metadata={
            "method": _METHOD,
            "abduction": abduction,
            "action": {**acted, **{f"{n} (level steps)": round(v, 3)
                                   for n, v in moves.items()}},
            "prediction": prediction,
            "no_op": no_op,
            **_cause_shares(*strata, healthy),
            "raw_p_failure_factual": float(1.0 - raw[healthy]),
            "raw_p_failure": float(1.0 - cf_raw[healthy]),
        })


def _shifted(proba: np.ndarray, moved: list[tuple[float, np.ndarray, np.ndarray]]
             ) -> np.ndarray:
    """``proba`` with each stratum's prediction in place of its factual share.

    ``moved`` holds (stratum weight, the stratum's factual P(failure type), its prediction
    under the action); the result is ``proba + sum(weight * (after - before))``, clipped at
    0 and renormalised.

    The counterfactual takes the strata's moves on the calibrated scale, each stratum's
    factual and predicted distribution through the calibration map, and adds them to the
    calibrated factual posterior. The map is fitted on whole posteriors whose top class is
    right more often than it says, and sharpens them (raw 0.79 -> 0.997); a mixture of
    causes the model cannot tell apart is a different uncertainty. Moved as one raw vector
    through the map, a rate change that fixes a run only under one cause with 29% of the
    posterior still read 0.997 for "fails anyway" (a sigmoid autoencoder under BCE at SGD
    0.01, which re-ran healthy at 10x the rate); moved stratum by stratum, that cause's
    share of P(failure) goes, and the answer says how much the model does not know.
    """
    out = proba.astype(float).copy()
    for weight, before, after in moved:
        out += weight * (after - before)
    out = np.clip(out, 0.0, None)
    return out / out.sum()


def _strata(reasoner: FittedModel, evidence: dict[str, str]) -> tuple[list[str], np.ndarray]:
    """The abduction's strata: P(root cause, failure type | trace), a failing run with a cause.

    ``none`` is the root cause of a healthy run, and a run that fails has a cause
    (registered or ``unknown``), as :func:`.cause_given_failure` reads it for ``explain``.
    The network cannot say so itself (the root cause reaches the failure type through the
    slice states, and directly only through the failure those states do not show), so part
    of a failure's posterior lies on ``none``: a failure with no cause, which no knob could
    touch. That mass goes to the causes in proportion to their share of the failure, so a
    counterfactual reasons over the causes ``explain`` names.
    Each failure type's total, and so the factual posterior, is unchanged.

    Returns
    -------
    causes : list of str
        The root-cause states (rows).
    joint : numpy.ndarray of shape (n_causes, n_classes)
        The joint posterior, columns in ``classes_`` order.
    """
    order, names, values = _joint(reasoner, ["root_cause", "failure_type"], evidence)
    if order[0] != "root_cause":
        values = values.T
    classes = list(reasoner.classes_)
    joint = values[:, [names["failure_type"].index(c) for c in classes]].copy()
    causes = np.asarray(names["root_cause"])
    for f, name in enumerate(classes):
        if name == HEALTHY:
            continue
        given = cause_given_failure(joint[:, f], causes)
        if given.sum() > 0:
            joint[:, f] = given * joint[:, f].sum()
    return [str(c) for c in causes], joint


#: The root-cause state of a failure no registered cause explains.
_UNKNOWN = "unknown"


def _cause_shares(causes: list[str], joint: np.ndarray, healthy: int) -> dict[str, Any]:
    """P(root cause | the run fails), and a caution when no known cause takes half of it.

    ``{"cause_shares": {cause: share}}`` (shares from 0.01), with ``"cause_undetermined"``,
    a sentence, when the run failed (raw P(failure) >= 0.5) and no cause but ``unknown``
    reaches 0.5: the answer then mixes the strata, a change aimed at one cause moves only
    that cause's share of P(failure), and no knob acts on an unknown cause, so a P(failure)
    that stays high is the model not knowing, not a prediction. ``explain`` names such a
    failure ``unknown``. On probe23's user runs whose cause read unknown, the fix a user
    would try re-ran healthy on 6 of 9 while ``what_if`` said 0.99.
    """
    failing = np.delete(joint, healthy, axis=1).sum(axis=1)
    total = float(failing.sum())
    if total <= 0:
        return {"cause_shares": {}}
    shares = {c: float(v / total) for c, v in zip(causes, failing, strict=True)}
    out: dict[str, Any] = {"cause_shares": {c: round(v, 4) for c, v in sorted(
        shares.items(), key=lambda kv: -kv[1]) if v >= 0.01}}
    failed = total >= 0.5 * float(joint.sum())  # the cause of a failure the run showed
    if failed and max((v for c, v in shares.items() if c != _UNKNOWN), default=0.0) < 0.5:
        top = ", ".join(f"{c} {v:.0%}" for c, v in list(out["cause_shares"].items())[:3])
        out["cause_undetermined"] = (
            f"the model does not single out this failure's cause ({top}): a change aimed at "
            "one cause moves only its share of P(failure), and no knob acts on an unknown "
            "cause, so a P(failure) that stays high means the model cannot tell")
    return out


def _outcome(proba: np.ndarray, classes: list[str], healthy: int) -> str:
    """The outcome ``p_failure`` reads: the most probable failure type if the run fails.

    ``p_failure >= 0.5`` is a failure, named by its most probable type even when "healthy"
    is the single most probable class (0.50 spread over six types against 0.497 healthy);
    below 0.5 the run is healthy.
    """
    if 1.0 - proba[healthy] < 0.5:
        return HEALTHY
    failing = proba.copy()
    failing[healthy] = -np.inf
    return str(classes[int(np.argmax(failing))])


def _twin(reasoner: FittedModel, faults: list[str], evidence: dict[str, str],
          acted: dict[str, str], moves: dict[str, float], latent: set[str],
          features: dict[str, float], strata: tuple[list[str], np.ndarray]
          ) -> tuple[list[tuple[float, np.ndarray, np.ndarray]], dict[str, Any], dict[str, Any]]:
    """Abduction, action and prediction on the twin network, stratified by root cause.

    The faults are dependent given the evidence (co-parents of the root cause: a failing run
    has one cause, which explains the others away), so abduction is stratified by the root
    cause: within each posterior root-cause state the faults are treated as independent.
    In each stratum the action moves the faults (:func:`_faults_under`), the faults move the
    root cause (:func:`.root_cause_under`), the root cause moves the slice states and those
    the failure type (:func:`.failure_under`), every node keeping its abducted noise.

    Returns
    -------
    moved : list of (float, numpy.ndarray, numpy.ndarray)
        Per stratum with posterior weight >= ``_MIN_STRATUM`` (the lighter strata are left
        as they are): its weight, its factual P(failure type) and its prediction under the
        action (``classes_`` order).
    abduction : dict
        The root-cause strata's posterior weights and, per stratum, the faults' posteriors.
    prediction : dict
        Per stratum: the faults and the root cause after the action, and P(failure).
    """
    classes = list(reasoner.classes_)
    causes, joint = strata
    moved: list[tuple[float, np.ndarray, np.ndarray]] = []
    abduction: dict[str, Any] = {"root_cause": {}, "p_fault": {}}
    prediction: dict[str, Any] = {"p_fault": {}, "root_cause": {}, "p_failure": {}}
    for cause, row in zip(causes, joint, strict=False):
        weight = float(row.sum())
        if weight < _MIN_STRATUM:
            continue
        stratum = {**evidence, "root_cause": str(cause)}
        q_new, q_old = _faults_under(reasoner, faults, stratum, evidence, acted, moves, latent,
                                     features)
        new_causes = root_cause_under(reasoner, str(cause), q_new, q_old)
        p_ft = row / weight
        after = failure_under(reasoner, evidence, str(cause), p_ft, new_causes)
        moved.append((weight, p_ft, after))
        key = str(cause)
        abduction["root_cause"][key] = round(weight, 4)
        abduction["p_fault"][key] = {f: round(q_old[f], 4) for f in faults if q_old[f] >= 0.01}
        prediction["p_fault"][key] = {f: round(q_new[f], 4) for f in faults
                                      if max(q_new[f], q_old[f]) >= 0.01}
        prediction["root_cause"][key] = {r: round(w, 4) for r, w in new_causes.items()
                                         if w >= 0.001}
        prediction["p_failure"][key] = round(float(1.0 - after[classes.index(HEALTHY)]), 4)
    return moved, abduction, prediction
