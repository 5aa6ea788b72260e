"""State Classifier: the health of every module's gradient and activation at every recorded step.

First stage of the heuristic Post-Mortem Reasoner (trace -> **states** -> events -> compression
-> hypotheses). Everything is computed on dense ``(recorded steps, modules)`` arrays built once
from ``trace.stats``; no Python loop runs over rows, so a trace of 10,000 steps x 100 modules
classifies in a few tens of milliseconds.

Thresholds are absolute (a gradient below ``1e-6``, as published) and relative (a module against
its own early baseline, against the largest gradient of the network at the same step, against
the module that feeds it); all live in :class:`ThresholdConfig`, each with its reason.
Saturation is judged per activation family by the capture (``act_frac_saturated`` is 0 for
Linear and Conv outputs, and a sigmoid stuck near 0 counts), so no ``|x| > 0.95`` cut is applied
here. Entering and leaving an unhealthy state use two thresholds (hysteresis), so a statistic
that hovers around one threshold does not produce an event at every step.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import pandas as pd

from neuraldbg.trace import Trace

__all__ = [
    "GradientHealth",
    "ActivationHealth",
    "ThresholdConfig",
    "StateTable",
    "wide_stats",
    "classify_states",
    "UNOBSERVED",
]

#: Code of a (step, module) cell without a usable observation (module not called, no grad).
UNOBSERVED = -1


class GradientHealth(str, Enum):
    """Health of the gradient flowing through a module at one step."""

    HEALTHY = "healthy"
    VANISHING = "vanishing"
    EXPLODING = "exploding"
    SATURATED = "saturated"


class ActivationHealth(str, Enum):
    """Health of a module's output at one step."""

    NORMAL = "normal"
    SATURATED = "saturated"
    DEAD = "dead"
    ANOMALOUS = "anomalous"


#: Integer codes used in the state arrays (index into these tuples).
GRADIENT_STATES: tuple[GradientHealth, ...] = tuple(GradientHealth)
ACTIVATION_STATES: tuple[ActivationHealth, ...] = tuple(ActivationHealth)

_SATURATING_FAMILIES = ("sigmoid", "tanh", "softmax", "smooth")


@dataclass(frozen=True, slots=True)
class ThresholdConfig:
    """Every threshold of the heuristic reasoner, with the reason for its value.

    Ratios of gradient norms are taken at the same step, so they do not move when the loss
    (and with it every gradient) shrinks during healthy training.

    Attributes
    ----------
    abs_vanish : float, default=1e-6
        A module's output-gradient norm below this is vanishing (the published absolute rule).
    abs_vanish_guard : float, default=1e-2
        ... but only when it is also 100x below the network's largest gradient at that
        step: a converged run has every gradient tiny at once, which is not vanishing, and
        hidden layers of a healthy net commonly sit 10x under the top.
    rel_vanish : float, default=1e-3
        Gradient norm / largest gradient norm of the network at the same step below this is
        vanishing. AutoTrainer's first/last-layer ratio rule uses 1e-3.
    rel_vanish_exit : float, default=3e-3
        Hysteresis: a vanishing module recovers only above this ratio.
    explode_growth : float, default=100.0
        Gradient norm above this multiple of the module's own early baseline is exploding:
        the contract's "grow by orders of magnitude" (two).
    explode_growth_exit : float, default=10.0
        Hysteresis: an exploding module recovers only below this multiple.
    explode_depth : float, default=100.0
        A module gradient this many times the output module's gradient at the same step is
        exploding through depth (AutoTrainer flags a first/last ratio above 70).
    grad_spike : float, default=10.0
        A global gradient norm above this multiple of its run median is a spike: sporadic
        explosions (a recurrent net without clipping) that never grow 100x over the start.
        Healthy runs peak at ~2-5x their median.
    baseline_steps : int, default=5
        A gradient's early baseline is the smallest of its first this-many recorded values
        (the smallest, since a run that explodes from step 2 would lift a median); an
        activation's is their median.
    baseline_floor : float, default=1e-3
        A module's gradient baseline is at least this share of the network's largest early
        gradient, so a layer that starts at exactly zero (a zero-initialised head) does not
        count as exploding when it wakes up.
    dead_frac : float, default=0.6
        Share of units exactly zero for the whole batch above which a layer is dead.
        DeepDiagnosis flags 70% of activations <= 0; whole-batch-dead units are a stricter
        measure, so a lower share is as telling. A layer fed by a fully dead layer measures
        about 0.5 (half its biases negative), which stays below.
    dead_frac_exit : float, default=0.4
        Hysteresis: a dead layer recovers only below this share.
    sat_frac : float, default=0.5
        Share of outputs in the flat region of a saturating activation (sigmoid, tanh,
        softmax, GELU/SiLU tail) above which the layer is saturated (DeepDiagnosis: > 50%).
    sat_frac_exit : float, default=0.3
        Hysteresis: a saturated layer recovers only below this share.
    sat_grad_drop : float, default=0.1
        A saturated activation whose input-gradient / output-gradient ratio is below this
        blocks the gradient (GradientHealth.SATURATED); a healthy tanh passes ~0.5-1.
    sat_grad_drop_exit : float, default=0.2
        Hysteresis: the gradient through a saturated layer counts as unblocked above this.
    act_overflow : float, default=1e6
        Largest |activation| above which an output is anomalous even when finite (float16
        overflows at 65504; float32 runs stay far below in healthy training).
    act_growth : float, default=1e3
        Activation std above this multiple of the module's early baseline is anomalous.
    loss_spike_factor : float, default=3.0
        A finite loss above this multiple of the median of the previous ``loss_window``
        losses is a spike (the capture's own spike rule).
    loss_window : int, default=10
        Trailing window of the spike rule.
    loss_blowup : float, default=10.0
        A loss above this multiple of its early baseline has blown up (diverged while finite).
    plateau_improvement : float, default=0.1
        A run whose loss improved by less than this share between its first and last
        windows has stalled.
    plateau_window : float, default=0.1
        Share of the run (at least 5 steps) averaged for the first and last loss windows.
    plateau_min_steps : int, default=20
        Shorter runs are never judged stalled (too little evidence).
    lr_jump : float, default=3.0
        A learning rate this many times the previous step's is a jump (a spike or a missing
        warm-up), the signature of a divergence without a gradient lead.
    lr_jump_window : int, default=5
        A jump up to this many steps before a blow-up is taken as its trigger.
    update_ratio_high : float, default=1e-2
        ||dW||/||W|| per step above this is a large learning rate: ~1e-3 is the usual healthy
        value (Karpathy's rule of thumb); 10x more moves weights ~1% a step.
    update_ratio_low : float, default=1e-4
        ... and below this (10x under the healthy value) the weights barely move. Adam's
        update is ~lr per weight, so a too-low Adam learning rate shows here too.
    total_update_low : float, default=0.1
        Weights that moved less than this share of their norm over the whole run (the sum
        of the per-step update ratios) barely trained: a learning rate too low for the run.
    init_scale_high : float, default=2.0
        When the config names the init scheme: a measured gain above this multiple of the
        scheme's own gain is an init too large (a deep ReLU stack at 2x Kaiming grows its
        signal 2x per layer).
    init_scale_low : float, default=0.25
        ... and below this fraction of it, an init too small.
    depth_gain_high : float, default=10.0
        A signal growing (or shrinking, at 1/10) this much from the first to the last
        Linear/Conv layer at the first step, with every layer's own gain sound, means the
        network lacks normalization.
    init_gain_high : float, default=3.0
        Without a known scheme: median init gain std(out)/rms(in) of Linear/Conv layers
        above this is an init too large. PyTorch's default gives 1/sqrt(3) ~ 0.58,
        Kaiming-ReLU ~1.41 (the largest standard init); 3 is 5x the default.
    init_gain_low : float, default=0.12
        ... below this (a fifth of the default) an init too small.
    grad_sum_exponent : float, default=0.8
        Gradients never reset (a missing ``zero_grad``) pile up: the step-t gradient is the
        sum of t gradients, so its norm grows like t (like t^1.5-2 under momentum) while the
        loss does not improve. A global gradient norm whose log-log growth over the first
        steps has at least this exponent, on a run whose loss ends no lower than it began, is
        that running sum. Healthy runs rise at most ~0.6 there while their loss falls.
    grad_sum_fit : float, default=0.8
        ... and the power law must fit that growth (R^2 of log norm against log step) at
        least this well ...
    grad_sum_monotone : float, default=0.9
        ... and the norm must grow at this share of those steps at least: a sum of
        same-signed gradients rises step after step, where the noisy start of a blow-up by a
        too-high rate (the zoo's, R^2 ~0.4) and healthy training go up and down.
    grad_sum_steps : int, default=30
        Steps (before any non-finite norm) that growth is measured over.
    loss_scale_ratio : float, default=1e3
        First loss / (rms of the model's output at the first step^2 + 1) above this: the
        targets sit three orders of magnitude off the outputs (a regression target left in
        dollars). A squared-error loss starts near E[y^2] when the outputs are small, so the
        ratio reads the target scale; cross-entropy starts near log(classes), under 10.
    row_diversity_low : float, default=1e-3
        A weight matrix whose rows differ by less than this (mean std across rows over the
        matrix's rms; :mod:`neuraldbg.weight_diversity`) at enter and still at the latest
        flush has units that are copies of each other: a constant or identical init. A random
        init measures ~1 and rows filled with one constant exactly 0 (a float32 spread of
        identical values stays ~1e-7); 1e-3 leaves room for both. A zero-initialised head is
        symmetric at enter but not after training, so it never counts.
    grad_accumulation_growth : float, default=10.0
        Parameter-gradient norm / output-gradient norm of a layer growing this much from the
        first tenth of the run to the last one: the parameter gradient holds the steps before
        (gradients never reset). Without accumulation the ratio follows the layer's input
        scale, which moves a few-fold in training (measured 1-3x on the zoo's healthy runs);
        a running sum over 100 steps grows it ~100x.
    batchnorm_std_high : float, default=5.0
        BatchNorm outputs with a std this many times away from 1 at the first step do not
        normalise (train-mode BatchNorm gives ~1 per channel at init): the layers run on their
        initial running statistics, a model left in ``eval()``.
    data_update_ratio : float, default=1e-3
        A stalled run whose weights still move by this share of their norm per step (the
        healthy ~1e-3, Karpathy's rule of thumb) stalls for want of signal in the data, not
        for a small learning rate (labels unrelated to the inputs, when no other cause has
        evidence).
    cause_tie_margin : float, default=0.05
        Two causes of one symptom whose supports differ by less than this are not told
        apart by the evidence: neither is named with confidence >= 0.5 (``unsure_cap``) and
        the symptom is carried by ``unknown``, with the tie in the metadata.
    unsure_cap : float, default=0.45
        Confidence cap of a specific cause the evidence does not single out (a tie, or
        ``unknown`` better supported): below the contract's 0.5, where a claim is one a
        user acts on.
    default_gain : float, default=0.577
        Gain assumed for the first layer when no other layer measures one (PyTorch default
        init: weights U(+-1/sqrt(fan_in)) give rms(out)/rms(in) = 1/sqrt(3)).
    input_scale_high : float, default=5.0
        Estimated rms of the first layer's input above this is an unnormalised input:
        standardised data has rms ~1; 5x is far beyond it (raw pixels reach 100+).
    window : int, default=5
        Steps within which events in different layers are coupled.
    """

    abs_vanish: float = 1e-6
    abs_vanish_guard: float = 1e-2
    rel_vanish: float = 1e-3
    rel_vanish_exit: float = 3e-3
    explode_growth: float = 100.0
    explode_growth_exit: float = 10.0
    explode_depth: float = 100.0
    grad_spike: float = 10.0
    baseline_steps: int = 5
    baseline_floor: float = 1e-3
    dead_frac: float = 0.6
    dead_frac_exit: float = 0.4
    sat_frac: float = 0.5
    sat_frac_exit: float = 0.3
    sat_grad_drop: float = 0.1
    sat_grad_drop_exit: float = 0.2
    act_overflow: float = 1e6
    act_growth: float = 1e3
    loss_spike_factor: float = 3.0
    loss_window: int = 10
    loss_blowup: float = 10.0
    plateau_improvement: float = 0.1
    plateau_window: float = 0.1
    plateau_min_steps: int = 20
    lr_jump: float = 3.0
    lr_jump_window: int = 5
    update_ratio_high: float = 1e-2
    update_ratio_low: float = 1e-4
    total_update_low: float = 0.1
    init_scale_high: float = 2.0
    init_scale_low: float = 0.25
    depth_gain_high: float = 10.0
    init_gain_high: float = 3.0
    init_gain_low: float = 0.12
    default_gain: float = 0.577
    input_scale_high: float = 5.0
    grad_sum_exponent: float = 0.8
    grad_sum_fit: float = 0.8
    grad_sum_monotone: float = 0.9
    grad_sum_steps: int = 30
    loss_scale_ratio: float = 1e3
    row_diversity_low: float = 1e-3
    grad_accumulation_growth: float = 10.0
    batchnorm_std_high: float = 5.0
    data_update_ratio: float = 1e-3
    cause_tie_margin: float = 0.05
    unsure_cap: float = 0.45
    window: int = 5

    def __post_init__(self) -> None:
        """Reject a non-positive or non-numeric threshold (the message names it)."""
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(
                    f"ThresholdConfig.{name} must be a positive number, got {value!r}."
                )

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ThresholdConfig:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


#: Statistics the classifier reads (columns of ``trace.stats``).
_COLUMNS = ("calls", "out_grad_norm", "act_mean", "act_std", "act_max_abs", "act_frac_dead",
            "act_frac_saturated", "act_nan", "act_inf", "param_norm", "param_grad_norm",
            "update_ratio")


def wide_stats(trace: Trace, columns: tuple[str, ...] | list[str] = _COLUMNS
               ) -> tuple[np.ndarray, list[str], dict[str, np.ndarray]]:
    """Dense ``(recorded steps, modules)`` arrays of several statistics at once.

    Faster than one ``trace.stat(column)`` pivot per column: the step and module codes are
    computed once and each column is scattered into a preallocated array.

    Parameters
    ----------
    trace : Trace
    columns : sequence of str
        Columns of ``trace.stats``; a missing column comes back all-NaN.

    Returns
    -------
    steps : ndarray of int64, shape (n_steps,)
        Recorded steps, ascending.
    module_names : list of str
        Modules in forward order (``trace.module_names``).
    tables : dict of str to ndarray of float64, shape (n_steps, n_modules)
        NaN where a module has no row at a step.
    """
    names = trace.module_names
    stats = trace.stats
    if len(stats) == 0:
        return np.zeros(0, np.int64), names, {c: np.full((0, len(names)), np.nan) for c in columns}
    # Hash-based factorisation (pd.factorize) is ~10x faster than a Categorical on 1e6 strings.
    s_idx, steps = pd.factorize(stats["step"].to_numpy(dtype=np.int64), sort=True)
    steps = np.asarray(steps, dtype=np.int64)
    codes, uniques = pd.factorize(stats["module_name"])
    position = {name: i for i, name in enumerate(names)}
    lookup = np.array([position.get(u, -1) for u in uniques], dtype=np.int64)
    m_idx = lookup[codes] if len(lookup) else np.full(len(codes), -1, dtype=np.int64)
    ok = m_idx >= 0
    if not ok.all():
        s_idx, m_idx = s_idx[ok], m_idx[ok]
    tables = {}
    for c in columns:
        arr = np.full((len(steps), len(names)), np.nan)
        if c in stats.columns:
            vals = stats[c].to_numpy(dtype=np.float64, na_value=np.nan)
            arr[s_idx, m_idx] = vals[ok] if not ok.all() else vals
        tables[c] = arr
    return steps, names, tables


@dataclass(frozen=True)
class StateTable:
    """States of every module at every recorded step (output of :func:`classify_states`).

    Attributes
    ----------
    steps : ndarray of int64, shape (n_steps,)
        Recorded steps (with ``every > 1`` only the steps that have module statistics).
    module_names : list of str
        Modules in forward order.
    module_types : list of str
    families : list of str
        Activation family of each module.
    grad_state : ndarray of int8, shape (n_steps, n_modules)
        Index into :data:`GRADIENT_STATES`, :data:`UNOBSERVED` where not measured.
    act_state : ndarray of int8, shape (n_steps, n_modules)
        Index into :data:`ACTIVATION_STATES`, :data:`UNOBSERVED` where not measured.
    measures : dict of str to ndarray
        The measured quantities behind the states, same shape: the raw statistics plus
        ``grad_ratio`` (gradient / largest gradient at the step), ``grad_growth`` (gradient /
        own early baseline), ``grad_drop`` (input-side / output-side gradient), ``nonfinite``
        (output or gradient), ``act_nonfinite`` (output only) and ``act_growth``; and one
        boolean mask per condition (``is_vanishing``, ``is_exploding``, ``is_dead``,
        ``is_saturated``, ``is_anomalous``), since a cell in two conditions shows only the
        higher-priority one in the state arrays.
    config : ThresholdConfig
    """

    steps: np.ndarray
    module_names: list[str]
    module_types: list[str]
    families: list[str]
    grad_state: np.ndarray
    act_state: np.ndarray
    measures: dict[str, np.ndarray] = field(repr=False)
    config: ThresholdConfig = field(default_factory=ThresholdConfig)

    def frame(self, kind: str = "gradient") -> pd.DataFrame:
        """States as a readable DataFrame (rows steps, columns modules, state names).

        Parameters
        ----------
        kind : {"gradient", "activation"}, default="gradient"
        """
        if kind not in ("gradient", "activation"):
            raise ValueError(f"kind must be 'gradient' or 'activation', got {kind!r}.")
        codes = self.grad_state if kind == "gradient" else self.act_state
        labels = np.array([s.value for s in (GRADIENT_STATES if kind == "gradient"
                                             else ACTIVATION_STATES)] + ["unobserved"],
                          dtype=object)
        return pd.DataFrame(labels[codes], index=pd.Index(self.steps, name="step"),
                            columns=self.module_names)


def _hysteresis(enter: np.ndarray, stay: np.ndarray) -> np.ndarray:
    """Boolean state per column: on where ``enter``, kept on while ``stay``, off otherwise.

    ``enter`` implies ``stay``. Vectorised as a forward fill of the decided cells.
    """
    decided = np.where(enter, 1.0, np.where(~stay, 0.0, np.nan))
    filled = pd.DataFrame(decided).ffill().to_numpy()
    return np.nan_to_num(filled, nan=0.0) > 0.5


def _early_baseline(values: np.ndarray, valid: np.ndarray, k: int, how: str = "median"
                    ) -> np.ndarray:
    """Median (or minimum) of each column's first ``k`` valid values (NaN when none)."""
    rank = np.cumsum(valid, axis=0)
    keep = valid & (rank <= k)
    with warnings.catch_warnings():  # all-NaN columns: NaN baseline, no warning
        warnings.simplefilter("ignore", RuntimeWarning)
        reduce = np.nanmin if how == "min" else np.nanmedian
        return reduce(np.where(keep, values, np.nan), axis=0)


def classify_states(trace: Trace, config: ThresholdConfig | None = None) -> StateTable:
    """Classify the gradient and activation health of each module at each recorded step.

    Parameters
    ----------
    trace : Trace
    config : ThresholdConfig, optional
        Thresholds; the documented defaults when omitted.

    Returns
    -------
    StateTable
    """
    cfg = config or ThresholdConfig()
    steps, names, t = wide_stats(trace)
    mods = trace.modules.set_index("module_name").reindex(names)
    families = mods["activation_family"].fillna("other").astype(str).tolist()
    types = mods["module_type"].fillna("").astype(str).tolist()
    n_s, n_m = len(steps), len(names)
    fam = np.asarray(families, dtype=object)

    calls = np.nan_to_num(t["calls"], nan=0.0)
    observed = calls > 0
    g = t["out_grad_norm"]
    act_nonfinite = observed & (np.nan_to_num(t["act_nan"]) + np.nan_to_num(t["act_inf"]) > 0)
    nonfinite = act_nonfinite | (observed & ~np.isfinite(g))
    finite_g = observed & np.isfinite(g) & ~nonfinite
    # A module whose gradient is exactly zero at every step and which sits before the first
    # trainable module measures nothing (its output needs no gradient): not "vanishing".
    trainable = (mods["n_trainable"].fillna(0).to_numpy() > 0)
    before_trainable = np.cumsum(trainable) == 0
    always_zero = np.all(~finite_g | (g == 0), axis=0) & np.any(finite_g, axis=0)
    grad_observed = finite_g & ~(always_zero & before_trainable)[None, :]

    with np.errstate(all="ignore"):
        g_fin = np.where(grad_observed, g, np.nan)
        g_ref = np.nanmax(np.where(np.isnan(g_fin), -np.inf, g_fin), axis=1)
        g_ref = np.where(np.isfinite(g_ref) & (g_ref > 0), g_ref, np.nan)
        ratio = g_fin / g_ref[:, None]
        # Output gradient: the last observed module in forward order at each step.
        last_idx = n_m - 1 - np.argmax(grad_observed[:, ::-1], axis=1)
        g_out = np.where(grad_observed.any(axis=1), g_fin[np.arange(n_s), last_idx], np.nan)
        depth_ratio = g_fin / np.where(g_out > 0, g_out, np.nan)[:, None]
        base = _early_baseline(g_fin, grad_observed & (g_fin > 0), cfg.baseline_steps, "min")
        ref_base = _early_baseline(g_ref[:, None], np.isfinite(g_ref)[:, None],
                                   cfg.baseline_steps, "min")[0]
        base = np.fmax(base, cfg.baseline_floor * ref_base)
        growth = g_fin / base[None, :]
        # Input-side gradient of module m: output gradient of the module that feeds it.
        g_prev = np.concatenate([np.full((n_s, 1), np.nan), g_fin[:, :-1]], axis=1)
        drop = g_prev / g_fin

    vanish_enter = grad_observed & ((ratio < cfg.rel_vanish)
                                    | ((g_fin < cfg.abs_vanish) & (ratio < cfg.abs_vanish_guard)))
    vanish_stay = grad_observed & ((ratio < cfg.rel_vanish_exit)
                                   | ((g_fin < cfg.abs_vanish) & (ratio < cfg.abs_vanish_guard)))
    vanish_stay |= ~observed  # an unobserved cell keeps the last decided state
    vanishing = _hysteresis(vanish_enter, vanish_stay) & grad_observed

    explode_enter = nonfinite | (grad_observed & ((growth > cfg.explode_growth)
                                                  | (depth_ratio > cfg.explode_depth)))
    explode_stay = nonfinite | ~observed | (grad_observed & (
        (growth > cfg.explode_growth_exit) | (depth_ratio > cfg.explode_depth)))
    exploding = _hysteresis(explode_enter, explode_stay) & (grad_observed | nonfinite)

    # Activations.
    std = t["act_std"]
    with np.errstate(all="ignore"):
        std_base = _early_baseline(std, observed & np.isfinite(std) & (std > 0), cfg.baseline_steps)
        act_growth = std / std_base[None, :]
    huge = observed & ~nonfinite & ((t["act_max_abs"] > cfg.act_overflow)
                                    | (act_growth > cfg.act_growth))
    act_ok = observed & ~nonfinite
    dead_frac = np.nan_to_num(t["act_frac_dead"])
    dead = _hysteresis(act_ok & (dead_frac >= cfg.dead_frac),
                       ~act_ok | (dead_frac >= cfg.dead_frac_exit)) & act_ok
    saturating = np.isin(fam, _SATURATING_FAMILIES)
    # A softmax that ends the network becomes one-hot when training succeeds: not a fault.
    if n_m and fam[-1] == "softmax":
        saturating = saturating.copy()
        saturating[-1] = False
    sat_frac = np.nan_to_num(t["act_frac_saturated"])
    saturated = _hysteresis(act_ok & saturating[None, :] & (sat_frac >= cfg.sat_frac),
                            ~act_ok | (sat_frac >= cfg.sat_frac_exit)) & act_ok

    act_state = np.full((n_s, n_m), UNOBSERVED, dtype=np.int8)
    act_state[observed] = ACTIVATION_STATES.index(ActivationHealth.NORMAL)
    # Priority: non-finite > dead > huge > saturated. A layer whose live units blew up but
    # most of whose units are dead is dead first (the blow-up is the divergence's evidence).
    act_state[saturated] = ACTIVATION_STATES.index(ActivationHealth.SATURATED)
    act_state[huge] = ACTIVATION_STATES.index(ActivationHealth.ANOMALOUS)
    act_state[dead] = ACTIVATION_STATES.index(ActivationHealth.DEAD)
    act_state[nonfinite] = ACTIVATION_STATES.index(ActivationHealth.ANOMALOUS)

    grad_state = np.full((n_s, n_m), UNOBSERVED, dtype=np.int8)
    grad_state[grad_observed] = GRADIENT_STATES.index(GradientHealth.HEALTHY)
    blocked = _hysteresis(saturated & ~(drop >= cfg.sat_grad_drop),
                          ~observed | (saturated & ~(drop >= cfg.sat_grad_drop_exit))
                          ) & saturated & grad_observed
    grad_state[blocked] = GRADIENT_STATES.index(GradientHealth.SATURATED)
    grad_state[vanishing] = GRADIENT_STATES.index(GradientHealth.VANISHING)
    grad_state[exploding] = GRADIENT_STATES.index(GradientHealth.EXPLODING)

    measures = {
        **t,
        "grad_ratio": ratio,
        "grad_growth": growth,
        "grad_depth_ratio": depth_ratio,
        "grad_drop": drop,
        "act_growth": act_growth,
        "nonfinite": nonfinite,
        "act_nonfinite": act_nonfinite,
        "observed": observed,
        # Each condition on its own (the state arrays keep only the highest-priority one).
        "is_vanishing": vanishing,
        "is_exploding": exploding,
        "is_dead": dead,
        "is_saturated": saturated,
        "is_anomalous": nonfinite | huge,
    }
    return StateTable(steps=steps, module_names=names, module_types=types, families=families,
                      grad_state=grad_state, act_state=act_state, measures=measures, config=cfg)
