"""Event Extractor: semantic events from module states and from the loss curve.

Second stage of the heuristic Post-Mortem Reasoner (states -> **events** -> compression ->
hypotheses). An :class:`~neuraldbg.records.Event` is emitted

- on every change of a module's gradient or activation state (into a failure and back), and
- on the first observation of a module that is already unhealthy (``from_state`` is
  ``"unobserved"``), so a run that is sick from step 0 still produces events;
- for the loss and the run as a whole (module name ``"<loss>"`` / ``"<model>"``): the loss
  turning non-finite, a loss spike, a loss blow-up, a plateau, the global gradient norm
  exploding, and a learning-rate jump. These use ``trace.steps``, which has every step, so
  their onset is exact even when module statistics were recorded only every ``k`` steps.

Transitions are found with array operations; Python runs once per event, not per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, TypedDict

import numpy as np
import pandas as pd

from neuraldbg.records import Event
from neuraldbg.states import (
    ACTIVATION_STATES,
    GRADIENT_STATES,
    ActivationHealth,
    GradientHealth,
    StateTable,
)
from neuraldbg.thresholds import ThresholdConfig, require_positive_fields
from neuraldbg.trace import Trace

__all__ = ["LOSS", "MODEL", "CurveWindows", "LossDynamics", "loss_dynamics",
           "rose_after_first_update", "extract_events"]

#: Module name of events about the loss.
LOSS = "<loss>"
#: Module name of events about the run as a whole (global gradient norm, learning rate).
MODEL = "<model>"

# Statistic behind each unhealthy state (the evidence an event carries).
_GRAD_EVIDENCE = {
    GradientHealth.VANISHING: ("out_grad_norm", "grad_ratio"),
    GradientHealth.EXPLODING: ("out_grad_norm", "grad_growth", "grad_depth_ratio"),
    GradientHealth.SATURATED: ("out_grad_norm", "grad_drop", "act_frac_saturated"),
    GradientHealth.HEALTHY: ("out_grad_norm", "grad_ratio"),
}
_ACT_EVIDENCE = {
    ActivationHealth.DEAD: ("act_frac_dead", "act_mean", "act_std"),
    ActivationHealth.SATURATED: ("act_frac_saturated", "act_mean", "act_std"),
    ActivationHealth.ANOMALOUS: ("act_nan", "act_inf", "act_max_abs", "act_growth"),
    ActivationHealth.NORMAL: ("act_frac_dead", "act_frac_saturated"),
}


@dataclass(frozen=True, slots=True)
class LossDynamics:
    """What the loss curve and the step table say about the run.

    Attributes
    ----------
    n_steps : int
    baseline : float
        Median of the first finite losses (the run's starting level).
    improvement : float
        (first-window median - last-window median) / |first-window median|, over the finite
        part of the run; NaN when too short. The first loss replaces the first window's
        median when the loss rose right after the first update
        (:attr:`CurveWindows.early_rise_factor`).
    settled : float
        The improvement the stall is measured from: ``improvement``, or, when the run starts
        with a transient (its first window reaches :attr:`CurveWindows.transient_factor`
        times the second window's median: weights far too large give a loss of hundreds
        that collapses within a few steps), the same from the second window on: undoing an
        absurd start is not learning.
    stall : float
        In [0, 1]: 1 - settled / 0.5 (:attr:`CurveWindows.stall_improvement`), clipped. 0
        for a loss that halved or better, 1 for one that did not move or rose.
    plateau_step : int or None
        Where the loss stopped improving, when the run stalled: improvement below
        ``plateau_improvement`` over at least ``plateau_min_steps`` steps, of the windows'
        medians and of their lower quartiles alike (``lower_improvement``: a minibatch loss
        that mixes two kinds of batch, a few bad labels in some, can hold its median on the
        bad kind while the other batches learn).
    nonfinite_step : int or None
        First step with a NaN/Inf loss.
    blowup_step : int or None
        First step with a finite loss above ``loss_blowup`` x baseline.
    grad_explode_step : int or None
        First step with the global gradient norm above ``explode_growth`` x its baseline (the
        smallest of its first values), or non-finite.
    lr_jump_steps : tuple of int
        Steps where the learning rate rose at least ``lr_jump``-fold over the previous step.
    lr_collapse_step : int or None
        First step from which the learning rate stays below ``lr_collapse`` x its largest
        value to the end of the run (None when it never does).
    spike_steps : tuple of int
        Onsets of loss spikes.
    update_ratio : float
        Median ||dW||/||W|| per step before any failure onset: a non-finite loss, a loss
        blow-up or spike, a gradient explosion (NaN if unknown). A rate too high kills the
        units in its first spike, and the dead run's tiny updates that follow made the median
        over the whole run read a rate too low.
    total_update : float
        Sum of ||dW||/||W|| over the finite steps: how far, relative to their size, the
        weights moved in the whole run (NaN if unknown). A step between recorded steps
        (``every > 1``) counts at the ratio interpolated from its recorded neighbours.
    grad_growth_max : float
        Largest global gradient norm / baseline before the loss turned non-finite.
    grad_spikiness : float
        Largest global gradient norm / its median, before the loss turned non-finite.
    grad_spike_step : int or None
        First step with the global gradient norm above ``grad_spike`` x its median.
    grad_spike_share : float
        Share of the steps from ``grad_spike_step`` on whose gradient norm is above 3x the
        median (:attr:`CurveWindows.spike_share_factor`) (how persistent the spikes are).
    grad_spike_episodes : int
        Separate runs of steps with the gradient norm above ``grad_spike`` x its median.
    grad_explode_share : float
        Share of the steps from ``grad_explode_step`` on with the gradient norm still above
        ``explode_growth_exit`` x baseline or non-finite.
    lower_improvement : float
        ``improvement`` of the windows' lower quartiles
        (:attr:`CurveWindows.lower_quantile`) rather than their medians; NaN when too short.
    """

    n_steps: int
    baseline: float
    improvement: float
    settled: float
    stall: float
    plateau_step: int | None
    nonfinite_step: int | None
    blowup_step: int | None
    grad_explode_step: int | None
    lr_jump_steps: tuple[int, ...]
    spike_steps: tuple[int, ...]
    update_ratio: float
    grad_growth_max: float
    grad_spikiness: float = float("nan")
    grad_spike_step: int | None = None
    grad_spike_share: float = 0.0
    grad_explode_share: float = 0.0
    grad_spike_episodes: int = 0
    total_update: float = float("nan")
    lr_collapse_step: int | None = None
    lower_improvement: float = float("nan")


def _first(mask: np.ndarray, steps: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    return int(steps[idx[0]]) if len(idx) else None


def _onsets(mask: np.ndarray) -> np.ndarray:
    """Indices where a boolean series turns on."""
    prev = np.concatenate([[False], mask[:-1]])
    return np.flatnonzero(mask & ~prev)


@dataclass(frozen=True, slots=True)
class CurveWindows:
    """The fixed numbers of :func:`loss_dynamics`, with the reason for each.

    The thresholds it compares with are in :class:`~neuraldbg.thresholds.ThresholdConfig`.

    Attributes
    ----------
    stall_improvement : float, default=0.5
        ``stall = 1 - improvement / this``, clipped to [0, 1]: a loss that halved or better
        did not stall at all, one that did not move (or rose) stalled fully.
    min_plateau_window : int, default=5
        The first and last loss windows span at least this many steps (``plateau_window``
        of a short run would be one noisy minibatch loss).
    spike_min_history : int, default=3
        The trailing median of the spike rule needs at least this many earlier losses; the
        first steps, with less history, are never a spike.
    spike_share_factor : float, default=3.0
        ``grad_spike_share`` counts the steps whose gradient norm is above this multiple of
        its median: the level the healthy runs' peaks (~2-5x) sit at, so that the share says
        how persistent the instability is, not how tall its peaks are.
    improvement_floor : float, default=1e-12
        The first window's loss is at least this in the improvement's denominator, so a
        loss that starts at zero does not divide by zero.
    lower_quantile : float, default=0.25
        The quantile of a window's losses that ``lower_improvement`` reads. A stall leaves
        every part of the minibatch losses where it was; a loss whose batches are of two
        kinds (20 target outliers among 2,048 samples under a Huber loss put one in about
        half the batches of 64) has a median that sits on the bad kind: it rose by 54% over
        a run whose lower quartile fell by 87% and whose error on the clean samples fell
        six-fold, read by the medians alone as a plateau at 1.00. The quartile rather than a
        lower quantile, since over the 5 losses of a short run's window a lower one is the
        single smallest loss.
    transient_factor : float, default=100.0
        A first window whose largest loss is this many times the second window's median is
        an initial transient, and the stall is measured from the second window. Two
        decades: the zoo's 44 healthy runs at their default knobs reach at most 20x
        (healthy_cnn_bn), while weights 20-30x too large start at ~600-2000 and settle near
        chance (~2) within the first window.
    transient_floor : float, default=0.01
        ... unless the second window's median is already below this: a loss that fell to
        the bottom within the first tenth of the run learned, and whatever it did after is
        measured from its start (full-batch training of a graph network: 1.39 to 0.0003
        by step 30, then 0.0019 at the end as weight decay pulls on the weights, read as a
        transient and a full stall; the zoo's transients all settle near chance, 2.29-2.54).
        The level :data:`neuraldbg.sufficiency.LEARNED_LOSS` calls the bottom.
    early_rise_factor : float, default=2.0
        A first window whose median is this many times the first loss rose right after the
        first update: the improvement is then measured from the first loss (taken on the
        initial weights) rather than from that window. An LSTM at Adam 1.0 goes 1.1 -> 10
        -> 1.2 (chance 1.1) and read as a 4x fall from its first window's median.
    """

    stall_improvement: float = 0.5
    min_plateau_window: int = 5
    spike_min_history: int = 3
    spike_share_factor: float = 3.0
    improvement_floor: float = 1e-12
    lower_quantile: float = 0.25
    transient_factor: float = 100.0
    transient_floor: float = 0.01
    early_rise_factor: float = 2.0

    def __post_init__(self) -> None:
        """Reject a non-positive or non-numeric coefficient (the message names it)."""
        require_positive_fields(self)


class _Columns(NamedTuple):
    """The columns of ``trace.steps`` the dynamics read (NaN where absent)."""

    steps: np.ndarray
    loss: np.ndarray
    lr: np.ndarray
    gnorm: np.ndarray
    update: np.ndarray
    complete: np.ndarray
    recorded: np.ndarray
    stepped: np.ndarray

    @classmethod
    def read(cls, st: pd.DataFrame) -> _Columns:
        """Read the columns off the steps table."""
        n = len(st)

        def col(name: str) -> np.ndarray:
            if name in st.columns:
                return st[name].to_numpy(dtype=np.float64, na_value=np.nan)
            return np.full(n, np.nan)

        steps = st["step"].to_numpy(dtype=np.int64) if n else np.zeros(0, np.int64)
        # A step that did not finish has NaN loss by construction; only a real NaN/Inf counts.
        complete = (st["complete"].to_numpy(dtype=bool) if "complete" in st.columns
                    else np.ones(n, bool))

        def flag(name: str) -> np.ndarray:
            return st[name].to_numpy(dtype=bool) if name in st.columns else np.ones(n, bool)

        return cls(steps, col("loss"), col("lr"), col("grad_norm"), col("update_ratio"),
                   complete, flag("recorded"), flag("stepped"))


class _LossEvents(TypedDict):
    baseline: float
    nonfinite_step: int | None
    spike_steps: tuple[int, ...]
    blowup_step: int | None


class _GradGrowth(TypedDict):
    grad_explode_step: int | None
    grad_explode_share: float
    grad_growth_max: float


class _GradSpikes(TypedDict):
    grad_spikiness: float
    grad_spike_step: int | None
    grad_spike_share: float
    grad_spike_episodes: int


class _Improvement(TypedDict):
    improvement: float
    settled: float
    stall: float
    lower_improvement: float
    plateau_step: int | None


def rose_after_first_update(loss: np.ndarray, window: int,
                            windows: CurveWindows | None = None) -> bool:
    """Whether a loss curve leapt right after its first update.

    ``loss`` holds the finite losses in step order; true when the first (taken on the
    initial weights) is positive and the median of the first ``window`` is at least
    :attr:`CurveWindows.early_rise_factor` times it. The run then started at its first
    loss, not at the rise that followed: a fall back from that rise is no learning.
    """
    win = windows or CurveWindows()
    return bool(len(loss) and loss[0] > 0
                and np.median(loss[:window]) >= win.early_rise_factor * loss[0])


def loss_dynamics(trace: Trace, config: ThresholdConfig | None = None,
                  windows: CurveWindows | None = None) -> LossDynamics:
    """Summarise the loss curve, the global gradient norm and the learning rate of a run.

    Parameters
    ----------
    trace : Trace
    config : ThresholdConfig, optional
    windows : CurveWindows, optional
        The fixed numbers of the summary; the documented defaults when omitted.

    Returns
    -------
    LossDynamics
    """
    cfg, win = config or ThresholdConfig(), windows or CurveWindows()
    c = _Columns.read(trace.steps)
    loss = _loss_events(c, cfg, win)
    stop = (len(c.steps) if loss["nonfinite_step"] is None
            else int(np.searchsorted(c.steps, loss["nonfinite_step"])))
    grad = _grad_norm_growth(c, cfg, stop)
    curve = _improvement(c, cfg, win, stop, loss["nonfinite_step"] is not None)
    update_ratio, total_update = _update_ratios(
        c, [loss["nonfinite_step"], loss["blowup_step"], grad["grad_explode_step"],
            loss["spike_steps"][0] if loss["spike_steps"] else None])
    return LossDynamics(
        n_steps=len(c.steps), **loss, **curve, **grad, lr_jump_steps=_lr_jumps(c, cfg),
        lr_collapse_step=_lr_collapse(c, cfg),
        **_grad_spikes(c, cfg, win, stop), update_ratio=update_ratio,
        total_update=total_update)


def _loss_events(c: _Columns, cfg: ThresholdConfig, win: CurveWindows) -> _LossEvents:
    """Baseline, first non-finite step, spikes and blow-up of the loss."""
    loss, steps = c.loss, c.steps
    nonfinite = c.complete & ~np.isfinite(loss)
    if not (np.isfinite(loss).any() or np.isinf(loss).any()):
        nonfinite[:] = False  # no loss was ever passed to dbg.step: nothing to judge
    finite = np.isfinite(loss)
    fin_idx = np.flatnonzero(finite)
    baseline = (float(np.median(loss[fin_idx[:cfg.baseline_steps]])) if len(fin_idx)
                else float("nan"))
    # Spikes: a finite loss above spike_factor x the trailing median of the previous losses
    # that also rises by a share of the baseline (not the jitter of a converged loss).
    trailing = (pd.Series(loss).rolling(cfg.loss_window, min_periods=win.spike_min_history)
                .median().shift(1).to_numpy())
    with np.errstate(invalid="ignore"):
        spike = (finite & (loss > cfg.loss_spike_factor * np.abs(trailing)) & (trailing > 0)
                 & (loss - trailing > cfg.loss_spike_min_rise * abs(baseline)))
        blow = finite & (loss > cfg.loss_blowup * abs(baseline)) & (baseline > 0)
    return {"baseline": baseline, "nonfinite_step": _first(nonfinite, steps),
            "spike_steps": tuple(int(steps[i]) for i in _onsets(spike)),
            "blowup_step": _first(blow, steps)}


def _grad_norm_growth(c: _Columns, cfg: ThresholdConfig, stop: int) -> _GradGrowth:
    """The global gradient norm against its early baseline (the smallest of its first)."""
    gnorm, steps = c.gnorm, c.steps
    gfin = np.flatnonzero(np.isfinite(gnorm) & (gnorm > 0))
    gbase = float(np.min(gnorm[gfin[:cfg.baseline_steps]])) if len(gfin) else float("nan")
    with np.errstate(invalid="ignore", divide="ignore"):
        ggrowth = gnorm / gbase
        gexp = (ggrowth > cfg.explode_growth) | (c.complete & np.isinf(gnorm))
    grad_explode_step = _first(gexp, steps)
    explode_share = 0.0
    if grad_explode_step is not None:
        i0 = int(np.searchsorted(steps, grad_explode_step))
        with np.errstate(invalid="ignore"):
            explode_share = float(np.mean((ggrowth[i0:] > cfg.explode_growth_exit)
                                          | ~np.isfinite(gnorm[i0:])))
    pre = ggrowth[:stop]
    return {"grad_explode_step": grad_explode_step, "grad_explode_share": explode_share,
            "grad_growth_max": (float(np.nanmax(pre)) if np.isfinite(pre).any()
                                else float("nan"))}


def _grad_spikes(c: _Columns, cfg: ThresholdConfig, win: CurveWindows, stop: int
                 ) -> _GradSpikes:
    """Spikes of the global gradient norm over its median, before the loss went non-finite."""
    gpre = c.gnorm[:stop]
    gpre_ok = np.isfinite(gpre) & (gpre > 0)
    out: _GradSpikes = {"grad_spikiness": float("nan"), "grad_spike_step": None,
                        "grad_spike_share": 0.0, "grad_spike_episodes": 0}
    if gpre_ok.sum() < cfg.plateau_min_steps:
        return out
    gmed = float(np.median(gpre[gpre_ok]))
    with np.errstate(invalid="ignore"):
        out["grad_spikiness"] = float(gpre[gpre_ok].max() / gmed)
        spiked = gpre_ok & (gpre > cfg.grad_spike * gmed)
    spike_step = _first(spiked, c.steps[:stop])
    out["grad_spike_step"] = spike_step
    out["grad_spike_episodes"] = int(len(_onsets(spiked)))
    if spike_step is not None:
        i0 = int(np.searchsorted(c.steps, spike_step))
        with np.errstate(invalid="ignore"):
            out["grad_spike_share"] = float(np.mean(gpre[i0:] > win.spike_share_factor * gmed))
    return out


def _lr_jumps(c: _Columns, cfg: ThresholdConfig) -> tuple[int, ...]:
    """Steps where the learning rate rose ``lr_jump``-fold over the previous step."""
    lr = c.lr
    with np.errstate(invalid="ignore", divide="ignore"):
        lr_ratio = lr[1:] / lr[:-1]
    jumps = np.flatnonzero(np.isfinite(lr_ratio) & (lr_ratio >= cfg.lr_jump)) + 1
    return tuple(int(c.steps[i]) for i in jumps)


def _lr_collapse(c: _Columns, cfg: ThresholdConfig) -> int | None:
    """First step from which the learning rate stays below ``lr_collapse`` x its peak."""
    lr = c.lr
    known = np.isfinite(lr)
    if not known.any():
        return None
    peak = float(np.max(lr[known]))
    if not peak > 0:
        return None
    high = np.flatnonzero(known & (lr >= cfg.lr_collapse * peak))
    start = int(high[-1]) + 1 if len(high) else 0
    return int(c.steps[start]) if start < len(c.steps) else None


def _improvement(c: _Columns, cfg: ThresholdConfig, win: CurveWindows, stop: int,
                 went_nonfinite: bool) -> _Improvement:
    """Improvement over the finite prefix of the run (up to the first non-finite loss)."""
    fin_prefix = c.loss[:stop]
    fin_prefix = fin_prefix[np.isfinite(fin_prefix)]
    m = len(fin_prefix)
    w = max(win.min_plateau_window, int(round(cfg.plateau_window * m)))
    out: _Improvement = {"improvement": float("nan"), "settled": float("nan"), "stall": 0.0,
                         "lower_improvement": float("nan"), "plateau_step": None}
    if m < max(cfg.plateau_min_steps, 2 * w):
        return out
    first, last = np.median(fin_prefix[:w]), np.median(fin_prefix[-w:])
    low_first, low_last = (np.quantile(fin_prefix[:w], win.lower_quantile),
                           np.quantile(fin_prefix[-w:], win.lower_quantile))
    start = float(fin_prefix[0])
    if rose_after_first_update(fin_prefix, w, win):
        # the loss rose right after the first update: the first loss, taken on the initial
        # weights, is where the run started, not the median of the rise that followed. One
        # loss has no lower quartile: the last window's median is what compares with it (its
        # lower quartile sits below any single loss by the minibatch noise alone)
        first, low_first, low_last = start, start, last
    improvement = float((first - last) / max(abs(first), win.improvement_floor))
    out["improvement"] = improvement
    lower = float((low_first - low_last) / max(abs(low_first), win.improvement_floor))
    out["lower_improvement"] = lower
    settled = improvement
    if m >= 3 * w:
        second = float(np.median(fin_prefix[w:2 * w]))
        if (win.transient_floor <= second
                and np.max(fin_prefix[:w]) >= win.transient_factor * second):
            settled = float((second - last) / max(second, win.improvement_floor))
    out["settled"] = settled
    out["stall"] = float(np.clip(1.0 - settled / win.stall_improvement, 0.0, 1.0))
    if (improvement < cfg.plateau_improvement and lower < cfg.plateau_improvement
            and not went_nonfinite):
        smooth = pd.Series(fin_prefix).rolling(w, min_periods=1, center=True).median()
        suffix_min = smooth[::-1].cummin()[::-1].to_numpy()
        done = (smooth.to_numpy() - suffix_min) <= cfg.plateau_improvement * abs(first)
        fin_steps = c.steps[:stop][np.isfinite(c.loss[:stop])]
        out["plateau_step"] = int(fin_steps[int(np.argmax(done))])
    return out


def _update_ratios(c: _Columns, onsets: list[int | None]) -> tuple[float, float]:
    """(median update ratio before anything went wrong, the sum over the run)."""
    known = [s for s in onsets if s is not None]
    n = len(c.steps)
    end = int(np.searchsorted(c.steps, min(known))) if known else n
    u = c.update[:max(end, 1)]
    u = u[np.isfinite(u) & (u > 0)]
    # the update is measured on recorded steps only: an optimizer step between two of them
    # (every > 1) moved the weights too, by about what its neighbours' did (summing the
    # measured ones alone read a 16x smaller total at every=16, a rate "too low")
    u_all = c.update.copy()
    measured = np.isfinite(u_all)
    gap = ~c.recorded & c.stepped & np.isnan(u_all) & np.isfinite(c.loss)
    if gap.any() and measured.any():
        u_all[gap] = np.interp(c.steps[gap], c.steps[measured], u_all[measured])
    u_all = u_all[np.isfinite(u_all)]
    return (float(np.median(u)) if len(u) else float("nan"),
            float(u_all.sum()) if len(u_all) else float("nan"))


def _round(value: Any) -> Any:
    if isinstance(value, (np.floating, float)):
        v = float(value)
        return v if np.isfinite(v) else str(v)
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    return value


def _module_events(states: StateTable, domain: str) -> list[Event]:
    codes = states.grad_state if domain == "gradient" else states.act_state
    labels = GRADIENT_STATES if domain == "gradient" else ACTIVATION_STATES
    healthy = 0  # HEALTHY / NORMAL are the first members of both enums
    evidence_cols: dict[Any, tuple[str, ...]] = (_GRAD_EVIDENCE if domain == "gradient"
                                                 else _ACT_EVIDENCE)
    if codes.size == 0:
        return []
    seen = np.where(codes >= 0, codes.astype(np.float64), np.nan)
    prev = pd.DataFrame(seen).ffill().shift(1).to_numpy()
    observed = codes >= 0
    first_bad = observed & np.isnan(prev) & (codes != healthy)
    change = observed & ~np.isnan(prev) & (codes != np.nan_to_num(prev, nan=-9))
    rows, cols = np.nonzero(first_bad | change)
    events = []
    m = states.measures
    cfg = states.config
    thresholds = {
        "grad_ratio": cfg.rel_vanish, "grad_growth": cfg.explode_growth,
        "grad_depth_ratio": cfg.explode_depth, "grad_drop": cfg.sat_grad_drop,
        "act_frac_dead": cfg.dead_frac, "act_frac_saturated": cfg.sat_frac,
        "act_max_abs": cfg.act_overflow, "act_growth": cfg.act_growth,
    }
    for s, j in zip(rows.tolist(), cols.tolist(), strict=True):
        to = labels[int(codes[s, j])]
        p = prev[s, j]
        frm = "unobserved" if np.isnan(p) else labels[int(p)].value
        ev: dict[str, Any] = {"forward_index": j, "family": states.families[j]}
        for c in evidence_cols[to]:
            ev[c] = _round(m[c][s, j])
        main = evidence_cols[to][1] if to in (GradientHealth.VANISHING, GradientHealth.EXPLODING,
                                              GradientHealth.SATURATED) else evidence_cols[to][0]
        if to not in (GradientHealth.HEALTHY, ActivationHealth.NORMAL) and main in thresholds:
            ev["statistic"] = main
            ev["threshold"] = thresholds[main]
        events.append(Event(kind=f"{domain}_{to.value}", module_name=states.module_names[j],
                            step=int(states.steps[s]), from_state=frm, to_state=to.value,
                            evidence=ev))
    return events


def _step_events(trace: Trace, dyn: LossDynamics, cfg: ThresholdConfig) -> list[Event]:
    st = trace.steps
    events: list[Event] = []
    if not len(st):
        return events
    steps = st["step"].to_numpy(dtype=np.int64)
    loss = st["loss"].to_numpy(dtype=np.float64, na_value=np.nan)
    complete = st["complete"].to_numpy(dtype=bool) if "complete" in st.columns else None
    bad = ~np.isfinite(loss)
    if complete is not None:
        bad &= complete
    if dyn.nonfinite_step is None:
        bad[:] = False
    for i in _onsets(bad):
        events.append(Event("loss_nonfinite", LOSS, int(steps[i]), "finite", "nonfinite",
                            {"loss": _round(loss[i])}))
    idx = {int(s): i for i, s in enumerate(steps.tolist())}
    for s in dyn.spike_steps:
        events.append(Event("loss_spike", LOSS, s, "normal", "spike",
                            {"loss": _round(loss[idx[s]]), "factor": cfg.loss_spike_factor}))
    if dyn.blowup_step is not None:
        events.append(Event("loss_blowup", LOSS, dyn.blowup_step, "normal", "blowup",
                            {"loss": _round(loss[idx[dyn.blowup_step]]),
                             "baseline": _round(dyn.baseline), "threshold": cfg.loss_blowup}))
    if dyn.plateau_step is not None:
        events.append(Event("loss_plateau", LOSS, dyn.plateau_step, "decreasing", "plateau",
                            {"improvement": _round(dyn.improvement),
                             "threshold": cfg.plateau_improvement}))
    if dyn.grad_explode_step is not None:
        events.append(Event("grad_norm_exploding", MODEL, dyn.grad_explode_step, "healthy",
                            "exploding", {"threshold": cfg.explode_growth}))
    lr = st["lr"].to_numpy(dtype=np.float64, na_value=np.nan) if "lr" in st.columns else None
    for s in dyn.lr_jump_steps:
        i = int(np.searchsorted(steps, s))
        events.append(Event("lr_increase", MODEL, s, "steady", "increased",
                            {"lr": _round(lr[i]) if lr is not None else None,
                             "previous_lr": _round(lr[i - 1]) if lr is not None else None}))
    return events


def extract_events(trace: Trace, states: StateTable, dynamics: LossDynamics | None = None
                   ) -> list[Event]:
    """All events of a run, ordered by step, then forward order (loss and run events first).

    Parameters
    ----------
    trace : Trace
    states : StateTable
        Output of :func:`neuraldbg.states.classify_states` for ``trace``.
    dynamics : LossDynamics, optional
        Output of :func:`loss_dynamics`; computed when omitted.

    Returns
    -------
    list of Event
    """
    dyn = dynamics or loss_dynamics(trace, states.config)
    events = (_step_events(trace, dyn, states.config) + _module_events(states, "gradient")
              + _module_events(states, "activation"))
    events.sort(key=lambda e: (e.step, e.evidence.get("forward_index", -1)))
    return events
