"""Root-cause support: how far the run facts favour each cause of one symptom.

Used by the Hypothesis Generator (:mod:`neuraldbg.hypotheses`) to rank the causes of a
symptom: one rule function per failure type, plus the script bugs that any symptom can
come from. The facts come from :mod:`neuraldbg.run_facts`. Every support value is in [0, 1]
and comes from a measured quantity compared with a threshold of
:class:`~neuraldbg.thresholds.ThresholdConfig` through
:func:`~neuraldbg.cause_evidence.logistic_support`, so a cause is favoured exactly as far as
its evidence reaches; how much each piece of evidence weighs is in
:class:`~neuraldbg.cause_evidence.CauseWeights`, each number with its reason:

- learning rate: the update ratio ||dW||/||W|| before the failure (too high above 1e-2, too
  low below 1e-4), learning-rate jumps in ``trace.steps`` just before a blow-up, and a rate
  that collapsed to ~0 before the loss stopped (a schedule stepped per batch);
- initialisation: the init gain against the scheme the config names, else against absolute
  bounds; depth amplification: layers with a sound init that still amplify the signal 10x
  or more through depth point at missing normalization rather than at the init;
- inputs: the first layer's input rms; pre-activations: mean/std of the output feeding a
  dead layer (a large negative bias puts it far below zero from the first step).

Bugs in the training script, whatever symptom they produce (their evidence takes its share
from the generic causes above, which the bug itself inflates):

- gradients never reset (``missing_zero_grad``): the global gradient norm grows from the
  first steps like a running sum while the loss does not improve, or with that shape the
  parameter-gradient / output-gradient norm ratio grows ~10x over the run (the parameter
  gradient holds the steps before; Adam still lowers the loss a little);
- ``loss_output_mismatch``: a softmax (or sigmoid) module ends the network on a stall, a
  rectifier ends it and its units died (a ReLU on the logits), or
  the loss settles on the floor ``log(1 + (K - 1) / e)`` that ``CrossEntropyLoss`` fed K
  probabilities cannot go below, or the loss turns non-finite out of a learned state while
  every module output is finite (a hand-written loss on probabilities at ``log(0)``);
- ``unscaled_targets``: the first loss is orders of magnitude above the output scale;
- ``symmetric_init``: weight rows identical at enter and still at the latest flush
  (``trace.meta["weight_diversity"]``, :mod:`neuraldbg.weight_diversity`);
- ``gradient_blocked``: a trainable module the forward called never received a gradient
  while others did (a ``.detach()``, ``no_grad`` in the forward);
- ``data_problem``: a stall whose weights move as much as in healthy training, with no
  other cause supported (labels unrelated to the inputs); or an input batch that carried
  NaN or Inf (the first module's output turned non-finite from sound weights); or targets
  that did (the loss turned non-finite out of a calm run while every output was finite);
- BatchNorm layers whose outputs are not normalised at the first step (a model left in
  ``eval()``): a cause outside the vocabulary, so its support goes to ``unknown``;
- weights that never moved while gradients flowed (the optimizer holds other parameters):
  no cause in the vocabulary, so every specific cause gives way to ``unknown``.

Two causes the trace cannot measure keep a fixed, low support so that they are offered as
alternatives: ``saturating_activation`` (0.35) for saturated units, since replacing the
activation is always a valid fix, and ``missing_gradient_clipping`` (0.25) for an
explosion in a non-recurrent net without configured clipping. Both rank below any cause
whose evidence is measured beyond its threshold (support > 0.5).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from neuraldbg.cause_evidence import (
    DEFAULT_WEIGHTS,
    CauseWeights,
    ScriptBugs,
    init_support,
    logistic_support,
    probabilities_read_rightly,
)
from neuraldbg.outside_vocabulary import batchnorm_hint
from neuraldbg.run_facts import RunFacts
from neuraldbg.sufficiency import LEARNED_DROP
from neuraldbg.thresholds import ThresholdConfig

__all__ = ["CauseSupport", "nonfinite_check", "score_causes"]

#: Cause -> (support in [0, 1], the evidence behind it).
CauseSupport: TypeAlias = dict[str, tuple[float, dict[str, Any]]]


#: Support for ``loss_output_mismatch`` by the type of the network's last module, on a run
#: that stalls or saturates: a softmax output is the classic bug (``CrossEntropyLoss``
#: applies its own); a sigmoid output is right for ``BCELoss`` and wrong for
#: ``BCEWithLogitsLoss``, which the trace cannot tell apart above that loss's floor, so it
#: stays below 0.5 (under the floor it is 0: :func:`_output_type_support`).
_OUTPUT_MISMATCH: dict[str, float] = {"Softmax": 0.85, "Softmax2d": 0.85, "Sigmoid": 0.45}


def _output_type_support(facts: RunFacts, cfg: ThresholdConfig) -> float:
    """:data:`_OUTPUT_MISMATCH` of the output's type, 0 where the loss reads it rightly.

    See :func:`~neuraldbg.cause_evidence.probabilities_read_rightly`.
    """
    if probabilities_read_rightly(facts, cfg):
        return 0.0
    return _OUTPUT_MISMATCH.get(facts.output_type, 0.0)
#: Bugs in the user's script: evidence for one of them takes its share from the generic
#: causes (a high update ratio, a small init gain) that the bug itself produces.
_BUGS = ("missing_zero_grad", "unscaled_targets", "symmetric_init", "gradient_blocked",
         "loss_output_mismatch", "data_problem")


def _lr_jump_before(facts: RunFacts, step: int, window: int) -> bool:
    return any(step - window <= s <= step for s in facts.lr_jump_steps)


@dataclass(frozen=True, slots=True)
class _Shared:
    """Supports and evidence every failure type's rules read (computed once per symptom)."""

    facts: RunFacts
    cfg: ThresholdConfig
    w: CauseWeights
    extra: dict[str, float]
    from_start: bool
    jump: bool
    inputs: float
    init_large: float
    init_small: float
    piled: float
    targets: float
    mismatch: float
    lr_high: float
    cold_start: float
    first_step: float = 0.0
    ev_lr: dict[str, Any] = field(default_factory=dict)
    ev_init: dict[str, Any] = field(default_factory=dict)
    ev_norm: dict[str, Any] = field(default_factory=dict)
    ev_output: dict[str, Any] = field(default_factory=dict)

    @property
    def ev_inputs(self) -> dict[str, Any]:
        """Evidence of ``unnormalized_inputs``."""
        return {"input_rms": self.facts.input_rms, "threshold": self.cfg.input_scale_high}

    def spikes(self) -> float:
        """Support for "the global gradient norm spikes"."""
        return logistic_support(float(self.extra.get("grad_spikiness", math.nan)),
                                self.cfg.grad_spike)

    def loss_rise(self) -> float:
        """Support for "the stalled loss ended well above where it started"."""
        end_over_start = 1.0 - float(self.extra.get("improvement", math.nan))
        if not end_over_start > 1.0:  # a loss that did not rise is no evidence of rising
            return 0.0
        return logistic_support(end_over_start, self.w.loss_rise,
                                decades=self.w.loss_rise_decades)

    def saturated_cell(self) -> float:
        """Support for "inputs far off scale saturate a recurrent cell's gates".

        0 when the net has no recurrent cell. Its output and gradient stop moving, and its
        first steps spike.
        """
        return self.w.recurrent_inputs * self.inputs if self.facts.recurrent else 0.0

    def clip_can_help(self) -> float:
        """1 - support for "even the ordinary steps are far too big" (a clip cannot help)."""
        return 1.0 - logistic_support(self.facts.update_ratio,
                                      self.cfg.update_ratio_high * self.w.steps_too_big,
                                      decades=self.w.steps_too_big_decades)


class _Candidates:
    """The causes of one symptom with their support, those under ``min_support`` left out."""

    def __init__(self, min_support: float) -> None:
        self.min_support = min_support
        self.out: CauseSupport = {}

    def put(self, cause: str, support: float, evidence: dict[str, Any]) -> None:
        """Record ``cause`` when its support reaches ``min_support`` (capped at 1).

        A cause already put keeps its support and evidence unless this support is higher:
        the strongest of several readings stands (a symptom's rule does not undo a script
        bug's).
        """
        held = self.out.get(cause)
        if support >= self.min_support and (held is None or support > held[0]):
            self.out[cause] = (float(min(1.0, support)), evidence)


def score_causes(failure_type: str, *, onset: int, first_step: int, facts: RunFacts,
                 cfg: ThresholdConfig, extra: dict[str, float] | None = None,
                 weights: CauseWeights | None = None) -> CauseSupport:
    """Support of each candidate root cause of one symptom.

    Parameters
    ----------
    failure_type : str
        A failure type of the contract's vocabulary.
    onset : int
        Step the symptom appeared.
    first_step : int
        First recorded step. A symptom present there was measured before any update, so
        the learning rate cannot have caused it.
    facts : RunFacts
    cfg : ThresholdConfig
    extra : dict, optional
        Symptom-specific numbers: ``preact_z`` (mean/std feeding a dead layer),
        ``origin_is_first_activation`` (1.0/0.0), ``n_vanished_layers`` (modules whose
        gradient vanished first), ``activation_decay_share`` (share of a
        vanishing gradient's decay across sigmoid/tanh modules), ``upstream_instability``
        (probability of an explosion before the symptom), ``grad_spikiness``.
    weights : CauseWeights, optional
        How much each piece of evidence weighs; the documented defaults when omitted.

    Returns
    -------
    dict of str to (float, dict)
        Cause -> (support in [0, 1], the evidence behind it). Causes without support are
        left out.
    """
    w = weights or DEFAULT_WEIGHTS
    bugs = ScriptBugs.measure(facts, cfg, w)
    shared = _shared(onset <= first_step, facts, cfg, w, extra or {}, bugs,
                     _lr_jump_before(facts, onset, cfg.lr_jump_window))
    cands = _Candidates(w.min_support)
    _put_script_bugs(cands, shared, bugs)
    rules = _RULES.get(failure_type)
    if rules is not None:
        rules(cands, shared)
    out = cands.out
    # Evidence of a bug in the script: the generic causes lose what it explains.
    bug = bugs.strongest
    for cause in list(out):
        if cause not in _BUGS and cause != "unknown":
            sup, ev = out[cause]
            out[cause] = (sup * (1.0 - bug), ev)
    if facts.weights_unmoved:  # no cause in the vocabulary trains a model nothing updates
        out = {c: (0.0, ev) for c, (_, ev) in out.items()}
        out["unknown"] = (1.0, {"weights_unmoved": True, "hint": facts.weights_unmoved})
    return {c: v for c, v in out.items() if v[0] >= w.min_support}


def _shared(from_start: bool, facts: RunFacts, cfg: ThresholdConfig, w: CauseWeights,
            extra: dict[str, float], bugs: ScriptBugs, jump: bool) -> _Shared:
    """Supports every failure type's rules read."""
    ur = facts.update_ratio
    init_large, init_small = init_support(facts, cfg, w)
    init_large *= 1.0 - bugs.bn_off
    # BatchNorm present but not normalising: whatever it was there to absorb (the input or
    # init scale, a high rate, depth) is not the root; the mode mix-up has no cause in the
    # vocabulary, so its support goes to "unknown" (see generate_hypotheses).
    inputs = logistic_support(facts.input_rms, cfg.input_scale_high)
    inputs *= (1.0 - bugs.bn_off) * (1.0 - bugs.outlier_records)
    # Unnormalised inputs or a too-large init inflate every gradient and so the update
    # ratio: a high ratio is weaker evidence of a high learning rate when either holds.
    # Gradients that pile up (no zero_grad) or targets far off the output scale inflate it
    # whatever the rate: then a high ratio is hardly evidence of the rate at all.
    # Under SGD the update ratio is the rate times the gradient's size: gradients that
    # dwarfed the weights before the first update (an init, inputs or a loss on a far
    # larger scale) make it high at any rate, and gradients far smaller than the weights
    # (a signal fading through depth) make it small at any rate.
    hot_start, cold_start = (
        (logistic_support(facts.start_grad_ratio, cfg.start_grad_ratio_high,
                          decades=w.start_grad_decades),
         logistic_support(facts.start_grad_ratio, cfg.start_grad_ratio_low, above=False,
                          decades=w.start_grad_decades))
        if facts.step_scales_with_gradient else (0.0, 0.0))
    # Adam and its kin step by about the rate per weight, so weights far smaller than the
    # default make every update large against them at any rate; and their first step
    # larger than the weights is a rate too high, though the weights it inflates make
    # every later ratio small (an LSTM at Adam's 1.0: 7.0 at the first step, the run's
    # median 0.005)
    # ... and so does a rate that grew the weights far past their start (a warmup that
    # takes Adam's rate to 1.0: small first steps, then weights 23-29x theirs, units dead)
    small_weights, first_step = (
        (0.0, 0.0) if facts.step_scales_with_gradient else
        (init_small, max(logistic_support(facts.start_update_ratio, cfg.start_update_ratio_high,
                                          decades=w.start_update_decades),
                         logistic_support(facts.early_weight_growth,
                                          cfg.adaptive_weight_growth_high,
                                          decades=w.weight_growth_decades))))
    steady = min(logistic_support(ur, cfg.update_ratio_high), _rate_borne_out(facts, cfg, w))
    lr_high = (max(steady, first_step)
               * (1.0 - w.lr_confound_share * max(inputs, init_large, small_weights))
               * (1.0 - hot_start) * (1.0 - bugs.strongest))
    return _Shared(
        facts=facts, cfg=cfg, w=w, extra=extra, from_start=from_start, jump=jump,
        inputs=inputs, init_large=init_large, init_small=init_small, piled=bugs.piled,
        targets=bugs.targets,
        mismatch=max(_output_type_support(facts, cfg), bugs.floor),
        lr_high=lr_high, cold_start=cold_start, first_step=first_step * (1.0 - small_weights),
        ev_lr={**({"hint": summed} if (summed := summed_loss_hint(facts)) else {}),
               "update_ratio": ur, "threshold": cfg.update_ratio_high, "lr": facts.lr,
               "start_grad_ratio": facts.start_grad_ratio,
               "start_update_ratio": facts.start_update_ratio,
               "early_overshoot": facts.early_overshoot, "loss_spikes": facts.loss_spikes,
               "lr_jump_before_onset": jump, "present_from_first_step": from_start},
        ev_init={"init_gain": facts.init_gain, "init_scale": facts.init_scale,
                 "n_layers_measured": facts.n_gain_pairs},
        ev_norm={"depth_gain": facts.depth_gain,
                 "normalization_layers": facts.has_normalization,
                 "n_weight_layers": facts.n_weight_layers},
        ev_output={"loss_receives": facts.output_type,
                   "loss_floor_gap": facts.output_floor_gap, "loss_floor_support": bugs.floor,
                   "logits_gradient_power_of_classes": facts.output_grad_power})


def _rate_borne_out(facts: RunFacts, cfg: ThresholdConfig, w: CauseWeights) -> float:
    """How far the run bears a high median update ratio out as a rate too high.

    1 under SGD, whose ratio is the rate times the gradient's size (its confounds are
    discounted elsewhere). Under Adam and its kin the median is about the rate over the
    weights' rms whatever the run does (see ``ThresholdConfig.adaptive_rate_first_step``):
    the larger of the supports for a first step large against the weights and for a loss
    that overshot its start, or 1 when the loss spiked (a rate a warmup grew too high).
    The overshoot does not count where the optimizer inflated its own first steps
    (RMSprop): any rate it trains at overshoots, and its first step, read at the rate,
    stands for it.
    """
    if facts.step_scales_with_gradient or facts.loss_spikes:
        return 1.0
    first = logistic_support(facts.start_update_ratio, cfg.adaptive_rate_first_step,
                             decades=w.adaptive_rate_decades)
    if facts.early_steps_inflated:
        return first
    return max(first, logistic_support(facts.early_overshoot, cfg.early_overshoot_high,
                                       decades=w.overshoot_decades))


def _put_script_bugs(cands: _Candidates, s: _Shared, bugs: ScriptBugs) -> None:
    """Bugs in the training script, whatever the symptom they produce."""
    facts, cfg, w = s.facts, s.cfg, s.w
    cands.put("missing_zero_grad", w.zero_grad * bugs.piled, {
        "grad_growth_exponent": facts.grad_growth[0], "power_law_fit": facts.grad_growth[1],
        "share_rising": facts.grad_growth[2], "loss_improved": facts.loss_improved,
        "threshold": cfg.grad_sum_exponent,
        "param_over_output_grad_growth": facts.grad_accumulation,
        "accumulation_threshold": cfg.grad_accumulation_growth})
    cands.put("unscaled_targets", w.unscaled_targets * bugs.targets,
              {"loss_scale_ratio": facts.loss_scale_ratio, "threshold": cfg.loss_scale_ratio})
    cands.put("symmetric_init", w.symmetric_init * bugs.symmetric,
              {"row_diversity": facts.row_diversity, "threshold": cfg.row_diversity_low,
               "symmetric_modules": list(facts.symmetric_modules)})
    cands.put("gradient_blocked", w.gradient_blocked * bugs.blocked,
              {"modules_without_gradient": list(facts.blocked_modules)})
    cands.put("loss_output_mismatch", w.unsafe_loss * bugs.unsafe_loss, {
        "loss_before_nonfinite_over_start": facts.nonfinite_from_floor,
        "threshold": LEARNED_DROP,
        "reading": "the loss turned non-finite while every module output was finite, after "
                   "it had fallen to the bottom: the loss computation hit log(0) or 0 * inf "
                   "(a hand-written loss on probabilities); compute it from logits "
                   "(BCEWithLogitsLoss, CrossEntropyLoss)"})
    cands.put("loss_output_mismatch", bugs.clipped_output, {
        "loss_receives": facts.output_type, "output_dead_share": facts.output_dead,
        "threshold": cfg.dead_frac,
        "reading": "the network ends in a rectifier whose units died: the loss reads outputs "
                   "clipped at zero, and a unit pushed below zero gets no gradient back; "
                   "give the loss the last linear layer's output (logits)"})
    check = nonfinite_check(facts)
    cands.put("data_problem", w.nonfinite_input * bugs.bad_input, {
        "nonfinite_input_step": facts.nonfinite_input_step,
        "reading": "the first module's output turned non-finite (or overflowed) while its "
                   "weights and its earlier outputs were sound: the input batch carried NaN, "
                   "Inf or a huge value (a corrupted record, a missing value, a division by "
                   "zero in preprocessing, a sentinel such as 1e30)", "hint": check})
    cands.put("data_problem", w.nonfinite_target * bugs.bad_target, {
        "nonfinite_target_step": facts.nonfinite_target_step,
        "reading": "the loss turned non-finite out of a calm run while every module output "
                   "and every weight was finite: the NaN came with the targets (a missing "
                   "value) or from the loss computation", "hint": check})
    cands.put("data_problem", w.outlier_records * bugs.outlier_records, {
        "input_swing": facts.input_swing, "threshold": cfg.input_swing_high,
        "reading": "the first layer's output range jumps by decades from one batch to the "
                   "next: a few records carry values far off the rest (a missing-value code "
                   "such as -999, a corrupted column, a unit mix-up in some rows)",
        "hint": "find the records far off the rest (x.abs().amax(dim=1) per record) and "
                "clean them (impute the missing values, drop or clip the rows); rescaling "
                "every input, a normalization layer or a smaller rate do not undo them"})
    if facts.nonfinite_entry_module is not None:
        name, step = facts.nonfinite_entry_module, facts.nonfinite_entry_step
        cands.put("unknown", w.calm_nonfinite * bugs.calm_nonfinite, {
            "nonfinite_entry_module": name, "nonfinite_entry_step": step,
            "reading": f"at step {step} the first non-finite output was module {name}'s, "
                       "from sound weights, while every module before it had a finite "
                       "output: the NaN or Inf entered the forward pass before it",
            "hint": check})
    else:
        cands.put("unknown", w.calm_nonfinite * bugs.calm_nonfinite, {
            "calm_nonfinite_step": facts.calm_nonfinite_step,
            "reading": "the loss blew up or turned non-finite out of a calm run (no spike, "
                       "gradient growth or weight growth before it) at a step without module "
                       "statistics", "hint": check})
    if bugs.bn_off >= w.min_support:  # a cause outside the vocabulary: support for "unknown"
        cands.out["unknown"] = (bugs.bn_off, {
            "batchnorm_off_factor": facts.batchnorm_off_factor,
            "threshold": cfg.batchnorm_std_high,
            "reading": "BatchNorm layers do not normalise: the model may be in eval() mode "
                       "while it trains",
            "batchnorm_off_step": facts.batchnorm_off_step,
            "hint": batchnorm_hint(facts.batchnorm_off_factor, facts.batchnorm_off_step)})


#: The check a user can put on a batch for the values the non-finite readings point at.
_BATCH_ASSERT = "assert torch.isfinite(x).all() and x.abs().max() < 1e4"


def nonfinite_check(facts: RunFacts) -> str | None:
    """What to check when a non-finite loss came from the data or the script, or None.

    One sentence per reading of :class:`~neuraldbg.run_facts.RunFacts` (a batch that carried
    a bad value, a bad target, a value that entered between modules, a step without module
    statistics), with its step: the hint of that reading's hypothesis, and the one
    :func:`neuraldbg.explain` gives any method's verdict of ``data_problem`` or ``unknown``.
    """
    if facts.nonfinite_input_step is not None:
        return (f"check the batch of step {facts.nonfinite_input_step}: a record carrying "
                f"NaN, Inf or a huge value ({_BATCH_ASSERT} before the forward)")
    if facts.nonfinite_entry_module is not None:
        name, step = facts.nonfinite_entry_module, facts.nonfinite_entry_step
        return (f"check what module {name} receives at step {step}: an input the first "
                "module does not take, or an operation in forward() before it (a log, a "
                "division); assert torch.isfinite(...) there")
    if facts.nonfinite_target_step is not None:
        return (f"check the targets of step {facts.nonfinite_target_step} (assert "
                "torch.isfinite(y).all()), or the loss computation")
    if facts.calm_nonfinite_step is not None:
        return (f"step {facts.calm_nonfinite_step} has no module statistics: a batch "
                "carrying NaN, Inf or a huge value, or a numerical bug, rather than the "
                "learning rate; record every step (every=1) or check the batches "
                f"({_BATCH_ASSERT})")
    return None


def summed_loss_hint(facts: RunFacts) -> str | None:
    """What to change when the loss is summed over its batch (else None).

    :attr:`~neuraldbg.run_facts.RunFacts.loss_summed_rows`: a ``reduction="sum"`` loss
    makes every SGD step the rows times the mean loss's, so the rate was in effect that many
    times larger. The hint of a rate too high, from any method (:func:`neuraldbg.explain`).
    """
    rows = facts.loss_summed_rows
    if rows <= 1:
        return None
    return (f"the loss is summed over the batch's {rows} rows (reduction='sum'), not "
            f"averaged, so each step is {rows} times the one the learning rate was set for: "
            f"use reduction='mean', or a rate {rows} times smaller")


def _lr_after_start(s: _Shared) -> float:
    """A high rate, or a jump of it, for a failure that appeared after the first update."""
    return 0.0 if s.from_start else max(s.lr_high, s.w.lr_jump_later if s.jump else 0.0)


def _blowup_causes(cands: _Candidates, s: _Shared) -> None:
    """Exploding gradients and loss divergence."""
    facts, cfg, w = s.facts, s.cfg, s.w
    # A jump of the learning rate right before the blow-up is the strongest sign; a
    # failure already there before the first update cannot come from the learning rate.
    cands.put("learning_rate_too_high",
              max(s.lr_high * (w.lr_from_start if s.from_start else 1.0),
                  w.lr_jump if s.jump else 0.0), s.ev_lr)
    cands.put("init_scale_too_large", s.init_large * (1.0 - s.targets), s.ev_init)
    cands.put("unnormalized_inputs", w.explode_inputs * s.inputs, s.ev_inputs)
    if not facts.has_normalization:  # sound layers that still amplify through depth
        amplifies = logistic_support(facts.depth_gain, cfg.depth_gain_high)
        cands.put("missing_normalization", amplifies * (1.0 - s.init_large), s.ev_norm)
    if facts.grad_clip is None:
        # Recurrent nets explode through time without clipping; spikes are its mark (unless
        # inputs far off scale saturate the cell: its first steps' spike is theirs).
        cands.put("missing_gradient_clipping",
                  (w.clip_recurrent_base + w.clip_recurrent_spikes * s.spikes())
                  * s.clip_can_help() * (1.0 - s.saturated_cell()) if facts.recurrent
                  else w.clip_plain,
                  {"grad_clip": None, "recurrent": facts.recurrent,
                   "update_ratio": facts.update_ratio})


def _vanishing_causes(cands: _Candidates, s: _Shared) -> None:
    """Vanishing gradients."""
    facts, cfg, w = s.facts, s.cfg, s.w
    share = float(s.extra.get("activation_decay_share", 0.0))
    if facts.saturating_modules:
        cands.put("saturating_activation", w.saturating_base + w.saturating_share * share,
                  {"activation_decay_share": share,
                   "saturating_modules": list(facts.saturating_modules)})
    cands.put("init_scale_too_small", s.init_small, s.ev_init)
    if not facts.has_normalization:
        attenuates = logistic_support(facts.depth_gain, 1.0 / cfg.depth_gain_high,
                                      above=False)
        # the backward signal fading across many sound layers is the depth's doing too,
        # unless a probability output saturates it at the top (a softmax before a loss
        # that applies its own starves every layer below it)
        through_depth = logistic_support(float(s.extra.get("n_vanished_layers", 0.0)),
                                         float(cfg.vanished_layers_deep),
                                         decades=w.vanished_layers_decades
                                         ) * (1.0 - s.mismatch)
        cands.put("missing_normalization",
                  max(attenuates, through_depth) * (1.0 - s.init_small) * (1.0 - share),
                  {**s.ev_norm, "n_vanished_layers": s.extra.get("n_vanished_layers")})


def _dead_causes(cands: _Candidates, s: _Shared) -> None:
    """Dead units."""
    w = s.w
    z = float(s.extra.get("preact_z", float("nan")))
    if math.isfinite(z):
        neg = 1.0 / (1.0 + w.preact_base ** (-(-z - w.preact_center)))
        cands.put("negative_bias_init", neg * (1.0 if s.from_start else w.negative_bias_later),
                  {"preactivation_mean_over_std": z})
    # instability upstream kills units later whatever the rate when gradients pile up,
    # targets or inputs are far off scale, or the weights started far too large (their
    # first steps' huge gradients kill the units while the update ratio stays small)
    later = 0.0 if s.from_start else max(s.lr_high, w.lr_jump_later if s.jump else 0.0,
                                         float(s.extra.get("upstream_instability", 0.0))
                                         * (1.0 - max(s.piled, s.targets, s.inputs,
                                                      s.init_large)))
    cands.put("learning_rate_too_high", later, s.ev_lr)
    cands.put("init_scale_too_large", s.init_large * w.dead_init_large, s.ev_init)
    cands.put("unnormalized_inputs", w.dead_inputs * s.inputs, s.ev_inputs)


def _saturated_causes(cands: _Candidates, s: _Shared) -> None:
    """Saturated activations."""
    w = s.w
    first_act = float(s.extra.get("origin_is_first_activation", 0.0))
    cands.put("unnormalized_inputs",
              s.inputs * (w.first_activation_floor + w.first_activation_gain * first_act),
              s.ev_inputs)
    cands.put("init_scale_too_large", s.init_large, s.ev_init)
    cands.put("learning_rate_too_high", _lr_after_start(s), s.ev_lr)
    cands.put("saturating_activation", w.saturating_fixed,
              {"saturating_modules": list(s.facts.saturating_modules)})
    cands.put("loss_output_mismatch", s.mismatch, s.ev_output)


def _plateau_causes(cands: _Candidates, s: _Shared) -> None:
    """A stalled loss (the data-problem rule weighs what the others left)."""
    facts, cfg, w = s.facts, s.cfg, s.w
    ur = facts.update_ratio
    # Tiny steps, or weights that moved little in the whole run, relative to their size.
    # A probability output (softmax, sigmoid) fed to a loss that applies its own
    # softmax saturates and shrinks every gradient, whatever the rate: small updates
    # are then weaker evidence of a low learning rate.
    # Under SGD, gradients far smaller than the weights from the first step make the steps
    # small at any rate.
    low = max(logistic_support(ur, cfg.update_ratio_low, above=False),
              logistic_support(facts.total_update, cfg.total_update_low, above=False)
              ) * (1.0 - w.mismatch_lr_discount * s.mismatch) * (1.0 - s.cold_start)
    # A rate that collapsed to ~0 before the loss stopped (a schedule stepped per batch):
    # the steps that followed were too small to learn, whatever they were before.
    low = max(low, float(s.extra.get("lr_collapse", 0.0)) * w.lr_collapse)
    saturated_cell = s.saturated_cell()
    low *= 1.0 - saturated_cell
    cands.put("loss_output_mismatch", s.mismatch, s.ev_output)
    cands.put("unnormalized_inputs", saturated_cell, s.ev_inputs)  # (recurrent nets only)
    cands.put("learning_rate_too_low", low, {"update_ratio": ur,
                                             "threshold": cfg.update_ratio_low,
                                             "total_update": facts.total_update,
                                             "lr": facts.lr,
                                             "start_grad_ratio": facts.start_grad_ratio,
                                             "lr_collapse": s.extra.get("lr_collapse", 0.0)})
    # A rate that stalls a run more often makes it diverge (``plateau_lr_high``), unless
    # the stall shows the damage: a loss that ended above its start, or a first step that
    # outgrew the weights under Adam and its kin (which it did not owe to weights far too
    # small), after which the saturated or inflated units stop learning.
    rise = s.loss_rise()
    cands.put("learning_rate_too_high", max(w.plateau_lr_high, rise, s.first_step) * s.lr_high,
              {**s.ev_lr, "loss_rise_support": rise})
    cands.put("init_scale_too_small", w.plateau_init_small * s.init_small, s.ev_init)
    if facts.grad_clip is None and facts.recurrent:  # stalled by exploding spikes
        cands.put("missing_gradient_clipping", w.plateau_clip * s.spikes() * s.clip_can_help()
                  * (1.0 - saturated_cell),
                  {"grad_clip": None, "recurrent": True, "update_ratio": facts.update_ratio,
                   "grad_spikiness": s.extra.get("grad_spikiness")})
    _data_problem(cands, s)


def _data_problem(cands: _Candidates, s: _Shared) -> None:
    """Labels unrelated to the inputs: weights move as in healthy training, nothing else.

    The loss sits at chance while the weights move as much as in healthy training and no
    other cause has evidence. Gradient spikes belong to an unstable run (a recurrent net
    without clipping), not to labels that carry no signal: a shuffled dataset gives a flat,
    noisy gradient.
    """
    ur, cfg = s.facts.update_ratio, s.cfg
    moved = logistic_support(ur, cfg.data_update_ratio)
    others = max([sup for c, (sup, _) in cands.out.items() if c != "unknown"] + [0.0])
    spiky = s.spikes()
    rise = s.loss_rise()
    cands.put("data_problem",
              s.w.data_problem * moved * (1.0 - others) * (1.0 - spiky) * (1.0 - rise),
              {"update_ratio": ur, "threshold": cfg.data_update_ratio,
               "other_cause_support": others, "grad_spikiness": s.extra.get("grad_spikiness"),
               "loss_rise_support": rise})


#: The rules of each failure type (the script bugs apply to every one).
_RULES: dict[str, Callable[[_Candidates, _Shared], None]] = {
    "exploding_gradients": _blowup_causes,
    "loss_divergence": _blowup_causes,
    "vanishing_gradients": _vanishing_causes,
    "dead_neurons": _dead_causes,
    "saturated_activations": _saturated_causes,
    "training_plateau": _plateau_causes,
}
