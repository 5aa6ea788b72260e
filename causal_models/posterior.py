"""Posteriors over (failure type, root cause) from the network, and their recalibration."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from causal_models.backend import normalised_joint
from causal_models.calibration import Calibrator

__all__ = ["joint_posterior", "calibrate_joint"]


def joint_posterior(engine: Any, evidence: Mapping[str, str],
                    classes: Sequence[str] | np.ndarray,
                    root_causes: Sequence[str] | np.ndarray) -> np.ndarray:
    """P(failure_type, root_cause | evidence) by variable elimination.

    Parameters
    ----------
    engine : pgmpy.inference.VariableElimination
    evidence : dict of str to str
        Observed node -> state.
    classes, root_causes : sequence of str
        The row and column order of the result.

    Returns
    -------
    numpy.ndarray
        Shape ``(len(classes), len(root_causes))``, summing to 1.
    """
    factor = normalised_joint(engine, ["failure_type", "root_cause"], evidence)
    order = [factor.variables.index(v) for v in ("failure_type", "root_cause")]
    values = np.transpose(factor.values, order)
    ft_pos = [factor.state_names["failure_type"].index(c) for c in classes]
    rc_pos = [factor.state_names["root_cause"].index(c) for c in root_causes]
    return values[np.ix_(ft_pos, rc_pos)]


def calibrate_joint(calibrator: Calibrator, joint: np.ndarray) -> np.ndarray:
    """Recalibrate the failure-type marginal of joint posteriors; keep P(cause | failure).

    Parameters
    ----------
    calibrator : Calibrator
    joint : numpy.ndarray
        Shape ``(..., n_classes, n_root_causes)``.

    Returns
    -------
    numpy.ndarray
        Same shape; each joint sums to 1.
    """
    marginal = joint.sum(axis=2)
    calibrated = calibrator.transform(marginal)
    with np.errstate(invalid="ignore", divide="ignore"):
        conditional = np.where(marginal[..., None] > 0, joint / marginal[..., None], 0.0)
    joint = np.clip(conditional * calibrated[..., None], 0.0, None)
    return joint / joint.sum(axis=(-2, -1), keepdims=True)
