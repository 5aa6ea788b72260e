"""Probabilistic causal model of training failures: a time-sliced Bayesian network.

A trace is discretized into time slices and layer blocks (:mod:`.discretize`); the
registered rules give the network's edges and Dirichlet priors (:mod:`.registry`,
:mod:`.structure`); :class:`ProbabilisticReasoner` fits the tables on failure-zoo traces and
answers posteriors, ``do()`` queries and counterfactual what-ifs (:mod:`.network`,
:mod:`.interventions`, :mod:`.counterfactuals`), with calibrated confidences
(:mod:`.calibration`).

>>> import causal_models
>>> model = causal_models.load_default_model()                  # doctest: +SKIP
>>> model.explain(trace)[0]                                       # doctest: +SKIP
>>> model.what_if(trace, lr_scale=0.1).p_failure                  # doctest: +SKIP

The package declares :class:`ProbabilisticMethod` as the ``"probabilistic"`` method in the
``neuraldbg.methods`` entry-point group; :mod:`neuraldbg.methods` loads it on first use,
backed by the default model.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

# the default failure modes and root causes, registered first (as an extension registers its own)
from causal_models import defaults as _defaults  # noqa: F401  (registers on import)
from causal_models.bins import Bins
from causal_models.calibration import (
    Calibrator,
    brier_score,
    calibration_report,
    expected_calibration_error,
    negative_log_likelihood,
)
from causal_models.counterfactuals import Counterfactual, what_if
from causal_models.discretize import Discretized, discretize
from causal_models.export import cpd_frame, cpd_frames, network_to_mermaid, to_networkx
from causal_models.interventions import intervene
from causal_models.network import ProbabilisticReasoner
from causal_models.registry import (
    CauseFragment,
    FailureMode,
    get_failure_mode,
    get_root_cause,
    list_failure_modes,
    list_root_causes,
    register_code_bug,
    register_failure_mode,
    register_root_cause,
    unregister,
)

__all__ = [
    "ProbabilisticReasoner",
    "Counterfactual",
    "load_default_model",
    "DEFAULT_MODEL_PATH",
    "discretize",
    "Discretized",
    "Bins",
    "intervene",
    "what_if",
    "Calibrator",
    "calibration_report",
    "expected_calibration_error",
    "brier_score",
    "negative_log_likelihood",
    "to_networkx",
    "network_to_mermaid",
    "cpd_frame",
    "cpd_frames",
    "FailureMode",
    "CauseFragment",
    "register_failure_mode",
    "register_root_cause",
    "register_code_bug",
    "unregister",
    "ProbabilisticMethod",
    "get_failure_mode",
    "get_root_cause",
    "list_failure_modes",
    "list_root_causes",
]

#: The shipped default model (JSON, re-fitted by ``python -m benchmarks.fit_default``).
DEFAULT_MODEL_PATH = Path(__file__).parent / "data" / "default_model.json"
_DEFAULT: dict[str, Any] = {}


def load_default_model(*, reload: bool = False) -> ProbabilisticReasoner:
    """The fitted default model shipped with the package (cached after the first load).

    Parameters
    ----------
    reload : bool, default=False
        Read the JSON file again instead of returning the cached model.

    Returns
    -------
    ProbabilisticReasoner

    Raises
    ------
    FileNotFoundError
        If the package ships no default model; ``python -m benchmarks.fit_default``
        writes it.
    """
    if reload or "model" not in _DEFAULT:
        if not DEFAULT_MODEL_PATH.is_file():
            raise FileNotFoundError(
                f"No default causal model at {DEFAULT_MODEL_PATH}. Fit it with "
                "`python -m benchmarks.fit_default` or fit a ProbabilisticReasoner on "
                "your own traces.")
        start = time.perf_counter()
        model = ProbabilisticReasoner.from_dict(json.loads(DEFAULT_MODEL_PATH.read_text()))
        model.load_seconds_ = time.perf_counter() - start
        _DEFAULT["model"] = model
    return _DEFAULT["model"]


class ProbabilisticMethod:
    """The ``"probabilistic"`` diagnosis method of :mod:`neuraldbg.methods`.

    ``neuraldbg`` finds it through the ``neuraldbg.methods`` entry point this package
    declares (``pyproject.toml``), so ``neuraldbg`` never imports ``causal_models``.

    Parameters
    ----------
    model : ProbabilisticReasoner, optional
        A fitted model; the shipped default model (:func:`load_default_model`) when omitted.
    """

    name = "probabilistic"

    def __init__(self, model: ProbabilisticReasoner | None = None) -> None:
        self.model = model

    def fitted_model(self) -> ProbabilisticReasoner:
        """The model this method answers with."""
        return self.model if self.model is not None else load_default_model()

    def explain(self, trace: Any) -> list[Any]:
        """Ranked hypotheses with posterior confidences."""
        return self.fitted_model().explain(trace)

    def predict_proba(self, traces: Any) -> Any:
        """Posterior over failure types (columns ``classes_``)."""
        return self.fitted_model().predict_proba(traces)

    def what_if(self, trace: Any, **knobs: Any) -> Counterfactual:
        """The run's counterfactual under changed knobs (:func:`what_if`)."""
        return self.fitted_model().what_if(trace, **knobs)

    @property
    def classes_(self) -> Any:
        """Failure types and ``"healthy"``."""
        return self.fitted_model().classes_
