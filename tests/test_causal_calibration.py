"""Calibration metrics against hand computation, and recalibration that must help."""

from __future__ import annotations

import math

import numpy as np
import pytest

from causal_models.calibration import (
    Calibrator,
    brier_score,
    calibration_report,
    expected_calibration_error,
    fit_calibrator,
    negative_log_likelihood,
    verdict_from_proba,
)


def test_ece_brier_nll_by_hand() -> None:
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.55, 0.45]])
    y = np.array([0, 1, 1, 0])
    # top-1 confidences 0.9 (right), 0.6 (wrong), 0.8 (right), 0.55 (right); 15 bins:
    # 0.9 -> bin 13, 0.6 -> bin 8, 0.8 -> bin 11, 0.55 -> bin 8.
    # bin 8: mean correct 0.5, mean conf 0.575 -> |gap| * 2/4; bin 11: |1-0.8| * 1/4; bin 13: 0.1/4
    expected = (abs(1 - 0.6 - 0.55) + 0.2 + 0.1) / 4
    assert expected_calibration_error(probs, y) == pytest.approx(expected)
    brier = np.mean([0.01 * 2, 0.36 * 2, 0.04 * 2, 0.45 ** 2 * 2])
    assert brier_score(probs, y) == pytest.approx(brier)
    nll = -np.mean(np.log([0.9, 0.4, 0.8, 0.55]))
    assert negative_log_likelihood(probs, y) == pytest.approx(nll)
    report = calibration_report(probs, y)
    assert report["accuracy"] == pytest.approx(0.75) and report["n"] == 4


def test_ece_of_perfectly_calibrated_bins_is_zero() -> None:
    # 10 runs at confidence 0.7, 7 right: calibrated.
    probs = np.tile([0.7, 0.3], (10, 1))
    y = np.array([0] * 7 + [1] * 3)
    assert expected_calibration_error(probs, y) == pytest.approx(0.0, abs=1e-12)


def _overconfident(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities sharpened far beyond what the labels support."""
    true_p = rng.dirichlet(np.ones(4), size=n)
    y = np.array([rng.choice(4, p=p) for p in true_p])
    sharp = true_p ** 6
    return sharp / sharp.sum(axis=1, keepdims=True), y


def test_temperature_scaling_lowers_nll_and_ece_on_held_out_data() -> None:
    rng = np.random.default_rng(0)
    fit_p, fit_y = _overconfident(600, rng)
    test_p, test_y = _overconfident(600, rng)
    cal = fit_calibrator("temperature", fit_p, fit_y)
    assert cal.temperature > 2.0  # sharpened by a power of 6: T well above 1
    after = cal.transform(test_p)
    np.testing.assert_allclose(after.sum(axis=1), 1.0)
    assert negative_log_likelihood(after, test_y) < negative_log_likelihood(test_p, test_y)
    assert expected_calibration_error(after, test_y) < expected_calibration_error(test_p, test_y)


def test_isotonic_recalibration_and_round_trip() -> None:
    rng = np.random.default_rng(1)
    fit_p, fit_y = _overconfident(600, rng)
    test_p, test_y = _overconfident(600, rng)
    cal = fit_calibrator("isotonic", fit_p, fit_y)
    after = cal.transform(test_p)
    np.testing.assert_allclose(after.sum(axis=1), 1.0)
    assert brier_score(after, test_y) < brier_score(test_p, test_y)
    again = Calibrator.from_dict(cal.to_dict())
    np.testing.assert_allclose(again.transform(test_p), after)


def test_unknown_method_and_bad_shapes_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="Valid methods are"):
        fit_calibrator("platt", np.ones((2, 2)) / 2, np.array([0, 1]))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one label per row"):
        brier_score(np.ones((3, 2)) / 2, np.array([0, 1]))
    assert math.isclose(Calibrator().transform(np.array([[0.2, 0.8]]))[0, 1], 0.8)


def test_a_few_dozen_right_answers_never_buy_certainty() -> None:
    """30 held-out runs, every verdict right and already confident: sharpening would score
    best on them, but the rule of succession caps a verdict at (n + 1) / (n + 2) of its
    kind (here 20 failing and 10 healthy verdicts)."""
    rng = np.random.default_rng(2)
    k, healthy = 4, 0
    y = np.array([healthy] * 10 + list(rng.integers(1, k, 20)))
    probs = np.full((30, k), 0.04)
    probs[np.arange(30), y] = 0.88
    cal = fit_calibrator("temperature", probs, y, healthy=healthy)
    label, conf = verdict_from_proba(cal.transform(probs), healthy)
    assert (label == y).all()
    assert conf[y != healthy].max() <= 21 / 22 + 1e-9
    assert conf[y == healthy].max() <= 11 / 12 + 1e-9
    # the temperature still sharpens: the cap comes from the bound, not from flattening
    assert cal.temperature < 1.0


def test_recalibration_changes_confidences_not_answers() -> None:
    """Ten held-out runs, all right: the confidence bound leaves every calibrator's gap
    above zero, and ECE alone would rather turn the three failing verdicts into wrong
    "healthy" ones at matching confidence; the chosen map keeps every answer."""
    y = np.array([2, 0, 0, 3, 0, 0, 1, 0, 0, 0])
    probs = np.full((10, 7), 0.001)
    probs[np.arange(10), y] = 0.99
    probs /= probs.sum(axis=1, keepdims=True)
    cal = fit_calibrator("temperature", probs, y, healthy=0)
    label, _ = verdict_from_proba(cal.transform(probs), 0)
    np.testing.assert_array_equal(label, y)
