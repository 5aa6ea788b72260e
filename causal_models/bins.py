"""The discretization's vocabulary: the states of every evidence node and the thresholds.

:class:`Bins` holds every threshold that turns a trace's statistics into discrete states
(documented field by field); the ``*_STATES`` tuples are the states of the nodes, in the order
the network's tables use. :mod:`causal_models.discretize` and :mod:`causal_models.run_evidence`
both read them, so they live below both.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuraldbg.thresholds import ThresholdConfig

_RULES = ThresholdConfig()

__all__ = [
    "GRAD_STATES",
    "ACT_STATES",
    "LOSS_STATES",
    "UPDATE_STATES",
    "GAIN_STATES",
    "WEIGHT_SCALE_STATES",
    "INPUT_STATES",
    "PROGRESS_STATES",
    "SPIKE_STATES",
    "GRAD_RATIO_STATES",
    "LR_CONFIG_STATES",
    "INIT_CONFIG_STATES",
    "INPUT_CONFIG_STATES",
    "ACTIVATION_STATES",
    "NORMALIZATION_STATES",
    "CLIPPING_STATES",
    "DEPTH_STATES",
    "ARCH_STATES",
    "Bins",
]

GRAD_STATES: tuple[str, ...] = ("healthy", "vanishing", "exploding", "nonfinite")
ACT_STATES: tuple[str, ...] = ("normal", "saturated", "dead", "anomalous")
LOSS_STATES: tuple[str, ...] = ("decreasing", "low", "flat", "rising", "nonfinite")
UPDATE_STATES: tuple[str, ...] = ("tiny", "small", "normal", "large", "nonfinite")
GAIN_STATES: tuple[str, ...] = ("shrinking", "stable", "growing")
WEIGHT_SCALE_STATES: tuple[str, ...] = ("small", "default", "large", "unknown")
INPUT_STATES: tuple[str, ...] = ("normal", "large")
PROGRESS_STATES: tuple[str, ...] = ("learned", "partial", "none", "worse", "nonfinite")
SPIKE_STATES: tuple[str, ...] = ("calm", "spiky", "extreme", "nonfinite")
GRAD_RATIO_STATES: tuple[str, ...] = ("dead", "vanishing", "balanced", "growing")
LR_CONFIG_STATES: tuple[str, ...] = ("low", "typical", "high", "unknown")
INIT_CONFIG_STATES: tuple[str, ...] = ("small", "default", "large", "unknown")
INPUT_CONFIG_STATES: tuple[str, ...] = ("standardized", "raw", "unknown")
ACTIVATION_STATES: tuple[str, ...] = ("relu", "leaky_relu", "gelu", "tanh", "sigmoid", "other")
NORMALIZATION_STATES: tuple[str, ...] = ("none", "batch", "layer")
CLIPPING_STATES: tuple[str, ...] = ("none", "peaks", "tight")
DEPTH_STATES: tuple[str, ...] = ("shallow", "deep")
ARCH_STATES: tuple[str, ...] = ("feedforward", "convolutional", "recurrent", "attention")


@dataclass(frozen=True, slots=True)
class Bins:
    """Thresholds of the discretization (log10 units unless said otherwise).

    Attributes
    ----------
    vanish_abs : float
        A block whose mean log10 gradient norm is below this is ``vanishing`` (1e-7).
    vanish_rel : float
        ... or more than this many decades below the output block's in the same slice.
    explode_growth : float
        A block whose gradient grew by more than this many decades since its first slice is
        ``exploding`` (in a run whose global gradient norm surged ``grad_spike`` x, since
        the lower of that and its early level, the first recorded steps) ...
    explode_abs : float
        ... or whose mean log10 gradient norm exceeds this (1e3).
    dead_frac : float
        Share of units dead for the whole batch (rectifier outputs) above which a block is
        ``dead``.
    saturated_frac : float
        Share of saturated outputs (sigmoid/tanh/softmax modules) above which it is
        ``saturated``.
    anomalous_act : float
        log10 of max |activation| above which a block is ``anomalous`` (also any NaN/Inf).
    loss_low : float
        Slice median loss below this fraction of the early loss: ``low`` (learned).
    loss_rising : float
        Slice median above this multiple of the early loss: ``rising``.
    loss_decrease : float
        Slice median below this fraction of the previous slice's: ``decreasing``.
    update_edges : tuple of float
        log10 early update ratio edges between tiny | small | normal | large.
    gain_edge : float
        Decades of activation-scale change across the depth counted as shrinking/growing.
    input_large : float
        log10 std of the first weighted layer's output above which inputs count as large.
    lr_config_edges : tuple of float
        Decades of the configured lr against the optimizer's usual value: low | typical | high.
    init_gain_edges : tuple of float
        Configured init gain edges: small | default | large.
    input_scale_raw : float
        A configured input multiplier above this counts as raw (unstandardized) inputs.
    lr_spike_factor : float
        A recorded learning rate above this multiple of its median is a schedule spike.
    deep_layers : int
        Weighted layers from which a model counts as ``deep``.
    sigmoid_decay_edges : tuple of float
        Decades by which a stack of sigmoid units with this run's depth and weight gain would
        shrink the backward signal (:func:`causal_models.evidence.sigmoid_decay`):
        mild | strong | severe.
    progress_edges : tuple of float
        Final over early loss: learned | partial | none | worse.
    spike_edges : tuple of float
        Decades of max over median global gradient norm: calm | spiky | extreme.
    grad_ratio_edges : tuple of float
        Decades of first over last weighted layer's early gradient norm:
        dead | vanishing | balanced | growing.
    clip_engage : float
        A recorded total gradient norm at or above this fraction of a clipping threshold
        ``c`` counts as capped by it (a clipped run records its norms at ``c`` after the cap).
    clip_tight : float
        Share of steps capped from which clipping at ``c`` is ``tight`` (it rescales most
        updates) rather than capping the ``peaks`` only; no step capped is ``none``.
    spike_factor : float
        Onset: a loss above this multiple of its early median.
    grad_spike : float
        Onset: a global gradient norm above this multiple of its early median.
    weight_scale_high, weight_scale_low : float
        The Linear/Conv weights' norm at the first step over PyTorch's default above which
        the init reads ``large``, below which ``small`` (plain ratios; the heuristic's
        :attr:`neuraldbg.thresholds.ThresholdConfig.weight_scale_high` and ``_low``).
    start_grad_ratio_high, start_grad_ratio_low : float
        Global gradient norm / parameter norm at the first step above which the gradients
        dwarf the weights before any update, and below which they are tiny against them
        (plain ratios, not log10; the heuristic's
        :attr:`neuraldbg.thresholds.ThresholdConfig.start_grad_ratio_high` and ``_low``).
    input_swing_high : float
        The first weighted layer's step-to-step swing (decades, the heuristic's
        :attr:`neuraldbg.thresholds.ThresholdConfig.input_swing_high`) above which a few
        records far off the rest set its output's scale: the input magnitude is then read
        on the recorded steps without them (the lowest of the first ones).
    """

    vanish_abs: float = -7.0
    vanish_rel: float = -4.0
    explode_growth: float = 2.0
    explode_abs: float = 3.0
    dead_frac: float = 0.5
    saturated_frac: float = 0.5
    anomalous_act: float = 4.0
    loss_low: float = 0.5
    loss_rising: float = 1.5
    loss_decrease: float = 0.95
    update_edges: tuple[float, float, float] = (-5.0, -3.0, -1.3)
    gain_edge: float = 1.0
    input_large: float = 1.0
    lr_config_edges: tuple[float, float] = (-1.5, 1.0)
    init_gain_edges: tuple[float, float] = (0.5, 2.0)
    input_scale_raw: float = 10.0
    lr_spike_factor: float = 3.0
    deep_layers: int = 8
    sigmoid_decay_edges: tuple[float, float] = (-1.75, -3.5)
    progress_edges: tuple[float, float, float] = (0.5, 0.7, 1.05)
    spike_edges: tuple[float, float] = (1.0, 2.5)
    grad_ratio_edges: tuple[float, float, float] = (-10.0, -2.0, 1.5)
    clip_engage: float = 0.99
    clip_tight: float = 0.5
    spike_factor: float = 3.0
    grad_spike: float = 100.0
    weight_scale_high: float = _RULES.weight_scale_high
    weight_scale_low: float = _RULES.weight_scale_low
    start_grad_ratio_high: float = _RULES.start_grad_ratio_high
    start_grad_ratio_low: float = _RULES.start_grad_ratio_low
    input_swing_high: float = _RULES.input_swing_high
