"""Placing a run inside its knob level (unit tests of ``fit_placement`` and ``offset``)."""

from __future__ import annotations

import math

from causal_models.placement import fit_placement, offset


def _rows(level: str, values: list[float], schedule: str = "steady") -> list[dict]:
    return [{"lr_level": level, "lr_schedule": schedule, "feature:update": v} for v in values]


def test_fit_placement_takes_each_levels_median_and_skips_sparse_or_spiked_runs() -> None:
    rows = (_rows("ok", [-2.1, -2.0, -1.9]) + _rows("high", [-1.2, -1.0, -0.8])
            + _rows("very_high", [0.0, 0.1])  # too few runs: left out
            + _rows("low", [5.0, 5.0, 5.0], schedule="spike")  # a spike's update is not read
            + [{"lr_level": "ok", "lr_schedule": "steady", "feature:update": math.nan}])
    medians = fit_placement(rows)["lr_level"]
    assert medians == {"ok": -2.0, "high": -1.0}


def test_fit_placement_medians_never_decrease_along_the_levels() -> None:
    rows = _rows("low", [-1.0] * 3) + _rows("ok", [-2.0] * 3) + _rows("high", [0.0] * 3)
    assert fit_placement(rows)["lr_level"] == {"low": -1.0, "ok": -1.0, "high": 0.0}


def test_offset_interpolates_the_feature_between_level_medians_within_half_a_level() -> None:
    placement = {"lr_level": {"ok": -2.0, "high": -1.0}}
    steady = {"lr_schedule": "steady"}
    assert offset(placement, "lr_level", "ok", {"update": -1.75}, steady) == 0.25
    assert offset(placement, "lr_level", "high", {"update": -1.75}, steady) == -0.5
    assert offset(placement, "lr_level", "ok", {"update": -2.0}, steady) == 0.0
    # missing feature (or a spike without its peak), or no fitted medians: the centre
    assert offset(placement, "lr_level", "ok", {"update": math.nan}, steady) == 0.0
    spike = {"lr_schedule": "spike"}
    assert offset(placement, "lr_level", "ok", {"update": -2.0, "lr_peak": 0.25}, spike) == 0.25
    assert offset(placement, "lr_level", "ok", {"update": -1.75}, spike) == 0.0
    assert offset(placement, "init_level", "ok", {"fwd_gain": 3.0}, steady) == 0.0


def test_the_shipped_model_carries_its_fitted_level_medians() -> None:
    import causal_models

    placement = causal_models.load_default_model().placement_
    lr = placement["lr_level"]
    assert {"ok", "high"} <= set(lr)
    assert lr["ok"] <= lr["high"]
