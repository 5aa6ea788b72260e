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

from neuraldbg.cause_evidence import output_floor_support
from neuraldbg.compressor import NONFINITE, Compression, Propagation
from neuraldbg.events import CurveWindows, LossDynamics
from neuraldbg.run_facts import RunFacts
from neuraldbg.states import SATURATING_FAMILIES, StateTable
from neuraldbg.thresholds import require_positive_fields
from neuraldbg.trace import Trace

__all__ = ["Symptom", "SymptomWeights", "find_symptoms", "ratio_strength", "share_strength"]


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


@dataclass(frozen=True, slots=True)
class SymptomWeights:
    """The coefficients of the symptom probability terms, with the reason for each number.

    The terms themselves are defined in the module docstring; the thresholds the evidence is
    compared with are in :class:`~neuraldbg.thresholds.ThresholdConfig`.

    Attributes
    ----------
    consistency_floor, consistency_gain : float, default=0.5, 0.5
        ``consistency = floor + gain x persistence``: a one-step blip still counts half (it
        was measured), a failure that lasts counts fully.
    impact_floor, impact_stall : float, default=0.4, 0.6
        ``impact = floor + stall_weight x stall`` for vanishing gradients, dead units and a
        gradient explosion that did not blow the loss up: such a failure matters when it
        stalls the loss, but is a real fault (0.4) even when the loss still moves.
    full_dead_share, full_dead_span : float, default=0.8, 0.2
        A layer more than ``full_dead_share`` dead counts as a stall: the stall term grows
        linearly from 0 at that share to 1 at ``share + span`` (all units dead), since a
        layer that dead passes little signal whatever the loss does yet. From 0.8 rather
        than 0.9: the zoo's dead_relu_high_lr kills 87-94% of its layer from step 3 while
        the loss still falls to a third, and on those runs the term started at the edge
        (0.39-0.57 for the rules, a healthy verdict on 2 of 5 seeds); healthy runs with
        dead units stay below 0.8 (at most 0.78 in the zoo's fixed twins, 0.73 in a new
        user's 356 healthy runs).
    saturation_impact_floor, saturation_impact_gain : float, default=0.6, 0.4
        ``impact = floor + gain x max(stall, present from the first step)`` for saturation:
        saturated units train slowly even when the loss still moves, so the floor is higher
        than for vanishing gradients; saturation from step 0 is an input or init problem.
    recurring_spike_episodes : float, default=2.0
        Spike episodes that make a spiking gradient fully persistent: spikes are sporadic
        by nature, so two separate episodes are already a recurring pattern.
    preact_z_limit : float, default=10.0
        mean/std of the output feeding a dead layer is clipped to +-this (and a zero std
        with a negative mean reads as -this): beyond 10 std the support of a negative bias
        is 1 to float precision, and the evidence stays JSON-finite.
    plateau_strength_floor, plateau_strength_gain : float, default=0.5, 0.5
        ``strength = floor + gain x`` how far the improvement falls short of
        ``plateau_improvement`` (share of it): 0.5 at the threshold, 1 for no improvement,
        as for the ratio and share strengths.
    level_floor : float, default=1e-12
        The loss level a divergence is measured against is at least this, so a loss that
        had converged to zero does not divide by zero.
    reach_share : float, default=0.5
        A module nearer the input than every vanished one whose gradient is not vanishing
        on at least this share of its observed steps from the onset on shows the gradient
        reaching the input past them: not vanishing *toward the input* (the contract's
        definition), but small gradients local to a few modules. A transformer's residual
        stream carries the gradient past attention's query and key projections, whose own
        gradients sit near 1e-6 of the output's at a standard init (uniform attention
        passes little gradient to the scores); the embeddings below them get a healthy one.
    """

    consistency_floor: float = 0.5
    consistency_gain: float = 0.5
    impact_floor: float = 0.4
    impact_stall: float = 0.6
    full_dead_share: float = 0.8
    full_dead_span: float = 0.2
    saturation_impact_floor: float = 0.6
    saturation_impact_gain: float = 0.4
    recurring_spike_episodes: float = 2.0
    preact_z_limit: float = 10.0
    plateau_strength_floor: float = 0.5
    plateau_strength_gain: float = 0.5
    level_floor: float = 1e-12
    reach_share: float = 0.5

    def __post_init__(self) -> None:
        """Reject a non-positive or non-numeric coefficient (the message names it)."""
        require_positive_fields(self)


#: The loss improvement below which a run counts as stalled (the loss curve's own rule).
_STALL_IMPROVEMENT = CurveWindows().stall_improvement


@dataclass(frozen=True, slots=True)
class _Run:
    """The stage outputs every symptom rule reads."""

    trace: Trace
    states: StateTable
    dyn: LossDynamics
    comp: Compression
    facts: RunFacts
    w: SymptomWeights

    @property
    def first_step(self) -> int:
        """First recorded step (0 without any)."""
        return int(self.states.steps[0]) if len(self.states.steps) else 0

    @property
    def loss_bad(self) -> list[int]:
        """Steps where the loss turned non-finite or blew up."""
        return [s for s in (self.dyn.nonfinite_step, self.dyn.blowup_step) if s is not None]

    def consistency(self, persistence: float) -> float:
        """``consistency_floor + consistency_gain x persistence``."""
        return self.w.consistency_floor + self.w.consistency_gain * persistence

    def stall_impact(self) -> float:
        """``impact_floor + impact_stall x stall``."""
        return self.w.impact_floor + self.w.impact_stall * self.dyn.stall

    def stall_impact_since(self, onset: int) -> float:
        """:meth:`stall_impact`, the stall also measured from the loss before ``onset``.

        The run's stall is measured from the median of its first losses; a failure that
        began among them (a blow-up at step 1) lifts that median, and a loss that fell back
        from its peak reads as learning even when it ends above where the run stood before
        the failure (a GRU at Adam 1.0: 0.78 at step 0, 221 at step 2, 1.67 at the end: a
        stall of 0, impact 0.4). Measured from the first loss as well (taken on the initial
        weights, before any update could blow up), the larger stall counts.
        """
        loss = self.trace.steps["loss"].to_numpy(dtype=float, na_value=np.nan)
        steps = self.trace.steps["step"].to_numpy()
        fin = np.isfinite(loss)
        finite, window = loss[fin], self.states.config.loss_window
        if len(finite) < 2 * window or not steps[fin][0] < onset <= steps[fin][window - 1]:
            return self.stall_impact()  # no loss before it, or it began after the first ones
        pre = float(finite[0])
        final = float(np.median(finite[-window:]))
        settled = (pre - final) / max(abs(pre), self.w.level_floor)
        stall = float(np.clip(1.0 - settled / _STALL_IMPROVEMENT, 0.0, 1.0))
        return self.w.impact_floor + self.w.impact_stall * max(self.dyn.stall, stall)


def _activation_symptom(run: _Run, kind: str, failure: str, share_col: str, thr: float,
                        prop: Propagation) -> Symptom:
    states = run.states
    row, col = _row(states, prop.origin_step), _col(states, prop.origin_layer)
    share = _tail_median(states.measures[share_col], row, col)
    pers = _persistence(states.measures[f"is_{kind}"], states.measures["observed"], row, col)
    return Symptom(failure, prop.origin_layer, prop.origin_step, share_strength(share, thr),
                   run.consistency(pers), 1.0, {share_col: share, "persistence": pers,
                                                "threshold": thr}, prop)


def find_symptoms(trace: Trace, states: StateTable, dyn: LossDynamics, comp: Compression,
                  facts: RunFacts, weights: SymptomWeights | None = None) -> list[Symptom]:
    """Every failure type the compressed events support, with its probability terms.

    Parameters
    ----------
    trace : Trace
    states : StateTable
    dyn : LossDynamics
    comp : Compression
    facts : RunFacts
        The outputs of the earlier stages for ``trace``.
    weights : SymptomWeights, optional
        Coefficients of the probability terms; the documented defaults when omitted.

    Returns
    -------
    list of Symptom
        In the order vanishing gradients, exploding gradients, loss divergence, dead
        neurons, saturated activations, training plateau (those found).
    """
    run = _Run(trace, states, dyn, comp, facts, weights or SymptomWeights())
    found = (rule(run) for rule in (_vanishing, _exploding, _divergence, _dead, _saturated,
                                    _plateau))
    return [sym for sym in found if sym is not None]


def _floor_plateau(run: _Run) -> Symptom | None:
    """A loss that fell, then settled on the floor a softmax output under a logits loss has.

    ``CrossEntropyLoss`` on probabilities cannot go below ``log(1 + (K - 1) / e)``: the run
    learned what it could and stopped there, however far the loss fell first.
    """
    facts = run.facts
    support = output_floor_support(facts, run.states.config)
    if support < 0.5 or facts.output_floor_step is None:
        return None
    names = run.states.module_names
    return Symptom("training_plateau", names[-1] if names else facts.first_layer,
                   facts.output_floor_step, support, 1.0, 1.0,
                   {"loss_floor_gap": facts.output_floor_gap,
                    "threshold": run.states.config.output_floor_gap},
                   extra={"grad_spikiness": run.dyn.grad_spikiness,
                          "improvement": run.dyn.improvement})


def _flat_before_the_first_cut(lr: np.ndarray, loss: np.ndarray, edge: int,
                               improvement: float, floor: float) -> bool:
    """Whether the loss had stopped improving before the rate was first cut (halved).

    ``lr`` and ``loss`` are the steps' columns. Over the last ``2 * edge`` finite losses
    before the first step whose rate is under half the largest so far, the later half
    improved on the earlier one by less than ``improvement``. ``ReduceLROnPlateau`` cuts
    the rate because the loss stalled (a run at its label-noise floor, cut again and
    again): the stall came first. A ``StepLR`` stepped per batch cuts it early, while the
    loss still falls, or before ``2 * edge`` steps.
    """
    known = np.isfinite(lr) & (lr > 0)
    if not known.any():
        return False
    peak = np.fmax.accumulate(np.where(known, lr, np.nan))
    with np.errstate(invalid="ignore"):
        cut = np.flatnonzero(known & (lr < 0.5 * peak))
    if not len(cut):
        return False
    loss = loss[:cut[0]]
    loss = loss[np.isfinite(loss)]
    if len(loss) < 2 * edge:
        return False
    before, last = float(np.median(loss[-2 * edge:-edge])), float(np.median(loss[-edge:]))
    return (before - last) / max(abs(before), floor) < improvement


def _collapse_plateau(run: _Run) -> Symptom | None:
    """A loss that stopped improving once the learning rate collapsed to ~0.

    The run as a whole improved (so it is not a stall from the start), but from the step
    the rate fell below ``lr_collapse`` of its peak, for at least ``lr_collapse_share`` of
    the run, the loss moved by less than ``plateau_improvement``: training ended there.
    Not when the loss had already stalled before the rate was first cut
    (:func:`_flat_before_the_first_cut`: the cuts followed the stall).
    """
    dyn, cfg, w = run.dyn, run.states.config, run.w
    start = dyn.lr_collapse_step
    if start is None:
        return None
    steps = run.trace.steps
    after = (steps["step"] >= start).to_numpy()
    share = float(after.mean())
    loss = steps["loss"].to_numpy(dtype=float)[after]
    loss = loss[np.isfinite(loss)]
    edge = max(3, int(round(cfg.plateau_window * len(loss))))
    if share < cfg.lr_collapse_share or len(loss) < max(cfg.plateau_min_steps, 2 * edge):
        return None
    first, last = float(np.median(loss[:edge])), float(np.median(loss[-edge:]))
    imp = (first - last) / max(abs(first), w.level_floor)
    if imp >= cfg.plateau_improvement or first < cfg.lr_collapse_level * abs(dyn.baseline):
        return None
    whole = max(3, int(round(cfg.plateau_window * len(steps))))
    if _flat_before_the_first_cut(steps["lr"].to_numpy(dtype=float),
                                  steps["loss"].to_numpy(dtype=float), whole,
                                  cfg.plateau_improvement, w.level_floor):
        return None
    strength = w.plateau_strength_floor + w.plateau_strength_gain * float(np.clip(
        (cfg.plateau_improvement - imp) / cfg.plateau_improvement, 0.0, 1.0))
    return Symptom("training_plateau", run.facts.first_layer, int(start), strength, 1.0, 1.0,
                   {"lr_collapse_step": int(start), "lr_collapse_share": share,
                    "improvement_after_collapse": imp,
                    "threshold": cfg.plateau_improvement},
                   extra={"grad_spikiness": dyn.grad_spikiness, "improvement": imp,
                          "lr_collapse": 1.0})


def _vanishing(run: _Run) -> Symptom | None:
    """Vanishing gradients: the smallest gradient ratio among the layers that vanished first."""
    prop, m, cfg = run.comp.propagation, run.states.measures, run.states.config
    if "gradient_vanishing" not in prop:
        return None
    p = prop["gradient_vanishing"]
    row = _row(run.states, p.origin_step)
    vanished = [e.evidence["forward_index"] for e in run.comp.onsets
                if e.kind == "gradient_vanishing" and e.step == p.origin_step]
    deepest = min(vanished)
    healthy = m["observed"] & ~m["is_vanishing"]
    if any(_persistence(healthy, m["observed"], row, col) >= run.w.reach_share
           for col in range(deepest) if m["observed"][row:, col].any()):
        return None  # the gradient reaches the input past the vanished modules
    min_ratio = float(np.nanmin(m["grad_ratio"][row, vanished]))
    pers = _persistence(m["is_vanishing"], m["observed"], row, deepest)
    strength = 1.0 if min_ratio <= 0 else ratio_strength(cfg.rel_vanish / min_ratio, 1.0)
    act_share = _activation_decay_share(run.states, row, deepest)
    stall = run.dyn.stall
    return Symptom("vanishing_gradients", p.origin_layer, p.origin_step, strength,
                   run.consistency(pers), run.stall_impact(),
                   {"min_grad_ratio": min_ratio, "threshold": cfg.rel_vanish,
                    "n_vanished_layers": len(vanished), "persistence": pers,
                    "loss_stall": stall, "activation_decay_share": act_share}, p,
                   {"activation_decay_share": act_share,
                    "n_vanished_layers": float(len(vanished))})


@dataclass(frozen=True, slots=True)
class _ModuleExplosion:
    """Where module gradients exploded on finite values (rows after a NaN are left out)."""

    finite_rows: np.ndarray
    exploding: np.ndarray
    first_row: int  # -1 when no module exploded
    onset: int | None
    col: int

    @classmethod
    def find(cls, states: StateTable) -> _ModuleExplosion:
        """Locate the first module explosion on finite rows."""
        m = states.measures
        finite_rows: np.ndarray = np.asarray(~m["nonfinite"].any(axis=1), dtype=bool)
        exploding = m["is_exploding"] & finite_rows[:, None]
        rows = np.flatnonzero(exploding.any(axis=1))
        if not len(rows):
            return cls(finite_rows, exploding, -1, None, -1)
        return cls(finite_rows, exploding, int(rows[0]), int(states.steps[rows[0]]),
                   int(np.argmax(exploding[rows[0]])))


def _explosion_onset(run: _Run, mod: _ModuleExplosion) -> int:
    """Onset of a gradient explosion.

    A module exploding at the first observation exploded through depth at init (only
    per-module statistics show it); otherwise the earliest of the every-step global
    gradient norm's growth and its spikes.
    """
    if mod.onset is not None and mod.onset <= run.first_step:
        return mod.onset
    timed = [t for t in (run.dyn.grad_explode_step, run.dyn.grad_spike_step) if t is not None]
    return min(timed) if timed else int(mod.onset)  # type: ignore[arg-type]


def _explosion_strength(run: _Run, mod: _ModuleExplosion) -> tuple[float, float]:
    """(largest gradient growth on finite rows, the strength it and the spikes give)."""
    dyn, cfg = run.dyn, run.states.config
    growth = dyn.grad_growth_max
    mod_growth = np.where(mod.finite_rows[:, None], run.states.measures["grad_growth"], np.nan)
    if np.isfinite(mod_growth).any():
        growth = float(np.nanmax([growth if not math.isnan(growth) else 0.0,
                                  np.nanmax(mod_growth)]))
    return growth, max(ratio_strength(growth, cfg.explode_growth),
                       ratio_strength(dyn.grad_spikiness, cfg.grad_spike))


def _exploding(run: _Run) -> Symptom | None:
    """Exploding gradients: module growth, global-norm growth or recurring spikes."""
    dyn, states, cfg = run.dyn, run.states, run.states.config
    mod = _ModuleExplosion.find(states)
    if mod.onset is None and dyn.grad_explode_step is None and dyn.grad_spike_step is None:
        return None
    onset = _explosion_onset(run, mod)
    # Weight gradients explode in layers with weights: a parameter-free module (activation,
    # pooling) reports the parameterised layer that feeds it.
    layer = (states.module_names[_weighted_producer(run.trace, states, mod.col)]
             if mod.col >= 0 else _spiking_layer(states, onset, run.facts))
    growth, strength = _explosion_strength(run, mod)
    # Growth is consistent when it lasts; spikes are sporadic by nature, so two separate
    # spike episodes are a recurring pattern (spikes count only without growth).
    grew = mod.onset is not None or dyn.grad_explode_step is not None
    pers = dyn.grad_explode_share if grew else min(
        1.0, dyn.grad_spike_episodes / run.w.recurring_spike_episodes)
    if mod.col >= 0:
        pers = max(pers, _persistence(mod.exploding,
                                      states.measures["observed"] & mod.finite_rows[:, None],
                                      mod.first_row, mod.col))
    lead_onsets = [t for t in (mod.onset, dyn.grad_explode_step) if t is not None]
    return Symptom("exploding_gradients", layer, onset, strength, run.consistency(pers),
                   1.0 if run.loss_bad else run.stall_impact_since(onset),
                   {"grad_growth_max": growth, "threshold": cfg.explode_growth,
                    "grad_spikiness": dyn.grad_spikiness,
                    "global_onset": dyn.grad_explode_step,
                    "growth_onset": min(lead_onsets) if lead_onsets else None,
                    "spike_onset": dyn.grad_spike_step, "persistence": pers},
                   run.comp.propagation.get("gradient_exploding"),
                   {"grad_spikiness": dyn.grad_spikiness})


def _divergence_origin(run: _Run) -> tuple[str, str | None, Propagation | None]:
    """(origin layer, first non-finite module or ``"<loss>"``, its propagation)."""
    prop, dyn = run.comp.propagation, run.dyn
    nf = prop.get(NONFINITE)
    if dyn.nonfinite_step is not None and (nf is None or dyn.nonfinite_step < nf.origin_step):
        # The loss turned non-finite while every module output was finite: the value
        # overflowed after the last module (in the loss on its output); the modules going
        # NaN the step after only carry the NaN update.
        return run.states.module_names[-1], "<loss>", None
    origin = nf or prop.get("activation_anomalous")
    return (origin.origin_layer if origin else run.facts.first_layer,
            nf.origin_layer if nf else None, origin)


def _divergence_extent(run: _Run, onset: int) -> dict[str, float]:
    """How far the loss rose from where it stood, and whether it stayed.

    The level is the lower of the loss just before the onset and the run's starting
    baseline: a converged run that jumps back up diverged even if it stays under its
    starting level, and a loss that climbed gradually diverged from where it started.
    """
    dyn, cfg = run.dyn, run.states.config
    loss = run.trace.steps["loss"].to_numpy(dtype=float, na_value=np.nan)
    steps = run.trace.steps["step"].to_numpy()
    tail = loss[steps >= onset]
    with np.errstate(invalid="ignore"):
        diverged = ~np.isfinite(tail) | (tail > cfg.loss_blowup * abs(dyn.baseline))
    bad_share = float(np.mean(diverged)) if len(tail) else 1.0
    before = loss[(steps < onset) & np.isfinite(loss)][-cfg.loss_window:]
    level = float(np.median(before)) if len(before) else abs(dyn.baseline)
    if math.isfinite(dyn.baseline) and dyn.baseline > 0:
        # A loss that climbed for a while before crossing the blow-up line is measured
        # against where it started, not against the height it had already climbed to.
        level = min(level, dyn.baseline)
    level = max(level, run.w.level_floor)
    finite_tail = tail[np.isfinite(tail)]
    peak = float(finite_tail.max()) if len(finite_tail) else math.nan
    final = (float(np.median(finite_tail[-cfg.loss_window:])) if len(finite_tail)
             else math.nan)
    damage = 1.0 if not np.isfinite(tail[-1:]).all() else ratio_strength(
        final / level, cfg.loss_blowup)
    return {"bad_share": bad_share, "level": level, "peak": peak, "final": final,
            "damage": damage}


def _divergence(run: _Run) -> Symptom | None:
    """Loss divergence: the loss turned non-finite or blew up, or a module went non-finite."""
    dyn, cfg = run.dyn, run.states.config
    nf = run.comp.propagation.get(NONFINITE)
    loss_bad = run.loss_bad
    if not (loss_bad or nf is not None):
        return None
    onset = min(loss_bad + ([nf.origin_step] if nf is not None else []))
    layer, first_nonfinite, origin = _divergence_origin(run)
    ext = _divergence_extent(run, onset)
    nonfinite = dyn.nonfinite_step is not None or nf is not None
    strength = 1.0 if nonfinite else ratio_strength(ext["peak"] / ext["level"], cfg.loss_blowup)
    return Symptom("loss_divergence", layer, onset, strength,
                   run.consistency(max(ext["bad_share"], ext["damage"])), 1.0,
                   {"nonfinite_step": dyn.nonfinite_step, "blowup_step": dyn.blowup_step,
                    "first_nonfinite_module": first_nonfinite,
                    "loss_peak": ext["peak"], "loss_before": ext["level"],
                    "loss_final": ext["final"], "loss_baseline": dyn.baseline,
                    "share_of_steps_diverged": ext["bad_share"]}, origin)


def _dead(run: _Run) -> Symptom | None:
    """Dead units, with the mean/std of the output that feeds the dead layer."""
    prop, states, w = run.comp.propagation, run.states, run.w
    if "activation_dead" not in prop:
        return None
    p = prop["activation_dead"]
    sym = _activation_symptom(run, "dead", "dead_neurons", "act_frac_dead",
                              states.config.dead_frac, p)
    share = sym.evidence["act_frac_dead"]
    full = (float(np.clip((share - w.full_dead_share) / w.full_dead_span, 0.0, 1.0))
            if math.isfinite(share) else 0.0)
    sym.impact = w.impact_floor + w.impact_stall * max(run.dyn.stall, full)
    row, col = _row(states, p.origin_step), _col(states, p.origin_layer)
    if col > 0:
        m, lim = states.measures, w.preact_z_limit
        mean, std = m["act_mean"][row, col - 1], m["act_std"][row, col - 1]
        z = mean / std if std > 0 else (-lim if mean < 0 else 0.0)
        sym.extra["preact_z"] = float(np.clip(z, -lim, lim)) if np.isfinite(z) else math.nan
    sym.evidence["loss_stall"] = run.dyn.stall
    return sym


def _saturated(run: _Run) -> Symptom | None:
    """Saturated activations, and whether they began at the first saturating activation."""
    sat, states, w = run.comp.propagation.get("activation_saturated"), run.states, run.w
    if sat is None:
        return None
    stall = run.dyn.stall
    sym = _activation_symptom(run, "saturated", "saturated_activations", "act_frac_saturated",
                              states.config.sat_frac, sat)
    sym.impact = w.saturation_impact_floor + w.saturation_impact_gain * max(
        stall, 1.0 if sat.origin_step <= run.first_step else 0.0)
    col = _col(states, sat.origin_layer)
    first_sat = next((i for i, f in enumerate(states.families) if f in SATURATING_FAMILIES), -1)
    sym.extra["origin_is_first_activation"] = 1.0 if col == first_sat else 0.0
    sym.evidence["loss_stall"] = stall
    return sym


def _plateau(run: _Run) -> Symptom | None:
    """A stalled loss, stronger the less it improved; or one that sits on an output floor."""
    dyn, cfg, w = run.dyn, run.states.config, run.w
    if dyn.plateau_step is None:
        return _floor_plateau(run) or _collapse_plateau(run)
    imp = dyn.improvement
    if dyn.blowup_step is not None and 1.0 - imp >= cfg.loss_blowup:
        return None  # the loss blew up and ended on the far side of the blow-up line: the
        # divergence describes the run, not a stall (the vocabulary's "no learning")
    strength = w.plateau_strength_floor + w.plateau_strength_gain * float(np.clip(
        (cfg.plateau_improvement - imp) / cfg.plateau_improvement, 0.0, 1.0))
    return Symptom("training_plateau", run.facts.first_layer, dyn.plateau_step, strength,
                   1.0, 1.0, {"improvement": imp, "threshold": cfg.plateau_improvement},
                   extra={"grad_spikiness": dyn.grad_spikiness, "improvement": imp})
