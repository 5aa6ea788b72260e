"""Persistence of a fitted reasoner as plain JSON (no pickle).

The file holds the hyperparameters, the network's states and parents, every conditional
table as nested lists, the calibrator and what the model was fitted on. Loading rebuilds the
pgmpy network from those tables; nothing in the file can run code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from causal_models.backend import import_pgmpy, new_network
from causal_models.bins import Bins
from causal_models.calibration import Calibrator
from causal_models.fitted import FittedModel, check_is_fitted
from causal_models.structure import Structure
from causal_models.support import SUPPORT_COLUMNS

__all__ = ["MODEL_FORMAT", "MODEL_VERSION", "model_to_dict", "model_from_dict"]

MODEL_FORMAT = "neuraldbg-causal-model"
MODEL_VERSION = 2

M = TypeVar("M", bound=FittedModel)


def model_to_dict(reasoner: FittedModel) -> dict[str, Any]:
    """JSON-compatible form of a fitted reasoner."""
    check_is_fitted(reasoner)
    s = reasoner.structure_
    cpds = {}
    for node in s.states:
        cpd = reasoner.network_.get_cpds(node)
        cpds[node] = {"evidence": list(cpd.variables[1:]),
                      "values": np.round(cpd.get_values(), 8).tolist()}
    params = {k: v for k, v in reasoner.get_params().items() if k != "bins"}
    params["bins"] = None if reasoner.bins is None else {
        f: getattr(reasoner.bins, f) for f in reasoner.bins.__dataclass_fields__}
    return {"format": MODEL_FORMAT, "version": MODEL_VERSION, "params": params,
            "states": {n: list(v) for n, v in s.states.items()},
            "parents": {n: list(v) for n, v in s.parents.items()},
            "roles": dict(s.roles), "cpds": cpds,
            "calibrator": reasoner.calibrator_.to_dict(),
            "placement": {n: dict(m) for n, m in getattr(reasoner, "placement_", {}).items()},
            "fit": {"n_traces": reasoner.n_fit_traces_, "families": reasoner.fit_families_},
            "support": reasoner.support_.to_dict(orient="records")
            if hasattr(reasoner, "support_") else []}


def model_from_dict(cls: Callable[..., M], data: dict[str, Any]) -> M:
    """Inverse of :func:`model_to_dict`.

    Parameters
    ----------
    cls : callable
        The reasoner class: ``cls(**params)`` makes the unfitted reasoner the tables go into.
    data : dict
        What :func:`model_to_dict` wrote.

    Raises
    ------
    ValueError
        If ``data`` is not a NeuralDBG causal model or was written by a newer version.
    """
    if data.get("format") != MODEL_FORMAT:
        raise ValueError(f"Not a NeuralDBG causal model (format {data.get('format')!r}, "
                         f"expected {MODEL_FORMAT!r}).")
    if int(data.get("version", 0)) > MODEL_VERSION:
        raise ValueError(f"Model version {data.get('version')} is newer than the "
                         f"{MODEL_VERSION} this causal_models reads; upgrade neuraldbg.")
    if int(data.get("version", 0)) < MODEL_VERSION:
        raise ValueError(f"Model version {data.get('version')} predates the causal direction "
                         f"of version {MODEL_VERSION} (knobs -> layer states -> failure); "
                         "re-fit it with `python -m benchmarks.fit_default` or "
                         "ProbabilisticReasoner().fit(traces).")
    params = dict(data["params"])
    if params.get("bins") is not None:
        b = params["bins"]
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                  for k, v in b.items()}
        params["bins"] = Bins(**fields)
    reasoner = cls(**params)
    _, _, _, TabularCPD = import_pgmpy(estimators=False)
    states = {n: tuple(v) for n, v in data["states"].items()}
    parents = {n: tuple(v) for n, v in data["parents"].items()}
    reasoner.structure_ = Structure(states=states, parents=parents, roles=dict(data["roles"]),
                                prior={}, n_slices=reasoner.n_time_slices,
                                n_blocks=reasoner.n_blocks)
    model = new_network(states, reasoner.structure_.edges)
    cpds = []
    for node, entry in data["cpds"].items():
        ev = entry["evidence"]
        cpds.append(TabularCPD(node, len(states[node]), np.asarray(entry["values"]),
                               evidence=ev or None,
                               evidence_card=[len(states[e]) for e in ev] or None,
                               state_names={v: list(states[v]) for v in [node, *ev]}))
    model.add_cpds(*cpds)
    reasoner.network_ = model
    reasoner.classes_ = np.array(states["failure_type"], dtype=object)
    reasoner.root_causes_ = np.array(states["root_cause"], dtype=object)
    reasoner.calibrator_ = Calibrator.from_dict(data["calibrator"])
    reasoner.n_fit_traces_ = int(data["fit"]["n_traces"])
    reasoner.fit_families_ = list(data["fit"]["families"])
    reasoner.placement_ = {n: {k: float(v) for k, v in m.items()}
                           for n, m in (data.get("placement") or {}).items()}
    reasoner.support_ = pd.DataFrame(data.get("support") or [], columns=list(SUPPORT_COLUMNS))
    return reasoner
