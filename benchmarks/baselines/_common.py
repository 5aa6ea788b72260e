"""What the ported baselines share: trace helpers and the symptom -> cause table.

The peers name symptoms (vanishing gradient, dying ReLU, ...) and propose repairs; none
names a root cause in NeuralDBG's vocabulary. To score them on cause ranking at all, each
symptom maps to a fixed, ordered list of the causes that usually produce it
(:data:`SYMPTOM_CAUSES`): the first is the one a practitioner would try first. The table is
ours, not the peers', and the same for every baseline.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod

import numpy as np
import pandas as pd

from neuraldbg.records import Hypothesis
from neuraldbg.trace import Trace

__all__ = ["BaselineMethod", "SYMPTOM_CAUSES", "hypotheses_for", "param_layers", "wide",
           "loss_array"]

#: Failure type -> causes in the order a practitioner would suspect them.
SYMPTOM_CAUSES: dict[str, tuple[str, ...]] = {
    "vanishing_gradients": ("saturating_activation", "init_scale_too_small",
                            "missing_normalization"),
    "exploding_gradients": ("learning_rate_too_high", "init_scale_too_large",
                            "missing_gradient_clipping"),
    "loss_divergence": ("learning_rate_too_high", "missing_gradient_clipping"),
    "dead_neurons": ("negative_bias_init", "learning_rate_too_high"),
    "saturated_activations": ("unnormalized_inputs", "saturating_activation",
                              "init_scale_too_large"),
    "training_plateau": ("learning_rate_too_low",),
}


class BaselineMethod(ABC):
    """A ported peer rule set as a :class:`neuraldbg.methods.DiagnosisMethod`.

    :meth:`explain` is shared: a trace without a recorded loss gives no hypothesis; otherwise
    the subclass's :meth:`rules` answer. Each subclass is registered by name with
    :func:`neuraldbg.methods.register_method` and documents its rules, not the contract.
    """

    def explain(self, trace: Trace) -> list[Hypothesis]:
        """The peer's hypotheses for one trace, in the peer's own order.

        Parameters
        ----------
        trace : Trace
            The recorded run.

        Returns
        -------
        list of Hypothesis
            Empty when the trace holds no loss or no rule fires (the run is judged healthy).
        """
        loss = loss_array(trace)
        if loss.size == 0:
            return []
        return self.rules(trace, loss)

    @abstractmethod
    def rules(self, trace: Trace, loss: np.ndarray) -> list[Hypothesis]:
        """The peer's rules on a trace with a recorded loss (``loss`` per step, float64)."""


def hypotheses_for(failure_type: str, origin_layer: str, origin_step: int, confidence: float,
                   method: str, evidence: dict) -> list[Hypothesis]:
    """One hypothesis per cause of :data:`SYMPTOM_CAUSES`, in its order, same confidence."""
    return [
        Hypothesis(failure_type=failure_type, root_cause=cause, origin_layer=origin_layer,
                   origin_step=int(origin_step), confidence=float(confidence),
                   metadata={"method": method, "cause_rank_in_table": i, "evidence": evidence})
        for i, cause in enumerate(SYMPTOM_CAUSES.get(failure_type, ("unknown",)))
    ]


#: Wide tables already pivoted, per trace (by identity) and statistic; see :func:`wide`.
_WIDE_CACHE: dict[int, dict[tuple[int, int, str], pd.DataFrame]] = {}


def wide(trace: Trace, column: str) -> pd.DataFrame:
    """``trace.stat(column)`` (steps x modules in forward order), empty when not recorded.

    Pivoting is most of a baseline's time, and the baselines read the same statistics
    (all four the NaN/inf counts, three the gradient norms): each table is pivoted once
    per trace object and statistic, and every caller gets its own copy. Keyed by the
    trace's identity and its stats table's, and forgotten with the trace.
    """
    if trace.stats.empty or column not in trace.stats.columns:
        return pd.DataFrame()
    tables = _WIDE_CACHE.get(id(trace))
    if tables is None:
        tables = _WIDE_CACHE[id(trace)] = {}
        weakref.finalize(trace, _WIDE_CACHE.pop, id(trace), None)
    key = (id(trace.stats), len(trace.stats), column)
    if key not in tables:
        tables[key] = trace.stat(column)
    return tables[key].copy()


def param_layers(trace: Trace) -> list[str]:
    """Modules owning trainable parameters, in forward order."""
    mods = trace.modules.set_index("module_name")
    return [m for m in trace.module_names if m in mods.index and mods.at[m, "n_trainable"] > 0]


def loss_array(trace: Trace) -> np.ndarray:
    """Loss per step as float64 (NaN for a step that did not finish)."""
    if trace.steps.empty:
        return np.zeros(0)
    return trace.steps["loss"].astype(float).to_numpy()


def families(trace: Trace) -> dict[str, str]:
    """Module name -> activation family."""
    return dict(zip(trace.modules["module_name"], trace.modules["activation_family"],
                    strict=True))
