"""Every threshold of the heuristic Post-Mortem Reasoner, each with the reason for its value.

One record read by every stage (states, events, compression, symptoms, causes,
hypotheses): absolute thresholds as published (a gradient below ``1e-6``), relative ones (a
module against its own early baseline, against the largest gradient of the network at the
same step, against the module that feeds it), and the enter/exit pairs of the hysteresis.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["ThresholdConfig", "require_positive_fields"]


def require_positive_fields(record: Any) -> None:
    """Raise if a field of a dataclass of coefficients is not a positive number.

    Parameters
    ----------
    record : dataclass instance
        A record of numbers (:class:`ThresholdConfig` and the coefficient records of the
        other stages).

    Raises
    ------
    ValueError
        Naming the record, the field and the value.
    """
    for name in record.__dataclass_fields__:
        value = getattr(record, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(
                f"{type(record).__name__}.{name} must be a positive number, got {value!r}."
            )


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
        that register on the network's scale (see ``baseline_floor``; the smallest, since a
        run that explodes from step 2 would lift a median); an activation's is their median.
    baseline_floor : float, default=1e-3
        A gradient value counts toward its module's baseline only at or above this share of
        the step's largest gradient, and the baseline is at least this share of the
        network's largest early gradient: a layer that starts at exactly zero (a
        zero-initialised head) or whose gradient cancels at step 0 (units that are copies of
        each other) does not count as exploding when it wakes up.
    dead_frac : float, default=0.6
        Share of units exactly zero for the whole batch above which a layer is dead.
        DeepDiagnosis flags 70% of activations <= 0; whole-batch-dead units are a stricter
        measure, so a lower share is as telling. A layer fed by a fully dead layer measures
        about 0.5 (half its biases negative), which stays below.
    dead_frac_exit : float, default=0.4
        Hysteresis: a dead layer recovers only below this share.
    dropout_dead_frac : float, default=0.95
        A dropout module's zeros are its draws, so its output is dead only where nearly
        every unit is zero for the whole batch: a drop rate p zeroes a unit for a batch of B
        with probability p^B (0.95 of the units at most for p = 0.95 and a batch of one;
        Dropout(0.95) after a ReLU on batches of 64 reads 0.2-0.4). Above this share the
        units were zero before the dropout: an activation applied as a function
        (``F.relu``), which has no module of its own, shows its dead units first here.
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
        losses is a spike, when it also rises above that median by ``loss_spike_min_rise``
        of the baseline loss (the capture's own spike rule).
    loss_spike_min_rise : float, default=0.25
        Near convergence a minibatch loss jitters by many times its median while moving by
        a sliver of where it started (1e-5 to 6e-5 from a baseline of 2.2): no spike.
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
    lr_collapse, lr_collapse_share : float, default=1e-3, 0.25
        A learning rate that falls below ``lr_collapse`` times its largest value and stays
        there for at least ``lr_collapse_share`` of the run has collapsed: the weights
        barely move from then on (a ``StepLR`` stepped per batch instead of per epoch
        divides the rate by 10 every few dozen steps). A cosine or linear decay to zero
        spends well under 1% of the run that low, where a loss that flattens has converged.
    lr_collapse_level : float, default=0.3
        ... and a stall under a collapsed rate is a failure only while the loss is still
        above this share of where it started: a model that had converged first (its loss a
        tenth of the start, the rate then cut again and again by ``ReduceLROnPlateau``)
        has nothing left to learn.
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
    vanished_layers_deep : int, default=4
        A gradient that vanished across at least this many layers of a stack without
        normalization, whose own init gain is sound and whose units do not saturate, is
        the depth's doing even where the forward signal held up (biases keep a deep ReLU
        stack's activations alive while its backward signal shrinks 4e4x over 12 layers).
        The zoo's vanishing runs that have another cause (an init too small, sigmoid
        stacks, a detached tensor) are told apart by their own evidence.
    init_gain_high : float, default=3.0
        Without a known scheme: median init gain std(out)/rms(in) of Linear/Conv layers
        above this is an init too large. PyTorch's default gives 1/sqrt(3) ~ 0.58,
        Kaiming-ReLU ~1.41 (the largest standard init); 3 is 5x the default.
    gain_min_units : int, default=8
        Fewest output units of a Linear/Conv layer for its std(out)/rms(in) to count as an
        init gain: over fewer units (a classifier head of a few classes) the units' own
        offsets rule the std (a default-init LSTM's 4-unit head read 2.2x the default
        gain, an init too large).
    start_grad_ratio_high : float, default=2.0
        Global gradient norm / parameter norm at the first step, before any update: above
        this the gradients are far larger than the weights from the start, which the init,
        the inputs or the loss's scale did and the learning rate cannot have. With the
        default inits and normalised inputs it is 0.03-0.34 on the zoo's MLPs and up to 1.1
        on its CNNs (healthy or failing through the learning rate: at most 0.44); a 5x init
        gives 4-1,700, unnormalised inputs 2-24.
    start_grad_ratio_low : float, default=3e-3
        ... and below this the gradients are far smaller than the weights from the start:
        a signal that fades through depth, units switched off by their biases, a softmax
        before a loss that applies its own. Under SGD the update ratio is then small at any
        rate. Healthy zoo runs under SGD: >= 0.0067 (a residual net), >= 0.023 for its
        MLPs, and a rate too low does not show it (0.024); a plain 8-hidden ReLU stack at
        PyTorch's init gives 0.0012, biases that kill the units 0.0015.
    start_update_ratio_high : float, default=1.0
        Under Adam and its kin: the first step's update norm / parameter norm above this is
        a learning rate too high for the weights, whatever follows (a first step larger
        than the weights themselves; the weights it inflates make the later ratios small,
        so the run's median can read a normal rate). That first ratio is about the rate
        over the weights' rms. Zoo runs under Adam: healthy ones (rates up to 0.03) 0.016-
        0.12; rates too high 0.39-7.1 (an LSTM at 1.0: 7.0, its median over the run 0.005).
    adaptive_rate_first_step : float, default=0.25
        Under Adam and its kin the run's median update ratio is about the rate over the
        weights' rms, whatever the gradients say: a rate that trains (a true-label MLP at
        Adam's 1e-2: 0.014-0.018) reads the same as one on labels with no signal that
        stalls (0.018), and above ``update_ratio_high``. So there a high median counts
        for a rate too high only as far as the first step (this, first update norm /
        parameter norm) or the loss's overshoot of its start (``early_overshoot_high``)
        bears it out (or a loss spike, :attr:`neuraldbg.run_facts.RunFacts.loss_spikes`).
        Zoo rates too high under Adam: first steps 0.39-7.1; healthy runs
        and the shuffled-label stalls at Adam's 1e-2: 0.11-0.17.
    input_swing_high : float, default=1.5
        The first weighted layer's output range jumping by more than this many decades
        from one step to the next on a tenth of the steps
        (:attr:`neuraldbg.run_facts.RunFacts.input_swing`) is a few records carrying values
        far off the rest: ``data_problem``, whatever the symptom (a missing-value code of
        -999 in 5% of a standardised table: 2.1-2.3; the same table standardised with the
        codes in, 1.15-1.24; 1,600 zoo and probe traces without such records: at most
        1.19, an unclipped LSTM whose weights blow up).
    adaptive_weight_growth_high : float, default=15.0
        Under Adam and its kin, weights grown more than this many times their start over
        the run's first quarter (:attr:`neuraldbg.run_facts.RunFacts.early_weight_growth`)
        are a rate too high, as a first step larger than the weights is: a warmup that
        grows Adam's rate to 1.0 starts with steps of 0.3 of the weights, then inflates
        them 23-29x and kills the units (runs that train at workable high rates: 2-8x;
        up to 11x on an AdamW at 30x its rate that still trains).
    early_overshoot_high : float, default=2.0
        ... the largest loss of the run's first tenth over its first loss
        (:attr:`neuraldbg.run_facts.RunFacts.early_overshoot`) above this bears a high
        median out too: zoo rates too high 2.3-106, runs that learn or stall 1.0-1.1 (up
        to 1.5 on a noisy minibatch loss). Not under RMSprop, whose own inflated first
        steps overshoot at any rate it trains at
        (:attr:`neuraldbg.run_facts.RunFacts.early_steps_inflated`).
    init_gain_low : float, default=0.12
        ... below this (a fifth of the default) an init too small.
    weight_scale_high : float, default=4.0
        Without a known scheme: the median Linear/Conv weight rms when the capture was
        entered over the rms PyTorch's default init gives it (``1 / sqrt(3 fan_in)``;
        :attr:`neuraldbg.run_facts.RunFacts.weight_scale`) above this is an init too
        large. Read from the weights themselves, it holds where the signal's gain does not
        (biases that dominate tiny weights' outputs). Standard
        schemes give 1 (PyTorch), ~1.7 (Xavier, square layers), ~2.45 (Kaiming for ReLU,
        orthogonal at gain sqrt(2)); 5x the default gives 5.
    weight_scale_low : float, default=0.1
        ... and below this (a tenth of the default) an init too small. Hugging Face's
        std 0.02 gives 0.96 at width 768 and 0.14 at width 16.
    grad_sum_exponent : float, default=0.8
        Gradients never reset (a missing ``zero_grad``) pile up: the step-t gradient is the
        sum of t gradients, so its norm grows like t (like t^1.5-2 under momentum) while the
        loss does not improve. A global gradient norm whose log-log growth over the first
        steps has at least this exponent, on a run whose loss ends no lower than it began, is
        that running sum. Healthy runs rise at most ~0.6 there while their loss falls.
    grad_sum_exponent_max : float, default=3.0
        ... and at most this: a running sum of gradients of bounded size grows like t, like
        t^2 under momentum (the zoo's missing-``zero_grad`` runs measure 0.8-1.8); a norm
        growing like t^12 is a blow-up (an MLP at lr 20 that does call ``zero_grad``), not
        a sum.
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
    output_floor_gap, output_floor_decades : float, default=0.05, 0.25
        A network that ends in a softmax fed to ``CrossEntropyLoss`` (which applies its own
        softmax) cannot bring its loss below ``log(1 + (K - 1) / e)`` for K classes (1.46
        for 10): the loss of perfect probabilities taken as logits. A loss that ends within
        this relative gap above that floor has reached it: the support is 0.5 at the gap,
        0.75 at ``decades`` closer (a healthy classifier's loss falls through the floor
        towards 0; one that sits on it learned all the bug lets it learn). The misclassified
        examples keep it a few percent above: an MLP on the digits with Adam ends 3% above,
        a separable problem 0.2%.
    row_diversity_low : float, default=1e-3
        A weight matrix whose rows differ by less than this (mean std across rows over the
        matrix's rms; :mod:`neuraldbg.weight_diversity`) at enter and still at the latest
        flush has units that are copies of each other: a constant or identical init. A random
        init measures ~1 and rows filled with one constant exactly 0 (a float32 spread of
        identical values stays ~1e-7); 1e-3 leaves room for both. A zero-initialised head is
        symmetric at enter but not after training, so it never counts.
    grad_accumulation_monotone : float, default=0.6
        The share of rising steps :func:`~neuraldbg.cause_evidence.accumulation_support`
        asks of the running-sum shape, lower than ``grad_sum_monotone``: the ratio's
        ``grad_accumulation_growth``-fold rise is itself the mark of summed gradients, and
        the power law (exponent and fit) already rules out a blow-up (no zoo run outside
        the missing-``zero_grad`` families has that shape at all); Adam's noisy steps on a
        recurrent net leave 0.66-0.72 rising (an LSTM that never calls ``zero_grad``, two
        seeds) where healthy training goes up about half the time.
    grad_accumulation_growth : float, default=10.0
        Parameter-gradient norm / output-gradient norm of a layer growing this much from the
        first tenth of the run to the last one: the parameter gradient holds the steps before
        (gradients never reset). Without accumulation the ratio follows the layer's input
        scale, which moves a few-fold in training (measured 1-3x on the zoo's healthy runs);
        a running sum over 100 steps grows it ~100x.
    grad_reset_period : int, default=4
        Fewest optimizer steps between the resets of a gradient that ``zero_grad`` clears
        only every k steps (:func:`~neuraldbg.cause_evidence.periodic_reset_support`): over
        two or three steps a pile-up barely grows, and a blown-up rate's oscillating norm
        can fall every third step (a regression at lr 0.5 did).
    grad_reset_fall : float, default=0.5
        A fall of the global gradient norm: to this share of the step before or less. A reset
        after k steps of a pile-up leaves one step's gradient of the k summed, a fall to 1/k
        at most; 0.5 takes every k >= 2 (the period rule asks k >= 4).
    grad_reset_falls : int, default=3
        Falls of the global gradient norm (``grad_reset_fall``) on that period: three resets
        are a pattern, not a coincidence.
    grad_reset_aligned : float, default=0.75
        Share of all falls that land on the period.
    grad_reset_monotone : float, default=0.6
        Share of steps on which the global gradient norm grew: between resets a pile-up grows
        at almost every step (0.73-0.91 on the zoo's and the user-style probes' runs that
        clear the gradients once per epoch or every 8 steps; a period of 4 rises on 3 steps
        of 4 at best, 0.68-0.75 measured, and Adam's levelled-off pile-up 0.68), healthy
        training about half the time (0.49-0.54 on the healthy runs that meet the other three
        conditions: data sorted by norm, unshuffled). No run of 937 healthy user-style runs,
        nor any of 400 healthy or fixed twins of a second probe, meets the four conditions;
        0.6 is what :attr:`grad_accumulation_monotone` asks of the same shape.
    grad_kept_falls : int, default=3
        Fewest falls of the loss to half the step before's or less that
        :func:`~neuraldbg.cause_evidence.kept_gradient_support` reads
        (:attr:`~neuraldbg.run_facts.RunFacts.grad_kept`) ...
    grad_kept_share : float, default=0.9
        ... the share of them across which the global gradient norm kept 0.9 of its value
        or more: a gradient that holds every step before (a missing ``zero_grad``) does not
        follow the loss down. Of 1,108 runs (the zoo's and two new-user probes') whose norm
        grew tenfold or more across three or more falls, the 12 user runs without
        ``zero_grad`` (SGD and Adam) kept it at every fall and the zoo's
        ``zero_grad_per_epoch_mlp`` at 0.75-1.0; no other run above 0.79 (an LSTM blowing
        up without a clip 0.67-0.73) ...
    grad_kept_growth : float, default=10.0
        ... and the largest norm at least this many times the median of the first five: a
        running sum grows. A norm a clip pins at every step is kept across every fall too
        (the healthy corpus's runs clipped at 1, 0.9-1.0) but does not grow.
    batchnorm_std_high : float, default=1.5
        BatchNorm outputs whose std is typically this many times away from 1 at the first step
        (:attr:`~neuraldbg.run_facts.RunFacts.batchnorm_off_factor`) do not normalise:
        train-mode BatchNorm gives 1 per channel at init (1.00-1.02 measured on the zoo), so
        the layers run on their initial running statistics, a model left in ``eval()``.
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
        ``unknown`` better supported) and of a specific cause listed after the one that
        carries its symptom: below the contract's 0.5, where a claim is one a user acts on.
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
    dropout_dead_frac: float = 0.95
    sat_frac: float = 0.5
    sat_frac_exit: float = 0.3
    sat_grad_drop: float = 0.1
    sat_grad_drop_exit: float = 0.2
    act_overflow: float = 1e6
    act_growth: float = 1e3
    loss_spike_factor: float = 3.0
    loss_spike_min_rise: float = 0.25
    loss_window: int = 10
    loss_blowup: float = 10.0
    plateau_improvement: float = 0.1
    plateau_window: float = 0.1
    plateau_min_steps: int = 20
    lr_jump: float = 3.0
    lr_jump_window: int = 5
    lr_collapse: float = 1e-3
    lr_collapse_share: float = 0.25
    lr_collapse_level: float = 0.3
    update_ratio_high: float = 1e-2
    update_ratio_low: float = 1e-4
    total_update_low: float = 0.1
    init_scale_high: float = 2.0
    init_scale_low: float = 0.25
    depth_gain_high: float = 10.0
    vanished_layers_deep: int = 4
    init_gain_high: float = 3.0
    gain_min_units: int = 8
    start_grad_ratio_high: float = 2.0
    start_grad_ratio_low: float = 3e-3
    start_update_ratio_high: float = 1.0
    adaptive_rate_first_step: float = 0.25
    adaptive_weight_growth_high: float = 15.0
    early_overshoot_high: float = 2.0
    input_swing_high: float = 1.5
    init_gain_low: float = 0.12
    weight_scale_high: float = 4.0
    weight_scale_low: float = 0.1
    default_gain: float = 0.577
    input_scale_high: float = 5.0
    grad_sum_exponent: float = 0.8
    grad_sum_exponent_max: float = 3.0
    grad_sum_fit: float = 0.8
    grad_sum_monotone: float = 0.9
    grad_sum_steps: int = 30
    loss_scale_ratio: float = 1e3
    output_floor_gap: float = 0.05
    output_floor_decades: float = 0.25
    row_diversity_low: float = 1e-3
    grad_accumulation_monotone: float = 0.6
    grad_accumulation_growth: float = 10.0
    grad_reset_period: int = 4
    grad_reset_fall: float = 0.5
    grad_reset_falls: int = 3
    grad_reset_aligned: float = 0.75
    grad_reset_monotone: float = 0.6
    grad_kept_falls: int = 3
    grad_kept_share: float = 0.9
    grad_kept_growth: float = 10.0
    batchnorm_std_high: float = 1.5
    data_update_ratio: float = 1e-3
    cause_tie_margin: float = 0.05
    unsure_cap: float = 0.45
    window: int = 5

    def __post_init__(self) -> None:
        """Reject a non-positive or non-numeric threshold (the message names it)."""
        require_positive_fields(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ThresholdConfig:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)
