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
#: The open ends of each level node that the feature keeps placing a run beyond (``"low"``:
#: below the first level's median, ``"high"``: above the last one's), with the decades of the
#: feature per decade of the knob where the mechanism fixes them (None: the slope of the two
#: outermost medians). The update ratio is proportional to a learning rate too low (SGD's
#: step is the rate times the gradient, Adam's the rate times a unit-scale direction), but a
#: rate too high is read in the first steps of its blow-up, which inflate it (the zoo's
#: ``high`` and ``very_high`` medians lie 0.36 decade apart, a level being one): above the
#: top median it does not say how far. The first layer's output is proportional to the
#: input scale. The forward gain grows with the init scale by a power that depends on depth,
#: so the zoo's slope misplaces a deeper or shallower net: a 10x larger init of the zoo's
#: init_too_small run (a fix) was placed two levels short of "ok"; the init levels stay
#: closed.
_OPEN_ENDS: dict[str, dict[str, float | None]] = {
    "lr_level": {"low": 1.0}, "input_level": {"high": 1.0}}
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

    Its feature against the levels' fitted medians (``placement``, from
    :func:`fit_placement`), interpolated between them; 0 (the centre) when the feature is
    missing or does not apply. Within +-0.5, except on the open side of an end level
    (:data:`_OPEN_ENDS`): the first level (``very_low``) holds every rate below it, so a run
    whose feature lies beyond that level's median is placed beyond its centre, by the
    feature's distance at the mechanism's slope. A rate three decades below the usual one
    then needs a 1,000x rise, not a 10x one, to reach "ok".
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
    position = float(np.interp(x, meds, idx))
    last = len(states) - 1
    ends = dict(_OPEN_ENDS.get(node, {}))
    if node == "lr_level" and evidence.get("start_grad") == "small":
        # under SGD, gradients tiny from the first step (dead or starved units) make the
        # update ratio tiny at any rate: it does not say how far below the level the rate
        # is (the zoo's compound dead-and-slow run read three decades below it)
        ends.pop("low", None)
    # beyond an open end's median: from that median, at the mechanism's slope (level steps
    # per decade of the feature) or else that of the two outermost medians
    for side, edge, inner, beyond in (("low", 0, 1, x < meds[0]),
                                      ("high", -1, -2, x > meds[-1])):
        if side in ends and idx[edge] == (0 if side == "low" else last) and beyond:
            per_decade = ends[side]
            slope = (per_decade / LEVEL_WIDTH[node] if per_decade
                     else (idx[edge] - idx[inner]) / (meds[edge] - meds[inner]))
            position = float(idx[edge] + (x - meds[edge]) * slope)
    i = states.index(state)
    return float(np.clip(position + lift - i, -math.inf if i == 0 and "low" in ends else -0.5,
                         math.inf if i == last and "high" in ends else 0.5))
