"""Interventions and counterfactuals on a fitted :class:`ProbabilisticReasoner`.

``intervene(do={node: state})`` answers P(failure_type | do(...)) on the network through
pgmpy's ``CausalInference`` (graph surgery on a copy, adjustment where needed).

``what_if(trace, lr_scale=0.1, ...)`` answers for *one* run, in Pearl's three steps, written
as DoWhy's gcm writes them:

1. **Abduction**: the posterior, given everything the trace shows, over the run's exogenous
   nodes: the latent knob levels (``lr_level``, ``init_level``, ``input_level``: how far each
   knob sits from what this run tolerates) and the registered causes' latent traits.
2. **Action**: the knobs change. A multiplier moves a level by ``log10(k) / LEVEL_WIDTH``
   level steps (a fractional move splits the mass between the two nearest levels); an
   activation, normalization or clipping setting replaces that node's state, mapped from the
   run's config and module table.
3. **Prediction**: P(failure_type | do(all knob nodes and traits = their acted values)),
   averaged over the abducted posterior.

The fault, root-cause and failure-type nodes are re-drawn from their conditional tables in
the prediction (their own noise is not abducted): a unit's identity is carried by its latent
knob levels and traits, which the evidence pins down.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from causal_models.registry import CONTEXT_NODES, KNOB_NODES
from causal_models.structure import LEVEL_NODES, LEVEL_WIDTH
from neuraldbg.records import HEALTHY
from neuraldbg.trace import Trace

if TYPE_CHECKING:
    from causal_models.network import ProbabilisticReasoner

__all__ = ["Counterfactual", "KNOBS", "intervene", "what_if", "validate_knobs"]

#: The contract's knobs and the values each accepts.
KNOBS: dict[str, str] = {
    "lr_scale": "a positive multiplier of every learning rate",
    "init_scale": "a positive multiplier of the initial weight matrices",
    "input_scale": "a positive multiplier of every input batch",
    "grad_clip": "a positive max total gradient norm (None: unchanged)",
    "activation": "one of ['relu', 'leaky_relu', 'gelu', 'tanh', 'sigmoid']",
    "normalization": "one of ['batch', 'layer', 'none']",
}
_ACTIVATIONS = ("relu", "leaky_relu", "gelu", "tanh", "sigmoid")
_NORMALIZATIONS = ("batch", "layer", "none")


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


def validate_knobs(knobs: dict[str, Any]) -> dict[str, Any]:
    """Check contract knob names and values; return the knobs that change something.

    Raises
    ------
    ValueError
        For an unknown knob or a value it does not accept, listing what is allowed.
    """
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise ValueError(f"Invalid knob(s) {unknown}. Valid knobs are: {list(KNOBS)}.")
    out: dict[str, Any] = {}
    for name, value in knobs.items():
        if value is None:
            continue
        if name in ("lr_scale", "init_scale", "input_scale", "grad_clip"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value > 0):
                raise ValueError(f"Invalid value {value!r} for knob {name!r}: expected "
                                 f"{KNOBS[name]}.")
            out[name] = float(value)
        elif name == "activation":
            if value not in _ACTIVATIONS:
                raise ValueError(f"Invalid value {value!r} for knob 'activation'. Valid values "
                                 f"are: {list(_ACTIVATIONS)}.")
            out[name] = value
        elif name == "normalization":
            if value not in _NORMALIZATIONS:
                raise ValueError(f"Invalid value {value!r} for knob 'normalization'. Valid "
                                 f"values are: {list(_NORMALIZATIONS)}.")
            out[name] = value
    return out


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


def _shift(dist: dict[str, float], states: tuple[str, ...], steps: float) -> dict[str, float]:
    """Move a distribution over ordered levels by a fractional number of steps."""
    out: dict[str, float] = {s: 0.0 for s in states}
    lo, frac = math.floor(steps), steps - math.floor(steps)
    for state, p in dist.items():
        i = states.index(state)
        for offset, w in ((lo, 1.0 - frac), (lo + 1, frac)):
            if w > 0:
                j = min(max(i + offset, 0), len(states) - 1)
                out[states[j]] += p * w
    return out


def _abduct(reasoner: ProbabilisticReasoner, evidence: dict[str, str],
            latent: list[str]) -> pd.DataFrame:
    """Joint posterior over the latent roots given the evidence, one row per configuration."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        factor = reasoner._engine().query(latent, evidence=evidence, joint=True,
                                          show_progress=False)
    factor = factor.copy()
    factor.normalize()
    grids = np.meshgrid(*[np.arange(len(factor.state_names[v])) for v in factor.variables],
                        indexing="ij")
    frame = pd.DataFrame({v: np.asarray(factor.state_names[v], dtype=object)[g.ravel()]
                          for v, g in zip(factor.variables, grids)})
    frame["p"] = factor.values.ravel()
    return frame[frame["p"] > 1e-6].reset_index(drop=True)


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
    changes = validate_knobs(knobs)
    states = reasoner.structure_.states
    roles = reasoner.structure_.roles
    evidence = reasoner.evidence(trace)
    factual = reasoner.predict_proba(trace)[0]
    classes = list(reasoner.classes_)

    # 1. Abduction: posterior over the run's exogenous (latent root) nodes.
    latent = [n for n, r in roles.items() if r in ("latent_knob", "trait")]
    posterior = _abduct(reasoner, evidence, latent)

    # 2. Action: the knob nodes under the intervention.
    observed_knobs = {n: evidence[n] for n, r in roles.items()
                      if r == "knob" and n in evidence}
    observed_knobs.update({n: evidence[n] for n in CONTEXT_NODES if n in evidence})
    action: dict[str, Any] = {}
    if "grad_clip" in changes:
        observed_knobs["clipping"] = "clipped"
        action["clipping"] = "clipped"
    if "activation" in changes:
        observed_knobs["activation"] = changes["activation"]
        action["activation"] = changes["activation"]
    if "normalization" in changes:
        observed_knobs["normalization"] = changes["normalization"]
        action["normalization"] = changes["normalization"]
    moves = {node: math.log10(changes[knob]) / LEVEL_WIDTH[node]
             for node, knob in LEVEL_NODES.items() if knob in changes}
    action.update({f"{node} (level steps)": round(v, 3) for node, v in moves.items()})
    acted: dict[tuple[str, ...], float] = {}
    for _, row in posterior.iterrows():
        parts: list[list[tuple[str, float]]] = []
        for node in latent:
            if node in moves:
                shifted = _shift({row[node]: 1.0}, KNOB_NODES[node], moves[node])
                parts.append([(s, w) for s, w in shifted.items() if w > 0])
            else:
                parts.append([(row[node], 1.0)])
        for combo in _product(parts):
            key = tuple(s for s, _ in combo)
            acted[key] = acted.get(key, 0.0) + float(row["p"]) * float(
                np.prod([w for _, w in combo]))

    # 3. Prediction: P(failure_type | do(acted latent levels and knobs)), averaged.
    predicted = np.zeros(len(classes))
    kept = {k: w for k, w in acted.items() if w > 1e-4}
    total = sum(kept.values())
    for key, w in kept.items():
        do = {**observed_knobs, **dict(zip(latent, key))}
        do = {n: s for n, s in do.items() if n in states}
        predicted += (w / total) * _query_do(reasoner, do, None)
    healthy = classes.index(HEALTHY)
    top = int(np.argmax(predicted))
    return Counterfactual(
        knobs=dict(knobs),
        p_failure_factual=float(1.0 - factual[healthy]),
        p_failure=float(1.0 - predicted[healthy]),
        failure_type=str(classes[top]),
        p_failure_types={c: float(p) for c, p in zip(classes, predicted)},
        p_failure_types_factual={c: float(p) for c, p in zip(classes, factual)},
        metadata={
            "method": "abduction-action-prediction",
            "abduction": {n: posterior.groupby(n)["p"].sum().round(4).to_dict() for n in latent},
            "action": action,
            "prediction": {"n_configurations": len(kept),
                           "knob_states": observed_knobs},
        })


def _product(parts: list[list[tuple[str, float]]]) -> list[list[tuple[str, float]]]:
    out: list[list[tuple[str, float]]] = [[]]
    for options in parts:
        out = [prev + [opt] for prev in out for opt in options]
    return out
