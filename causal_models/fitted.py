"""What a fitted probabilistic reasoner offers the queries, and the check that it is fitted.

The queries (:mod:`causal_models.explanation`, :mod:`causal_models.interventions`,
:mod:`causal_models.placement`, :mod:`causal_models.export`) and the persistence
(:mod:`causal_models.persistence`) work on a fitted model through this public surface only,
as pgmpy's inference classes work on a model; :class:`causal_models.network.
ProbabilisticReasoner` implements it. Keeping the protocol here, below them all, is what lets
the estimator call the queries without the queries importing the estimator back.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import pandas as pd

from causal_models.bins import Bins
from causal_models.calibration import Calibrator
from causal_models.discretize import Discretized
from causal_models.structure import Structure
from neuraldbg.errors import NotFittedError
from neuraldbg.trace import Trace

__all__ = ["FittedModel", "check_is_fitted"]


class FittedModel(Protocol):
    """The public surface of a fitted reasoner that the queries and persistence rely on.

    Attributes
    ----------
    n_slices, n_blocks : int
        Hyperparameters of the unrolling.
    bins : Bins or None
        Discretization thresholds (None: the defaults).
    min_confidence : float
        Failure types listed by ``explain`` below the most probable one need this posterior.
    structure_, network_, classes_, root_causes_, calibrator_, placement_, support_,
    n_fit_traces_, fit_families_
        The fitted attributes (see :class:`causal_models.network.ProbabilisticReasoner`).
    """

    n_slices: int
    n_blocks: int
    bins: Bins | None
    min_confidence: float
    structure_: Structure
    network_: Any
    classes_: np.ndarray
    root_causes_: np.ndarray
    calibrator_: Calibrator
    placement_: dict[str, dict[str, float]]
    support_: pd.DataFrame
    n_fit_traces_: int
    fit_families_: list[str]

    @property
    def n_time_slices(self) -> int:
        """Slices the network is unrolled over (1 for the run-level-only ablation)."""
        ...

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Hyperparameters."""
        ...

    def observe(self, trace: Trace) -> Discretized:
        """The trace's discrete view, with run features and the rules' event onsets."""
        ...

    def evidence(self, trace: Trace) -> dict[str, str]:
        """The observed node states of ``trace``."""
        ...

    def inference(self) -> Any:
        """Pgmpy's variable elimination on the fitted network."""
        ...

    def raw_proba(self, trace: Trace) -> np.ndarray:
        """The network's posterior over failure types before recalibration."""
        ...

    def calibrate_joint(self, joint: np.ndarray) -> np.ndarray:
        """Recalibrate joint posteriors over (failure type, root cause)."""
        ...


def check_is_fitted(model: object) -> None:
    """Raise :class:`neuraldbg.errors.NotFittedError` unless ``model`` has been fitted.

    As scikit-learn's ``check_is_fitted``: a model is fitted once it has ``network_``.
    """
    if not hasattr(model, "network_"):
        raise NotFittedError(f"This {type(model).__name__} is not fitted yet. Call "
                             "fit(traces) or use causal_models.load_default_model().")
