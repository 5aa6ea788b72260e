"""Discretization: a trace becomes a bounded set of discrete states, the network's evidence.

A run of any length and any depth is cut into ``n_slices`` time slices and ``n_blocks``
layer blocks, so the unrolled network has the same size for a 3-layer MLP over 50 steps and
a 100-module model over 10,000 steps.

Time slices
    An onset is located without ground truth (first non-finite loss, first global gradient
    norm 100x its early median, or first loss 3x its early median). With an onset at step
    ``o`` and two slices, they are ``[start, o)`` and ``[o, end)``; with more, the steps
    before it are split evenly into ``n_slices - 2`` slices, slice ``n_slices - 2`` is the
    onset window ``[o, o + w)`` and the last slice is the rest of the run. Without an onset
    the run is split evenly ("across the run"). A slice without statistics takes the state
    of its nearest observed neighbour (a run sick from step 0 is sick in every slice before
    the onset window too).
Layer blocks
    Monitored modules in forward order, cut into ``n_blocks`` consecutive groups.

States (all thresholds in :class:`causal_models.bins.Bins`, documented there; the state
names are there too):

- ``grad[b]@t`` in :data:`GRAD_STATES`: gradient health of block ``b`` in slice ``t``, from
  the mean log10 parameter-gradient norm (output-gradient norm for blocks without
  parameters); ``exploding`` when it is huge or has grown by ``explode_growth`` decades
  (from its first slice, or from its early level in a run whose gradient surged 100x).
- ``act[b]@t`` in :data:`ACT_STATES`: activation health from dead-unit and saturation shares
  of the block's activation modules and from non-finite or huge outputs.
- ``loss@t`` in :data:`LOSS_STATES`: the loss in slice ``t`` against its start.
- Run-level evidence on the failure: ``progress`` (final loss over early loss), ``spikes``
  (largest global gradient norm over its median) and ``grad_ratio`` (early gradient norm of
  the first weighted layer over the last one's, the AutoTrainer ratio).
- Run-level evidence on the knobs: ``update`` (early ||dW||/||W||, tells a learning-rate
  level), ``fwd_gain`` (activation scale last block / first block at the first recorded step,
  tells an init scale), ``input_mag`` (scale of the first layer's output), ``lr_config``
  (configured learning rate against the optimizer's usual range), ``init_config`` (the
  configured init gain), ``input_config`` (whether the config says inputs are standardized).
- The observed knob and context nodes and the rules' verdict are in
  :mod:`causal_models.evidence`.

Nothing here reads ``trace.meta["ground_truth"]``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from causal_models.bins import Bins
from causal_models.run_evidence import early_count, early_median, log10_abs, run_states
from neuraldbg.trace import Trace

__all__ = ["Discretized", "discretize", "slice_node"]




@dataclass(frozen=True, slots=True)
class Discretized:
    """The discrete view of one trace.

    Attributes
    ----------
    states : dict of str to str
        Node name -> observed state, for every evidence node (slice, run-level and knobs).
    slices : tuple of (int, int)
        ``[start, end)`` steps of each slice.
    blocks : tuple of tuple of str
        Module names of each block, in forward order.
    onset_step : int or None
        Located onset (no ground truth used), or None when the run shows none.
    features : dict of str to float
        The continuous value behind each state (log10 units as in :class:`Bins`).
    events : dict of str to (str, int)
        Failure type -> (layer, step) of the first event of that failure the rules' event
        extractor found at module resolution (filled by the reasoner; empty here).
    """

    states: dict[str, str]
    slices: tuple[tuple[int, int], ...]
    blocks: tuple[tuple[str, ...], ...]
    onset_step: int | None
    features: dict[str, float] = field(default_factory=dict)
    events: dict[str, tuple[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form."""
        return {"states": dict(self.states), "slices": [list(s) for s in self.slices],
                "blocks": [list(b) for b in self.blocks], "onset_step": self.onset_step,
                "features": dict(self.features)}


def slice_node(kind: str, t: int, block: int | None = None) -> str:
    """Name of a slice node: ``loss@t``, ``grad[b]@t`` or ``act[b]@t``."""
    return f"{kind}@{t}" if block is None else f"{kind}[{block}]@{t}"


def _locate_onset(steps: pd.DataFrame, bins: Bins, surge: int | None
                  ) -> tuple[int | None, int | None]:
    """(first anomaly step, first non-finite step); either may be None.

    ``surge`` is the first step of a gradient surge (:func:`_gradient_surge`), or None.
    """
    n = len(steps)
    if n == 0:
        return None, None
    step = steps["step"].to_numpy()
    loss = steps["loss"].to_numpy(dtype=float)
    gnorm = steps["grad_norm"].to_numpy(dtype=float)
    hits = []
    # A NaN gradient norm with a finite loss was not measured (no optimizer step closed the
    # step: none was taken, or a GradScaler skipped it); an infinite one was.
    bad = ~np.isfinite(loss) | np.isinf(gnorm)
    nonfinite = int(step[np.argmax(bad)]) if bad.any() else None
    if nonfinite is not None:
        hits.append(nonfinite)
    l0 = early_median(loss, n)
    if np.isfinite(l0) and l0 > 0:
        spike = np.isfinite(loss) & (loss > bins.spike_factor * l0)
        if spike.any():
            hits.append(int(step[np.argmax(spike)]))
    if surge is not None:
        hits.append(surge)
    return (min(hits) if hits else None), nonfinite


def _gradient_surge(steps: pd.DataFrame, bins: Bins) -> int | None:
    """First step whose global gradient norm is ``grad_spike`` x its early median, or None."""
    gnorm = steps["grad_norm"].to_numpy(dtype=float)
    g0 = early_median(gnorm, len(gnorm))
    if not (np.isfinite(g0) and g0 > 0):
        return None
    spike = np.isfinite(gnorm) & (gnorm > bins.grad_spike * g0)
    return int(steps["step"].to_numpy()[np.argmax(spike)]) if spike.any() else None


def _slice_bounds(n_steps: int, onset: int | None, nonfinite: int | None, n_slices: int,
                  first: int) -> list[int]:
    """Boundaries b_0 <= ... (len n_slices + 1), possibly with empty slices.

    The onset window runs from the first anomaly to the first non-finite step when that
    comes later (the lead of an explosion), else for 5% of the run.
    """
    end = first + n_steps
    if n_slices == 1:  # the whole run (run level only)
        return [first, end]
    if onset is None:
        return [int(round(first + i * n_steps / n_slices)) for i in range(n_slices + 1)]
    o = max(first, min(onset, end - 1))
    if n_slices == 2:  # before the onset | from the onset on
        return [first, o, end]
    w = max(1, int(round(0.05 * n_steps)))
    stop = nonfinite if nonfinite is not None and nonfinite > o else min(o + w, end)
    pre = [int(round(first + i * (o - first) / (n_slices - 2))) for i in range(n_slices - 1)]
    return pre + [stop, end]


def _fill_empty(values: list[Any], observed: list[bool]) -> list[Any]:
    """Each unobserved slice takes the nearest observed slice's value (later first)."""
    if not any(observed):
        return values
    out = list(values)
    idx = [i for i, ok in enumerate(observed) if ok]
    for i, ok in enumerate(observed):
        if not ok:
            later = [j for j in idx if j > i]
            out[i] = values[later[0] if later else idx[-1]]
    return out


def _grad_state(g: float, g_out: float, g_first: float, nonfinite: bool, bins: Bins,
                is_output: bool) -> str:
    """Gradient state of one block in one slice.

    ``g`` is the mean over the finite values of the cell: an explosion seen before the
    values turned non-finite stays ``exploding``.
    """
    exploding = np.isfinite(g) and (
        g > bins.explode_abs or (np.isfinite(g_first) and g - g_first > bins.explode_growth))
    if exploding:
        return "exploding"
    if nonfinite:
        return "nonfinite"
    if not np.isfinite(g):
        return "healthy"
    if g < bins.vanish_abs or (not is_output and np.isfinite(g_out)
                               and g - g_out < bins.vanish_rel):
        return "vanishing"
    return "healthy"


def _act_state(dead: float, sat: float, maxabs: float, nonfinite: bool, bins: Bins) -> str:
    if nonfinite or (np.isfinite(maxabs) and maxabs > bins.anomalous_act):
        return "anomalous"
    if dead > bins.dead_frac:
        return "dead"
    if sat > bins.saturated_frac:
        return "saturated"
    return "normal"


def _loss_states(steps: pd.DataFrame, bounds: list[int], onset: int | None,
                 bins: Bins) -> tuple[list[str], list]:
    step = steps["step"].to_numpy()
    loss = steps["loss"].to_numpy(dtype=float)
    # The reference is the early loss, taken before the onset when there is one.
    before = loss[step < onset] if onset is not None else loss
    l0 = early_median(before if np.isfinite(before).any() else loss[:1], len(loss))
    states, feats, observed = [], [], []
    prev = l0
    for t in range(len(bounds) - 1):
        sel = (step >= bounds[t]) & (step < bounds[t + 1])
        vals = loss[sel]
        observed.append(bool(vals.size))
        if not vals.size:
            states.append("flat")
            feats.append(float("nan"))
            continue
        if not np.isfinite(vals).all():
            states.append("nonfinite")
            feats.append(float("inf"))
            continue
        m = float(np.median(vals))
        ratio = m / l0 if np.isfinite(l0) and abs(l0) > 1e-12 else 1.0
        feats.append(ratio)
        if ratio > bins.loss_rising:
            states.append("rising")
        elif ratio < bins.loss_low:
            states.append("low")
        elif np.isfinite(prev) and m < bins.loss_decrease * prev:
            states.append("decreasing")
        else:
            states.append("flat")
        prev = m
    return _fill_empty(states, observed), feats


def discretize(trace: Trace, *, n_slices: int = 4, n_blocks: int = 3,
               bins: Bins | None = None, slices: bool = True,
               cut_off: Collection[str] = (), input_swing: float = float("nan")
               ) -> Discretized:
    """Turn a trace into the discrete evidence of the time-sliced network.

    Parameters
    ----------
    trace : Trace
        A recorded run (never its ground truth).
    n_slices : int, default=4
        Time slices (>= 2).
    n_blocks : int, default=3
        Layer blocks (>= 1).
    bins : Bins, optional
        Thresholds; defaults to :class:`Bins`.
    slices : bool, default=True
        False: one slice over the whole run (run level only; ``n_slices`` is still
        validated but not used), the ablation without the time slices.
    cut_off : collection of str, default=()
        Modules the backward never reached
        (:attr:`neuraldbg.run_facts.RunFacts.blocked_modules`), left out of the gradient
        ratio.
    input_swing : float, default=NaN
        :attr:`neuraldbg.run_facts.RunFacts.input_swing`: above ``bins.input_swing_high``,
        the input magnitude is read past the records far off the rest.

    Returns
    -------
    Discretized

    Raises
    ------
    ValueError
        If the trace has no steps, or ``n_slices``/``n_blocks`` are out of range.
    """
    bins = bins or Bins()
    if n_slices < 2 or n_blocks < 1:
        raise ValueError(f"n_slices must be >= 2 and n_blocks >= 1, got {n_slices}, {n_blocks}.")
    n_slices = n_slices if slices else 1
    steps = trace.steps
    if len(steps) == 0:
        raise ValueError("The trace has no steps; record at least one training step.")
    first = int(steps["step"].min())
    n_steps = int(steps["step"].max()) - first + 1
    surge = _gradient_surge(steps, bins)
    onset, nonfinite = _locate_onset(steps, bins, surge)
    bounds = _slice_bounds(n_steps, onset, nonfinite, n_slices, first)
    windows = tuple((bounds[i], bounds[i + 1]) for i in range(n_slices))
    names = trace.module_names
    blocks = tuple(tuple(b) for b in np.array_split(np.array(names, dtype=object), n_blocks))
    filled = [b for b in blocks if b]  # fewer modules than blocks: an empty block repeats
    blocks = tuple(b if b else (filled[-1] if filled else ()) for b in blocks)  # the last
    states: dict[str, str] = {}
    features: dict[str, float] = {}

    loss_states, loss_feats = _loss_states(steps, bounds, onset, bins)
    for t in range(n_slices):
        states[slice_node("loss", t)] = loss_states[t]
        features[slice_node("loss", t)] = loss_feats[t]

    _block_states(trace, blocks, bounds, bins, states, features, surged=surge is not None)
    run_states(trace, blocks, bins, states, features, cut_off, input_swing)
    return Discretized(states=states, slices=windows, blocks=blocks, onset_step=onset,
                       features=features)


def _block_states(trace: Trace, blocks: tuple[tuple[str, ...], ...], bounds: list[int],
                  bins: Bins, states: dict[str, str], features: dict[str, float], *,
                  surged: bool) -> None:
    """Fill ``grad[b]@t`` and ``act[b]@t`` with one vectorised pass over the statistics.

    ``surged``: the run's global gradient norm surged (:func:`_gradient_surge`).
    """
    n_t, n_b = len(bounds) - 1, len(blocks)
    mods = trace.modules.set_index("module_name")
    block_of = {m: b for b, names in enumerate(blocks) for m in names}
    stats = trace.stats
    if len(stats) == 0:
        for t in range(n_t):
            for b in range(n_b):
                states[slice_node("grad", t, b)] = "healthy"
                states[slice_node("act", t, b)] = "normal"
        return
    name = stats["module_name"].to_numpy()
    codes, uniq = pd.factorize(name)
    blk_u = np.array([block_of.get(m, -1) for m in uniq])
    weighted_u = np.array([float(mods.at[m, "n_trainable"]) > 0 if m in mods.index else False
                           for m in uniq])
    fam_u = np.array([str(mods.at[m, "activation_family"]) if m in mods.index else "other"
                      for m in uniq])
    blk = blk_u[codes]
    weighted = weighted_u[codes]
    fam = fam_u[codes]
    t_idx = np.searchsorted(np.asarray(bounds[1:]), stats["step"].to_numpy(), side="right")
    keep = (blk >= 0) & (t_idx < n_t)
    cell = np.where(keep, t_idx * n_b + np.maximum(blk, 0), n_t * n_b)
    n_cells = n_t * n_b + 1

    def cell_mean(values: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w = mask & np.isfinite(values)
        s = np.bincount(cell, weights=np.where(w, values, 0.0), minlength=n_cells)
        c = np.bincount(cell, weights=w.astype(float), minlength=n_cells)
        with np.errstate(invalid="ignore", divide="ignore"):
            return s / c, c

    pg = stats["param_grad_norm"].to_numpy(dtype=float)
    # an infinite norm is one whose float32 sum of squares overflowed: an explosion, read at
    # the largest norm float32 holds (NaN is what non-finite gradients give)
    pg = np.where(np.isposinf(pg), float(np.finfo(np.float32).max), pg)
    og = stats["out_grad_norm"].to_numpy(dtype=float)
    g_param, n_param = cell_mean(log10_abs(pg), weighted & np.isfinite(pg))
    g_out, _ = cell_mean(log10_abs(og), np.isfinite(og))
    g = np.where(n_param > 0, g_param, g_out)
    nan_act = stats["act_nan"].to_numpy(dtype=float) + stats["act_inf"].to_numpy(dtype=float)
    # counted on a sample; the largest value is over every element (NaN: a missed NaN)
    called = stats["calls"].to_numpy(dtype=float) > 0
    nan_act = np.where(called & ~np.isfinite(stats["act_max_abs"].to_numpy(dtype=float)),
                       np.maximum(np.nan_to_num(nan_act), 1.0), nan_act)
    # A NaN parameter-gradient norm is non-finite where the step's loss was (the backward of
    # a blown-up loss), else unmeasured (no optimizer step took the gradients).
    loss_bad = trace.steps.loc[~np.isfinite(trace.steps["loss"].to_numpy(dtype=float)), "step"]
    at_bad_loss = np.isin(stats["step"].to_numpy(), loss_bad.to_numpy())
    bad = ((nan_act > 0) | (~np.isfinite(og) & ~np.isnan(og))
           | (weighted & np.isnan(pg) & at_bad_loss))
    # A NaN output gradient right after the loss went non-finite is non-finite too.
    bad |= np.isnan(og) & called & np.isnan(stats["act_mean"].to_numpy(dtype=float))
    n_bad = np.bincount(cell, weights=bad.astype(float), minlength=n_cells)
    n_obs = np.bincount(cell, minlength=n_cells)
    rect = np.isin(fam, ("relu",))
    satur = np.isin(fam, ("sigmoid", "tanh", "softmax"))
    dead, _ = cell_mean(stats["act_frac_dead"].to_numpy(dtype=float), rect)
    sat, _ = cell_mean(stats["act_frac_saturated"].to_numpy(dtype=float), satur)
    maxabs = stats["act_max_abs"].to_numpy(dtype=float)
    mx = np.full(n_cells, -np.inf)
    finite = np.isfinite(maxabs)
    np.maximum.at(mx, cell[finite], log10_abs(maxabs[finite]))

    def at(arr: np.ndarray, t: int, b: int) -> float:
        return float(arr[t * n_b + b])

    # Where the run's gradient grew 100x (the onset's surge), each block's growth counts from
    # its early level too; elsewhere a block that starts low and catches up with the others
    # (a constant initialisation's hidden layers, 1e-4.7 -> 1e-2.4 under an output at 1e-1)
    # is no explosion
    g_early = (_early_levels(stats["step"].to_numpy(), blk, log10_abs(pg),
                             weighted & np.isfinite(pg), log10_abs(og), np.isfinite(og), bad,
                             n_b, bins)
               if surged else np.full(n_b, np.nan))

    for b in range(n_b):
        g_first = next((at(g, t, b) for t in range(n_t) if np.isfinite(at(g, t, b))
                        and at(n_bad, t, b) == 0), float("nan"))
        # an explosion grows from the lower of the first slice's level and the early one:
        # the first slice's mean already holds part of a growth that starts at once (a
        # missing zero_grad sums the gradients from step 1), and the early level of a
        # recurrence whose gradients fall after the first steps sits above its first slice
        if np.isfinite(g_early[b]):
            g_first = g_early[b] if not np.isfinite(g_first) else min(g_first, g_early[b])
        g_states, a_states, observed = [], [], []
        for t in range(n_t):
            observed.append(at(n_obs, t, b) > 0)
            nonfinite = at(n_bad, t, b) > 0
            gv = at(g, t, b)
            g_states.append(_grad_state(gv, at(g, t, n_b - 1), g_first, nonfinite, bins,
                                        is_output=b == n_b - 1))
            d = at(dead, t, b)
            s = at(sat, t, b)
            a_states.append(_act_state(d if np.isfinite(d) else 0.0, s if np.isfinite(s) else 0.0,
                                       at(mx, t, b), nonfinite, bins))
            features[slice_node("grad", t, b)] = gv
            features[slice_node("act", t, b)] = d if np.isfinite(d) else 0.0
        g_states = _fill_empty(g_states, observed)
        a_states = _fill_empty(a_states, observed)
        for t in range(n_t):
            states[slice_node("grad", t, b)] = g_states[t]
            states[slice_node("act", t, b)] = a_states[t]


def _early_levels(step: np.ndarray, blk: np.ndarray, log_param: np.ndarray,
                  param_ok: np.ndarray, log_out: np.ndarray, out_ok: np.ndarray,
                  bad: np.ndarray, n_b: int, bins: Bins) -> np.ndarray:
    """Each block's early gradient level (log10), NaN where no early step counts.

    The median of its level over the first recorded steps (as many as
    :func:`early_median` takes). A block's level at a step is the mean log10 norm of its
    parameter gradients (its output gradients without parameters), as in the slices. A step
    where the block is vanishing (below ``vanish_abs``, or ``vanish_rel`` decades under the
    output block at that step) gives no baseline: the hidden gradients of a constant
    initialisation cancel to ~1e-9 at step 0.
    """
    rec = np.unique(step)
    early = np.isin(step, rec[:early_count(len(rec))]) & ~bad & (blk >= 0)
    out = np.full(n_b, np.nan)
    if not early.any():
        return out
    frame = pd.DataFrame({"step": step[early], "blk": blk[early],
                          "param": np.where(param_ok[early], log_param[early], np.nan),
                          "out": np.where(out_ok[early], log_out[early], np.nan)})
    means = frame.groupby(["step", "blk"])[["param", "out"]].mean()
    level = means["param"].fillna(means["out"]).unstack("blk").reindex(columns=range(n_b))
    values = level.to_numpy(dtype=float)
    ref = values[:, [n_b - 1]]
    with np.errstate(invalid="ignore"):
        counts = (values >= bins.vanish_abs) & ~(values - ref < bins.vanish_rel)
    for b in range(n_b):
        ok = counts[:, b] & np.isfinite(values[:, b])
        if ok.any():
            out[b] = float(np.median(values[ok, b]))
    return out
