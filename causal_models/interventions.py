"""Interventions and counterfactuals on a fitted :class:`ProbabilisticReasoner`.

``intervene(do={node: state})`` answers P(failure_type | do(...)) on the network through
pgmpy's ``CausalInference`` (graph surgery on a copy, adjustment where needed).

``what_if(trace, lr_scale=0.1, ...)`` answers for *one* run in Pearl's three steps, written
as DoWhy's gcm writes them, on the twin network of the causal core (knobs -> faults ->
root cause -> failure type):

1. **Abduction**: given everything the trace shows, the joint posterior of each fault node
   and its unobserved parents (the latent knob levels ``lr_level``, ``init_level``,
   ``input_level``: how far each knob sits from what this run tolerates, and the causes'
   latent traits). A fault node is a monotone threshold mechanism, ``F = [U < p(parents)]``
   with ``U ~ Uniform(0, 1)``, so the posterior of ``F`` pins down where this run's ``U``
   lies.
2. **Action**: the knobs change. A multiplier moves a level by ``log10(k) / LEVEL_WIDTH``
   level steps from where the run sits inside its level (:func:`_landing`: a fractional
   move splits the mass between neighbouring levels, a move of 0 keeps the level); an
   activation or normalization setting replaces that node's state; ``grad_clip=c`` sets
   the clipping node from how many of the run's recorded gradient norms ``c`` would cap
   (none: a clip above them all changes nothing; the peaks; or most steps).
3. **Prediction**: with the same ``U``, a fault present in the run stays present with
   probability ``min(p, p') / p`` and an absent one appears with ``max(0, p' - p) / (1 - p)``,
   where ``p`` and ``p'`` are P(fault | parents) before and after the action; the root
   cause and the failure type then follow their conditional tables.

So a knob that does not touch the run's fault leaves the failure in place, and a fix that
removes it removes the failure, unless another fault the action creates takes its place.
The faults are dependent given the evidence (a failing run has one root cause, which explains
the other faults away), so the abduction is stratified by the posterior root cause: within a
stratum the faults are treated as independent given their abducted posteriors, and the
strata are mixed by their posterior weights.

Consistency. Factual and counterfactual are both answered by the twin network, on one
scale: the factual world is the same abduction and prediction without an action, and a knob
at its factual value (a multiplier of 1, a clip above every recorded gradient norm, the
run's own activation) is no action at all, so a no-op returns ``p_failure ==
p_failure_factual`` exactly. The twin network's scale is not the
calibrated posterior of ``explain`` (its stratified abduction reproduces that posterior only
approximately, and the calibration map was fitted on factual verdicts, not on re-runs); the
posterior is kept in ``metadata["posterior_p_failure"]``. Putting the counterfactual on the
posterior's scale was measured and dropped: adding the twin's difference to the posterior and
calibrating it took what_if accuracy against re-runs on the zoo's seed-10 runs from 0.92 to
0.71, and multiplying the odds did worse (``docs/design-notes.md``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from causal_models import placement
from causal_models.evidence import sigmoid_decay_state
from causal_models.registry import KNOB_NODES
from causal_models.structure import LEVEL_NODES, LEVEL_WIDTH
from neuraldbg.knobs import validate_knobs
from neuraldbg.records import HEALTHY
from neuraldbg.trace import Trace

if TYPE_CHECKING:
    from causal_models.network import ProbabilisticReasoner

__all__ = ["Counterfactual", "intervene", "what_if"]

_METHOD = "abduction-action-prediction (twin network, monotone faults)"
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


def _causal_inference(reasoner: ProbabilisticReasoner) -> Any:
    cached = getattr(reasoner, "_causal", None)
    if cached is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pgmpy.inference import CausalInference

            cached = CausalInference(reasoner.network_)
        reasoner._causal = cached
    return cached


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
        fault nodes or ``root_cause``.
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
               if r in ("knob", "latent_knob", "context", "trait", "fault", "root_cause")]
    for node, value in {**do, **(evidence or {})}.items():
        if node not in states:
            raise ValueError(f"Unknown node {node!r}. Nodes that can be set: {allowed}.")
        if value not in states[node]:
            raise ValueError(f"Invalid state {value!r} for node {node!r}. Valid states are: "
                             f"{list(states[node])}.")
    for node in do:
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
    """State of the ``clipping`` node had the run's total gradient norm been clipped at
    ``clip``: compared with the run's recorded norms (:func:`causal_models.evidence.
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


def _predict(reasoner: ProbabilisticReasoner, faults: list[str], abduct_on: dict[str, str],
             evidence: dict[str, str], acted: dict[str, str], moves: dict[str, float],
             latent: set[str], classes: list[str], features: dict[str, float]
             ) -> tuple[np.ndarray, dict[str, float], dict[str, float], np.ndarray, list[str]]:
    """Abduction on ``abduct_on``, then action and prediction: outcome probabilities, the
    faults' probabilities after and before the action, the root cause after it."""
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
            state = {v: names[v][i] for v, i in zip(order, idx)}
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

    # 3. Prediction: root cause and failure type from the acted fault probabilities.
    rc_cpd = network.get_cpds("root_cause")
    weights = np.ones(1)
    for parent in rc_cpd.variables[1:]:
        q = q_new[parent]
        bern = np.array([1 - q, q]) if rc_cpd.state_names[parent][0] == "no" else np.array(
            [q, 1 - q])
        weights = np.kron(weights, bern)
    p_rc = rc_cpd.get_values() @ weights
    ft_cpd = network.get_cpds("failure_type")
    rc_names = list(rc_cpd.state_names["root_cause"])
    weights = np.ones(1)
    for parent in ft_cpd.variables[1:]:
        names = list(ft_cpd.state_names[parent])
        if parent == "root_cause":
            vec = np.array([p_rc[rc_names.index(n)] for n in names])
        else:  # observed context (e.g. the lr schedule), as acted
            vec = np.array([1.0 if n == acted.get(parent, evidence.get(parent)) else 0.0
                            for n in names])
            vec = vec if vec.sum() else np.full(len(names), 1.0 / len(names))
        weights = np.kron(weights, vec)
    p_ft = ft_cpd.get_values() @ weights
    p_ft = p_ft / p_ft.sum()
    predicted = np.array([p_ft[ft_cpd.state_names["failure_type"].index(c)] for c in classes])
    return predicted, q_new, q_old, p_rc, rc_names


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
    factual = reasoner.predict_proba(trace)[0]
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
    latent_post = {}
    for node in sorted(latent):
        order, names, values = _joint(reasoner, [node], evidence)
        latent_post[node] = {s: round(float(v), 4) for s, v in zip(names[node], values)}
    faults = sorted(n for n, r in roles.items() if r == "fault")
    # The factual world on the twin network: the same abduction and prediction without an
    # action.
    noop_raw, q_old, abduction, p_rc, rc_names, strata = _twin(
        reasoner, faults, evidence, {}, {}, latent, classes, features)
    if moves or acted:
        predicted, q_new, _, p_rc, rc_names, _ = _twin(
            reasoner, faults, evidence, acted, moves, latent, classes, features)
    else:  # a no-op: the counterfactual world is the factual one
        predicted, q_new = noop_raw, q_old
    return Counterfactual(
        knobs=dict(knobs),
        p_failure_factual=float(1.0 - noop_raw[healthy]),
        p_failure=float(1.0 - predicted[healthy]),
        failure_type=str(classes[int(np.argmax(predicted))]),
        p_failure_types={c: float(p) for c, p in zip(classes, predicted)},
        p_failure_types_factual={c: float(p) for c, p in zip(classes, noop_raw)},
        metadata={
            "method": _METHOD,
            "abduction": {"p_fault": abduction, "latent": latent_post},
            "action": {**acted, **{f"{n} (level steps)": round(v, 3)
                                   for n, v in moves.items()}},
            "prediction": {"p_fault": {f: round(q, 4) for f, q in q_new.items()},
                           "p_root_cause": {s: round(float(v), 4) for s, v in zip(
                               rc_names, p_rc)},
                           "root_cause_strata": strata,
                           "no_op": not (moves or acted)},
            "posterior_p_failure": float(1.0 - factual[healthy]),
        })


def _twin(reasoner: ProbabilisticReasoner, faults: list[str], evidence: dict[str, str],
          acted: dict[str, str], moves: dict[str, float], latent: set[str],
          classes: list[str], features: dict[str, float]
          ) -> tuple[np.ndarray, dict[str, float], dict[str, float], np.ndarray, list[str],
                     dict[str, float]]:
    """Abduction, action and prediction on the twin network, stratified by root cause.

    The faults are dependent given the evidence (co-parents of the root cause: a failing run
    has one cause, which explains the others away). Abduction is therefore stratified by the
    root cause: within each posterior root-cause state the faults are treated as
    independent, and the strata are mixed by their posterior weights.

    Returns
    -------
    tuple
        Outcome probabilities (``classes`` order), the faults' probabilities after the action
        and in the run, the root cause's distribution after it with its state names, and the
        strata's weights.
    """
    order, names, values = _joint(reasoner, ["root_cause"], evidence)
    strata = [(str(r), float(w)) for r, w in zip(names["root_cause"], values)
              if w >= _MIN_STRATUM]
    norm = sum(w for _, w in strata)
    predicted = np.zeros(len(classes))
    q_mix: dict[str, float] = dict.fromkeys(faults, 0.0)
    abduction: dict[str, float] = dict.fromkeys(faults, 0.0)
    p_rc_mix: np.ndarray | None = None
    rc_names: list[str] = []
    for cause, weight in strata:
        pred, q_new, q_old, p_rc, rc_names = _predict(
            reasoner, faults, {**evidence, "root_cause": cause}, evidence, acted, moves,
            latent, classes, features)
        w = weight / norm
        predicted += w * pred
        for f in faults:
            q_mix[f] += w * q_new[f]
            abduction[f] += w * q_old[f]
        p_rc_mix = w * p_rc if p_rc_mix is None else p_rc_mix + w * p_rc
    return (predicted, q_mix, {f: round(q, 4) for f, q in abduction.items()},
            p_rc_mix if p_rc_mix is not None else np.zeros(0), rc_names,
            {r: round(w / norm, 4) for r, w in strata})
