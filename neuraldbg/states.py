"""State Classifier: the health of every module's gradient and activation at every recorded step.

First stage of the heuristic Post-Mortem Reasoner (trace -> **states** -> events -> compression
-> hypotheses). Everything is computed on dense ``(recorded steps, modules)`` arrays built once
from ``trace.stats``; no Python loop runs over rows, so a trace of 10,000 steps x 100 modules
classifies in a few tens of milliseconds.

Thresholds are absolute (a gradient below ``1e-6``, as published) and relative (a module against
its own early baseline, against the largest gradient of the network at the same step, against
the module that feeds it); all live in :class:`~neuraldbg.thresholds.ThresholdConfig`, each with
its reason.
Saturation is judged per activation family by the capture (``act_frac_saturated`` is 0 for
Linear and Conv outputs, and a sigmoid stuck near 0 counts), so no ``|x| > 0.95`` cut is applied
here. Entering and leaving an unhealthy state use two thresholds (hysteresis), so a statistic
that hovers around one threshold does not produce an event at every step.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
import pandas as pd

from neuraldbg.stat_tables import wide_stats
from neuraldbg.thresholds import ThresholdConfig
from neuraldbg.trace import Trace

__all__ = [
    "GradientHealth",
    "ActivationHealth",
    "StateTable",
    "classify_states",
    "UNOBSERVED",
    "SATURATING_FAMILIES",
    "DROPOUT_TYPES",
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

#: Module types whose zeros are random draws, not dead units (``nn.Dropout``, ``nn.Dropout2d``,
#: ``nn.AlphaDropout``, ...).
DROPOUT_TYPES = ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout")
#: Activation families with a flat region whose share of outputs is ``act_frac_saturated``.
SATURATING_FAMILIES = ("sigmoid", "tanh", "softmax", "smooth")


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
    trainable = (mods["n_trainable"].fillna(0).to_numpy() > 0)
    observed = np.nan_to_num(t["calls"], nan=0.0) > 0
    grad = _gradient_measures(t, observed, trainable, cfg)
    act = _activation_conditions(t, observed, grad.nonfinite,
                                 np.asarray(families, dtype=object), cfg,
                                 np.asarray([ty.endswith(DROPOUT_TYPES) for ty in types],
                                            dtype=bool))
    vanishing, exploding = _gradient_conditions(grad, observed, cfg)
    act_state = _activation_codes(observed, grad.nonfinite, act)
    grad_state = _gradient_codes(grad, observed, act.saturated, vanishing, exploding, cfg)
    measures = {
        **t,
        "grad_ratio": grad.ratio,
        "grad_growth": grad.growth,
        "grad_depth_ratio": grad.depth_ratio,
        "grad_drop": grad.drop,
        "act_growth": act.growth,
        "nonfinite": grad.nonfinite,
        "act_nonfinite": grad.act_nonfinite,
        "observed": observed,
        # Each condition on its own (the state arrays keep only the highest-priority one).
        "is_vanishing": vanishing,
        "is_exploding": exploding,
        "is_dead": act.dead,
        "is_saturated": act.saturated,
        "is_anomalous": grad.nonfinite | act.huge,
    }
    return StateTable(steps=steps, module_names=names, module_types=types, families=families,
                      grad_state=grad_state, act_state=act_state, measures=measures, config=cfg)


@dataclass(frozen=True, slots=True)
class _GradientMeasures:
    """The gradient quantities the states are judged on (see :class:`StateTable`)."""

    act_nonfinite: np.ndarray
    nonfinite: np.ndarray
    grad_observed: np.ndarray
    g_fin: np.ndarray
    ratio: np.ndarray
    depth_ratio: np.ndarray
    growth: np.ndarray
    drop: np.ndarray


def _gradient_measures(t: dict[str, np.ndarray], observed: np.ndarray, trainable: np.ndarray,
                       cfg: ThresholdConfig) -> _GradientMeasures:
    """Gradient ratios to the step's largest, to the output's, to the early baseline."""
    n_s, n_m = observed.shape
    g = t["out_grad_norm"]
    # NaN and Inf are counted on the output's sample; its largest value is taken over every
    # element (a NaN there is one the sample missed: one NaN record in a batch of 256)
    act_nonfinite = observed & ((np.nan_to_num(t["act_nan"]) + np.nan_to_num(t["act_inf"]) > 0)
                                | ~np.isfinite(t["act_max_abs"]))
    nonfinite = act_nonfinite | (observed & ~np.isfinite(g))
    finite_g = observed & np.isfinite(g) & ~nonfinite
    # A module whose gradient is exactly zero at every step and which sits before the first
    # trainable module measures nothing (its output needs no gradient): not "vanishing".
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
        # A module's own baseline is its early gradient where it registers on the network's
        # scale (ratio to the step's largest at or above ``baseline_floor``): a gradient that
        # cancels out at step 0 (units that are copies of each other) and is ordinary from
        # step 1 on did not grow a million-fold. A module below that scale for all of its
        # first steps keeps the floor below.
        measurable = grad_observed & (g_fin > 0) & (ratio >= cfg.baseline_floor)
        base = _early_baseline(g_fin, measurable, cfg.baseline_steps, "min")
        ref_base = _early_baseline(g_ref[:, None], np.isfinite(g_ref)[:, None],
                                   cfg.baseline_steps, "min")[0]
        base = np.fmax(base, cfg.baseline_floor * ref_base)
        growth = g_fin / base[None, :]
        # Input-side gradient of module m: output gradient of the module that feeds it.
        g_prev = np.concatenate([np.full((n_s, 1), np.nan), g_fin[:, :-1]], axis=1)
        drop = g_prev / g_fin
    return _GradientMeasures(act_nonfinite, nonfinite, grad_observed, g_fin, ratio,
                             depth_ratio, growth, drop)


def _gradient_conditions(grad: _GradientMeasures, observed: np.ndarray, cfg: ThresholdConfig
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(vanishing, exploding) masks, each with its enter/stay hysteresis."""
    seen, g_fin, ratio = grad.grad_observed, grad.g_fin, grad.ratio
    vanish_enter = seen & ((ratio < cfg.rel_vanish)
                           | ((g_fin < cfg.abs_vanish) & (ratio < cfg.abs_vanish_guard)))
    vanish_stay = seen & ((ratio < cfg.rel_vanish_exit)
                          | ((g_fin < cfg.abs_vanish) & (ratio < cfg.abs_vanish_guard)))
    vanish_stay |= ~observed  # an unobserved cell keeps the last decided state
    vanishing = _hysteresis(vanish_enter, vanish_stay) & seen

    nonfinite = grad.nonfinite
    explode_enter = nonfinite | (seen & ((grad.growth > cfg.explode_growth)
                                         | (grad.depth_ratio > cfg.explode_depth)))
    explode_stay = nonfinite | ~observed | (seen & (
        (grad.growth > cfg.explode_growth_exit) | (grad.depth_ratio > cfg.explode_depth)))
    exploding = _hysteresis(explode_enter, explode_stay) & (seen | nonfinite)
    return vanishing, exploding


@dataclass(frozen=True, slots=True)
class _ActivationConditions:
    """Activation growth and the huge/dead/saturated masks."""

    growth: np.ndarray
    huge: np.ndarray
    dead: np.ndarray
    saturated: np.ndarray


def _activation_conditions(t: dict[str, np.ndarray], observed: np.ndarray,
                           nonfinite: np.ndarray, fam: np.ndarray, cfg: ThresholdConfig,
                           dropout: np.ndarray) -> _ActivationConditions:
    """Outputs grown huge, dead or saturated (per activation family), with hysteresis.

    A dropout module's zeros are drawn on purpose: its output is dead only where nearly
    every unit is zero for the whole batch (``cfg.dropout_dead_frac``; ``dropout`` marks
    those columns), which no drop rate does to a batch: units zeroed before it, by an
    activation applied as a function.
    """
    std = t["act_std"]
    with np.errstate(all="ignore"):
        std_base = _early_baseline(std, observed & np.isfinite(std) & (std > 0), cfg.baseline_steps)
        act_growth = std / std_base[None, :]
    huge = observed & ~nonfinite & ((t["act_max_abs"] > cfg.act_overflow)
                                    | (act_growth > cfg.act_growth))
    act_ok = observed & ~nonfinite
    dead_frac = np.nan_to_num(t["act_frac_dead"])
    enter = np.where(dropout[None, :], cfg.dropout_dead_frac, cfg.dead_frac)
    leave = np.where(dropout[None, :], cfg.dropout_dead_frac, cfg.dead_frac_exit)
    dead = _hysteresis(act_ok & (dead_frac >= enter),
                       ~act_ok | (dead_frac >= leave)) & act_ok
    saturating = np.isin(fam, SATURATING_FAMILIES)
    # A softmax that ends the network becomes one-hot when training succeeds: not a fault.
    if len(fam) and fam[-1] == "softmax":
        saturating = saturating.copy()
        saturating[-1] = False
    sat_frac = np.nan_to_num(t["act_frac_saturated"])
    saturated = _hysteresis(act_ok & saturating[None, :] & (sat_frac >= cfg.sat_frac),
                            ~act_ok | (sat_frac >= cfg.sat_frac_exit)) & act_ok
    return _ActivationConditions(act_growth, huge, dead, saturated)


def _activation_codes(observed: np.ndarray, nonfinite: np.ndarray,
                      act: _ActivationConditions) -> np.ndarray:
    """Activation state codes, the highest-priority condition winning."""
    act_state = np.full(observed.shape, UNOBSERVED, dtype=np.int8)
    act_state[observed] = ACTIVATION_STATES.index(ActivationHealth.NORMAL)
    # Priority: non-finite > dead > huge > saturated. A layer whose live units blew up but
    # most of whose units are dead is dead first (the blow-up is the divergence's evidence).
    act_state[act.saturated] = ACTIVATION_STATES.index(ActivationHealth.SATURATED)
    act_state[act.huge] = ACTIVATION_STATES.index(ActivationHealth.ANOMALOUS)
    act_state[act.dead] = ACTIVATION_STATES.index(ActivationHealth.DEAD)
    act_state[nonfinite] = ACTIVATION_STATES.index(ActivationHealth.ANOMALOUS)
    return act_state


def _gradient_codes(grad: _GradientMeasures, observed: np.ndarray, saturated: np.ndarray,
                    vanishing: np.ndarray, exploding: np.ndarray, cfg: ThresholdConfig
                    ) -> np.ndarray:
    """Gradient state codes: exploding > vanishing > blocked by saturation > healthy."""
    grad_state = np.full(observed.shape, UNOBSERVED, dtype=np.int8)
    grad_state[grad.grad_observed] = GRADIENT_STATES.index(GradientHealth.HEALTHY)
    drop = grad.drop
    blocked = _hysteresis(saturated & ~(drop >= cfg.sat_grad_drop),
                          ~observed | (saturated & ~(drop >= cfg.sat_grad_drop_exit))
                          ) & saturated & grad.grad_observed
    grad_state[blocked] = GRADIENT_STATES.index(GradientHealth.SATURATED)
    grad_state[vanishing] = GRADIENT_STATES.index(GradientHealth.VANISHING)
    grad_state[exploding] = GRADIENT_STATES.index(GradientHealth.EXPLODING)
    return grad_state
