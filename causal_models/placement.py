"""Where a run sits inside its knob level: the continuous features that place it.

The latent level nodes (``lr_level``, ``init_level``, ``input_level``) are one decade (half a
decade for the init scale) wide, so a run at the centre of an abducted level and one at its
edge answer a multiplier differently: a tenfold cut from a rate just inside "high" lands in
"ok", one from the centre of "high" at the boundary. ``fit`` keeps, per level, the median of a
continuous feature over the fitting runs labelled with it (:func:`fit_placement`);
``what_if`` interpolates the run's own feature between those medians (:func:`offset`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from causal_models.registry import KNOB_NODES
from causal_models.structure import LEVEL_WIDTH

__all__ = ["PLACEMENT_FEATURES", "fit_placement", "offset"]

#: Latent level node -> the continuous evidence feature (discretize's ``features``) that places
#: a run inside its level, and the ``lr_schedule`` its medians are fitted on (None: any). The
#: early update ratio reads a steady rate; a spiked run is placed from it lifted by the
#: spike's recorded peak over the median rate (``lr_peak``, decades).
PLACEMENT_FEATURES: dict[str, tuple[str, str | None]] = {
    "lr_level": ("update", "steady"), "init_level": ("fwd_gain", None),
    "input_level": ("input_mag", None)}
#: Fewest fitting runs of a level for its median feature to place runs.
_MIN_PLACED = 3


def fit_placement(rows: list[dict[str, Any]], weights: np.ndarray | None = None
                  ) -> dict[str, dict[str, float]]:
    """Each level's median feature over the fitting runs labelled with it.

    ``rows`` hold a fitting run's level labels (``training_labels``), its evidence states and
    its continuous features under ``"feature:NAME"``. Levels with fewer than
    ``_MIN_PLACED`` runs with a finite feature are left out; the medians are made
    non-decreasing along the level order (the features grow with the level).

    Returns
    -------
    dict
        ``{level node: {level state: median feature}}``.
    """
    out: dict[str, dict[str, float]] = {}
    for node, (feature, schedule) in PLACEMENT_FEATURES.items():
        medians: dict[str, float] = {}
        for state in KNOB_NODES[node]:
            vals = [float(r[f"feature:{feature}"]) for r in rows
                    if r.get(node) == state and math.isfinite(float(
                        r.get(f"feature:{feature}", math.nan)))
                    and (schedule is None or r.get("lr_schedule") == schedule)]
            if len(vals) >= _MIN_PLACED:
                medians[state] = float(np.median(vals))
        running = -math.inf
        for state in KNOB_NODES[node]:
            if state in medians:
                running = max(running, medians[state])
                medians[state] = running
        if len(medians) >= 2:
            out[node] = medians
    return out


def offset(placement: Mapping[str, Mapping[str, float]], node: str, state: str,
           features: dict[str, float], evidence: dict[str, str]) -> float:
    """Where the run sits inside level ``state`` of ``node``, in level steps from its centre.

    Within +-0.5: its feature against the levels' fitted medians (``placement``, from
    :func:`fit_placement`), interpolated between them; 0 (the centre) when the feature is
    missing or does not apply.
    """
    medians = placement.get(node)
    feature, schedule = PLACEMENT_FEATURES[node]
    x = features.get(feature, math.nan)
    # a spiked schedule: the steady rate is read as usual, and the spike lifts it by its
    # recorded peak over the median rate, in level steps
    lift = (features.get("lr_peak", math.nan) / LEVEL_WIDTH[node]
            if schedule == "steady" and evidence.get("lr_schedule") == "spike" else 0.0)
    if not medians or not math.isfinite(x) or not math.isfinite(lift):
        return 0.0
    states = KNOB_NODES[node]
    idx = np.array([states.index(s) for s in medians], dtype=float)
    meds = np.array(list(medians.values()), dtype=float)
    if np.any(np.diff(meds) <= 0):  # flat stretches: keep the first level of each value
        keep = np.concatenate([[True], np.diff(meds) > 0])
        idx, meds = idx[keep], meds[keep]
    if len(meds) < 2:
        return 0.0
    position = float(np.interp(x, meds, idx)) + lift
    return float(np.clip(position - states.index(state), -0.5, 0.5))
