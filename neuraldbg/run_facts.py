"""Run facts: what the trace and the run's configuration say that bears on each root cause.

Gathered once per trace for the cause scorer (:mod:`neuraldbg.causes`), which compares each
fact with a threshold of :class:`~neuraldbg.thresholds.ThresholdConfig`:

- learning rate: the update ratio ||dW||/||W|| before the failure and learning-rate jumps in
  ``trace.steps`` (from :class:`~neuraldbg.events.LossDynamics`), the median learning rate;
- initialisation: the median gain std(output)/rms(input) of the Linear/Conv layers at the
  first step. For y = Wx, E[y^2] = fan_in * Var(w) * E[x^2], so the gain measures the init
  scale against each layer's fan-in without needing the fan-in itself: PyTorch's default
  (weights U(+-1/sqrt(fan_in))) gives 1/sqrt(3), Kaiming sqrt(2), Xavier/orthogonal ~1 for
  square layers. When the config names the init scheme the gain is compared with that
  scheme's (``init_scale`` = measured / expected), else with absolute bounds;
- depth amplification: rms of the last Linear/Conv output / rms of the first at the first
  step;
- inputs: the first layer's input rms, read directly where a shape-only module (Flatten)
  precedes it, else its output std divided by the gain of the other layers;
- architecture and config: activation families, normalization layers, recurrent modules,
  configured gradient clipping, the init scheme's name (``trace.meta["config"]``, never the
  ground truth, and never the init gain: that is what the trace measures);
- the marks of script bugs: the growth of the global gradient norm and of the parameter- over
  output-gradient ratio (gradients never reset), the first loss against the output scale
  (unscaled targets), weight-row diversity (symmetric init), modules that never received a
  gradient (a ``.detach()``), the BatchNorm output scale (a model left in ``eval()``), a
  loss that turned non-finite out of a learned state while the model's outputs stayed finite
  (a hand-written loss at ``log(0)``), a first module whose output turned non-finite while
  its weights and its earlier outputs were sound (a non-finite input batch).

The step counts these facts are measured over are in :class:`FactWindows`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypedDict

import numpy as np

from neuraldbg.events import LossDynamics
from neuraldbg.model_output import input_rms as model_input_rms
from neuraldbg.model_output import output_function, output_rows, output_width
from neuraldbg.outside_vocabulary import batchnorm_off, frozen_weights
from neuraldbg.states import StateTable
from neuraldbg.sufficiency import LEARNED_LOSS, output_module
from neuraldbg.thresholds import require_positive_fields
from neuraldbg.trace import Trace

__all__ = ["SCHEME_GAINS", "RECURRENT_TYPES", "SWING_STEPS", "RMSPROP_ALPHA", "recurrent_in_front",
           "input_swing", "early_step_inflation", "FactWindows", "RunFacts", "gather_facts"]

#: Module types of recurrent cells, whose outputs a tanh bounds.
RECURRENT_TYPES = ("RNN", "GRU", "LSTM", "RNNCell", "GRUCell", "LSTMCell")


def recurrent_in_front(types: list[str], first_weighted: int) -> bool:
    """Whether a recurrent cell comes at or before the first weighted module.

    Its output, which a tanh bounds (a GRU fed values in the thousands puts out +-1), then
    says nothing of the input's scale: the input the capture read does
    (:func:`neuraldbg.model_output.input_rms`).
    """
    return any(t in RECURRENT_TYPES for t in types[:first_weighted + 1])


#: Gain std(Wx)/rms(x) each init scheme gives a layer (square layers for Xavier/orthogonal).
SCHEME_GAINS: dict[str, float] = {
    "default": 1.0 / math.sqrt(3.0), "pytorch": 1.0 / math.sqrt(3.0),
    "kaiming": math.sqrt(2.0), "he": math.sqrt(2.0), "kaiming_normal": math.sqrt(2.0),
    "kaiming_uniform": math.sqrt(2.0), "xavier": 1.0, "glorot": 1.0, "xavier_normal": 1.0,
    "xavier_uniform": 1.0, "orthogonal": 1.0, "lecun": 1.0,
}
_WEIGHT_TYPES = ("Linear", "Conv1d", "Conv2d", "Conv3d", "Bilinear", "LazyLinear",
                 "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d")
#: Values of the config's ``grad_clip`` that mean "no clipping".
_NO_CLIP = (None, False, "none", "None")


@dataclass(frozen=True, slots=True)
class FactWindows:
    """Step counts and scales the run facts are measured over, with the reason for each.

    Attributes
    ----------
    min_growth_steps : int, default=8
        Fewest steps over which a growth is measured (the power law of the global gradient
        norm over finite steps, the late/early parameter- over output-gradient ratio over
        recorded steps): below it a fit to noise looks as good as a real trend, so the fact
        is NaN.
    edge_min_steps : int, default=3
        The start and the end of a run span at least this many steps, so that a median or a
        mean over them is not one noisy step (the loss "begins" as the mean of its first
        this-many steps).
    edge_share : int, default=10
        ... and the end spans a tenth (1 / this) of the run when that is longer: long enough
        to average the noise of a minibatch loss, short enough to be the run's end.
    flat_log_variance : float, default=1e-12
        A log gradient norm whose variance over those steps is below this is flat (a
        constant norm, a tiny model at a fixed point): there is no growth to fit, and the
        power-law R^2 would divide by ~0.
    target_variance : float, default=1.0
        The loss of an untrained model is about ``output rms^2 + target variance`` (mean
        squared error, or cross-entropy near its ~1 start); standardised targets have
        variance 1, so ``loss_scale_ratio`` divides the first loss by ``rms^2 + 1``.
    """

    min_growth_steps: int = 8
    edge_min_steps: int = 3
    edge_share: int = 10
    flat_log_variance: float = 1e-12
    target_variance: float = 1.0

    def __post_init__(self) -> None:
        """Reject a non-positive or non-numeric coefficient (the message names it)."""
        require_positive_fields(self)


@dataclass(frozen=True, slots=True)
class RunFacts:
    """Cause-relevant facts about a run (see the module docstring).

    Attributes
    ----------
    update_ratio : float
        Median ||dW||/||W|| per step before any failure (NaN without an optimizer).
    total_update : float
        Sum of ||dW||/||W|| over the run.
    lr : float
        Median learning rate (steps table, else the config).
    lr_jump_steps : tuple of int
    init_gain : float
        Median gain std(out)/rms(in) of the Linear/Conv layers after the first, at the first
        recorded step (NaN if no layer pair is measured).
    init_scale : float
        ``init_gain`` / the gain of the init scheme named in the config (NaN when the config
        names none or an unknown one).
    depth_gain : float
        rms of the last Linear/Conv output / rms of the first, at the first recorded step.
    weight_scale : float
        Median over the Linear/Conv modules of their weight matrix's rms when the capture
        was entered (``trace.meta["weight_diversity"]["rms"]``) over the rms PyTorch's
        default init gives it, ``1 / sqrt(3 fan_in)``; NaN when none is measured. ~1 at the
        default init, ~5 when every weight matrix was multiplied by 5. The weights alone:
        the parameter norm at the first step (what a trace recorded before the rms was
        kept is read by) counts the biases too, whose default norm floors it, so weights
        x0.05 under default biases read 0.13-0.14 (in a 64-wide MLP), not 0.05, and
        the network named a negative bias or a blocked gradient at 0.63-0.65.
    n_gain_pairs : int
    start_grad_ratio : float
        Global gradient norm / parameter norm at the first step of the run, before any
        update (NaN when either is not finite): how large the gradients start against the
        weights, which the init, the inputs and the loss set, not the learning rate. For a
        loss summed over its batch (``loss_summed_rows``), that of the mean loss: the sum's
        gradient is the rows times it, which a learning rate that many times smaller undoes.
    loss_summed_rows : int
        ``rows`` when the loss is a cross-entropy summed over the batch's rows rather than
        averaged (``reduction="sum"``), else 1: the first loss is ``rows`` times the ``ln K``
        a K-class classifier starts near (within a factor of 2), and the gradient of the
        logits is ``rows`` times the mean loss's (:data:`SUMMED_POWER_TOLERANCE`). Under
        SGD every step is then ``rows`` times the one the rate was meant for.
    start_update_ratio : float
        Update norm / parameter norm across the run's first step (NaN when not measured),
        over the optimizer's own inflation of that step (:func:`early_step_inflation`: 10
        under RMSprop, 1 otherwise).
        Under Adam and its kin the first step moves every weight by about the learning
        rate (the gradient divided by its own scale), so this is the rate against the
        weights' size before anything else could move it; under SGD it is the rate times
        ``start_grad_ratio``.
    early_overshoot : float
        The largest finite loss over the run's first tenth (at least ``edge_min_steps``
        steps; ``edge_share``) over its first finite loss; NaN when that first loss is not
        positive or the run is shorter. A rate too high for Adam and its kin throws the
        weights off in its first steps and the loss overshoots its start (zoo: 2.3-106 on
        the rates that kill ReLU units, 2.3-8.2 on an LSTM at 0.3-1.0); a run that learns
        or that stalls on labels with no signal stays within about 1.1 of it.
    early_weight_growth : float
        The parameter norm's largest value over the run's first quarter (at least
        :data:`GROWTH_MIN_STEPS` steps) over its value at the first step, read against
        the default init's scale when the weights started smaller (``weight_scale`` below
        1: weights far smaller than the default grow at any rate); NaN when not measured.
        Adam and its kin move every weight by about the rate at every step, so a rate too
        high grows the weights far past their init within a few dozen steps, whatever the
        loss or the later update ratios show (the weights it inflated make those small):
        rates too high 8-72x (those under 15x, the zoo's ReLU MLP at 100x and LSTM at
        0.3, show in their first step as well; warmups to Adam's 1.0 show here alone,
        23-29x); runs that train at high workable rates (Adam 1e-2 to 0.1, a fine-tuned
        body at 100x its rate, unscaled targets) 2-8x.
    early_steps_inflated : bool
        Whether the optimizer's first steps outgrow the rate's steady step
        (:func:`early_step_inflation` above 1: RMSprop, whose uncorrected average of squared
        gradients makes its first steps 10x down to 2.3x by the 20th). Any rate such an
        optimizer trains at overshoots the loss early: a new user's RMSprop at 1e-2 on
        digits 1.5-3.2x on runs that train to 0.95-0.97, 1.7-4.4x on the same runs with
        shuffled labels.
    input_swing : float
        How far the first weighted layer's output range jumps from one recorded step to the
        next, in decades: the 90th percentile of |log10| of the step-to-step ratio of its
        max |output| over its weights' norm, over its first :data:`SWING_STEPS` recorded
        steps with both finite (NaN with fewer than 10). Dividing by
        the weights' norm leaves what the batches bring: inputs on a scale far from the
        default move it by the same factor at every step (at most 1.2 over 1,600 zoo and
        probe traces, rates that blow the weights up included), a few records carrying a
        value far off the rest (a missing-value code such as -999 in 5% of the rows) by two
        decades whenever a batch has one and the next does not (2.1-2.3). See
        :func:`input_swing`.
    loss_spikes : int
        Loss spikes before the run's end (:attr:`neuraldbg.events.LossDynamics.spike_steps`:
        a loss 3x its trailing median). A rate that grows too high under a warmup makes
        them where the first step and the first tenth were calm (a helper's Adam warmed up
        to 0.3: first step 0.025 of the weights, spikes from step 23-37, then chance).
    step_scales_with_gradient : bool
        The optimizer's step grows with the gradient (SGD, with or without momentum, and
        any optimizer the trace does not name), so its update ratio is the learning rate
        times the gradient's size; False for optimizers that divide by a running gradient
        scale (Adam and its kin, RMSprop, Adagrad, Adadelta).
    input_rms : float
        Estimated rms of the network input (NaN when unknown): from the first weighted
        layer's output, or, behind a recurrent first layer, the input the capture read.
    first_layer : str
        First parameterised module in forward order.
    saturating_modules : tuple of str
        Sigmoid/tanh modules.
    rectifier_modules : tuple of str
    has_normalization : bool
    recurrent : bool
    grad_clip : float or None
        From the config.
    n_weight_layers : int
    config : dict
    grad_growth : tuple of float
        Growth of the global gradient norm over the first ``grad_sum_steps`` finite steps:
        (exponent of a power law in the step, R^2 of that power law, share of steps where
        the norm grew). NaNs with fewer than 8 such steps.
    grad_resets : tuple of float
        Periodic falls of a gradient that piles up (``zero_grad`` called every k optimizer
        steps instead of every step): (k, falls on that period, their share of all falls,
        share of the steps the global gradient norm grew). A fall is the norm dropping to
        half or less in one step; k is the most common gap between falls. NaNs with fewer
        than two falls.
    grad_kept : tuple of float
        Whether the global gradient norm follows the loss down: (steps whose loss fell to
        :data:`LOSS_FALL` of the step before's or less, the share of them at which the norm
        kept :data:`GRAD_KEPT` of its value or more, the largest norm over the median of the
        first five). A step's gradient is computed at its weights, on its batch, so a loss
        that falls fourfold takes the norm down with it (about twofold for a squared error);
        a gradient that holds every step before (``zero_grad`` never called) barely moves
        when one more term is added. Over the steps before the first non-finite or zero norm
        or loss; NaNs with no such fall.
    loss_improved : bool
        The loss ends (mean of the last tenth, non-finite counting as worse) below where it
        began (mean of the first three steps).
    loss_scale_ratio : float
        First finite loss / (rms of the last module's output at the first recorded step^2
        + 1): how far the loss starts above the output scale (the mean loss's, for a loss
        summed over its batch: ``loss_summed_rows``).
    output_type : str
        What the loss receives: ``"Softmax"`` when the model's output rows were
        probabilities (also from a function in ``forward``:
        :func:`neuraldbg.model_output.output_function`), or when the loss line applies a
        softmax to the logits the model returns (:func:`_softmax_in_the_loss`, read off
        the logits' first gradient), else the module type of the last module in forward
        order.
    output_dead : float
        When that last module is a rectifier (a ReLU on the logits), the largest share of its
        units dead at a recorded step; NaN otherwise.
    row_diversity : float
        Weight-row diversity (:mod:`neuraldbg.weight_diversity`) of the most symmetric
        module: the larger of its values at enter and at the latest flush, the smallest over
        modules whose rows are not a single output (NaN when not recorded).
    symmetric_modules : tuple of str
        Modules whose rows stayed copies of each other (diversity below
        ``row_diversity_low`` at enter and at the latest flush).
    blocked_modules : tuple of str
        Trainable modules the forward pass called that never received a gradient (no
        output gradient at any recorded step, parameter gradients exactly zero or absent)
        while other trainable modules did; every one of them when no module's output
        received a gradient (the loss computed on ``outputs.detach()``: an L2 term on the
        weights then still gives them parameter gradients, toward zero).
    grad_accumulation : float
        Growth over the run of parameter-gradient norm / output-gradient norm of the
        weight layers (median over layers, late steps over the first ones): ~1 when each
        step's gradient is that step's, growing like the step when they pile up.
    weights_unmoved : str or None
        What to check when the weights never changed (the global parameter norm is the same
        at every recorded step): no gradient reached the optimizer step, or the optimizer
        holds other parameters (:func:`neuraldbg.outside_vocabulary.frozen_weights`). ``None`` when
        they moved.
    output_floor_gap : float
        For a network that ends in a softmax over K classes: (loss at the end - the floor
        ``log(1 + (K - 1) / e)`` that ``CrossEntropyLoss`` on probabilities cannot go below)
        / the floor (NaN otherwise). ~0 when the loss sits on that floor; below 0 when the
        loss is another one (it went under the floor). For one that ends in a sigmoid
        module, against the floor of two classes, ``log(1 + 1/e)``, below which no logits
        loss fed values in (0, 1) goes (an MSE autoencoder's loss lies far under it).
    output_floor_step : int or None
        For a softmax output, the first step whose loss came within ``output_floor_gap``
        (the threshold) of that floor.
    output_grad_power : float
        For a softmax over K >= 4 classes: the output-gradient norm of the layer that makes
        the logits, at the first recorded step, over the norm cross-entropy on those logits
        gives there (``sqrt((1 - 1/K) / rows)`` for ``rows`` rows a batch, mean reduction),
        as a power of K. Near -1 when a logits loss is fed the probabilities (the softmax's
        Jacobian at near-uniform probabilities scales the gradient by 1/K), near 0 when the
        loss reads them through their log (``nll_loss(log p)``). NaN otherwise.
    nonfinite_from_floor : float
        When the loss turned non-finite at a step whose module outputs were all recorded
        finite and below ``act_overflow``, right after it had fallen below
        :data:`~neuraldbg.sufficiency.LEARNED_LOSS`: the loss just before (the median of its
        last ``edge_min_steps`` finite values) over its start. NaN otherwise. A model that
        learned its task outputs near-certain probabilities; a hand-written
        ``-(y log p + (1 - y) log(1 - p))`` on ``p = sigmoid(z)`` (or a ``log`` of a
        softmax) then reaches ``log(0)`` once ``p`` rounds to 1, and the loss is NaN while
        every output is finite.
    nonfinite_input_step : int or None
        The step whose input batch carried non-finite values, or finite ones so huge that
        the loss overflowed: at the first recorded step, up to the one where the loss first
        turned non-finite, with a module output non-finite or above ``act_overflow``, the
        first module the forward called put out NaN, Inf or such a value (after a sound
        output at an earlier recorded step, when finite: inputs of that scale from the
        start are unnormalised, not one bad record) while its
        parameters were finite and within 10x (``_WEIGHT_GROWTH_HIGH``) of their first recorded
        norm, its outputs at every earlier recorded step were finite and below
        ``act_overflow``, and the run was calm up to it (as for ``calm_nonfinite_step``,
        from the first step on): so
        nothing blew up on its way there. Weights like these fed finite, moderate values do
        not output NaN; a corrupted record, a missing value or a division by zero in the
        data pipeline does. None otherwise (also when that step has no module statistics:
        ``every > 1`` between recorded steps).
    nonfinite_entry_module : str or None
        As for ``nonfinite_input_step``, but the first module whose output turned
        non-finite is not the first one the forward called (every module before it had a
        finite output): the NaN or Inf entered between modules, with an input the first
        module does not take (a float feature beside an embedding), from an upstream
        output whose sampled statistics missed it, or from an operation in ``forward``
        (a ``log`` or a division). The data or the script: the trace cannot tell which.
    nonfinite_entry_step : int or None
        The step of ``nonfinite_entry_module``.
    nonfinite_target_step : int or None
        The step the loss first turned non-finite, when that step was recorded with every
        module output finite and below ``act_overflow``, the model's output below 80 in
        absolute value (no loss that exponentiates it overflows), every parameter finite,
        and the run calm up to it (as for ``calm_nonfinite_step``, from the first step
        on): the model computed
        sound outputs, so the NaN entered with what the loss compared them to (a missing
        value among regression targets) or in the loss computation itself. None otherwise.
    calm_nonfinite_step : int or None
        The step the loss first turned non-finite, or blew up on its way there in one step
        (by :data:`_JUMP_DECADES` decades: a record of 1e30 makes the loss huge at its step
        and NaN at the next), when that step has no
        module statistics (``every > 1``, between recorded steps), the weights were finite and
        within 10x of their first norm wherever measured up to it, and the run was calm up
        to it: at least
        ``edge_min_steps`` finite losses before it, no loss blow-up, no loss spike in the
        ``loss_window`` steps before it, no gradient-norm explosion and no learning-rate
        jump before it. A rate, an init or unscaled inputs grow the loss or the gradients
        first; a non-finite batch, or a numerical bug, does not, and the trace cannot tell
        which without that step's module statistics. None otherwise.
    batchnorm_off_factor : float
        How far the BatchNorm outputs' std is from 1 at the first recorded step, as a factor
        (>= 1): ``exp(median over BatchNorm layers of |ln std|)``. ~1 when they normalise
        (train mode, whatever their input), the scale of each layer's input when they run on
        their initial running statistics (``eval()``): layers off in both directions count,
        where a median of the stds let 4x and 0.15x average out to 0.8. When they
        normalised at first and stopped later (a model left in ``eval()`` after a
        validation pass), the largest factor after that, if larger
        (:func:`neuraldbg.outside_vocabulary.batchnorm_off`). NaN without BatchNorm.
    batchnorm_off_step : int or None
        The step the BatchNorm layers stopped normalising, when they did after normalising
        at first; None otherwise.
    """

    update_ratio: float
    total_update: float
    lr: float
    lr_jump_steps: tuple[int, ...]
    init_gain: float
    init_scale: float
    depth_gain: float
    n_gain_pairs: int
    input_rms: float
    first_layer: str
    saturating_modules: tuple[str, ...]
    rectifier_modules: tuple[str, ...]
    has_normalization: bool
    recurrent: bool
    grad_clip: float | None
    n_weight_layers: int
    config: dict[str, Any] = field(default_factory=dict)
    grad_growth: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    grad_resets: tuple[float, float, float, float] = (math.nan, math.nan, math.nan, math.nan)
    grad_kept: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    loss_improved: bool = True
    loss_scale_ratio: float = math.nan
    start_grad_ratio: float = math.nan
    loss_summed_rows: int = 1
    start_update_ratio: float = math.nan
    early_overshoot: float = math.nan
    early_steps_inflated: bool = False
    early_weight_growth: float = math.nan
    loss_spikes: int = 0
    input_swing: float = math.nan
    weight_scale: float = math.nan
    step_scales_with_gradient: bool = True
    output_type: str = ""
    output_dead: float = math.nan
    row_diversity: float = math.nan
    symmetric_modules: tuple[str, ...] = ()
    blocked_modules: tuple[str, ...] = ()
    grad_accumulation: float = math.nan
    batchnorm_off_factor: float = math.nan
    batchnorm_off_step: int | None = None
    output_floor_gap: float = math.nan
    output_floor_step: int | None = None
    output_grad_power: float = math.nan
    weights_unmoved: str | None = None
    nonfinite_from_floor: float = math.nan
    nonfinite_input_step: int | None = None
    nonfinite_entry_module: str | None = None
    nonfinite_entry_step: int | None = None
    nonfinite_target_step: int | None = None
    calm_nonfinite_step: int | None = None




class _OutputFloor(TypedDict):
    output_grad_power: float
    output_floor_gap: float
    output_floor_step: int | None


class _Scales(NamedTuple):
    """Signal scales at the first recorded step (see :class:`RunFacts`)."""

    init_gain: float = math.nan
    n_gain_pairs: int = 0
    input_rms: float = math.nan
    depth_gain: float = math.nan
    loss_scale_ratio: float = math.nan


def _rms(states: StateTable, row: int) -> np.ndarray:
    m = states.measures
    return np.sqrt(m["act_std"][row] ** 2 + m["act_mean"][row] ** 2)


def _n_trainable(trace: Trace, states: StateTable) -> np.ndarray:
    """Trainable parameter count of each module, in the states' module order."""
    return (trace.modules.set_index("module_name")["n_trainable"]
            .reindex(states.module_names).fillna(0).to_numpy())


def gather_facts(trace: Trace, states: StateTable, dyn: LossDynamics,
                 windows: FactWindows | None = None) -> RunFacts:
    """Collect :class:`RunFacts` from a trace, its states and its loss dynamics.

    Parameters
    ----------
    trace : Trace
    states : StateTable
        Output of :func:`neuraldbg.states.classify_states` for ``trace``.
    dyn : LossDynamics
        Output of :func:`neuraldbg.events.loss_dynamics` for ``trace``.
    windows : FactWindows, optional
        Step counts the facts are measured over; the documented defaults when omitted.

    Returns
    -------
    RunFacts
    """
    win = windows or FactWindows()
    cfg_run = dict(trace.meta.get("config") or {})
    names, types, fams = states.module_names, states.module_types, states.families
    trainable = _n_trainable(trace, states) > 0
    weight = np.array([t in _WEIGHT_TYPES for t in types]) & trainable
    first_layer = (names[int(np.argmax(trainable))] if trainable.any()
                   else (names[0] if names else ""))
    rows = np.flatnonzero(states.measures["observed"].any(axis=1))
    scales = _first_step_scales(trace, states, weight, rows, win)
    inflation = float(early_step_inflation(trace, 1)[0])
    weight_scale = _weight_scale(trace)
    # what the loss receives: a softmax or sigmoid the forward applies after its last
    # module (F.softmax(self.fc(x))) counts as that module would
    out = output_module(trace)
    last = names.index(out) if out in names else len(names) - 1  # (-1 without modules)
    logits = _logits_module(names, types, last) if types else ""
    function = output_function(trace.meta) or _softmax_in_the_loss(trace, logits)
    output_type = function[0] if function else (types[last] if types else "")
    clip = _grad_clip(cfg_run)
    bn_factor, bn_step = batchnorm_off(trace)
    summed = _loss_summed_rows(trace, logits)
    scales = scales._replace(loss_scale_ratio=scales.loss_scale_ratio / summed)
    return RunFacts(
        update_ratio=dyn.update_ratio, total_update=dyn.total_update,
        lr=_learning_rate(trace, cfg_run), lr_jump_steps=dyn.lr_jump_steps,
        init_scale=_init_scale(cfg_run, scales.init_gain), first_layer=first_layer,
        saturating_modules=tuple(n for n, f in zip(names, fams, strict=True)
                                 if f in ("sigmoid", "tanh")),
        rectifier_modules=tuple(n for n, f in zip(names, fams, strict=True) if f == "relu"),
        has_normalization=_has_normalization(fams, cfg_run),
        recurrent=any(t in RECURRENT_TYPES for t in types),
        grad_clip=clip if clip and clip > 0 else None, n_weight_layers=int(weight.sum()),
        config=cfg_run, grad_growth=_grad_growth(trace, states.config.grad_sum_steps, win),
        grad_resets=_grad_resets(trace, states.config.grad_reset_fall),
        grad_kept=_grad_kept(trace),
        loss_improved=_loss_improved(trace, win), output_type=output_type,
        start_grad_ratio=_first_ratio(trace, "grad_norm") / summed, loss_summed_rows=summed,
        start_update_ratio=_first_ratio(trace, "update_norm") / inflation,
        early_overshoot=_early_overshoot(trace, win), early_steps_inflated=inflation > 1.0,
        loss_spikes=len(dyn.spike_steps),
        input_swing=input_swing(trace, names[int(np.argmax(weight))]) if weight.any()
        else math.nan,
        weight_scale=weight_scale,
        early_weight_growth=_early_weight_growth(trace, weight_scale),
        step_scales_with_gradient=_step_scales_with_gradient(trace),
        output_dead=_output_dead(states, last),
        **_symmetry(trace, states.config.row_diversity_low),
        blocked_modules=_blocked(trace, states, win.edge_min_steps),
        grad_accumulation=_grad_accumulation(states, weight, win),
        batchnorm_off_factor=bn_factor, batchnorm_off_step=bn_step,
        **_output_floor(trace, states, win, output_type,
                        function[1] if function else _output_classes(trace, states, last),
                        logits),
        weights_unmoved=frozen_weights(trace, win.edge_min_steps),
        nonfinite_from_floor=_nonfinite_from_floor(trace, states, dyn, win),
        **_nonfinite_entry_facts(trace, states, dyn, win),
        nonfinite_target_step=_nonfinite_target(trace, states, dyn, win),
        calm_nonfinite_step=_calm_nonfinite(trace, states, dyn, win),
        **scales._asdict())


def _nonfinite_from_floor(trace: Trace, states: StateTable, dyn: LossDynamics,
                          win: FactWindows) -> float:
    """:attr:`RunFacts.nonfinite_from_floor` (see there)."""
    at = _nonfinite_row(states, dyn)
    if at is None:
        return math.nan  # no loss went non-finite, or its step has no module statistics
    step, row = at
    loss = trace.steps["loss"].to_numpy(dtype=float)
    steps = trace.steps["step"].to_numpy()
    before = loss[(steps < step) & np.isfinite(loss)]
    k = win.edge_min_steps
    if not _outputs_sound(states, row) or len(before) < 2 * k:
        return math.nan
    start, last = float(np.mean(before[:k])), float(np.median(before[-k:]))
    if not (start > 0 and 0 <= last < LEARNED_LOSS):
        return math.nan
    return last / start


def _nonfinite_row(states: StateTable, dyn: LossDynamics) -> tuple[int, int] | None:
    """The first step with a non-finite loss and its row in ``states``, when recorded."""
    step = dyn.nonfinite_step
    rows = np.flatnonzero(states.steps == step) if step is not None else np.zeros(0, int)
    return (int(step), int(rows[0])) if step is not None and len(rows) else None


def _entry_row(states: StateTable, dyn: LossDynamics) -> tuple[int, int] | None:
    """The first recorded step, up to the first non-finite loss, with an output not sound.

    Not sound: non-finite, or finite above ``act_overflow`` (a record of 1e30 makes the
    loss finite but huge at its step and NaN at the next, after the update). ``(step,
    row)``; None when the loss never turned non-finite or no such step was recorded.
    """
    if dyn.nonfinite_step is None:
        return None
    rows = np.flatnonzero(_unsound(states).any(axis=1) & (states.steps <= dyn.nonfinite_step))
    return (int(states.steps[rows[0]]), int(rows[0])) if len(rows) else None


def _unsound(states: StateTable) -> np.ndarray:
    """(steps, modules): a recorded output that is non-finite or above ``act_overflow``."""
    m = states.measures
    with np.errstate(invalid="ignore"):
        return m["observed"] & (m["act_nonfinite"]
                                | ~(m["act_max_abs"] <= states.config.act_overflow))


def _outputs_sound(states: StateTable, row: int) -> bool:
    """Every module output recorded at ``row`` finite and below ``act_overflow``."""
    return bool(states.measures["observed"][row].any()) and not _unsound(states)[row].any()


#: Largest growth of the first module's parameter norm (over its first recorded one) under
#: which a non-finite output of that module is read as a non-finite input: weights that grew
#: more than this may have blown the output up themselves.
_WEIGHT_GROWTH_HIGH = 10.0
#: Largest growth of the model's parameter norm from one measurement to the next under which
#: a run counts as calm at a non-finite or overflowing step.
_WEIGHT_STEP_GROWTH = 2.0


def _nonfinite_entry_facts(trace: Trace, states: StateTable, dyn: LossDynamics,
                           win: FactWindows) -> dict[str, Any]:
    """``nonfinite_input_step`` and ``nonfinite_entry_module`` (:class:`RunFacts`)."""
    entry = _nonfinite_entry(trace, states, dyn, win)
    if entry is None:
        return {}
    step, j, first = entry
    return ({"nonfinite_input_step": step} if first
            else {"nonfinite_entry_module": states.module_names[j],
                  "nonfinite_entry_step": step})


def _nonfinite_entry(trace: Trace, states: StateTable, dyn: LossDynamics,
                     win: FactWindows) -> tuple[int, int, bool] | None:
    """Where a non-finite value entered the forward pass out of a calm run.

    ``(step, module index, first)``: at the first recorded step up to the first non-finite
    loss with an output non-finite or above ``act_overflow`` (:func:`_entry_row`), the
    first module in forward order whose output is so has finite parameters within
    :data:`_WEIGHT_GROWTH_HIGH` of their first recorded norm and sound earlier outputs, the
    run was calm up to it (from the first step on), and ``first`` says whether that module
    is the first one the forward called. None otherwise.
    """
    at = _entry_row(states, dyn)
    if at is None:
        return None
    step, row = at
    m = states.measures
    unsound = _unsound(states)
    called = np.flatnonzero(m["observed"][row])
    bad = called[unsound[row, called]]
    if not len(bad):
        return None
    j = int(bad[0])  # modules are in forward order
    before = m["observed"][:row, j]
    if not m["act_nonfinite"][row, j]:
        # finite and above act_overflow: an entry is a jump, not a signal crossing the line
        # as it grows (an init too large: each layer's output a few times the last's)
        big = m["act_max_abs"][row, j]
        prev = m["act_max_abs"][:row, j][before]
        upstream = m["act_max_abs"][row, called[called < j]]
        jump = 10.0**_JUMP_DECADES
        if not (len(prev) and big > jump * prev[-1]):
            return None  # huge from its first call (the inputs' scale), or grown into it
        if len(upstream) and not big > jump * np.nanmax(np.abs(upstream), initial=0.0):
            return None
    earlier_sound = not unsound[:row, j].any()
    if _n_trainable(trace, states)[j] > 0:
        norms = m["param_norm"][:row + 1, j]
        seen = norms[np.isfinite(norms)]
        if not (np.isfinite(norms[-1]) and len(seen)
                and norms[-1] <= _WEIGHT_GROWTH_HIGH * seen[0]):
            return None  # weights non-finite or grown: they may have made the output
    # no history needed: a module that turns non-finite from sound weights at step 0 was fed
    # a non-finite batch as surely as one at step 60; the whole model's weights too (a
    # residual sum in forward() feeds a later module what no module put out)
    if not (earlier_sound and _weights_sound_until(trace, step)
            and _calm_before(trace, states, dyn, win, step, history=False)):
        return None
    return int(step), j, j == int(called[0])


def _calm_nonfinite(trace: Trace, states: StateTable, dyn: LossDynamics,
                    win: FactWindows) -> int | None:
    """:attr:`RunFacts.calm_nonfinite_step` (see there)."""
    step = dyn.nonfinite_step
    if step is None:
        return None
    if dyn.blowup_step is not None and dyn.blowup_step < step and _jumped(
            trace, dyn.blowup_step, states.config.loss_window):
        step = dyn.blowup_step  # the loss went wrong there, finite, in one step
    if (states.steps == step).any():
        return None  # a recorded step: the module statistics say more (nonfinite_input)
    if not _weights_sound_until(trace, step):
        return None
    return int(step) if _calm_before(trace, states, dyn, win, step) else None


def _weights_sound_until(trace: Trace, step: int) -> bool:
    """Whether the model's weights stayed sound wherever measured up to ``step``.

    Sound: finite, within :data:`_WEIGHT_GROWTH_HIGH` of their first norm, and not doubled
    from the measurement before ``step``'s to ``step``'s (recorded steps only). A calm run
    does not grow them between recorded steps; weights blown up earlier may have made the
    loss (or an output) what it was at ``step`` themselves (a residual MLP without
    normalisation: its weights x6 in the one step before an output passed 1e6).
    """
    if "param_norm" not in trace.steps:
        return True
    norms = trace.steps.loc[trace.steps["step"] <= step, "param_norm"].to_numpy(dtype=float)
    seen = norms[~np.isnan(norms)]
    if not len(seen):
        return True
    return bool(np.isfinite(seen).all() and seen.max() <= _WEIGHT_GROWTH_HIGH * seen[0]
                and (len(seen) < 2 or seen[-1] <= _WEIGHT_STEP_GROWTH * seen[-2]))


#: Decades a finite loss must jump in one step, over the largest of the ``loss_window``
#: losses before it, to date a non-finite loss's origin there: a rate grows the loss a
#: decade or so a step (a regression at lr 1: 1.0, 3.8, 82, 1.2e4), a record of 1e30 by 27.
_JUMP_DECADES = 3.0


def _jumped(trace: Trace, step: int, window: int) -> bool:
    """Whether the loss jumped by :data:`_JUMP_DECADES` at ``step`` from the window before."""
    steps = trace.steps["step"].to_numpy()
    loss = trace.steps["loss"].to_numpy(dtype=float)
    now = loss[steps == step]
    before = loss[(steps < step) & (steps >= step - window)]
    before = before[np.isfinite(before)]
    if not (len(now) and np.isfinite(now[0]) and len(before)):
        return False
    return bool(abs(now[0]) > 10.0**_JUMP_DECADES * np.abs(before).max())


def _calm_before(trace: Trace, states: StateTable, dyn: LossDynamics, win: FactWindows,
                 step: int, *, history: bool = True) -> bool:
    """Whether the run was calm up to ``step``.

    At least ``edge_min_steps`` finite losses (unless ``history`` is False), no loss
    blow-up, no loss spike in the ``loss_window`` steps before it, no gradient-norm
    explosion and no learning-rate jump before it.
    """
    loss = trace.steps["loss"].to_numpy(dtype=float)
    steps = trace.steps["step"].to_numpy()
    if history and np.isfinite(loss[steps < step]).sum() < win.edge_min_steps:
        return False
    window = states.config.loss_window
    return not ((dyn.blowup_step is not None and dyn.blowup_step < step)
                or (dyn.grad_explode_step is not None and dyn.grad_explode_step < step)
                or any(step - window <= s < step for s in dyn.spike_steps)
                or any(s <= step for s in dyn.lr_jump_steps))


def _nonfinite_target(trace: Trace, states: StateTable, dyn: LossDynamics,
                      win: FactWindows) -> int | None:
    """:attr:`RunFacts.nonfinite_target_step` (see there)."""
    at = _nonfinite_row(states, dyn)
    if at is None or not _outputs_sound(states, at[1]):
        return None
    step, row = at
    m = states.measures
    weights = m["param_norm"][row][_n_trainable(trace, states) > 0]
    last = int(np.flatnonzero(m["observed"][row])[-1])  # the model's output
    # no history needed either: finite outputs this small and finite weights do not make a
    # standard loss NaN at any step
    if (m["act_max_abs"][row, last] <= _EXP_SAFE and np.isfinite(weights).all()
            and _calm_before(trace, states, dyn, win, step, history=False)):
        return int(step)
    return None


#: Largest |model output| under which no loss that exponentiates it overflows in float32
#: (exp overflows past 88.7): beyond it a softmax written by hand, or a loss on huge logits,
#: can make the loss NaN from sound outputs (unnormalised inputs do, in the zoo).
_EXP_SAFE = 80.0


#: The loss floor of ``CrossEntropyLoss`` fed probabilities: every logit in [0, 1], the
#: best case one-hot, gives ``-log(e / (e + K - 1))``.
SOFTMAX_OUTPUTS = ("Softmax",)
#: Outputs in (0, 1) element by element. A logits loss fed them has the floor of two
#: classes, ``log(1 + 1/e)``: ``BCEWithLogitsLoss`` on ``x`` in [0, 1] is ``softplus(x) - y x
#: >= softplus(-x) >= softplus(-1)`` for any target ``y`` in [0, 1], and cross-entropy over
#: K classes of such values is ``log(1 + (K - 1)/e)`` or more.
_SIGMOID_OUTPUTS = ("Sigmoid",)


def _output_classes(trace: Trace, states: StateTable, last: int) -> int:
    """Width K of a softmax output module ``last``: the fan-out of the layer feeding it."""
    feeding = [int(units) for units in _fan_out(trace, states)[:max(last, 0)] if units > 0]
    return feeding[-1] if feeding else 0


def _logits_module(names: list[str], types: list[str], last: int) -> str:
    """The layer that makes the logits ("" without one).

    The module feeding a softmax module ``last``, else the output module itself (the
    forward applies the softmax).
    """
    if not names:
        return ""
    if types[last] in SOFTMAX_OUTPUTS:
        return names[last - 1] if last > 0 else ""
    return names[last]


#: Fewest classes whose softmax Jacobian (1/K) tells a logits loss fed probabilities from
#: one that reads their log (:attr:`RunFacts.output_grad_power`): 2 and 3 are within the
#: spread of a batch's labels.
_GRAD_POWER_MIN_CLASSES = 4


#: Fewest rows a batch holds for :attr:`RunFacts.loss_summed_rows` to tell a summed loss.
SUMMED_MIN_ROWS = 8
#: How far (as a power of the rows) the logits' first gradient may sit from ``rows`` times
#: the mean cross-entropy's for :attr:`RunFacts.loss_summed_rows`: 1 for a sum, 0 for a mean.
SUMMED_POWER_TOLERANCE = 0.25


def _loss_summed_rows(trace: Trace, logits_module: str) -> int:
    """:attr:`RunFacts.loss_summed_rows` (see there)."""
    k, rows = output_width(trace.meta), output_rows(trace.meta)
    steps, stats = trace.steps, trace.stats
    if not (k >= 2 and rows >= SUMMED_MIN_ROWS and logits_module
            and len(steps) and "loss" in steps and "out_grad_norm" in stats):
        return 1
    first = steps["step"].iloc[0]
    per_row = float(steps["loss"].iloc[0]) / rows / math.log(k)
    grad = stats.loc[(stats["module_name"] == logits_module) & (stats["step"] == first),
                     "out_grad_norm"].to_numpy(float)
    if not (0.5 <= per_row <= 2.0 and len(grad) and math.isfinite(grad[0]) and grad[0] > 0):
        return 1
    power = math.log(grad[0] / math.sqrt((1.0 - 1.0 / k) / rows)) / math.log(rows)
    return rows if abs(power - 1.0) <= SUMMED_POWER_TOLERANCE else 1


#: How far (as a power of K) the logits' first gradient may sit from the 1/K a softmax
#: between them and a logits loss gives, for :func:`_softmax_in_the_loss`.
_SOFTMAX_POWER_TOLERANCE = 0.35
#: The first loss of a K-class cross-entropy on near-uniform outputs, as a share of ln K.
_UNIFORM_LOSS_SHARE = (0.8, 1.25)


def _softmax_in_the_loss(trace: Trace, logits_module: str) -> tuple[str, int] | None:
    """``("Softmax", K)`` when a softmax stands between the model's logits and its loss.

    ``loss_fn(F.softmax(model(x), dim=1), y)``: the model returns logits, so the capture
    reads no probabilities, but the loss receives them. Its mark is the softmax's Jacobian
    on the logits' first gradient, 1/K of what a cross-entropy on them gives
    (:attr:`RunFacts.output_grad_power` near -1), with a first loss near ``ln K`` (a
    cross-entropy over K classes). A K-class output of K >= 4 only; None otherwise. A
    healthy digits MLP reads 0.0; the softmax fed to ``CrossEntropyLoss`` -1.00.
    """
    k = output_width(trace.meta)
    steps = trace.steps
    if not (k >= _GRAD_POWER_MIN_CLASSES and logits_module
            and len(steps) and "loss" in steps):
        return None
    share = float(steps["loss"].iloc[0]) / math.log(k)
    power = _output_grad_power(trace, k, logits_module)
    low, high = _UNIFORM_LOSS_SHARE
    if low <= share <= high and abs(power + 1.0) <= _SOFTMAX_POWER_TOLERANCE:
        return SOFTMAX_OUTPUTS[0], k
    return None


def _output_grad_power(trace: Trace, k: int, logits_module: str) -> float:
    """:attr:`RunFacts.output_grad_power` (see there)."""
    rows = output_rows(trace.meta)
    stats = trace.stats
    if k < _GRAD_POWER_MIN_CLASSES or not rows or not logits_module or not len(stats) \
            or "out_grad_norm" not in stats:
        return math.nan
    grad = stats.loc[stats["module_name"] == logits_module, "out_grad_norm"].to_numpy(float)
    grad = grad[np.isfinite(grad) & (grad > 0)]
    if not len(grad):
        return math.nan
    return float(math.log(grad[0] / math.sqrt((1.0 - 1.0 / k) / rows)) / math.log(k))


def _output_floor(trace: Trace, states: StateTable, win: FactWindows, output_type: str,
                  width: int, logits_module: str) -> _OutputFloor:
    """:attr:`RunFacts.output_floor_gap`, ``output_floor_step`` and ``output_grad_power``.

    ``width`` is the classes the model's output rows spread over when the capture read
    them (:func:`neuraldbg.model_output.output_function`), else the fan-out of the layer
    feeding the softmax module; ``logits_module`` the layer that makes the logits.
    """
    out: _OutputFloor = {"output_floor_gap": math.nan, "output_floor_step": None,
                         "output_grad_power": math.nan}
    if output_type in _SIGMOID_OUTPUTS:
        k = 2  # the floor only: a loss under it is not a logits loss on these values
    elif output_type in SOFTMAX_OUTPUTS:
        k = width
        out["output_grad_power"] = _output_grad_power(trace, k, logits_module)
    else:
        return out
    steps = trace.steps
    loss = steps["loss"].to_numpy(dtype=float)
    fin = np.isfinite(loss)
    n = int(fin.sum())
    if k < 2 or n < 2 * win.edge_min_steps:
        return out
    floor = math.log1p((k - 1) / math.e)
    end = max(win.edge_min_steps, n // win.edge_share)
    gap = (float(np.median(loss[fin][-end:])) - floor) / floor
    near = np.flatnonzero(fin & (loss <= floor * (1.0 + states.config.output_floor_gap)))
    out["output_floor_gap"] = gap
    if output_type in SOFTMAX_OUTPUTS:
        out["output_floor_step"] = int(steps["step"].iloc[near[0]]) if len(near) else None
    return out


def _first_step_scales(trace: Trace, states: StateTable, weight: np.ndarray, rows: np.ndarray,
                       win: FactWindows) -> _Scales:
    """Init gain, depth gain, input rms and loss scale at the first recorded step."""
    if not (len(rows) and len(states.module_names)):
        return _Scales()
    r = int(rows[0])
    rms = _rms(states, r)
    std = states.measures["act_std"][r]
    ok = states.measures["observed"][r] & np.isfinite(rms) & (rms > 0)
    idx = np.flatnonzero(weight)
    # Gain std(out)/rms(in): with random weights E[Wx] = 0, so std(out) carries the
    # whole input signal while a constant bias (which moves only the mean) is ignored.
    # The std is taken over the batch and the layer's units together, so each unit's own
    # offset (its bias, the mean input through its weights) adds to it: over many units
    # that spread is small beside the signal, over a few (a 4-class head) it can rule it
    # (a default-init LSTM's head read 2.2x the default gain). Such a layer measures no gain
    # (one whose width the trace does not hold, 0, still does).
    units = _fan_out(trace, states)
    gains = [std[j] / rms[j - 1] for j in idx[1:] if ok[j] and ok[j - 1]
             and not 0 < units[j] < states.config.gain_min_units]
    init_gain = float(np.median(gains)) if gains else float("nan")
    good = [j for j in idx if ok[j]]
    depth_gain = float(rms[good[-1]] / rms[good[0]]) if len(good) >= 2 else float("nan")
    return _Scales(init_gain=init_gain, n_gain_pairs=len(gains),
                   input_rms=_input_rms(states, idx, ok, rms, std, init_gain,
                                        model_input_rms(trace.meta)),
                   depth_gain=depth_gain, loss_scale_ratio=_loss_scale_ratio(trace, rms, win))


def _fan_out(trace: Trace, states: StateTable) -> np.ndarray:
    """Output units of each module of ``states`` (its ``fan_out``; 0 where not known)."""
    mods = trace.modules.set_index("module_name")
    if "fan_out" not in mods:
        return np.zeros(len(states.module_names), dtype=int)
    fan_out = mods["fan_out"]
    return np.array([int(fan_out.get(name, 0)) for name in states.module_names], dtype=int)


def _input_rms(states: StateTable, idx: np.ndarray, ok: np.ndarray, rms: np.ndarray,
               std: np.ndarray, init_gain: float, given: float) -> float:
    """Estimated rms of the network input, from the first weight layer ``idx[0]``.

    A recurrent layer first (a weighted one, or one the weight types leave out) bounds its
    output (a GRU fed values in the thousands puts out +-1), which then says nothing of the
    input: its input is the one the capture read, ``given``
    (:func:`neuraldbg.model_output.input_rms`; NaN when unread).
    """
    if not len(idx):
        return float("nan")
    if recurrent_in_front(states.module_types, int(idx[0])):
        return given
    fams = states.families
    j0 = int(idx[0])
    if j0 == 1 and ok[0] and fams[0] == "other":
        return float(rms[0])  # a Flatten/reshape in front shows the input itself
    if ok[j0] and "norm" not in fams[:j0]:
        gain = (init_gain if math.isfinite(init_gain) and init_gain > 0
                else states.config.default_gain)
        return float(std[j0] / gain)
    return float("nan")


#: Optimizers that divide each step by a running scale of the gradient (class names, lower
#: case): their update ratio reads the learning rate whatever the gradient's size.
_NORMALISING_OPTIMIZERS = frozenset({
    "adam", "adamw", "adamax", "nadam", "radam", "sparseadam", "rmsprop", "adagrad",
    "adadelta", "adafactor"})


def _weight_scale(trace: Trace) -> float:
    """Linear/Conv weight scales over PyTorch's default (see :class:`RunFacts`)."""
    mods = trace.modules
    if mods.empty or "fan_in" not in mods:
        return math.nan
    table = mods.drop_duplicates("module_name").set_index("module_name")
    rms = ((trace.meta.get("weight_diversity") or {}).get("rms") or {})
    # the weight matrices' own rms at enter: PyTorch's default draws them uniform in
    # +-1/sqrt(fan_in), an rms of 1/sqrt(3 fan_in)
    ratios = [float(rms[name]) * math.sqrt(3.0 * float(fan_in))
              for name, kind, n, fan_in in zip(table.index, table["module_type"],
                                               table["n_trainable"], table["fan_in"],
                                               strict=True)
              if kind in _WEIGHT_TYPES and n > 0 and fan_in > 0
              and isinstance(rms.get(name), (int, float)) and math.isfinite(rms[name])
              and rms[name] > 0]
    if ratios:
        return float(np.median(ratios))
    stats = trace.stats
    if stats.empty or "param_norm" not in stats:
        return math.nan
    # a trace without the weights' rms (recorded before it was): the parameter norm, weights
    # and biases together, at the first recorded step
    first = stats[stats["step"] == stats["step"].min()].groupby("module_name")[
        "param_norm"].mean()
    ratios = []
    for name, kind, n, fan_in in zip(table.index, table["module_type"], table["n_trainable"],
                                     table["fan_in"], strict=True):
        if kind in _WEIGHT_TYPES and n > 0 and fan_in > 0 and name in first.index:
            norm = float(first[name])
            if math.isfinite(norm) and norm > 0:
                ratios.append(norm / math.sqrt(float(n) / (3.0 * float(fan_in))))
    return float(np.median(ratios)) if ratios else math.nan


def _first_ratio(trace: Trace, column: str) -> float:
    """``column`` / the parameter norm at the run's first step (NaN when not finite).

    ``start_grad_ratio`` and ``start_update_ratio`` of :class:`RunFacts`.
    """
    steps = trace.steps
    if steps.empty or not {column, "param_norm"} <= set(steps.columns):
        return math.nan
    value, param = float(steps[column].iloc[0]), float(steps["param_norm"].iloc[0])
    if not (math.isfinite(value) and math.isfinite(param) and param > 0):
        return math.nan
    return value / param


#: The fewest steps :attr:`RunFacts.early_weight_growth` is read over (a quarter of the run
#: when longer).
GROWTH_MIN_STEPS = 10


def _early_weight_growth(trace: Trace, weight_scale: float) -> float:
    """How far the weights grew over the run's first quarter (:class:`RunFacts`)."""
    norm = (trace.steps["param_norm"].to_numpy(dtype=float)
            if "param_norm" in trace.steps else np.array([]))
    if len(norm) < GROWTH_MIN_STEPS or not (math.isfinite(norm[0]) and norm[0] > 0):
        return math.nan
    early = norm[: max(GROWTH_MIN_STEPS, len(norm) // 4)]
    early = early[np.isfinite(early)]
    start = norm[0] / min(1.0, weight_scale) if math.isfinite(weight_scale) and weight_scale > 0 \
        else norm[0]
    return float(early.max() / start)


def _early_overshoot(trace: Trace, win: FactWindows) -> float:
    """The largest finite loss of the run's first tenth / its first finite loss.

    :attr:`RunFacts.early_overshoot`.
    """
    loss = trace.steps["loss"].to_numpy(dtype=float) if "loss" in trace.steps else np.array([])
    start = loss[: _edge(len(loss), win)]
    start = start[np.isfinite(start)]
    if len(loss) <= win.edge_min_steps or len(start) == 0 or start[0] <= 0:
        return math.nan
    return float(start.max() / start[0])


#: Recorded steps the first layer's swing (:attr:`RunFacts.input_swing`) is read over, and
#: the fewest it is read from.
SWING_STEPS = 60
SWING_MIN_STEPS = 10


def input_swing(trace: Trace, module: str) -> float:
    """How far ``module``'s output range jumps from one recorded step to the next (decades).

    :attr:`RunFacts.input_swing` of the run's first weighted layer: the 90th percentile of
    |log10| of the step-to-step ratio of its max |output| over its weights' norm, over its
    first :data:`SWING_STEPS` recorded steps with both finite and positive; NaN with fewer
    than 10.
    """
    stats = trace.stats
    if stats.empty or not {"act_max_abs", "param_norm"} <= set(stats.columns):
        return math.nan
    rows = stats[stats["module_name"] == module].sort_values("step")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (rows["act_max_abs"].to_numpy(dtype=float)
                 / rows["param_norm"].to_numpy(dtype=float))
    ratio = ratio[np.isfinite(ratio) & (ratio > 0)][:SWING_STEPS]
    if len(ratio) < SWING_MIN_STEPS:
        return math.nan
    return float(np.percentile(np.abs(np.diff(np.log10(ratio))), 90))


#: RMSprop's default smoothing constant. Its running average of squared gradients starts at
#: zero without a bias correction, so its t-th step is 1 / sqrt(1 - alpha^t) times the rate's
#: steady step: 10x at the first step, 2.3x by the 20th (Adam corrects that bias).
RMSPROP_ALPHA = 0.99


def early_step_inflation(trace: Trace, n: int) -> np.ndarray:
    """How much larger than the rate's steady step each of the first ``n`` steps was.

    ``1 / sqrt(1 - alpha^t)`` at step t under RMSprop (:data:`RMSPROP_ALPHA`, PyTorch's
    default: the trace does not record the optimizer's settings), 1 under every other
    optimizer. A new user's RMSprop at 1e-2 moved the weights by 1.2-1.3 of their norm at
    its first step, the mark of a rate too high under Adam, on runs whose clean twins train.
    """
    named = trace.meta.get("optimizer_class")
    names = [named] if isinstance(named, str) else list(named or [])
    if not names or any(str(name).lower() != "rmsprop" for name in names):
        return np.ones(n)
    t = np.arange(1, n + 1, dtype=float)
    return 1.0 / np.sqrt(1.0 - RMSPROP_ALPHA ** t)


def _step_scales_with_gradient(trace: Trace) -> bool:
    """Whether the run's optimizer steps grow with the gradient (see :class:`RunFacts`)."""
    named = trace.meta.get("optimizer_class")
    if isinstance(named, str):
        named = [named]
    if not named:
        opt = str((trace.meta.get("config") or {}).get("optimizer", ""))
        named = [opt] if opt else []
    return not named or not all(str(n).lower() in _NORMALISING_OPTIMIZERS for n in named)


def _loss_scale_ratio(trace: Trace, rms: np.ndarray, win: FactWindows) -> float:
    """First finite loss / (rms of the last module's output^2 + target variance)."""
    loss = trace.steps["loss"].to_numpy(dtype=float)
    loss = loss[np.isfinite(loss)]
    if loss.size and np.isfinite(rms[-1]):
        return float(abs(loss[0]) / (float(rms[-1]) ** 2 + win.target_variance))
    return float("nan")


def _learning_rate(trace: Trace, cfg_run: dict[str, Any]) -> float:
    """Median learning rate of the steps table, else the config's ``lr`` (NaN if neither)."""
    lr_col = (trace.steps["lr"].to_numpy(dtype=float, na_value=np.nan)
              if "lr" in trace.steps.columns else np.array([]))
    if np.isfinite(lr_col).any():
        return float(np.nanmedian(lr_col))
    try:
        return float(cfg_run.get("lr", "nan"))
    except (TypeError, ValueError):
        return float("nan")


def _grad_clip(cfg_run: dict[str, Any]) -> float | None:
    """The configured gradient-clipping norm (``grad_clip`` or ``clip_grad_norm``), or None."""
    clip = cfg_run.get("grad_clip", cfg_run.get("clip_grad_norm"))
    try:
        return float(clip) if clip not in _NO_CLIP else None
    except (TypeError, ValueError):
        return None


def _init_scale(cfg_run: dict[str, Any], init_gain: float) -> float:
    """``init_gain`` / the gain of the init scheme the config names (NaN if none or unknown)."""
    init_cfg = cfg_run.get("init")
    scheme = str(init_cfg.get("scheme", "") if isinstance(init_cfg, dict) else init_cfg or "")
    expected = SCHEME_GAINS.get(scheme.lower())
    return init_gain / expected if expected else float("nan")


def _has_normalization(fams: list[str], cfg_run: dict[str, Any]) -> bool:
    """A normalization layer in the model, or one named by the config."""
    norm_cfg = str(cfg_run.get("normalization", "")).lower()
    return any(f == "norm" for f in fams) or norm_cfg in ("batch", "layer")


class _Symmetry(TypedDict):
    row_diversity: float
    symmetric_modules: tuple[str, ...]


def _symmetry(trace: Trace, row_diversity_low: float) -> _Symmetry:
    """``row_diversity`` and ``symmetric_modules`` from ``trace.meta["weight_diversity"]``."""
    rec = trace.meta.get("weight_diversity") or {}
    mods = rec.get("modules") or {}
    # at enter and at the latest flush; a run whose weights went non-finite keeps its
    # value at enter (the symmetry of an initialisation is read there)
    ends = {name: max(f) for name, v in mods.items() if v
            for f in [[x for x in (v[0], v[-1])
                       if isinstance(x, (int, float)) and math.isfinite(x)]] if f}
    if not ends:
        return {"row_diversity": math.nan, "symmetric_modules": ()}
    return {"row_diversity": float(min(ends.values())),
            "symmetric_modules": tuple(n for n, d in ends.items()
                                       if d < row_diversity_low)}


def _blocked(trace: Trace, states: StateTable, min_steps: int) -> tuple[str, ...]:
    """Trainable, called modules that never got a gradient while others did.

    All of them when no module's output got a gradient in ``min_steps`` or more recorded
    steps whose loss was finite.
    """
    m = states.measures
    n_train = _n_trainable(trace, states)
    called = np.nan_to_num(m["calls"], nan=0.0).sum(axis=0) > 0
    out_g = m["out_grad_norm"]
    par_g = np.nan_to_num(m["param_grad_norm"], nan=0.0)
    no_out = ~np.isfinite(out_g).any(axis=0)
    no_par = (par_g == 0).all(axis=0)
    trainable = called & (n_train > 0)
    # steps whose loss was finite: a NaN loss back-propagates NaN, which reads as no gradient
    # (a batch carrying NaN at step 0 is not a loss computed on detached outputs)
    steps = trace.steps
    finite_loss = np.isin(states.steps,
                          steps["step"].to_numpy()[np.isfinite(steps["loss"].to_numpy(float))])
    if (trainable.any() and not np.isfinite(out_g[finite_loss]).any()
            and finite_loss.sum() >= min_steps):
        # no module's output ever received a gradient: the loss does not reach the network
        # (computed on ``outputs.detach()``); parameter gradients, if any, come from a term
        # on the weights themselves (an L2 penalty), which trains nothing
        return tuple(n for n, b in zip(states.module_names, trainable, strict=True) if b)
    blocked = trainable & no_out & no_par
    learning = trainable & ~blocked & (par_g > 0).any(axis=0)
    if not learning.any() or len(states.steps) == 0:
        return ()
    return tuple(n for n, b in zip(states.module_names, blocked, strict=True) if b)


def _edge(n: int, win: FactWindows) -> int:
    """Steps in the start or the end of a run of ``n`` steps."""
    return max(win.edge_min_steps, n // win.edge_share)


def _grad_accumulation(states: StateTable, weight: np.ndarray, win: FactWindows) -> float:
    """Late over early ratio of parameter-gradient to output-gradient norm.

    The median over weight layers; NaN with fewer than ``win.min_growth_steps`` recorded
    steps.
    """
    m = states.measures
    n = len(states.steps)
    if n < win.min_growth_steps or not weight.any():
        return math.nan
    with np.errstate(all="ignore"):
        ratio = m["param_grad_norm"][:, weight] / m["out_grad_norm"][:, weight]
    ratio = np.where(np.isfinite(ratio) & (ratio > 0), ratio, np.nan)
    k = _edge(n, win)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        growth = np.nanmedian(ratio[-k:], axis=0) / np.nanmedian(ratio[:k], axis=0)
    growth = growth[np.isfinite(growth)]
    return float(np.median(growth)) if growth.size else math.nan


def _sound_grad_norms(trace: Trace) -> np.ndarray:
    """The global gradient norms of the steps before the first non-finite or zero one."""
    g = trace.steps["grad_norm"].to_numpy(dtype=float) if "grad_norm" in trace.steps \
        else np.zeros(0)
    ok = np.isfinite(g) & (g > 0)
    return g[:int(np.argmin(ok)) if not ok.all() else len(g)]


def _grad_growth(trace: Trace, n_steps: int, win: FactWindows) -> tuple[float, float, float]:
    """Growth of the global gradient norm: (power-law exponent, R^2, share of steps grown).

    Over the first ``n_steps`` steps before any non-finite or zero norm.
    """
    g = _sound_grad_norms(trace)
    n = min(len(g), n_steps)
    if n < win.min_growth_steps:
        return (math.nan, math.nan, math.nan)
    y = np.log(g[:n])
    if float(y.var()) <= win.flat_log_variance:
        return (0.0, 0.0, 0.0)

    def fit(x: np.ndarray) -> tuple[float, float]:
        coef = np.polyfit(x, y, 1)
        return float(coef[0]), float(1.0 - np.var(y - np.polyval(coef, x)) / np.var(y))

    exponent, power_fit = fit(np.log(np.arange(n, dtype=float) + 1.0))
    return (exponent, power_fit, float(np.mean(np.diff(g[:n]) > 0)))


def _output_dead(states: StateTable, last: int) -> float:
    """Largest dead share of the output module ``last`` when it is a rectifier, else NaN."""
    if not states.families or states.families[last] != "relu":
        return math.nan
    dead = states.measures["act_frac_dead"][:, last]
    dead = dead[states.measures["observed"][:, last] & np.isfinite(dead)]
    return float(dead.max()) if len(dead) else math.nan


#: A fall of the loss (:attr:`RunFacts.grad_kept`): to this share of the step before's or less.
LOSS_FALL = 0.5
#: The global gradient norm kept this share of its value or more across such a fall.
GRAD_KEPT = 0.9


def _grad_kept(trace: Trace) -> tuple[float, float, float]:
    """(loss falls, share the gradient norm kept, its growth): :attr:`RunFacts.grad_kept`."""
    g = _sound_grad_norms(trace)
    if "loss" not in trace.steps or len(g) < 6:
        return (math.nan, math.nan, math.nan)
    loss = trace.steps["loss"].to_numpy(dtype=float)[:len(g)]
    sound = np.isfinite(loss) & (loss > 0)
    n = int(np.argmin(sound)) if not sound.all() else len(loss)
    loss, g = loss[:n], g[:n]
    falls = loss[1:] <= LOSS_FALL * loss[:-1]
    if n < 6 or not falls.any():
        return (math.nan, math.nan, math.nan)
    kept = float(np.mean(g[1:][falls] >= GRAD_KEPT * g[:-1][falls]))
    return (float(falls.sum()), kept, float(g.max() / np.median(g[:5])))


def _grad_resets(trace: Trace, fall: float) -> tuple[float, float, float, float]:
    """Periodic falls of the global gradient norm: (period, falls on it, their share, grown).

    Over the steps before any non-finite or zero norm. A gradient that is reset only every
    k optimizer steps grows like a running sum between resets and falls back at each: the
    falls land on one period, and the norm grows on most steps. A fall is a step whose norm
    is ``fall`` times the step before's or less (``ThresholdConfig.grad_reset_fall``).
    """
    g = _sound_grad_norms(trace)
    ratio = g[1:] / g[:-1]
    falls = np.flatnonzero(ratio <= fall) + 1
    if len(falls) < 2:
        return (math.nan, math.nan, math.nan, math.nan)
    gaps, counts = np.unique(np.diff(falls), return_counts=True)
    period = int(gaps[np.argmax(counts)])
    on_period = int(np.sum((falls - falls[0]) % period == 0))
    return (float(period), float(on_period), on_period / len(falls),
            float(np.mean(ratio > 1.0)))


def _loss_improved(trace: Trace, win: FactWindows) -> bool:
    """The loss ends below where it began (a non-finite end is no improvement)."""
    loss = trace.steps["loss"].to_numpy(dtype=float)
    k = win.edge_min_steps
    if len(loss) <= k or not np.isfinite(loss[:k]).any():
        return True
    start = float(np.nanmean(np.where(np.isfinite(loss[:k]), loss[:k], np.nan)))
    tail = loss[-_edge(len(loss), win):]
    if not np.isfinite(tail).all():
        return False
    return float(tail.mean()) < start
