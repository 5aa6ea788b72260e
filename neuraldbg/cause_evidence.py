"""Cause evidence: how the run facts grade the support of one root cause, and its weights.

The building blocks of the cause scorer (:mod:`neuraldbg.causes`): :func:`logistic_support`
grades a measured fact (:mod:`neuraldbg.run_facts`) against its threshold of
:class:`~neuraldbg.thresholds.ThresholdConfig` on a log scale; the script-bug supports read the
marks a bug in the training script leaves (gradients that pile up, rows that stay copies,
BatchNorm that does not normalise, a first loss far off the output scale, a module without
gradient); :class:`CauseWeights` holds how much each piece of evidence weighs, each number
with its reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from neuraldbg.run_facts import SOFTMAX_OUTPUTS, RunFacts
from neuraldbg.sufficiency import LEARNED_DROP
from neuraldbg.thresholds import ThresholdConfig, require_positive_fields

__all__ = ["CauseWeights", "DEFAULT_WEIGHTS", "ScriptBugs", "logistic_support",
           "running_sum_support", "accumulation_support", "periodic_reset_support",
           "kept_gradient_support",
           "clipped_output_support", "symmetric_support",
           "batchnorm_off_support", "init_support", "unsafe_loss_support",
           "output_floor_support", "probabilities_read_rightly"]


def logistic_support(value: float, threshold: float, above: bool = True,
                     decades: float = 0.5) -> float:
    """Support in [0, 1] for "``value`` is beyond ``threshold``", graded on a log scale.

    0.5 at the threshold, 0.9 one ``2 * decades`` beyond it... precisely
    ``1 / (1 + 3 ** (-d / decades))`` with ``d`` the distance in decades past the threshold
    (negative before it): 0.75 at ``decades`` past, 0.25 at ``decades`` short.

    Parameters
    ----------
    value, threshold : float
        Positive numbers; NaN or non-positive values give 0.
    above : bool, default=True
        Support for ``value > threshold`` (else for ``value < threshold``).
    decades : float, default=0.5
    """
    if not (value > 0 and threshold > 0 and math.isfinite(value)):
        return 0.0
    d = math.log10(value / threshold)
    d = d if above else -d
    return float(1.0 / (1.0 + 3.0 ** (-d / decades)))


def probabilities_read_rightly(facts: RunFacts, cfg: ThresholdConfig) -> bool:
    """Whether the loss reads the network's probabilities rightly (``nll_loss`` on their log).

    A logits loss fed probabilities cannot pass the floor ``log(1 + (K - 1) / e)`` (K = 2 for
    a sigmoid output): a loss a third of ``output_floor_gap`` below it is another loss (MSE
    on a sigmoid autoencoder's reconstructions, ``nll_loss`` on a softmax's log). Nor, for a
    softmax over K >= 4 classes, is its gradient at the logits squashed by the softmax's
    Jacobian: ``output_grad_power`` above -1/2 is nearer cross-entropy on logits than the 1/K
    a logits loss on probabilities gives. A loss that reaches the floor for another reason
    (labels noisy enough that the best a model can do costs as much: 36% of ten classes) is
    read by the gradient.
    """
    return bool(facts.output_floor_gap < -cfg.output_floor_gap / 3.0
                or facts.output_grad_power > -0.5)


def output_floor_support(facts: RunFacts, cfg: ThresholdConfig) -> float:
    """Support for "the loss sits on the floor of a softmax output under a logits loss".

    0 when the network does not end in a softmax or its loss reads the probabilities rightly
    (:func:`probabilities_read_rightly`); else graded on the gap above the floor
    (:attr:`ThresholdConfig.output_floor_gap`).
    """
    gap, thr = facts.output_floor_gap, cfg.output_floor_gap
    if facts.output_type not in SOFTMAX_OUTPUTS or not math.isfinite(gap) \
            or probabilities_read_rightly(facts, cfg):
        return 0.0
    return logistic_support(max(gap, thr * 1e-3), thr, above=False,
                            decades=cfg.output_floor_decades)


@dataclass(frozen=True, slots=True)
class CauseWeights:
    """How much each piece of evidence weighs for a cause, with the reason for each number.

    A weight multiplies a support in [0, 1]; a fixed support stands where the trace cannot
    measure the cause. The thresholds the evidence is compared with are in
    :class:`~neuraldbg.thresholds.ThresholdConfig`.

    Attributes
    ----------
    min_support : float, default=0.05
        Causes supported less are left out: below it the evidence is the logistic tail of a
        value far short of its threshold, not a reading.
    zero_grad : float, default=0.95
        ``missing_zero_grad`` = this x the running-sum support: the gradient norm's shape is
        the bug's own mark, but a run whose rate rises every step can mimic it.
    unscaled_targets : float, default=0.9
        ``unscaled_targets`` = this x the loss-scale support: a first loss far above the
        output scale can also be a loss summed instead of averaged.
    symmetric_init : float, default=0.95
        ``symmetric_init`` = this x the row-diversity support: identical rows have no other
        origin than the init (dropout-free nets keep them identical forever).
    gradient_blocked : float, default=0.9
        Support of ``gradient_blocked`` when a trainable module never received a gradient:
        it may also be frozen on purpose in a way the trace does not record.
    unsafe_loss : float, default=0.85
        ``loss_output_mismatch`` = this x the unsafe-loss support
        (:func:`unsafe_loss_support`): a loss on probabilities that reaches ``log(0)`` is
        the usual way a learned run's loss turns NaN while its outputs stay finite, but a
        non-finite target arriving just then looks the same.
    clipped_output : float, default=0.85
        ``loss_output_mismatch`` = this when more than ``dead_frac`` of the units of a
        rectifier that ends the network died
        (:attr:`~neuraldbg.run_facts.RunFacts.output_dead`): a ReLU on
        the logits hands the loss outputs clipped at zero, and a unit pushed below zero
        never comes back, whatever its bias; as for a softmax output (0.85), the trace
        cannot see which loss reads it (a ReLU output is right for counts under MSE, but
        not once its units die).
    unsafe_loss_decades : float, default=0.5
        Log-scale width of that support around the learned-data line: a loss a decade
        under it (1e-4 of its start) gives 0.9.
    nonfinite_input : float, default=0.9
        Support of ``data_problem`` when an input batch carried non-finite values
        (:attr:`~neuraldbg.run_facts.RunFacts.nonfinite_input_step`): the first module put
        out NaN or Inf from sound weights; a preprocessing step inside ``forward`` (a log
        of a negative value) looks the same.
    nonfinite_target : float, default=0.75
        Support of ``data_problem`` when the loss turned non-finite at a recorded step
        whose module outputs and weights were sound, out of a calm run
        (:attr:`~neuraldbg.run_facts.RunFacts.nonfinite_target_step`): a missing value
        among the targets, most often; a loss computation that fails on sound outputs (a
        hand-written ``log``) looks the same, hence less than for a non-finite input.
    outlier_records : float, default=0.9
        Support of ``data_problem`` when the first layer's output range jumps by decades from
        batch to batch (``ThresholdConfig.input_swing_high``): a few records carry values far
        off the rest; rescaling every input, a normalization layer or a smaller rate do not
        undo them (a new user's -999 codes: 0.10, 0.29-0.74 and 0.76-0.79 against 0.96 for
        the cleaned table).
    outlier_swing_decades : float, default=0.03
        ``decades`` of that support, on the swing's own log scale: 1.19 reads 0.02, 2.1
        reads 1.0.
    calm_nonfinite : float, default=0.9
        Support of ``unknown`` when the loss turned non-finite out of a calm run at a step
        without module statistics (:attr:`~neuraldbg.run_facts.RunFacts.calm_nonfinite_step`):
        a non-finite batch or a numerical bug, which that step's statistics would tell apart;
        the generic causes (a rate, an init), which grow the loss or the gradients first,
        lose this share.
    lr_confound_share : float, default=0.5
        Unnormalised inputs or a too-large init inflate every gradient and so the update
        ratio: they take up to this share of a high ratio's support for the learning rate
        (both are then plausible; the rate still counts).
    start_grad_decades : float, default=0.25
        ``decades`` of the support for "the gradients dwarfed the weights at the first step"
        (``start_grad_ratio_high``). Under an optimizer whose step scales with the gradient
        (SGD, with or without momentum) the update ratio is the learning rate times that
        ratio, so a high update ratio then says little of the rate: its support for
        ``learning_rate_too_high`` is multiplied by ``1 -`` this support. Adam and its kin
        divide by the gradient's running scale, so their update ratio still reads the rate.
        The same width grades "the gradients were tiny against the weights at the first
        step" (``start_grad_ratio_low``), which discounts a small update ratio as evidence
        of ``learning_rate_too_low`` the same way.
    start_update_decades : float, default=0.25
        ``decades`` of the support for "the first step outgrew the weights" under Adam and
        its kin (``start_update_ratio_high``): the larger of it and the run's update-ratio
        support is the rate's support, before the confounds discount it.
    adaptive_rate_decades : float, default=0.25
        ``decades`` of the supports that bear a high median update ratio out under Adam
        and its kin (``ThresholdConfig.adaptive_rate_first_step``): the median's support
        for the rate is capped at the larger of them.
    weight_growth_decades : float, default=0.15
        ``decades`` of the support for "the weights grew far past their start" under Adam
        and its kin (``ThresholdConfig.adaptive_weight_growth_high``): 11x reads about
        0.13, 23x about 0.94.
    overshoot_decades : float, default=0.15
        ``decades`` of the support for "the loss overshot its start"
        (``ThresholdConfig.early_overshoot_high``): a factor 2.8 reads about 0.75, 1.4 about 0.25.
    lr_from_start : float, default=0.1
        Factor on a high learning rate's support when the failure was there at the first
        recorded step, before any update the rate could have made.
    lr_jump : float, default=0.95
        Support of ``learning_rate_too_high`` for a learning-rate jump right before a
        blow-up: the strongest sign there is.
    lr_jump_later : float, default=0.9
        The same for dead or saturated units that appeared after the jump (one step
        removed from the blow-up it causes).
    explode_inputs : float, default=0.8
        ``unnormalized_inputs`` = this x the input-scale support on a blow-up: large inputs
        inflate the first layer's gradient, but alone they rarely diverge.
    clip_recurrent_base, clip_recurrent_spikes : float, default=0.5, 0.45
        ``missing_gradient_clipping`` for a recurrent net without clipping that explodes:
        ``base + spikes x spike support``; recurrent nets explode through time and spikes
        are the mark, reaching 0.95 for clear spikes.
    clip_plain : float, default=0.25
        Fixed support of ``missing_gradient_clipping`` for a non-recurrent net without
        clipping: always a valid fix, never a measured cause (module docstring).
    steps_too_big, steps_too_big_decades : float, default=10.0, 0.25
        A recurrent net explodes through time in rare spikes that a clip caps while its
        ordinary steps are sound (the zoo's ``rnn_no_clip``: update ratio 1.2-1.9 x
        ``update_ratio_high``). When the update ratio before the failure is already
        ``steps_too_big`` times ``update_ratio_high`` (every step moves the weights by a
        tenth of their size), the ordinary gradients of such a net are of the size a clip
        leaves alone and the rate is what makes the steps big: a GRU at lr 3 with SGD
        momentum (update ratio 0.05-0.3) still diverges under ``clip_grad_norm_(1.0)``.
        The recurrent clipping support is multiplied by ``1 -`` the support for that,
        graded over ``decades`` (sharp: 0.9 one half-decade past, 0.04 at 1.9 x). Not
        applied to ``clip_plain``: a feed-forward net's huge steps come from exploding
        gradients, which a clip does shrink (the zoo's ``resnet_no_norm``).
    saturating_base, saturating_share : float, default=0.1, 0.85
        ``saturating_activation`` on vanishing gradients = ``base + share x`` the share of
        the decay across sigmoid/tanh modules: 0.95 when they do all of it.
    preact_center : float, default=2.0
        ``negative_bias_init`` is 0.5 when the output feeding the dead layer has its mean
        this many std below zero...
    preact_base : float, default=3.0
        ... and ``1 / (1 + base ** -(-z - center))``: 0.75 one std further, 0.9 at two.
    negative_bias_later : float, default=0.5
        Factor on ``negative_bias_init`` when the units died after the first step (a bias
        can start out fine and be pushed down by training).
    dead_inputs : float, default=1.0
        Factor on ``unnormalized_inputs`` (the input-scale support) for dead units: raw
        inputs inflate every update of the first layers, and a unit one of them pushes far
        negative stays dead (an MLP on 0-255 pixels with a rate tuned for [0, 1] inputs; a
        rate a hundred times lower also rescues it, but scaling the inputs is the fix that
        keeps the rate, as for the other failures they cause). The same large updates are
        why the update ratio reads high, so the learning-rate support an upstream blow-up
        lends dead units is discounted by the input support too.
    dead_init_large : float, default=0.5
        Factor on ``init_scale_too_large`` for dead units: a large init kills units less
        directly than it explodes gradients.
    first_activation_floor, first_activation_gain : float, default=0.5, 0.5
        ``unnormalized_inputs`` on saturation = input support x ``(floor + gain x`` whether
        the saturation began at the first activation, which the inputs reach first).
    saturating_fixed : float, default=0.35
        Fixed support of ``saturating_activation`` for saturated units (module docstring).
    mismatch_lr_discount : float, default=0.8
        A probability output fed to a loss with its own softmax shrinks every gradient:
        small updates lose this share of their weight as evidence of a low rate.
    lr_collapse : float, default=0.9
        ``learning_rate_too_low`` for a loss that stopped once the learning rate collapsed
        to ~0 (``ThresholdConfig.lr_collapse``): the steps were too small from then on, as
        the rate itself shows; short of 1 because the trace cannot tell a schedule bug from
        a run that had already learned what it could.
    plateau_lr_high : float, default=0.5
        Factor on ``learning_rate_too_high`` for a stall: too high a rate can also stall
        (bouncing across a valley), but more often diverges.
    loss_rise, loss_rise_decades : float, default=1.5, 0.08
        A stalled run whose loss ended ``loss_rise`` times above where it started did not
        just fail to learn: training made it worse, which large steps do (bouncing out of
        the valley) and labels without signal do not (they keep the loss at chance). The
        support for that rise (0 for a loss that ended no higher, 0.5 at 1.5x, 0.85 at 2x) lifts
        ``learning_rate_too_high`` to the full update-ratio support and takes its share
        from ``data_problem``.
    plateau_init_small : float, default=0.5
        Factor on ``init_scale_too_small`` for a stall (a small init vanishes first).
    plateau_clip : float, default=0.8
        ``missing_gradient_clipping`` for a recurrent net that stalls = this x the spike
        support: spikes that keep knocking it back.
    recurrent_inputs : float, default=0.9
        ``unnormalized_inputs`` for a stall of a recurrent net = this x the input-scale
        support: inputs in the thousands saturate a recurrent cell's gates from the first
        step, and its output and gradient stop moving. The same support takes its share from
        the evidence for a rate too low and for a missing clip, in a stall or a blow-up (the
        small updates and the first steps' spike are the saturation's). Not for a
        feed-forward net: an MLP whose inputs a noise augmentation 30 times too strong left
        at rms 10 stalls on the noise, which no rescaling fixes (a new user's probe; the
        claim was wrong there).
    data_problem : float, default=0.75
        ``data_problem`` = this x support for "weights move as in healthy training" x (1 -
        every other cause) x (1 - spikes): the absence of other causes is weaker evidence
        than a measured one.
    init_decades : float, default=0.25
        ``decades`` of the init-gain and init-scale supports: a gain 10^0.5 past its bound
        is already a clear reading (the default schemes differ by 2.4x).
    weight_scale_decades : float, default=0.15
        ``decades`` of the weight-scale supports (``weight_scale_high`` / ``_low``). The
        weights' norm against PyTorch's default is read with little noise (0.98-1.01 over
        the layers of a default-initialised MLP), so its support turns sharply: 0.01 at the
        default itself, where a wider grading gave every run a 0.07 support for an init too
        large that took mass from ``unknown``.
    vanished_layers_decades : float, default=0.25
        ``decades`` of the support for "the gradient vanished across a deep stack"
        (``vanished_layers_deep`` layers): 0.75 at about 7 layers past a line of 4.
    grad_sum_decades : float, default=0.1
        ``decades`` of the running-sum exponent's support: the exponent sits near 1 for a
        running sum and near 0 for healthy training, so a narrow band tells them apart.
    accumulation_decades : float, default=0.25
        ``decades`` of the gradient-accumulation growth's support.
    symmetric_decades : float, default=0.5
        ``decades`` of the row-diversity support.
    diversity_floor : float, default=1e-12
        Row diversity is floored here before its log is taken (rows exactly equal give 0).
    batchnorm_decades : float, default=0.05
        ``decades`` of the BatchNorm-off support.
    """

    min_support: float = 0.05
    zero_grad: float = 0.95
    unscaled_targets: float = 0.9
    symmetric_init: float = 0.95
    gradient_blocked: float = 0.9
    unsafe_loss: float = 0.85
    clipped_output: float = 0.85
    unsafe_loss_decades: float = 0.5
    nonfinite_input: float = 0.9
    calm_nonfinite: float = 0.9
    outlier_records: float = 0.9
    outlier_swing_decades: float = 0.03
    nonfinite_target: float = 0.75
    lr_confound_share: float = 0.5
    start_grad_decades: float = 0.25
    start_update_decades: float = 0.25
    adaptive_rate_decades: float = 0.25
    weight_growth_decades: float = 0.15
    overshoot_decades: float = 0.15
    lr_from_start: float = 0.1
    lr_jump: float = 0.95
    lr_jump_later: float = 0.9
    explode_inputs: float = 0.8
    clip_recurrent_base: float = 0.5
    clip_recurrent_spikes: float = 0.45
    clip_plain: float = 0.25
    steps_too_big: float = 10.0
    steps_too_big_decades: float = 0.25
    saturating_base: float = 0.1
    saturating_share: float = 0.85
    preact_center: float = 2.0
    preact_base: float = 3.0
    negative_bias_later: float = 0.5
    dead_inputs: float = 1.0
    dead_init_large: float = 0.5
    first_activation_floor: float = 0.5
    first_activation_gain: float = 0.5
    saturating_fixed: float = 0.35
    mismatch_lr_discount: float = 0.8
    lr_collapse: float = 0.9
    plateau_lr_high: float = 0.5
    loss_rise: float = 1.5
    loss_rise_decades: float = 0.08
    plateau_init_small: float = 0.5
    plateau_clip: float = 0.8
    recurrent_inputs: float = 0.9
    data_problem: float = 0.75
    init_decades: float = 0.25
    weight_scale_decades: float = 0.15
    vanished_layers_decades: float = 0.25
    grad_sum_decades: float = 0.1
    accumulation_decades: float = 0.25
    symmetric_decades: float = 0.5
    diversity_floor: float = 1e-12
    batchnorm_decades: float = 0.05

    def __post_init__(self) -> None:
        """Reject a non-positive or non-numeric coefficient (the message names it)."""
        require_positive_fields(self)


#: The documented defaults (what :func:`neuraldbg.causes.score_causes` uses when given none).
DEFAULT_WEIGHTS = CauseWeights()


def init_support(facts: RunFacts, cfg: ThresholdConfig, w: CauseWeights
                 ) -> tuple[float, float]:
    """(support for an init too large, for an init too small)."""
    if not facts.n_gain_pairs:
        return 0.0, 0.0
    if math.isfinite(facts.init_scale):  # scheme known: compare with its own gain
        return (logistic_support(facts.init_scale, cfg.init_scale_high,
                                 decades=w.init_decades),
                logistic_support(facts.init_scale, cfg.init_scale_low, above=False,
                                 decades=w.init_decades))
    # the signal's gain per layer, and the weights' own scale against PyTorch's default
    # (which holds where biases dominate the outputs of weights far too small)
    return (max(logistic_support(facts.init_gain, cfg.init_gain_high, decades=w.init_decades),
                logistic_support(facts.weight_scale, cfg.weight_scale_high,
                                 decades=w.weight_scale_decades)),
            max(logistic_support(facts.init_gain, cfg.init_gain_low, above=False,
                                 decades=w.init_decades),
                logistic_support(facts.weight_scale, cfg.weight_scale_low, above=False,
                                 decades=w.weight_scale_decades)))


def running_sum_support(facts: RunFacts, cfg: ThresholdConfig,
                        weights: CauseWeights = DEFAULT_WEIGHTS) -> float:
    """Support for "the gradients pile up across steps" (a missing ``zero_grad``).

    The global gradient norm grows from the first steps, step after step (at least
    ``cfg.grad_sum_monotone`` of them), like a power of the step with an exponent between
    ``cfg.grad_sum_exponent`` and ``cfg.grad_sum_exponent_max``, while the loss does not
    improve.
    """
    exponent, power_fit, rising = facts.grad_growth
    if facts.loss_improved or not (power_fit >= cfg.grad_sum_fit
                                   and rising >= cfg.grad_sum_monotone
                                   and exponent <= cfg.grad_sum_exponent_max):
        return 0.0
    return logistic_support(exponent, cfg.grad_sum_exponent, decades=weights.grad_sum_decades)


def accumulation_support(facts: RunFacts, cfg: ThresholdConfig,
                         weights: CauseWeights = DEFAULT_WEIGHTS) -> float:
    """Support for "each step's parameter gradient holds the steps before it".

    The ratio of parameter-gradient to output-gradient norm grows
    ``cfg.grad_accumulation_growth``-fold
    or more over the run (a running sum grows like the step; a healthy run keeps it within a
    few-fold, a too-high rate grows both norms together), and the global gradient norm
    grows from the first steps like a running sum (:func:`running_sum_support`'s shape, with
    ``cfg.grad_accumulation_monotone`` rising steps).
    Unlike that rule it does not ask the loss to stall: Adam still lowers the loss a little
    on a summed gradient. The ratio alone also grows when the weights blow up after a
    learning-rate spike (the layers' inputs grow), which the shape rules out.
    """
    exponent, power_fit, rising = facts.grad_growth
    if not (power_fit >= cfg.grad_sum_fit and rising >= cfg.grad_accumulation_monotone
            and cfg.grad_sum_exponent <= exponent <= cfg.grad_sum_exponent_max):
        return 0.0  # a running sum also grows step after step from the start
    return logistic_support(facts.grad_accumulation, cfg.grad_accumulation_growth,
                            decades=weights.accumulation_decades)


def kept_gradient_support(facts: RunFacts, cfg: ThresholdConfig) -> float:
    """Support for "the gradient norm does not follow the loss down" (a missing ``zero_grad``).

    1 when the loss fell to half the step before's or less on ``cfg.grad_kept_falls`` steps
    or more (before the first non-finite loss or norm), the global gradient norm kept 0.9
    of its value across ``cfg.grad_kept_share`` of them, and it grew
    ``cfg.grad_kept_growth``-fold (:attr:`~neuraldbg.run_facts.RunFacts.grad_kept`); else 0.
    A pile-up that blows up within a few dozen steps under SGD with momentum (loss 1.1 ->
    1e14 by step 29) fits no power law, so :func:`running_sum_support` misses it, while
    its norm stays put as the loss swings 100x down and up (578 three steps running while
    the loss went 88 -> 0.79).
    """
    falls, kept, growth = facts.grad_kept
    return float(falls >= cfg.grad_kept_falls and kept >= cfg.grad_kept_share
                 and growth >= cfg.grad_kept_growth)


def periodic_reset_support(facts: RunFacts, cfg: ThresholdConfig) -> float:
    """Support for "the gradients are reset only every k optimizer steps".

    ``zero_grad`` once every k steps (an accumulation loop that steps the optimizer at every
    batch, or once per epoch) sums each window's gradients: the global gradient norm grows
    on most steps and falls back at every reset, on one period
    (:attr:`~neuraldbg.run_facts.RunFacts.grad_resets`). 1 when the period is at least
    ``cfg.grad_reset_period`` steps, ``cfg.grad_reset_falls`` falls or more land on it and
    make ``cfg.grad_reset_aligned`` of all falls, and the norm grew on
    ``cfg.grad_reset_monotone`` of the steps; else 0.
    """
    period, on_period, aligned, rising = facts.grad_resets
    return float(period >= cfg.grad_reset_period and on_period >= cfg.grad_reset_falls
                 and aligned >= cfg.grad_reset_aligned and rising >= cfg.grad_reset_monotone)


def clipped_output_support(facts: RunFacts, cfg: ThresholdConfig,
                           weights: CauseWeights = DEFAULT_WEIGHTS) -> float:
    """Support for "a rectifier ends the network and its units died".

    ``weights.clipped_output`` when more than ``cfg.dead_frac`` of the last module's units
    were dead at a recorded step and that module is a rectifier
    (:attr:`~neuraldbg.run_facts.RunFacts.output_dead`), else 0.
    """
    dead = facts.output_dead
    return weights.clipped_output if math.isfinite(dead) and dead > cfg.dead_frac else 0.0


def symmetric_support(facts: RunFacts, cfg: ThresholdConfig,
                      weights: CauseWeights = DEFAULT_WEIGHTS) -> float:
    """Support for "a layer's units are copies of each other".

    Constant or identical initial weights: weight-row diversity below
    ``cfg.row_diversity_low`` at enter and
    still at the latest flush (1.0 for rows exactly equal).
    """
    if not facts.symmetric_modules:
        return 0.0
    return logistic_support(max(facts.row_diversity, weights.diversity_floor),
                            cfg.row_diversity_low, above=False,
                            decades=weights.symmetric_decades)


def outlier_records_support(facts: RunFacts, cfg: ThresholdConfig, w: CauseWeights) -> float:
    """Support for "a few records carry values far off the rest" (a missing-value code).

    The first weighted layer's output range jumps from one batch to the next by decades
    (:attr:`~neuraldbg.run_facts.RunFacts.input_swing` against
    ``cfg.input_swing_high``); inputs on a uniformly wrong scale move it by the same factor
    at every step.
    """
    return logistic_support(facts.input_swing, cfg.input_swing_high,
                            decades=w.outlier_swing_decades)


def batchnorm_off_support(facts: RunFacts, cfg: ThresholdConfig,
                          weights: CauseWeights = DEFAULT_WEIGHTS) -> float:
    """Support for "the BatchNorm layers do not normalise".

    A model left in ``eval()``, normalising with its initial running statistics: their
    outputs' std at the first step ``cfg.batchnorm_std_high`` times or more off 1, typically
    (:attr:`~neuraldbg.run_facts.RunFacts.batchnorm_off_factor`). Train-mode BatchNorm
    outputs have std 1 by construction (1.00-1.02 over the zoo's runs with BatchNorm, 0.02
    support; a model in ``eval()`` 2.9x to 23x).
    """
    return logistic_support(facts.batchnorm_off_factor, cfg.batchnorm_std_high,
                            decades=weights.batchnorm_decades)


def unsafe_loss_support(facts: RunFacts, weights: CauseWeights = DEFAULT_WEIGHTS) -> float:
    """Support for "the loss computation failed, not the training".

    The loss turned non-finite while every module output was finite, right after it had
    fallen to :data:`~neuraldbg.sufficiency.LEARNED_DROP` of its start or below
    (:attr:`~neuraldbg.run_facts.RunFacts.nonfinite_from_floor`): the model had learned
    its task, and a hand-written loss on its near-certain probabilities hit ``log(0)``. A
    smaller learning rate only delays it; the loss on logits (``BCEWithLogitsLoss``) never
    has it (``tests/test_loss_styles.py``).
    """
    share = facts.nonfinite_from_floor
    if not math.isfinite(share):
        return 0.0
    return logistic_support(max(share, _TINY_SHARE), LEARNED_DROP, above=False,
                            decades=weights.unsafe_loss_decades)


#: A loss of exactly 0 before the NaN is as far below the line as it gets (log scale).
_TINY_SHARE = 1e-12


@dataclass(frozen=True, slots=True)
class ScriptBugs:
    """Support for each bug in the training script, whatever symptom it produced.

    Attributes
    ----------
    piled : float
        Gradients that pile up across steps (a missing ``zero_grad``, or one called only
        every few steps).
    targets : float
        A first loss far above the output scale (unscaled targets).
    symmetric : float
        Weight rows that stay copies of each other (a symmetric init).
    blocked : float
        1 when a trainable module never received a gradient, else 0.
    bn_off : float
        BatchNorm layers that do not normalise (a model left in ``eval()``).
    floor : float
        A loss that sits on the floor a softmax output fed to a logits loss cannot go
        below (:func:`output_floor_support`).
    clipped_output : float
        A rectifier that ends the network and whose units died
        (:func:`clipped_output_support`).
    unsafe_loss : float
        A loss that turned non-finite out of a learned state with finite outputs
        (:func:`unsafe_loss_support`).
    bad_input : float
        1 when an input batch carried non-finite values
        (:attr:`~neuraldbg.run_facts.RunFacts.nonfinite_input_step`), else 0.
    bad_target : float
        1 when the loss turned non-finite from sound outputs out of a calm run
        (:attr:`~neuraldbg.run_facts.RunFacts.nonfinite_target_step`) and not right after
        it reached the bottom (:attr:`unsafe_loss` reads that case), else 0.
    outlier_records : float
        A first layer whose output range jumps by decades from batch to batch
        (:func:`outlier_records_support`): a few records far off the rest.
    calm_nonfinite : float
        1 when the loss turned non-finite out of a calm run at an unrecorded step
        (:attr:`~neuraldbg.run_facts.RunFacts.calm_nonfinite_step`) or from a value that
        entered between modules (``nonfinite_entry_module``), else 0.
    """

    piled: float
    targets: float
    symmetric: float
    blocked: float
    bn_off: float
    floor: float = 0.0
    clipped_output: float = 0.0
    unsafe_loss: float = 0.0
    bad_input: float = 0.0
    bad_target: float = 0.0
    calm_nonfinite: float = 0.0
    outlier_records: float = 0.0

    @classmethod
    def measure(cls, facts: RunFacts, cfg: ThresholdConfig, w: CauseWeights) -> ScriptBugs:
        """Read every bug's support off the facts."""
        unsafe_loss = unsafe_loss_support(facts, w)
        return cls(piled=max(running_sum_support(facts, cfg, w),
                             accumulation_support(facts, cfg, w),
                             periodic_reset_support(facts, cfg),
                             kept_gradient_support(facts, cfg)),
                   targets=logistic_support(facts.loss_scale_ratio, cfg.loss_scale_ratio),
                   symmetric=symmetric_support(facts, cfg, w),
                   blocked=1.0 if facts.blocked_modules else 0.0,
                   bn_off=batchnorm_off_support(facts, cfg, w),
                   floor=output_floor_support(facts, cfg),
                   clipped_output=clipped_output_support(facts, cfg, w),
                   unsafe_loss=unsafe_loss,
                   bad_input=0.0 if facts.nonfinite_input_step is None else 1.0,
                   bad_target=(0.0 if facts.nonfinite_target_step is None
                               else 1.0 - unsafe_loss),
                   calm_nonfinite=0.0 if facts.calm_nonfinite_step is None
                   and facts.nonfinite_entry_module is None else 1.0,
                   outlier_records=outlier_records_support(facts, cfg, w))

    @property
    def strongest(self) -> float:
        """The best-supported bug: the share the generic causes lose."""
        return max(self.piled, self.targets, self.symmetric, self.blocked, self.bn_off,
                   self.floor, self.clipped_output, self.unsafe_loss, self.bad_input,
                   self.bad_target, self.calm_nonfinite, self.outlier_records)
