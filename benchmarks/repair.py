"""What a method suggests doing about a failure, for the repair-rate re-runs.

A hypothesis may carry its own intervention in ``metadata`` (``suggested_fix``, ``fix``,
``intervention(s)``); otherwise the fix a fixed table assigns to its root cause (or, for
``"unknown"``, its failure type) stands in, the same table for every method. A method with a
``what_if`` (a causal model) picks, among the fixes of its likeliest causes, the one it
predicts works best.
"""

from __future__ import annotations

import math
from typing import Any

from benchmarks import metrics as M
from neuraldbg.knobs import KNOB_NAMES
from neuraldbg.records import HEALTHY, Hypothesis

__all__ = ["FIX_BY_CAUSE", "FIX_BY_FAILURE", "suggest_fix", "best_fix_by_what_if"]

#: The fix a method's top root cause implies when its hypothesis suggests none itself.
FIX_BY_CAUSE: dict[str, dict[str, Any]] = {
    "learning_rate_too_high": {"lr_scale": 0.1},
    "learning_rate_too_low": {"lr_scale": 10.0},
    "init_scale_too_large": {"init_scale": 0.1},
    "init_scale_too_small": {"init_scale": 10.0},
    "saturating_activation": {"activation": "relu"},
    "negative_bias_init": {"activation": "leaky_relu"},
    "unnormalized_inputs": {"input_scale": 0.1},
    "missing_normalization": {"normalization": "batch"},
    "missing_gradient_clipping": {"grad_clip": 1.0},
}
#: Fallback by failure type, for a cause of ``"unknown"``.
FIX_BY_FAILURE: dict[str, dict[str, Any]] = {
    "exploding_gradients": {"grad_clip": 1.0},
    "loss_divergence": {"lr_scale": 0.1},
    "vanishing_gradients": {"activation": "relu"},
    "dead_neurons": {"activation": "leaky_relu"},
    "saturated_activations": {"activation": "relu"},
    "training_plateau": {"lr_scale": 10.0},
}
_META_FIX_KEYS = ("suggested_fix", "fix", "intervention", "interventions",
                  "suggested_interventions")


def _as_knobs(value: Any) -> dict[str, Any] | None:
    if isinstance(value, list) and value:
        value = value[0]
    if isinstance(value, dict) and "knobs" in value and isinstance(value["knobs"], dict):
        value = value["knobs"]
    if isinstance(value, dict) and value and set(value) <= set(KNOB_NAMES):
        return dict(value)
    return None


def suggest_fix(hyps: list[Hypothesis]) -> dict[str, Any] | None:
    """The intervention a method's answer suggests; None when it judged the run healthy.

    Its own when its top hypothesis carries one in ``metadata`` (``suggested_fix``, ``fix``,
    ``intervention(s)``), else the table fix of its root cause (:data:`FIX_BY_CAUSE`) or
    failure type (:data:`FIX_BY_FAILURE`).
    """
    label, _ = M.predicted_label(hyps)
    if label == HEALTHY:
        return None
    top = max(hyps, key=lambda h: h.confidence)
    for key in _META_FIX_KEYS:
        fix = _as_knobs(top.metadata.get(key)) if isinstance(top.metadata, dict) else None
        if fix:
            return fix
    return dict(FIX_BY_CAUSE.get(top.root_cause) or FIX_BY_FAILURE.get(top.failure_type) or {}) \
        or None


def best_fix_by_what_if(model: Any, trace: Any, hyps: list[Hypothesis]
                        ) -> tuple[dict[str, Any], float]:
    """A causal model's own suggestion, and its ``what_if`` P(failure).

    Of the fixes implied by its three likeliest causes (and its top failure type), the one
    its ``what_if`` gives the lowest P(failure).
    """
    cands: list[dict[str, Any]] = []
    for h in hyps:
        for fix in (FIX_BY_CAUSE.get(h.root_cause), FIX_BY_FAILURE.get(h.failure_type)):
            if fix and fix not in cands:
                cands.append(dict(fix))
        if len(cands) >= 3:
            break
    scored = []
    for fix in cands:
        try:
            scored.append((float(model.what_if(trace, **fix).p_failure), fix))
        except Exception:  # a knob the model cannot intervene on: not a candidate
            continue
    if not scored:
        return suggest_fix(hyps) or {}, math.nan
    p, fix = min(scored, key=lambda t: t[0])
    return fix, p
