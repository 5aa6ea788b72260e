"""What happened in a run, read from its trace alone.

Loss landmarks, first non-finite value, the layers and their types. No diagnosis here; the
CLI's ``show`` and the report print it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from neuraldbg.stat_tables import wide_stats
from neuraldbg.sufficiency import (
    loss_ends,
    without_masking_infinities,
    without_skipped_gradients,
)
from neuraldbg.trace import Trace

__all__ = ["NonFinite", "RunSummary", "summarize_run", "module_types", "layer_label"]


@dataclass(frozen=True, slots=True)
class NonFinite:
    """The first non-finite value of a run.

    Attributes
    ----------
    step : int
        Step where it appeared.
    where : str
        ``"loss"``, ``"global gradient norm"``, or ``"output of <module>"`` /
        ``"gradient of <module>"``.
    value : str
        ``"nan"``, ``"inf"`` or ``"-inf"`` (for module statistics, ``"nan"``/``"inf"`` counts).
    module : str or None
        The module of an ``"output of"`` / ``"gradient of"`` value, else None.
    """

    step: int
    where: str
    value: str
    module: str | None = None


@dataclass(frozen=True, slots=True)
class RunSummary:
    """Landmarks of a recorded run (see :func:`summarize_run`).

    Attributes
    ----------
    n_steps, n_recorded, n_modules : int
        Steps, steps with per-module statistics, monitored modules.
    n_skipped : int
        Steps in which no optimizer stepped (a ``GradScaler`` skipped them: their gradients
        were not finite at the scale of the time, which the scaler then lowers).
    status : str
        ``complete``, ``failed``, ``running`` ... as the capture wrote it.
    loss_first, loss_last : float or None
        The run's starting and final loss: medians of its first and last finite losses
        (:func:`neuraldbg.sufficiency.loss_ends`).
    loss_peak, loss_peak_step : float or None, int or None
        Largest finite loss and its step.
    loss_min, loss_min_step : float or None, int or None
        Smallest finite loss and its step.
    first_nonfinite : NonFinite or None
        The earliest non-finite value anywhere (loss, gradient norm, module output or
        gradient); module statistics win a tie with the loss, since they show where it began.
    first_nonfinite_loss : NonFinite or None
        The first non-finite loss.
    layers : tuple of (str, str)
        ``(module_name, module_type)`` in forward order.
    config : dict
        The run config stored with the trace.
    masking_modules : tuple of str
        Modules whose output held infinities at every recorded step while the loss stayed
        finite: masks (:func:`neuraldbg.sufficiency.without_masking_infinities`), not counted
        in ``first_nonfinite``.
    """

    n_steps: int
    n_recorded: int
    n_modules: int
    n_skipped: int
    status: str
    loss_first: float | None
    loss_last: float | None
    loss_peak: float | None
    loss_peak_step: int | None
    loss_min: float | None
    loss_min_step: int | None
    first_nonfinite: NonFinite | None
    first_nonfinite_loss: NonFinite | None
    layers: tuple[tuple[str, str], ...]
    config: dict[str, Any] = field(default_factory=dict)
    masking_modules: tuple[str, ...] = ()


def module_types(trace: Trace) -> dict[str, str]:
    """``module_name -> module_type`` of the trace's module table."""
    mods = trace.modules
    if len(mods) == 0 or "module_type" not in mods:
        return {}
    return dict(zip(mods["module_name"].astype(str), mods["module_type"].astype(str),
                    strict=False))


def layer_label(name: str, types: dict[str, str]) -> str:
    """``fc2 (Linear)``: a module name with its type.

    ``layer 1 (ReLU)`` for a bare ``Sequential`` index, ``(model)`` for the empty name.
    """
    shown = name if name else "(model)"
    if name.replace(".", "").isdigit():
        shown = f"layer {name}"
    kind = types.get(name)
    return f"{shown} ({kind})" if kind else shown


def _value_name(v: float) -> str:
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _first_module_nonfinite(trace: Trace) -> NonFinite | None:
    """The first non-finite module output or gradient of ``trace``.

    The caller leaves masks unread first (:func:`neuraldbg.sufficiency.without_masking_infinities`).
    """
    if len(trace.stats) == 0:
        return None
    # (a step the optimizer skipped has overflowed gradients by design: a GradScaler's)
    steps, names, t = wide_stats(without_skipped_gradients(trace),
                                 ("act_nan", "act_inf", "act_max_abs", "calls",
                                  "out_grad_norm"))
    # NaN/Inf are counted on a sample; the largest value is over every element, so a NaN
    # there is one the sample missed (as neuraldbg.states reads it)
    out_bad = ((np.nan_to_num(t["act_nan"]) > 0) | (np.nan_to_num(t["act_inf"]) > 0)
               | ((np.nan_to_num(t["calls"]) > 0) & ~np.isfinite(t["act_max_abs"])))
    grad = t["out_grad_norm"]
    grad_bad = np.isinf(grad)  # NaN there also means "not measured"
    best: NonFinite | None = None
    for mask, what in ((out_bad, "output"), (grad_bad, "gradient")):
        rows = np.flatnonzero(mask.any(axis=1))
        if not len(rows):
            continue
        r = int(rows[0])
        c = int(np.flatnonzero(mask[r])[0])
        if what == "output":
            value = "nan" if np.nan_to_num(t["act_nan"][r, c]) > 0 else (
                "inf" if np.nan_to_num(t["act_inf"][r, c]) > 0
                or np.isposinf(t["act_max_abs"][r, c]) else "nan")
        else:
            value = "inf"
        cand = NonFinite(int(steps[r]), f"{what} of {names[c]}", value, str(names[c]))
        if best is None or cand.step < best.step:
            best = cand
    return best


def summarize_run(trace: Trace) -> RunSummary:
    """Landmarks of a run from its trace (no diagnosis).

    Parameters
    ----------
    trace : Trace

    Returns
    -------
    RunSummary
    """
    steps = trace.steps
    loss = steps["loss"].to_numpy(dtype=float) if len(steps) else np.zeros(0)
    step_ids = steps["step"].to_numpy(dtype=np.int64) if len(steps) else np.zeros(0, np.int64)
    finite = np.isfinite(loss)
    first = last = peak = low = None
    peak_step = low_step = None
    if finite.any():
        idx = np.flatnonzero(finite)
        # (one minibatch's loss is noisy: a mixup run's last batch read 0.021, the run ~0.5)
        first, last = loss_ends(loss[idx])
        i_peak = idx[int(np.argmax(loss[idx]))]
        i_low = idx[int(np.argmin(loss[idx]))]
        peak, peak_step = float(loss[i_peak]), int(step_ids[i_peak])
        low, low_step = float(loss[i_low]), int(step_ids[i_low])
    bad_loss = None
    complete = (steps["complete"].to_numpy(dtype=bool) if "complete" in steps
                else np.ones(len(loss), bool))
    stepped = (steps["stepped"].to_numpy(dtype=bool) if "stepped" in steps
               else np.ones(len(loss), bool))
    nonfinite_rows = np.flatnonzero(~finite & complete)
    if len(nonfinite_rows):
        r = int(nonfinite_rows[0])
        bad_loss = NonFinite(int(step_ids[r]), "loss", _value_name(float(loss[r])))
    # a module that masks with -inf outputs infinities by design
    unmasked = without_masking_infinities(trace)
    candidates = [c for c in (bad_loss, _first_module_nonfinite(unmasked)) if c is not None]
    if len(steps) and "grad_norm" in steps:
        g = steps["grad_norm"].to_numpy(dtype=float)
        # (a step no optimizer took has no gradient norm: a GradScaler skipped it)
        rows = np.flatnonzero(np.isinf(g) | (np.isnan(g) & complete & stepped
                                             & ~np.isnan(loss)))
        if len(rows):
            r = int(rows[0])
            candidates.append(NonFinite(int(step_ids[r]), "global gradient norm",
                                        _value_name(float(g[r]))))
    order = {"output": 0, "gradient": 1, "global": 2, "loss": 3}
    first_bad = min(candidates, key=lambda c: (c.step, order.get(c.where.split()[0], 4)),
                    default=None)
    types = module_types(trace)
    layers = tuple((name, types.get(name, "?")) for name in trace.module_names)
    n_rec = int(steps["recorded"].sum()) if len(steps) and "recorded" in steps else 0
    return RunSummary(
        n_steps=int(len(steps)), n_recorded=n_rec, n_modules=int(len(trace.modules)),
        n_skipped=int((~stepped).sum()),
        status=str(trace.meta.get("status", "unknown")), loss_first=first, loss_last=last,
        loss_peak=peak, loss_peak_step=peak_step, loss_min=low, loss_min_step=low_step,
        first_nonfinite=first_bad, first_nonfinite_loss=bad_loss, layers=layers,
        config=dict(trace.meta.get("config") or {}),
        masking_modules=tuple(unmasked.meta.get("masking_modules", ())))
