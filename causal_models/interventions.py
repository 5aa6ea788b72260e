"""do() on a fitted reasoner: P(failure_type | do(node = state), evidence).

Answered on the network through pgmpy's ``CausalInference`` (graph surgery on a copy,
adjustment where needed), on knob, context, trait, fault, root-cause and slice nodes. The
counterfactual ``what_if`` for one run is in :mod:`causal_models.counterfactuals`.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd

from causal_models.backend import network_cache
from causal_models.fitted import FittedModel, check_is_fitted

__all__ = ["intervene"]

#: Node roles that do() may set.
SETTABLE_ROLES = ("knob", "latent_knob", "context", "trait", "fault", "root_cause", "slice")


def _causal_inference(reasoner: FittedModel) -> Any:
    """The fitted network's pgmpy ``CausalInference``, built once per network."""
    cache = network_cache(reasoner.network_)
    if "causal" not in cache:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pgmpy.inference import CausalInference

            cache["causal"] = CausalInference(reasoner.network_)
    return cache["causal"]


def _query_do(reasoner: FittedModel, do: dict[str, str],
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


def intervene(reasoner: FittedModel, do: dict[str, str],
              evidence: dict[str, str] | None = None) -> pd.Series:
    """P(failure_type | do(node = state, ...), evidence) on the fitted network.

    Parameters
    ----------
    reasoner : FittedModel
        A fitted reasoner.
    do : dict of str to str
        Nodes to set and their states: knob nodes (``lr_level``, ``init_level``,
        ``input_level``, ``activation``, ``normalization``, ``clipping``), context, traits,
        fault nodes, ``root_cause``, or a layer state of one slice (``grad[0]@1``: graph
        surgery cuts the node from its parents, so the failure downstream moves and the
        causes upstream do not).
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
    check_is_fitted(reasoner)
    states = reasoner.structure_.states
    allowed = [n for n, r in reasoner.structure_.roles.items() if r in SETTABLE_ROLES]
    for node, value in {**do, **(evidence or {})}.items():
        if node not in states:
            raise ValueError(f"Unknown node {node!r}. Nodes that can be set: {allowed}.")
        if value not in states[node]:
            raise ValueError(f"Invalid state {value!r} for node {node!r}. Valid states are: "
                             f"{list(states[node])}.")
    for node in do:
        if node in (evidence or {}):
            raise ValueError(f"{node!r} is both set by do() and observed in evidence; "
                             "an intervened node is not evidence. Drop it from one of them.")
        if node not in allowed:
            raise ValueError(f"do() on {node!r} is not supported. Nodes that can be set: "
                             f"{allowed}.")
    return pd.Series(_query_do(reasoner, dict(do), evidence), index=reasoner.classes_,
                     name="p")
