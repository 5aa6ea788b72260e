"""Labels of the latent nodes of a fitting run, read from its ground truth (``fit`` only).

The knob levels describe the *scenario* (its injected cause, its severity and the knobs of the
run), the fault nodes, root cause and failure type its *outcome*. Prediction never reads
ground truth; :func:`training_labels` is what turns a zoo run into a row of fitting data.
"""

from __future__ import annotations

import math
from typing import Any

from causal_models.registry import KNOB_NODES, list_root_causes
from causal_models.structure import LEVEL_NODES, LEVEL_WIDTH, NO_CAUSE, unmodelled_causes
from neuraldbg.records import HEALTHY

__all__ = ["training_labels", "level_index"]

# Cause -> (level node, direction) for the level labels of fitting runs.
_CAUSE_LEVEL: dict[str, tuple[str, int]] = {
    "learning_rate_too_high": ("lr_level", +1),
    "learning_rate_too_low": ("lr_level", -1),
    "init_scale_too_large": ("init_level", +1),
    "init_scale_too_small": ("init_level", -1),
    "unnormalized_inputs": ("input_level", +1),
}

def _fix_value(ground_truth: dict[str, Any], knob: str) -> float | None:
    fixes = [ground_truth.get("canonical_fix") or {}] + list(
        ground_truth.get("equivalent_fixes") or [])
    for fix in fixes:
        value = fix.get(knob) if isinstance(fix, dict) else None
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    return None


def level_index(offset_levels: float, n_states: int, centred: bool) -> int:
    """State index of a level ``offset_levels`` steps from "ok" (clipped to the range)."""
    centre = n_states // 2 if centred else 0
    return int(min(max(round(offset_levels) + centre, 0), n_states - 1))


def _severity_factor(ground_truth: dict[str, Any]) -> float:
    """How far this run's severity is from its family's baseline, relative to the default.

    1 at the default severity, 0 at the baseline (fault absent), geometric in between and
    beyond; 1 when the family's default/baseline severities are not in the ground truth.
    """
    sev = ground_truth.get("severity")
    default = ground_truth.get("default_severity")
    base = ground_truth.get("baseline_severity")
    nums = [v for v in (sev, default, base) if isinstance(v, (int, float))]
    if len(nums) < 3 or min(nums) <= 0 or default == base:
        return 0.0 if (sev is not None and sev == base) else 1.0
    return math.log(float(sev) / float(base)) / math.log(float(default) / float(base))  # type: ignore[arg-type]


def training_labels(ground_truth: dict[str, Any]) -> dict[str, str]:
    """States of the latent nodes of a fitting run, from its ground truth.

    Used only by ``fit``. The knob levels describe the *scenario* (its injected cause, its
    severity and the knobs of this run), the fault nodes, root cause and failure type the
    *outcome*: a learning rate two decades too high with clipping switched on is still
    ``lr_level=very_high``, but a healthy run, so the model learns that clipping stops that
    fault. A level is the offset from "ok" in ``LEVEL_WIDTH`` decades: the canonical fix of
    the scenario's cause says how far at the default severity (``lr_scale=0.01`` fixes a
    learning rate two decades too high), scaled geometrically by the severity when the
    ground truth carries the family's ``default_severity`` and ``baseline_severity``, and
    moved by the run's own knob multipliers.

    Parameters
    ----------
    ground_truth : dict
        ``trace.meta["ground_truth"]`` of a failure-zoo run.

    Returns
    -------
    dict of str to str
    """
    causes = list_root_causes()
    names = {c.name for c in causes} | set(unmodelled_causes())
    failure = ground_truth.get("failure_type") or HEALTHY
    cause = ground_truth.get("root_cause") or NO_CAUSE
    if failure == HEALTHY:
        cause = NO_CAUSE
    elif cause not in names:
        cause = "unknown"
    scenario_cause = ground_truth.get("scenario_root_cause") or (
        cause if cause != NO_CAUSE else NO_CAUSE)
    labels: dict[str, str] = {"failure_type": failure, "root_cause": cause}
    knobs = ground_truth.get("knobs") or {}
    factor = _severity_factor(ground_truth)
    for node, knob in LEVEL_NODES.items():
        width = LEVEL_WIDTH[node]
        offset = 0.0
        if scenario_cause in _CAUSE_LEVEL and _CAUSE_LEVEL[scenario_cause][0] == node:
            direction = _CAUSE_LEVEL[scenario_cause][1]
            fix = _fix_value(ground_truth, knob)
            offset = -math.log10(fix) / width if fix else float(direction)
            offset = direction * max(1.0, direction * offset) * factor
        scale = knobs.get(knob)
        if isinstance(scale, (int, float)) and scale > 0:
            offset += math.log10(scale) / width
        if cause in _CAUSE_LEVEL and _CAUSE_LEVEL[cause][0] == node:
            direction = _CAUSE_LEVEL[cause][1]  # a failing run's level is at least one step off
            offset = direction * max(1.0, direction * offset)
        sts = KNOB_NODES[node]
        labels[node] = sts[level_index(offset, len(sts), centred=sts[0] != "ok")]
    for c in causes:
        labels.update(c.trait_labels({**ground_truth, "root_cause": scenario_cause
                                      if factor > 0 else NO_CAUSE}))
        labels[c.fault_node] = "yes" if cause == c.name else "no"
    return labels
