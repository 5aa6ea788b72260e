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


def test_an_end_level_places_a_run_beyond_its_median_at_the_mechanisms_slope() -> None:
    """``very_low`` holds every rate below it: a run whose update ratio lies 1.5 decades
    under that level's median sits 1.5 level steps below its centre (the update ratio is
    proportional to the rate), where an interior level clips at half a step."""
    placement = {"lr_level": {"very_low": -4.0, "low": -3.0, "ok": -2.0, "high": -1.0,
                              "very_high": 0.0}}
    steady = {"lr_schedule": "steady"}
    assert offset(placement, "lr_level", "very_low", {"update": -5.5}, steady) == -1.5
    # a rate too high is read in its blow-up's first steps: above the top median the
    # update ratio does not say how far, and the run stays at that median
    assert offset(placement, "lr_level", "very_high", {"update": 0.75}, steady) == 0.0
    assert offset(placement, "lr_level", "low", {"update": -5.5}, steady) == -0.5
    # the inner side of an end level still clips at half a step
    assert offset(placement, "lr_level", "very_low", {"update": -2.0}, steady) == 0.5
    # the forward gain's slope depends on depth: the init levels stay closed
    init = {"init_level": {"very_small": -4.0, "small": -2.0, "ok": 0.0}}
    assert offset(init, "init_level", "very_small", {"fwd_gain": -5.0}, steady) == 0.0
    # SGD with gradients tiny from the start: the update ratio does not read the rate
    starved = {"lr_schedule": "steady", "start_grad": "small"}
    assert offset(placement, "lr_level", "very_low", {"update": -5.5}, starved) == 0.0
    inputs = {"input_level": {"ok": -0.25, "very_large": 1.5}}
    assert offset(inputs, "input_level", "very_large", {"input_mag": 2.5}, steady) == 1.0


def test_a_run_placed_beyond_an_end_level_lands_as_far_as_it_moves() -> None:
    """1.2 steps below ``very_low``'s centre, a 3-step rise lands in ``ok`` and a 1-step
    rise stays mostly in ``very_low``; no move keeps it exactly where it was."""
    from causal_models.counterfactuals import _landing

    states = ("very_low", "low", "ok", "high", "very_high")
    assert _landing(states, "very_low", -1.2, 0.0) == {"very_low": 1.0}
    three = _landing(states, "very_low", -1.2, 3.0)
    assert max(three, key=three.get) == "ok" and three["ok"] > 0.7
    one = _landing(states, "very_low", -1.2, 1.0)
    assert one["very_low"] > 0.5 and "ok" not in one
