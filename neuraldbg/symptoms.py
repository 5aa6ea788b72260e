"""Symptoms: which failure types the compressed events support, and how strongly.

Fourth stage of the heuristic Post-Mortem Reasoner (compression -> **symptoms** ->
hypotheses). Each :class:`Symptom` is a failure type of the contract's vocabulary with its
origin (layer and step, from the compressor's propagation) and its probability, a product
of three documented terms, each in [0, 1]::

    P(symptom) = strength x consistency x impact

- ``strength``: how far the evidence lies beyond its threshold. For ratios (gradient decay
  or growth, gradient spikes, loss blow-up) ``1 - 0.5 * 2 ** (-d)`` with ``d`` the decades
  past the threshold (0.5 at the threshold, 0.75 one decade beyond); for shares (dead or
  saturated units) ``0.5 + 0.5 * (share - threshold) / (1 - threshold)``; 1 for a
  non-finite value.
- ``consistency``: ``0.5 + 0.5 * persistence``, persistence being the share of the origin
  layer's recorded steps from the onset on that stay in the failure state (a one-step blip
  counts half); for gradient spikes, two separate spike episodes count as persistent; for a
  divergence, the share of steps diverged or the lasting rise of the loss, whichever is
  larger.
- ``impact``: whether training is harmed. Vanishing gradients and dead units only matter
  when they stall the loss (``0.4 + 0.6 * stall``; a layer more than 90% dead counts as a
  stall); saturation ``0.6 + 0.4 * max(stall, present from the first step)``; a gradient
  explosion 1 when the loss blew up or turned non-finite, else ``0.4 + 0.6 * stall``.

Values are measured on finite rows: after a divergence every statistic is NaN, and those
rows belong to the divergence, not to the other symptoms.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from neuraldbg.compressor import NONFINITE, Compression, Propagation
from neuraldbg.events import LossDynamics
from neuraldbg.run_facts import RunFacts
from neuraldbg.states import StateTable
from neuraldbg.trace import Trace

__all__ = ["Symptom", "find_symptoms", "ratio_strength", "share_strength"]

_SATURATING = ("sigmoid", "tanh", "softmax", "smooth")


def ratio_strength(ratio: float, threshold: float) -> float:
    """``1 - 0.5 * 2 ** (-decades past threshold)``; 0 before it, 1 for +inf."""
    if not ratio >= threshold:
        return 0.0
    if math.isinf(ratio):
        return 1.0
    return float(1.0 - 0.5 * 2.0 ** (-math.log10(ratio / threshold)))


def share_strength(share: float, threshold: float) -> float:
    """``0.5 + 0.5 * (share - threshold) / (1 - threshold)``; 0 before the threshold."""
    if not share >= threshold:
        return 0.0
    return float(min(1.0, 0.5 + 0.5 * (share - threshold) / max(1.0 - threshold, 1e-9)))


@dataclass
class Symptom:
    """A failure type found in the run, before causes are attached.

    Attributes
    ----------
    failure_type : str
    origin_layer : str
    origin_step : int
    strength, consistency, impact : float
        The three terms of the symptom's probability (module docstring).
    evidence : dict
    propagation : Propagation or None
    extra : dict
        Symptom-specific numbers passed to the cause scorer.
    explained_by : dict
        Symptom -> probability that discounted this one.
    discount : float
        Product of the discounts applied.
    """

    failure_type: str
    origin_layer: str
    origin_step: int
    strength: float
    consistency: float
    impact: float
    evidence: dict[str, Any] = field(default_factory=dict)
    propagation: Propagation | None = None
    extra: dict[str, float] = field(default_factory=dict)
    explained_by: dict[str, float] = field(default_factory=dict)
    discount: float = 1.0

    @property
    def probability(self) -> float:
        """Strength x consistency x impact x discount."""
        return float(self.strength * self.consistency * self.impact * self.discount)


def _row(states: StateTable, step: int) -> int:
    return min(int(np.searchsorted(states.steps, step)), max(len(states.steps) - 1, 0))


def _col(states: StateTable, layer: str) -> int:
    return states.module_names.index(layer)


def _persistence(flag: np.ndarray, observed: np.ndarray, row: int, col: int) -> float:
    """Share of the observed steps from ``row`` on where ``flag`` holds in column ``col``."""
    seen = observed[row:, col]
    return float(flag[row:, col][seen].mean()) if seen.any() else 0.0


def _activation_decay_share(states: StateTable, row: int, deepest: int) -> float:
    """Share of the gradient's decay that happens across sigmoid/tanh modules.

    The decay is in decades, from the output down to module ``deepest``, at recorded row
    ``row``.

    A sigmoid passes at most 1/4 of the gradient, so a deep sigmoid stack decays mostly
    across its activations; a tanh in its linear range passes ~all of it, so a stack whose
    weights are too small decays across its Linear layers instead.
    """
    g = states.measures["out_grad_norm"][row]
    with np.errstate(divide="ignore", invalid="ignore"):
        logg = np.log10(np.clip(g, 1e-30, None))
    drops = np.nan_to_num(logg[deepest + 1:] - logg[deepest:-1], nan=0.0)
    drops = np.clip(drops, 0.0, None)  # module k+1 attenuates by drops[k - deepest]
    fams = np.asarray(states.families[deepest + 1:], dtype=object)
    total = float(drops.sum())
    if total <= 0:
        return 0.0
    return float(drops[np.isin(fams, ("sigmoid", "tanh"))].sum() / total)


def _weighted_producer(trace: Trace, states: StateTable, col: int) -> int:
    """``col``, or the nearest module before it in forward order with trainable parameters.

    ``col`` itself when there is none.
    """
    n_train = (trace.modules.set_index("module_name")["n_trainable"]
               .reindex(states.module_names).fillna(0).to_numpy())
    for j in range(col, -1, -1):
        if n_train[j] > 0:
            return j
    return col


def _spiking_layer(states: StateTable, onset: int, facts: RunFacts) -> str:
    """Module whose parameter gradient is furthest above its own median at ``onset``."""
    pg = states.measures["param_grad_norm"]
    row = _row(states, onset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rel = pg[row] / np.nanmedian(pg, axis=0)
    if not np.isfinite(rel).any():
        return facts.first_layer
    return states.module_names[int(np.nanargmax(np.where(np.isfinite(rel), rel, -np.inf)))]


def _tail_median(values: np.ndarray, row: int, col: int) -> float:
    tail = values[row:, col]
    tail = tail[np.isfinite(tail)]
    return float(np.median(tail)) if len(tail) else float("nan")


def _activation_symptom(kind: str, failure: str, share_col: str, thr: float, prop: Propagation,
                        states: StateTable, dyn: LossDynamics) -> Symptom:
    row, col = _row(states, prop.origin_step), _col(states, prop.origin_layer)
    share = _tail_median(states.measures[share_col], row, col)
    pers = _persistence(states.measures[f"is_{kind}"], states.measures["observed"], row, col)
    return Symptom(failure, prop.origin_layer, prop.origin_step, share_strength(share, thr),
                   0.5 + 0.5 * pers, 1.0, {share_col: share, "persistence": pers,
                                           "threshold": thr}, prop)


def find_symptoms(trace: Trace, states: StateTable, dyn: LossDynamics, comp: Compression,
                  facts: RunFacts) -> list[Symptom]:
    """Every failure type the compressed events support, with its probability terms."""
    cfg = states.config
    prop = comp.propagation
    first_step = int(states.steps[0]) if len(states.steps) else 0
    out: list[Symptom] = []
    stall = dyn.stall
    m = states.measures

    if "gradient_vanishing" in prop:
        p = prop["gradient_vanishing"]
        row = _row(states, p.origin_step)
        vanished = [e.evidence["forward_index"] for e in comp.onsets
                    if e.kind == "gradient_vanishing" and e.step == p.origin_step]
        deepest = min(vanished)
        min_ratio = float(np.nanmin(m["grad_ratio"][row, vanished]))
        pers = _persistence(m["is_vanishing"], m["observed"], row, deepest)
        strength = 1.0 if min_ratio <= 0 else ratio_strength(cfg.rel_vanish / min_ratio, 1.0)
        act_share = _activation_decay_share(states, row, deepest)
        out.append(Symptom("vanishing_gradients", p.origin_layer, p.origin_step, strength,
                           0.5 + 0.5 * pers, 0.4 + 0.6 * stall,
                           {"min_grad_ratio": min_ratio, "threshold": cfg.rel_vanish,
                            "n_vanished_layers": len(vanished), "persistence": pers,
                            "loss_stall": stall, "activation_decay_share": act_share}, p,
                           {"activation_decay_share": act_share}))

    loss_bad = [s for s in (dyn.nonfinite_step, dyn.blowup_step) if s is not None]
    nf = prop.get(NONFINITE)
    # Module explosions on finite values only: rows after a NaN belong to the divergence.
    finite_rows: np.ndarray = np.asarray(~m["nonfinite"].any(axis=1), dtype=bool)
    exploding = m["is_exploding"] & finite_rows[:, None]
    mod_rows = np.flatnonzero(exploding.any(axis=1))
    mod_onset = int(states.steps[mod_rows[0]]) if len(mod_rows) else None
    mod_col = int(np.argmax(exploding[mod_rows[0]])) if len(mod_rows) else -1
    p_exp = prop.get("gradient_exploding")
    spiky = dyn.grad_spike_step is not None
    if mod_onset is not None or dyn.grad_explode_step is not None or spiky:
        # Onset: a module exploding at the first observation exploded through depth at init
        # (only per-module statistics show it); otherwise the earliest of the every-step
        # global gradient norm's growth and its spikes.
        if mod_onset is not None and mod_onset <= first_step:
            onset = mod_onset
        else:
            timed = [t for t in (dyn.grad_explode_step, dyn.grad_spike_step) if t is not None]
            onset = min(timed) if timed else int(mod_onset)  # type: ignore[arg-type]
        if mod_col >= 0:
            # Weight gradients explode in layers with weights: a parameter-free module
            # (activation, pooling) reports the parameterised layer that feeds it.
            layer = states.module_names[_weighted_producer(trace, states, mod_col)]
        else:
            layer = _spiking_layer(states, onset, facts)
        growth = dyn.grad_growth_max
        mod_growth = np.where(finite_rows[:, None], m["grad_growth"], np.nan)
        if np.isfinite(mod_growth).any():
            growth = float(np.nanmax([growth if not math.isnan(growth) else 0.0,
                                      np.nanmax(mod_growth)]))
        strength = max(ratio_strength(growth, cfg.explode_growth),
                       ratio_strength(dyn.grad_spikiness, cfg.grad_spike))
        # Growth is consistent when it lasts; spikes are sporadic by nature, so two separate
        # spike episodes are a recurring pattern (spikes count only without growth).
        grew = mod_onset is not None or dyn.grad_explode_step is not None
        pers = dyn.grad_explode_share if grew else min(1.0, dyn.grad_spike_episodes / 2.0)
        if mod_col >= 0:
            pers = max(pers, _persistence(exploding, m["observed"] & finite_rows[:, None],
                                          int(mod_rows[0]), mod_col))
        lead_onsets = [t for t in (mod_onset, dyn.grad_explode_step) if t is not None]
        out.append(Symptom("exploding_gradients", layer, onset, strength, 0.5 + 0.5 * pers,
                           1.0 if loss_bad else 0.4 + 0.6 * stall,
                           {"grad_growth_max": growth, "threshold": cfg.explode_growth,
                            "grad_spikiness": dyn.grad_spikiness,
                            "global_onset": dyn.grad_explode_step,
                            "growth_onset": min(lead_onsets) if lead_onsets else None,
                            "spike_onset": dyn.grad_spike_step, "persistence": pers}, p_exp,
                           {"grad_spikiness": dyn.grad_spikiness}))

    if loss_bad or nf is not None:
        onset = min(loss_bad + ([nf.origin_step] if nf is not None else []))
        origin = nf or prop.get("activation_anomalous")
        layer = origin.origin_layer if origin else facts.first_layer
        first_nonfinite = nf.origin_layer if nf else None
        if dyn.nonfinite_step is not None and (nf is None or dyn.nonfinite_step < nf.origin_step):
            # The loss turned non-finite while every module output was finite: the value
            # overflowed after the last module (in the loss on its output); the modules going
            # NaN the step after only carry the NaN update.
            layer, first_nonfinite, origin = states.module_names[-1], "<loss>", None
        loss = trace.steps["loss"].to_numpy(dtype=float, na_value=np.nan)
        steps = trace.steps["step"].to_numpy()
        tail = loss[steps >= onset]
        with np.errstate(invalid="ignore"):
            diverged = ~np.isfinite(tail) | (tail > cfg.loss_blowup * abs(dyn.baseline))
        bad_share = float(np.mean(diverged)) if len(tail) else 1.0
        # How far the loss rose from where it stood just before (a converged run that jumps
        # back up diverged even if it stays under its starting level), and whether it stayed.
        before = loss[(steps < onset) & np.isfinite(loss)][-cfg.loss_window:]
        level = float(np.median(before)) if len(before) else abs(dyn.baseline)
        level = max(level, 1e-12)
        finite_tail = tail[np.isfinite(tail)]
        peak = float(finite_tail.max()) if len(finite_tail) else math.nan
        final = (float(np.median(finite_tail[-cfg.loss_window:])) if len(finite_tail)
                 else math.nan)
        damage = 1.0 if not np.isfinite(tail[-1:]).all() else ratio_strength(
            final / level, cfg.loss_blowup)
        nonfinite = dyn.nonfinite_step is not None or nf is not None
        strength = 1.0 if nonfinite else ratio_strength(peak / level, cfg.loss_blowup)
        out.append(Symptom("loss_divergence", layer, onset, strength,
                           0.5 + 0.5 * max(bad_share, damage), 1.0,
                           {"nonfinite_step": dyn.nonfinite_step, "blowup_step": dyn.blowup_step,
                            "first_nonfinite_module": first_nonfinite,
                            "loss_peak": peak, "loss_before": level, "loss_final": final,
                            "loss_baseline": dyn.baseline,
                            "share_of_steps_diverged": bad_share}, origin))

    if "activation_dead" in prop:
        p = prop["activation_dead"]
        sym = _activation_symptom("dead", "dead_neurons", "act_frac_dead", cfg.dead_frac, p,
                                  states, dyn)
        share = sym.evidence["act_frac_dead"]
        full = float(np.clip((share - 0.9) / 0.1, 0.0, 1.0)) if math.isfinite(share) else 0.0
        sym.impact = 0.4 + 0.6 * max(stall, full)
        row, col = _row(states, p.origin_step), _col(states, p.origin_layer)
        if col > 0:
            mean, std = m["act_mean"][row, col - 1], m["act_std"][row, col - 1]
            z = mean / std if std > 0 else (-10.0 if mean < 0 else 0.0)
            sym.extra["preact_z"] = float(np.clip(z, -10.0, 10.0)) if np.isfinite(z) else math.nan
        sym.evidence["loss_stall"] = stall
        out.append(sym)

    sat = prop.get("activation_saturated")
    if sat is not None:
        sym = _activation_symptom("saturated", "saturated_activations", "act_frac_saturated",
                                  cfg.sat_frac, sat, states, dyn)
        sym.impact = 0.6 + 0.4 * max(stall, 1.0 if sat.origin_step <= first_step else 0.0)
        col = _col(states, sat.origin_layer)
        first_sat = next((i for i, f in enumerate(states.families) if f in _SATURATING), -1)
        sym.extra["origin_is_first_activation"] = 1.0 if col == first_sat else 0.0
        sym.evidence["loss_stall"] = stall
        out.append(sym)

    if dyn.plateau_step is not None:
        imp = dyn.improvement
        strength = 0.5 + 0.5 * float(np.clip((cfg.plateau_improvement - imp)
                                             / cfg.plateau_improvement, 0.0, 1.0))
        out.append(Symptom("training_plateau", facts.first_layer, dyn.plateau_step, strength,
                           1.0, 1.0, {"improvement": imp, "threshold": cfg.plateau_improvement},
                           extra={"grad_spikiness": dyn.grad_spikiness}))
    return out
