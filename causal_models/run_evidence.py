"""Run-level evidence of a trace: how the whole run went and what its knobs look like.

On the failure: ``progress`` (final loss over early loss), ``spikes`` (largest global
gradient norm over its median) and ``grad_ratio`` (early gradient norm of the first weighted
layer over the last one's, the AutoTrainer ratio). On the knobs: ``update`` (early
||dW||/||W||, tells a learning-rate level), ``fwd_gain`` (activation scale across the depth at
the first recorded step, tells an init scale) and ``input_mag`` (scale of the first layer's
output). The thresholds are :class:`causal_models.bins.Bins`'. Nothing here reads
``trace.meta["ground_truth"]``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np

from neuraldbg.events import rose_after_first_update
from neuraldbg.model_output import input_rms
from neuraldbg.run_facts import (
    SCHEME_GAINS,
    SWING_STEPS,
    early_step_inflation,
    recurrent_in_front,
)
from neuraldbg.trace import Trace

if TYPE_CHECKING:
    from causal_models.bins import Bins

__all__ = ["run_states", "log10_abs", "early_count", "early_median", "early_loss"]


def log10_abs(x: np.ndarray) -> np.ndarray:
    """log10 of |x|, floored at 1e-30 (zeros read as -30, NaN stays NaN)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log10(np.maximum(np.abs(x), 1e-30))


def early_count(n_steps: int) -> int:
    """How many of a run's first values are its early level: max(3, n_steps / 50)."""
    return max(3, n_steps // 50)


def early_median(values: np.ndarray, n_steps: int) -> float:
    """Median of the finite values among the first :func:`early_count`; NaN if none."""
    head = values[:early_count(n_steps)]
    head = head[np.isfinite(head)]
    return float(np.median(head)) if head.size else float("nan")


def early_loss(loss: np.ndarray, n_steps: int) -> float:
    """The run's starting loss, which its progress is measured from.

    :func:`early_median`, or the first loss when the loss leapt right after the first update
    (:func:`neuraldbg.events.rose_after_first_update`, the heuristic's rule): the fall back
    from that leap is no learning.
    """
    finite = loss[np.isfinite(loss)]
    if rose_after_first_update(finite, early_count(n_steps)):
        return float(finite[0])
    return early_median(loss, n_steps)


def _progress(loss: np.ndarray, bins: Bins) -> tuple[str, float]:
    """Final over early loss: learned | partial | none | worse (nonfinite: a NaN/Inf loss)."""
    if not np.isfinite(loss).all():
        return "nonfinite", float("inf")
    tail = loss[-max(3, len(loss) // 20):]
    l0 = early_loss(loss, len(loss))
    progress = float(np.median(tail) / l0) if abs(l0) > 1e-12 else 1.0
    e = bins.progress_edges
    return ("learned" if progress < e[0] else "partial" if progress < e[1]
            else "none" if progress < e[2] else "worse"), progress


def _spikes(gnorm: np.ndarray, bins: Bins) -> tuple[str, float]:
    """Decades of the largest global gradient norm over its median: calm | spiky | extreme."""
    finite_g = gnorm[np.isfinite(gnorm) & (gnorm > 0)]
    if not np.isfinite(gnorm).all():
        return "nonfinite", float("inf")
    if not finite_g.size:
        return "calm", 0.0
    spikes = float(np.log10(finite_g.max() / np.median(finite_g)))
    e2 = bins.spike_edges
    return ("calm" if spikes < e2[0] else "spiky" if spikes < e2[1] else "extreme"), spikes


def _grad_ratio(trace: Trace, bins: Bins, cut_off: Collection[str]) -> tuple[str, float]:
    """Decades of the first over the last weighted layer's early gradient norm (AutoTrainer).

    Over the weighted layers not ``cut_off`` from the backward
    (:attr:`neuraldbg.run_facts.RunFacts.blocked_modules`): the ratio reads how the gradient
    fades on its way back, and a trunk cut off from it (a ``detach`` before the head) is
    another fact (``gradient_blocked``), not a flow that died. Read with the cut-off trunk,
    a CNN whose head learned to a loss of 0.002 was ``dead`` and the network named dead
    neurons at 0.98.
    """
    ratio = float("nan")
    stats = trace.stats
    if len(stats):
        mods = trace.modules.set_index("module_name")
        weighted = [m for m in trace.module_names if float(mods.at[m, "n_trainable"]) > 0
                    and m not in cut_off]
        if len(weighted) >= 2:
            head_steps = np.sort(stats["step"].unique())[:max(3, stats["step"].nunique() // 10)]
            sel = stats[stats["step"].isin(head_steps)
                        & stats["module_name"].isin((weighted[0], weighted[-1]))]
            med = sel.groupby("module_name")["param_grad_norm"].median()
            if weighted[0] in med.index and weighted[-1] in med.index:
                pair = np.array([med[weighted[0]], med[weighted[-1]]], dtype=float)
                if np.isfinite(pair).all():
                    logs = log10_abs(pair)
                    ratio = float(logs[0] - logs[1])
    e3 = bins.grad_ratio_edges
    return ("balanced" if not np.isfinite(ratio) else "dead" if ratio < e3[0]
            else "vanishing" if ratio < e3[1] else "balanced" if ratio < e3[2]
            else "growing"), ratio


def _update(upd: np.ndarray, lr: np.ndarray, inflation: np.ndarray, bins: Bins
            ) -> tuple[str, float]:
    """log10 of the early update ratio ||dW||/||W||: tiny | small | normal | large.

    Under a warmup each early step's ratio is taken at the rate the warmup reached (times
    that rate over the step's; the step is the rate times the gradient under SGD, times a
    unit-scale direction under Adam): a warmup starts the rate far below the one the run
    trains at (a new user's AdamW at 1e-6 warmed up from 2.5e-8 read 40x too low, and
    ``what_if(lr_scale=1000)``, which the re-run shows trains, still failed). A decay from
    the start keeps the early ratios, which are read at the rate a failure in the first
    steps saw (the run's median would read a cosine-scheduled SGD whose units died at
    step 18 at half its rate). The zoo's runs keep one rate over their first steps. Under
    RMSprop each early step is divided by the optimizer's own inflation of it
    (:func:`neuraldbg.run_facts.early_step_inflation`: no bias correction, 10x at the first
    step); ``inflation`` holds it for the first steps.
    """
    k = max(3, len(upd) // 20)
    head = upd[:k] * _at_warmed_rate(lr, min(k, len(upd)), bins.lr_spike_factor) / inflation
    if not np.isfinite(head).any():
        return "nonfinite", float("nan")
    u = float(np.median(log10_abs(head[np.isfinite(head)])))
    e = bins.update_edges
    return ("tiny" if u < e[0] else "small" if u < e[1]
            else "normal" if u < e[2] else "large"), u


def _at_warmed_rate(lr: np.ndarray, k: int, jump: float) -> np.ndarray:
    """The rate a warmup reached / each of the first ``k`` steps' rate (1 without a warmup).

    A warmup: over the first quarter of the run the rate rises to its largest value
    gradually (never falling, never jumping ``jump``-fold in one step, as a schedule spike
    does). A rate that starts at its largest (a decay, a constant rate) and
    a spike leave the ratios as they are.
    """
    head = lr[:max(k, len(lr) // 4)]
    if len(head) < k or not (np.isfinite(head).all() and (head > 0).all()):
        return np.ones(k)
    peak = int(np.argmax(head))
    steps = head[1:peak + 1] / head[:peak]
    if (steps < 1.0).any() or (steps >= jump).any():
        return np.ones(k)
    return float(head[peak]) / head[:k]


def _forward_scale(trace: Trace, bins: Bins, swing: float) -> tuple[float, float]:
    """The forward gain and the input scale, at the first recorded step.

    The gain is the activation scale of the last third of the weighted layers over the first
    third's (decades); the input scale is the first weighted layer's output scale, or the
    model's input read by the capture behind a recurrent first layer (which bounds its
    output). When a few records far off the rest make that layer's output range swing
    from batch to batch (``swing``, :attr:`neuraldbg.run_facts.RunFacts.input_swing`, above
    ``bins.input_swing_high``), the input scale is its lowest over the first recorded steps,
    those of batches without them.
    """
    stats = trace.stats
    gain, inp = float("nan"), float("nan")
    if len(stats):
        first_step = stats["step"].min()
        s0 = stats[stats["step"] == first_step].set_index("module_name")
        mods = trace.modules.set_index("module_name")
        weighted = [m for m in trace.module_names
                    if m in s0.index and float(mods.at[m, "n_trainable"]) > 0]
        if weighted:
            std = log10_abs(s0.loc[weighted, "act_std"].to_numpy(dtype=float))
            inp = float(std[0])
            if swing > bins.input_swing_high:
                # a few records far off the rest set the first step's scale: the inputs'
                # own is that of the steps whose batches held none
                early = stats[stats["module_name"] == weighted[0]].sort_values("step")
                early_std = log10_abs(early["act_std"].to_numpy(dtype=float)[:SWING_STEPS])
                early_std = early_std[np.isfinite(early_std)]
                if len(early_std):
                    inp = float(early_std.min())
            types = [str(mods.at[m, "module_type"]) for m in trace.module_names]
            if recurrent_in_front(types, trace.module_names.index(weighted[0])):
                # the input the capture read, at the scale a layer of PyTorch's default
                # init would put out from it
                given = input_rms(trace.meta) * SCHEME_GAINS["default"]
                inp = float(log10_abs(np.array([given]))[0])
            n = len(weighted)
            head_n = max(1, n // 3)
            lo = std[:head_n]
            hi = std[-head_n - 1:-1] if n > head_n + 1 else std[-head_n:]
            if np.isfinite(lo).all() and np.isfinite(hi).all():
                gain = float(np.mean(hi) - np.mean(lo))
            elif not np.isfinite(hi).all():
                gain = float("inf")
    return gain, inp


def run_states(trace: Trace, blocks: tuple[tuple[str, ...], ...], bins: Bins,
               states: dict[str, str], features: dict[str, float],
               cut_off: Collection[str] = (), input_swing: float = float("nan")) -> None:
    """Fill ``states`` and ``features`` with the run-level evidence (this module's docstring).

    Progress, gradient spikes, gradient ratio (over the weighted layers not in ``cut_off``);
    on the knobs: update ratio, forward gain, input magnitude (read past records far off the
    rest when ``input_swing``, the run facts' reading, says they swing the first layer).
    """
    steps = trace.steps
    states["progress"], features["progress"] = _progress(steps["loss"].to_numpy(dtype=float),
                                                         bins)
    states["spikes"], features["spikes"] = _spikes(steps["grad_norm"].to_numpy(dtype=float),
                                                   bins)
    states["grad_ratio"], features["grad_ratio"] = _grad_ratio(trace, bins, cut_off)
    lr = (steps["lr"].to_numpy(dtype=float) if "lr" in steps
          else np.full(len(steps), np.nan))
    upd = steps["update_ratio"].to_numpy(dtype=float)
    k = min(max(3, len(upd) // 20), len(upd))
    states["update"], features["update"] = _update(upd, lr, early_step_inflation(trace, k), bins)
    gain, inp = _forward_scale(trace, bins, input_swing)
    states["fwd_gain"] = ("growing" if gain > bins.gain_edge else
                          "shrinking" if gain < -bins.gain_edge else "stable")
    states["input_mag"] = "large" if np.isfinite(inp) and inp > bins.input_large else "normal"
    features["fwd_gain"] = gain
    features["input_mag"] = inp
