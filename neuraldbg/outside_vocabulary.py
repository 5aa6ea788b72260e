"""Bugs a trace shows that no cause in the vocabulary names: cause ``unknown`` and a hint.

A model whose weights never moved (:func:`frozen_weights`: the same parameter norm at every
recorded step) cannot have learned, and no cause in the vocabulary is a knob that would fix
it: the gradient never reached the optimizer step (``loss.backward()`` forgotten, or
``zero_grad()`` between it and the step), or the optimizer holds parameters other than the
model's. Every method's verdict on such a run becomes the stall with cause ``unknown`` and a
hint of what to check (:func:`claim_unknown`): a learning-rate story there sends the user
after a knob that cannot help. Likewise BatchNorm layers that do not normalise at the first
step (:func:`batchnorm_not_normalising`: the model trains in ``eval()`` mode) explain a
failure no cause in the vocabulary names: the failure a method claims keeps its type, with
cause ``unknown`` and the hint (:func:`name_cause_unknown`). So does a learning rate too low
claimed under a gradient norm pinned at one value (:func:`gradient_norm_pinned`: a
``clip_grad_norm_`` that caps every step keeps every update at the rate times the clip): the
clip, not the rate, is what to change. (A rate far too high under a clip that binds at every
step is still the rate.) And weights that collapsed toward zero (:func:`weights_collapsed`:
a weight decay or an L2 penalty far stronger than the data's gradient) leave update ratios
that look like a rate too high: the failure is claimed with cause ``unknown`` and the hint.
So do modules whose gradients no optimizer step applies (:func:`parameters_outside_optimizer`:
an optimizer built from part of the model), whose gradients pile up as if ``zero_grad()``
were missing. And a stall claimed behind weighted layers frozen on purpose
(:func:`frozen_layers_upstream`: ``requires_grad=False`` on the first layers) may be the
frozen features, which no knob in the vocabulary changes: the stall keeps its type, with
cause ``unknown`` and a hint that names them. So is a stall or dead units claimed behind a
layer of one or two units that every prediction passes through (:func:`narrow_layer`: a
model too small for the task, not bad data or a bias), and a failure claimed under dropout
that zeroes most of the units (:func:`heavy_dropout`: ``nn.Dropout(p=0.9)``, TensorFlow's
``keep_prob`` read the other way round), which no learning rate fixes, and a failure
claimed while the loss passed exactly no gradient to the model's output
(:func:`output_gradient_zero`: a clamp on outputs that saturated). A loss that fell through
zero faster the further it went (:func:`loss_unbounded_below`: ``BCEWithLogitsLoss`` on
real-valued targets) is a failure whether or not a method claims one: every method's verdict
becomes a ``loss_divergence`` with cause ``unknown`` and the hint
(:func:`claim_unbounded_loss`).

These are facts of the trace, not any method's opinion, so :func:`neuraldbg.explain` applies
them to every method's answer.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from neuraldbg.records import Hypothesis
from neuraldbg.sufficiency import MIN_STEPS, as_recorded, hedge, loss_ends, output_module
from neuraldbg.thresholds import ThresholdConfig
from neuraldbg.trace import Trace
from neuraldbg.trace_memo import memoized

__all__ = ["FROZEN_CONFIDENCE", "NO_GRADIENT_HINT", "NO_STEP_HINT", "OTHER_PARAMETERS_HINT",
           "PINNED_SHARE", "PINNED_TOLERANCE", "COLLAPSE_FACTOR", "frozen_weights",
           "claim_unknown", "gradient_norm_pinned", "weights_collapsed", "batchnorm_off_factor",
           "batchnorm_off",
           "batchnorm_not_normalising", "batchnorm_hint", "name_cause_unknown",
           "parameters_outside_optimizer", "NEVER_RUN_SHARE", "NEVER_RUN_LEARNED",
           "modules_never_run",
           "frozen_layers_upstream", "HEAVY_DROPOUT",
           "heavy_dropout", "NARROW_UNITS", "narrow_layer", "ZERO_GRADIENT_SHARE",
           "output_gradient_zero", "cause_outside_vocabulary", "UNBOUNDED_FALL",
           "UNBOUNDED_MIN_STEPS", "loss_unbounded_below", "claim_unbounded_loss"]

#: Confidence of the stall claimed for a model whose weights never moved over at least
#: :data:`MIN_STEPS` steps. Not 1: the parameter norm is a float32 sum, and updates below its
#: last bit would not show in it.
FROZEN_CONFIDENCE = 0.9
#: Share of the steps whose global gradient norm lies within :data:`PINNED_TOLERANCE`
#: (relative) of its median for the norm to count as pinned by a clip. Unclipped norms move
#: by percents from one minibatch to the next; a norm clipped to ``c`` is ``c (1 - 1e-6)``.
PINNED_SHARE = 0.9
PINNED_TOLERANCE = 1e-3
#: The global parameter norm at the end of a run this small a share of its start or less:
#: the weights collapsed. Of 1,175 runs (the zoo's and three new-user probes'), those under a
#: weight decay far too strong end at 0.21-0.25 (AdamW at weight_decay=50, whose norm falls
#: 9.4 -> 1.2 and drifts back to 2.0) or under 0.01 (SGD at 1.0); every other run at 0.90 or
#: more (a constant-init Transformer 0.90; 0.93 the least of the zoo's).
COLLAPSE_FACTOR = 0.5
#: A BatchNorm layer whose parameter norm is within this (relative) of ``sqrt(n_params / 2)``
#: is still at its initial weight 1 and bias 0 (the first step measures it before any update).
_AT_INIT = 0.01
#: A train-mode BatchNorm layer puts out exactly the mean square its affine parameters set,
#: ``(||weight||^2 + ||bias||^2) / channels``, whatever its input (each channel is normalised
#: on the batch). Its outputs this many times off that scale (as the median over the layers,
#: either way) at every recorded step from some step on, after steps within it, and at least
#: :data:`BATCHNORM_SWITCH_STEPS` of them: the layers stopped normalising there (the model
#: went to ``eval()`` for a validation pass and never came back). Healthy runs stay within
#: 1.06 at every step (164 runs with BatchNorm: the zoo's and user-style probes'; a
#: pretrained BatchNorm kept in eval() on purpose drifts off as the layers before it train);
#: a CNN left in eval() after step 32 read 1.15-1.25 from that step on, 6-1e5 as it blew up.
BATCHNORM_SWITCH = 1.1
#: Fewest recorded steps off the scale, to the end of the finite run, for a switch.
BATCHNORM_SWITCH_STEPS = 3
#: Share of the recorded steps (finite loss) at which the loss passed exactly no gradient to the
#: model's output for :func:`output_gradient_zero`: a loss on outputs clamped to [0, 1] once
#: every output saturated (0 from the third step of 300 on a new user's binary classifier).
ZERO_GRADIENT_SHARE = 0.9
#: A dropout rate this high or higher zeroes most units at every training step and scales the
#: rest by ``1 / (1 - p)`` (10x at 0.9): a digits CNN with ``nn.Dropout(0.9)`` after each
#: block ends at chance at any learning rate (0.005 to 0.05), and both methods blamed the
#: rate (0.75-0.98). Rates of 0.5 and under are the usual ones.
HEAVY_DROPOUT = 0.8
#: A hidden weighted layer this narrow or narrower (units or channels), read by a layer that
#: takes that few inputs, passes each sample through a handful of numbers: a digits CNN whose one
#: convolution has a single channel stalls near chance (2.5 -> 2.3), and both methods named
#: the data (0.84-0.97) where the same data and loop reach 99% with 16 channels.
NARROW_UNITS = 2
#: The last quarter of a loss with no lower bound fell by this share of the level it fell
#: from or more (:func:`loss_unbounded_below`). Of 1,215 runs (the zoo's and three new-user
#: probes'), six ended below zero: ``BCEWithLogitsLoss`` on standardised real-valued targets
#: (0.64-0.75 -> -186 to -208, quarters falling by 5-7, 32-36 and 99-114) and a Gaussian
#: likelihood with a learned variance (0.4-0.6 -> -0.6 to -0.75, quarters falling by
#: 0.36-0.45, 0.19-0.24 and 0.12-0.17: slowing).
UNBOUNDED_FALL = 0.1
#: Fewest finite losses :func:`loss_unbounded_below` reads: four quarters of five steps.
UNBOUNDED_MIN_STEPS = 4 * MIN_STEPS
#: What :func:`frozen_weights` tells the user when no gradient reached any optimizer step.
NO_GRADIENT_HINT = ("the weights never moved and no gradient was there when the optimizer "
                    "stepped, at any step: is loss.backward() called, and before "
                    "optimizer.step() with no optimizer.zero_grad() between the two?")
#: ... and when an optimizer was given to the capture but no step of it was ever measured.
NO_STEP_HINT = ("the optimizer given to NeuralDbg never stepped, so no weight moved: is "
                "optimizer.step() called, and on that optimizer?")
#: ... and when gradients were there but the optimizer updated none of the model's weights.
OTHER_PARAMETERS_HINT = ("gradients flowed but no optimizer step changed the model's weights: "
                         "the optimizer holds other parameters (was the model re-created, or "
                         "its parameters replaced, after the optimizer was built?)")



def frozen_weights(trace: Trace, min_steps: int = MIN_STEPS) -> str | None:
    """What to check when the model's weights never moved, or ``None`` when they did.

    When an optimizer was given to the capture and none of its steps was measured over
    ``min_steps`` steps or more, with the loss finite, it never stepped (:data:`NO_STEP_HINT`).
    Otherwise the weights did not move when the global parameter norm is the same number at
    every step that measured it (``min_steps`` or more). Then either no step had a gradient to
    apply (the global gradient norm is zero or unmeasured at every step, the loss finite:
    :data:`NO_GRADIENT_HINT`), or every step had one (finite, non-zero) and yet no update was
    measured (:data:`OTHER_PARAMETERS_HINT`). Non-finite gradients are neither: a
    ``GradScaler`` skips those steps on purpose, and the gradient rules read them. A rate too
    small to change a float32 weight has its (zero) update measured, so it is not this either.
    """
    steps = trace.steps
    if not {"param_norm", "grad_norm", "loss"} <= set(steps.columns):
        return None
    pn = steps["param_norm"].to_numpy(dtype=float)
    seen = np.isfinite(pn)
    if (trace.meta.get("optimizer_class") and len(pn) >= min_steps and not seen.any()
            and steps["grad_norm"].isna().all()
            and np.isfinite(steps["loss"].to_numpy(dtype=float)).all()):
        return NO_STEP_HINT
    if seen.sum() < min_steps or np.ptp(pn[seen]) != 0.0:
        return None
    grads = steps["grad_norm"].to_numpy(dtype=float)[seen]
    loss = steps["loss"].to_numpy(dtype=float)[seen]
    if np.isfinite(loss).all() and not (np.isfinite(grads) & (grads > 0)).any() \
            and not np.isinf(grads).any():
        return NO_GRADIENT_HINT
    updates = (steps["update_norm"].to_numpy(dtype=float)[seen] if "update_norm" in steps
               else np.full(len(grads), np.nan))
    if np.isfinite(grads).all() and (grads > 0).all() and np.isnan(updates).all():
        return OTHER_PARAMETERS_HINT
    return None


def claim_unknown(hypotheses: list[Hypothesis], reason: str, trace: Trace, *,
                  failure_type: str = "training_plateau",
                  origin: tuple[str, int] | None = None,
                  root_cause: str = "unknown") -> list[Hypothesis]:
    """A failure the trace shows, claimed with cause ``unknown`` (or ``root_cause``).

    By default the stall of a model that never moved.

    Without ``origin``, the method's strongest hypothesis of ``failure_type`` (or, when it
    gave none, a new one from the trace's first module and step) becomes the top one with
    ``root_cause="unknown"``; with ``origin`` (layer, step), a new one from there. It gets
    :data:`FROZEN_CONFIDENCE` or the method's top confidence when higher, and
    ``metadata["hint"] = reason``. Every other hypothesis is hedged below 0.5
    (:func:`hedge`), so no knob is claimed.
    """
    ranked = sorted(hypotheses, key=lambda h: -h.confidence)
    failure = (next((h for h in ranked if h.failure_type == failure_type), None)
               if origin is None else None)
    confidence = max([FROZEN_CONFIDENCE] + [h.confidence for h in ranked[:1]])
    if failure is None:
        layer, step = origin or (str(next(iter(trace.module_names), "")),
                                 int(trace.steps["step"].min()))
        failure = Hypothesis(failure_type=failure_type, root_cause=root_cause,
                             origin_layer=layer, origin_step=step, confidence=confidence)
    claim = dataclasses.replace(failure, root_cause=root_cause, confidence=confidence,
                                metadata={**failure.metadata, "hint": reason})
    return [claim] + hedge([h for h in ranked if h is not failure], reason)


def _finite_losses(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, losses)`` of the steps whose loss is finite, as the run recorded them.

    A usable trace's loss is measured from a floor
    (:func:`neuraldbg.sufficiency.loss_above_floor`); it is added back
    (:func:`neuraldbg.sufficiency.as_recorded`).
    """
    if "loss" not in trace.steps:
        return np.zeros(0, dtype=int), np.zeros(0)
    loss = as_recorded(trace, trace.steps["loss"].to_numpy(dtype=float))
    keep = np.isfinite(loss)
    return trace.steps["step"].to_numpy()[keep], loss[keep]


def loss_unbounded_below(trace: Trace) -> str | None:
    """What to check when the loss fell through zero without a lower bound, or ``None``.

    A loss with a floor (a cross-entropy, a squared error, the negative log-likelihood of a
    density that settles) slows as it nears it; one that fits no target (``BCEWithLogitsLoss``
    on a target above 1: the loss falls linearly in the logit) falls faster the further it
    goes. So, over at least :data:`UNBOUNDED_MIN_STEPS` finite losses split into quarters
    (medians):

    - the run ends below zero (the median of its last tenth) by the magnitude of its first
      steps (median of five) or more, and by three times the loss's step-to-step noise over
      the last quarter (median absolute difference);
    - the last quarter fell more than each quarter before it, and by
      :data:`UNBOUNDED_FALL` of the level it fell from or more.

    No knob in the vocabulary causes that.
    """
    _, loss = _finite_losses(trace)
    n = len(loss)
    if n < UNBOUNDED_MIN_STEPS:
        return None
    start = float(np.median(loss[:MIN_STEPS]))
    end = float(np.median(loss[-max(n // 10, 3):]))
    q = n // 4
    quarters = [float(np.median(loss[i * q:(i + 1) * q if i < 3 else n])) for i in range(4)]
    falls = -np.diff(quarters)
    noise = float(np.median(np.abs(np.diff(loss[3 * q:]))))
    if not (end < 0 and -end >= max(abs(start), 3.0 * noise)
            and falls[2] > max(falls[0], falls[1]) and falls[2] >= UNBOUNDED_FALL * abs(
                quarters[2])):
        return None
    return (f"the loss fell from {start:.3g} to {end:.3g}, faster the further it went: a loss "
            "with no lower bound, which a loss that fits its targets does not do. Check the "
            "loss against its targets: BCELoss or BCEWithLogitsLoss given targets outside "
            "[0, 1] (a regression target), NLLLoss on values that are not log-probabilities, "
            "a likelihood whose variance may shrink to zero, or a term subtracted without a "
            "bound")


def claim_unbounded_loss(hypotheses: list[Hypothesis], trace: Trace
                         ) -> list[Hypothesis] | None:
    """The run's ``loss_divergence`` with cause ``unknown``, or ``None``.

    When :func:`loss_unbounded_below` says the loss had no lower bound: from the network's
    output module (:func:`neuraldbg.sufficiency.output_module`), whose outputs grow to drive
    it, at the first step the loss went below zero.
    """
    hint = loss_unbounded_below(trace)
    if hint is None:
        return None
    steps, loss = _finite_losses(trace)
    onset = int(steps[int(np.argmax(loss < 0))])
    layer = output_module(trace) or str(next(iter(trace.module_names), ""))
    return claim_unknown(hypotheses, hint, trace, failure_type="loss_divergence",
                         origin=(layer, onset))


def gradient_norm_pinned(trace: Trace) -> str | None:
    """What to check when a clip capped the gradient norm at nearly every step, or ``None``.

    Pinned: over :data:`MIN_STEPS` or more measured steps, :data:`PINNED_SHARE` of the
    finite, positive global gradient norms lie within :data:`PINNED_TOLERANCE` of their
    median (``torch.nn.utils.clip_grad_norm_`` rescales every gradient above ``max_norm`` to
    it). Not when the loss is pinned as well: then the gradient did not change because
    nothing did (the whole data set as one batch, weights a rate of 1e-6 left in place: a
    graph network's gradient norm held within 1e-3 at 99% of its steps, with no clip in
    the script, and its rate too low was read as a clip too tight).
    """
    if "grad_norm" not in trace.steps:
        return None
    g = trace.steps["grad_norm"].to_numpy(dtype=float)
    g = g[np.isfinite(g) & (g > 0)]
    if len(g) < MIN_STEPS:
        return None
    c, share = float(np.median(g)), _pinned_share(g)
    if share < PINNED_SHARE or _pinned_share(_finite_losses(trace)[1]) >= PINNED_SHARE:
        return None
    return (f"the gradient norm is {c:.3g} at {share:.0%} of the steps, as a gradient clip "
            f"(clip_grad_norm_ with max_norm={c:.3g}) that caps every step makes it: each "
            "update is capped at the learning rate times that norm, so the clip, not the "
            "rate, keeps them small; is max_norm far too tight?")


def _pinned_share(values: np.ndarray) -> float:
    """Share of ``values`` within :data:`PINNED_TOLERANCE` of their median (0 when empty)."""
    if len(values) == 0:
        return 0.0
    c = float(np.median(values))
    return float(np.mean(np.abs(values - c) <= PINNED_TOLERANCE * abs(c)))


def weights_collapsed(trace: Trace) -> str | None:
    """What to check when the weights shrank toward zero, or ``None`` when they did not.

    Collapsed: over :data:`MIN_STEPS` or more measured steps, the global parameter norm at
    the end (median of the last :data:`MIN_STEPS`) is :data:`COLLAPSE_FACTOR` of the first
    one or less.
    """
    if "param_norm" not in trace.steps:
        return None
    pn = trace.steps["param_norm"].to_numpy(dtype=float)
    pn = pn[np.isfinite(pn)]
    if len(pn) < MIN_STEPS or not pn[0] > 0:
        return None
    end = float(np.median(pn[-MIN_STEPS:]))
    if end > COLLAPSE_FACTOR * pn[0]:
        return None
    shrink = pn[0] / max(end, 1e-30)
    return (f"the weights shrank from norm {pn[0]:.3g} to {end:.3g} ({shrink:.3g}x) "
            "while training, as a weight decay or an L2 penalty far stronger than the data's "
            "gradient makes them: is weight_decay (or the penalty's coefficient) too large?")


def _listed(names: list[str]) -> str:
    """The first four module names, and how many more."""
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def parameters_outside_optimizer(trace: Trace) -> str | None:
    """What to check when some weighted modules get gradients but never move, or ``None``.

    Over :data:`MIN_STEPS` or more recorded steps at which an optimizer step moved some
    module (its update measured), the modules named got a finite, non-zero gradient, had no
    update measured at any step, and kept the same parameter norm: the optimizers given to
    the capture do not hold their parameters (built from ``model.fc.parameters()``, or
    before the model grew a layer), so their gradients only pile up in ``.grad``. Parameters
    frozen on purpose (``requires_grad=False``) are not trainable and are not counted.
    """
    stats = trace.stats
    need = {"module_name", "step", "param_grad_norm", "param_norm", "update_ratio"}
    if not need <= set(stats.columns) or len(trace.modules) == 0:
        return None
    weighted = trace.modules.loc[trace.modules["n_trainable"] > 0, "module_name"].astype(str)
    stats = stats[stats["module_name"].astype(str).isin(set(weighted))]
    finite = np.isfinite(stats["update_ratio"].to_numpy(dtype=float))
    steps = np.unique(stats["step"].to_numpy()[finite])  # steps where some module moved
    if len(steps) < MIN_STEPS:
        return None
    at = stats[stats["step"].isin(steps)]
    idle = []
    for name, rows in at.groupby(at["module_name"].astype(str), sort=False):
        grad = rows["param_grad_norm"].to_numpy(dtype=float)
        norm = rows["param_norm"].to_numpy(dtype=float)
        if (np.isnan(rows["update_ratio"].to_numpy(dtype=float)).all()
                and (np.isfinite(grad) & (grad > 0)).any()
                and np.isfinite(norm).all() and np.ptp(norm) == 0.0):
            idle.append(name)
    if not idle:
        return None
    return (f"{_listed(idle)} got gradients but never moved while the optimizer stepped the rest: "
            "the optimizer does not hold their parameters (built from part of the model, "
            "e.g. model.fc.parameters(), or before a layer was added); build it from "
            "model.parameters(), or set requires_grad=False on what is frozen on purpose")


#: Share of the trainable parameters that modules which never ran with gradients must hold
#: for :func:`modules_never_run` to name them when none of them comes before the modules
#: that did run (an auxiliary head defined and left unused holds a few percent).
NEVER_RUN_SHARE = 0.5
#: ... and only while the loss ended above this share of its start: a pretrained body run
#: under no_grad by mistake still lets its head reach its task (the loss at 0.055 of its
#: start, 0.94 accuracy), where random features under a head stall (0.51-0.91).
NEVER_RUN_LEARNED = 0.25


def modules_never_run(trace: Trace) -> tuple[str, str] | None:
    """(what to check, the first module) when weights meant to train never got a gradient.

    Named: modules whose parameters an optimizer holds (their update measured, zero at
    every step) that were never called in a forward the capture records (one with
    gradients enabled) and kept their parameter norm over :data:`MIN_STEPS` or more
    recorded steps, while another trainable module was called, when

    - one of them comes before every module that ran (registration order: the layers that
      trained learned from features nothing trained; a body of 36% of the weights under
      no_grad left its head at 0.38 accuracy against 0.95), or together they hold
      :data:`NEVER_RUN_SHARE` of the trainable parameters or more;
    - and the loss ended above :data:`NEVER_RUN_LEARNED` of its start.

    Such modules run under ``torch.no_grad()``, or inside ``checkpoint(...,
    use_reentrant=True)`` on inputs that do not require a gradient, which builds no graph
    through them (a new user's two checkpointed blocks, 98% of the weights: 0.58-0.64
    accuracy against 0.85 with ``use_reentrant=False``), or the forward does not use them.
    A backbone run under ``torch.no_grad()`` on purpose, its parameters left out of the
    optimizer (a linear probe), has no update measured and is not named.
    """
    stats, mods = trace.stats, trace.modules
    need = {"module_name", "step", "calls", "param_norm", "update_ratio"}
    if not need <= set(stats.columns) or not {"n_trainable", "order"} <= set(mods.columns):
        return None
    if stats["step"].nunique() < MIN_STEPS:
        return None
    table = mods.drop_duplicates("module_name").set_index("module_name")
    n_train = table.loc[table["n_trainable"] > 0, "n_trainable"]
    rows = stats[stats["module_name"].isin(set(n_train.index))]
    by = rows.groupby("module_name")
    calls = by["calls"].sum()
    moved = by["param_norm"].agg(lambda v: np.ptp(v.to_numpy(dtype=float)))
    held = by["update_ratio"].agg(lambda v: bool(np.isfinite(v.to_numpy(dtype=float)).any()))
    never = [str(n) for n in n_train.index
             if calls.get(n, 0.0) == 0 and moved.get(n, 0.0) == 0.0 and held.get(n, False)]
    ran = [n for n in n_train.index if calls.get(n, 0.0) > 0]
    if not never or not ran:
        return None
    share = float(n_train[never].sum() / n_train.sum())
    upstream = table.loc[never, "order"].min() < table.loc[ran, "order"].min()
    if share < NEVER_RUN_SHARE and not upstream:
        return None
    loss = _finite_losses(trace)[1]
    if len(loss) < MIN_STEPS:
        return None
    first, last = loss_ends(loss)
    if not (first > 0 and last > NEVER_RUN_LEARNED * first):
        return None
    return (f"{_listed(never)} ({share:.0%} of the trainable weights) never ran in "
            "a forward that builds gradients, so no gradient reached them and they never "
            "moved: they run under torch.no_grad(), or in checkpoint(..., use_reentrant=True) "
            "on inputs that do not require a gradient (pass use_reentrant=False), or the "
            "forward does not use them"), never[0]


def frozen_layers_upstream(trace: Trace) -> str | None:
    """What to check when weighted layers before every trainable one are frozen, or ``None``.

    Frozen: the module has parameters and none of them requires a gradient. Upstream: it
    runs (``forward_order``; the registration order when no forward was seen) before the
    first module with trainable parameters. The layers that could learn then only see the
    frozen layers' features, and a stall may be theirs: an accident (``requires_grad_(False)``
    left from fine-tuning code), or features that do not carry what the task needs.
    """
    mods = trace.modules
    if not len(mods) or not {"n_params", "n_trainable"} <= set(mods.columns):
        return None
    order = mods["forward_order"].to_numpy(dtype=float) if "forward_order" in mods \
        else np.full(len(mods), -1.0)
    order = np.where(order >= 0, order, mods["order"].to_numpy(dtype=float) + len(mods))
    n_params = mods["n_params"].to_numpy(dtype=float)
    trainable = mods["n_trainable"].to_numpy(dtype=float) > 0
    if not trainable.any():
        return None
    frozen = (n_params > 0) & ~trainable & (order < order[trainable].min())
    if not frozen.any():
        return None
    names = mods.loc[frozen, "module_name"].astype(str).tolist()
    share = n_params[frozen].sum() / max(n_params.sum(), 1.0)
    return (f"layers {_listed(names)} ({share:.0%} of the weights) are frozen "
            "(requires_grad=False) and run before every layer that trains, so those layers "
            "learn from fixed features: if "
            "the frozen layers were meant to train, set requires_grad=True and give them to "
            "the optimizer; if they are frozen on purpose, their features may not carry what "
            "the task needs (unfreeze the last of them, or use a wider or pretrained "
            "extractor)")


def narrow_layer(trace: Trace) -> str | None:
    """What to check when the prediction passes through :data:`NARROW_UNITS` units or fewer.

    A module with weights and a ``units`` count of at most that, whose next weighted module
    (``forward_order``) reads that few inputs per position (its ``fan_in`` over the kernel
    size, ``fan_in * units / fan_out``): a hidden layer of one or two units, or a one-channel
    convolution under a classifier. A one-unit scorer that weights a wider signal (attention
    pooling's ``Linear(d, 1)``, whose next weighted module reads ``d``) is no bottleneck. A
    trace written before the module table's ``units`` column gives ``None``.
    """
    mods = trace.modules
    if not {"units", "forward_order", "n_params", "fan_in", "fan_out"} <= set(mods.columns):
        return None
    weighted = mods[(pd.to_numeric(mods["units"], errors="coerce") > 0)
                    & (mods["n_params"] > 0) & (mods["forward_order"] >= 0)]
    if len(weighted) < 2:
        return None
    weighted = weighted.sort_values("forward_order")
    units = weighted["units"].to_numpy(dtype=float)
    fan_in = weighted["fan_in"].to_numpy(dtype=float)
    fan_out = weighted["fan_out"].to_numpy(dtype=float)
    reads = np.where(fan_out > 0, fan_in * units / np.maximum(fan_out, 1.0), np.inf)
    narrow = (units[:-1] <= NARROW_UNITS) & (reads[1:] <= NARROW_UNITS)
    if not narrow.any():
        return None
    names = weighted["module_name"].astype(str).to_numpy()[:-1][narrow].tolist()
    return (f"every prediction passes through {_listed(names)}, with "
            f"{int(units[:-1][narrow].min())} output unit(s) or channel(s) that the next "
            "layer reads: the model may be too small for the task rather than the data or a "
            "knob at fault; widen that layer")


def output_gradient_zero(trace: Trace, min_steps: int = MIN_STEPS) -> str | None:
    """What to check when the loss passed no gradient to the model's output, or ``None``.

    The network's output module (:func:`neuraldbg.sufficiency.output_module`, the last the
    forward called) received an output gradient of exactly 0 at
    :data:`ZERO_GRADIENT_SHARE` of the recorded steps whose loss was finite (``min_steps``
    or more), while that loss was not 0: an operation between the model and the loss passes
    no gradient there (``clamp`` on outputs that saturated, ``round``, ``sign``), and no
    knob changes that. Units that died inside the network leave the
    output's own gradient alone, so they are not this.
    """
    stats, steps, last = trace.stats, trace.steps, output_module(trace)
    if last is None or "out_grad_norm" not in stats or "loss" not in steps:
        return None
    rows = stats[stats["module_name"] == last][["step", "out_grad_norm"]]
    rows = rows.merge(steps[["step", "loss"]], on="step")
    rows = rows[np.isfinite(rows["loss"].to_numpy(dtype=float))
                & np.isfinite(rows["out_grad_norm"].to_numpy(dtype=float))]
    if len(rows) < min_steps:
        return None
    zero = rows["out_grad_norm"].to_numpy(dtype=float) == 0.0
    loss = rows["loss"].to_numpy(dtype=float)
    if zero.mean() < ZERO_GRADIENT_SHARE or not (np.abs(loss[zero]) > 0).all():
        return None
    first = int(rows["step"].to_numpy()[int(np.argmax(zero))])
    return (f"the loss passed no gradient to the model's output ({last}) at {zero.sum()} of "
            f"{len(rows)} recorded steps, from step {first}, while it stayed near "
            f"{float(np.median(loss[zero])):.3g}: something between the model and the loss "
            "passes none (a clamp on outputs that saturated, a round or a sign); no "
            "learning rate fixes that. Feed the loss the raw outputs, or "
            "use the loss that takes them (BCEWithLogitsLoss for logits)")


def heavy_dropout(trace: Trace) -> str | None:
    """What to check when a dropout module zeroes :data:`HEAVY_DROPOUT` of its inputs or more.

    Read from the module table's ``dropout`` column (the module's ``p``); a trace written
    before that column gives ``None``.
    """
    mods = trace.modules
    if "dropout" not in mods.columns:
        return None
    rates = pd.to_numeric(mods["dropout"], errors="coerce").to_numpy(dtype=float)
    heavy = np.isfinite(rates) & (rates >= HEAVY_DROPOUT)
    if not heavy.any():
        return None
    names = mods.loc[heavy, "module_name"].astype(str).tolist()
    p = float(rates[heavy].max())
    return (f"dropout in {_listed(names)} zeroes {p:.0%} of the units at every training step "
            f"and scales the rest by {1 / max(1 - p, 1e-12):.3g}: p is the share dropped, "
            "not kept (TensorFlow's keep_prob is the other way round); try p <= 0.5, and "
            "check the other causes once it trains")


def batchnorm_off_factor(trace: Trace) -> float:
    """How far the BatchNorm layers were from normalising (>= 1); see :func:`batchnorm_off`."""
    return batchnorm_off(trace)[0]


def batchnorm_off(trace: Trace) -> tuple[float, int | None]:
    """How far the BatchNorm outputs were off the scale normalising sets, and from which step.

    At the first recorded step, ``exp(median over BatchNorm layers of |ln std|)``: ~1 when
    they normalise (train mode gives std 1 per channel at init, whatever the input), the
    scale of each layer's input when they run on their initial running statistics
    (``eval()``). Layers off in both directions count. Only layers still at their initial
    affine parameters (weight 1, bias 0: a parameter norm of ``sqrt(n_params / 2)``, or
    none) are read there: a pretrained layer's learned scale sets its output std in either
    mode. The step is ``None`` for that reading. When they normalised at first and stopped
    later (:func:`_batchnorm_switch`), the largest factor after the switch and the step it
    began, if that factor is larger. ``(NaN, None)`` without BatchNorm layers to read.
    Kept with the trace (:func:`neuraldbg.trace_memo.memoized`): the run facts and explain's
    hint both read it.
    """
    return memoized(trace, "batchnorm_off", lambda: _batchnorm_off(trace))


def _batchnorm_off(trace: Trace) -> tuple[float, int | None]:
    mods, stats_ = trace.modules, trace.stats
    if not len(mods) or not len(stats_) or not {"act_std", "param_norm"} <= set(stats_):
        return float("nan"), None
    bn = mods.loc[mods["module_type"].astype(str).str.contains("BatchNorm")]
    rows = stats_.loc[stats_["module_name"].isin(bn["module_name"])]
    if not len(rows):
        return float("nan"), None
    params_of = bn.set_index("module_name")["n_params"]
    first = rows.loc[rows["step"] == rows["step"].min()].set_index("module_name")
    n_params = params_of.reindex(first.index).to_numpy(float)
    with np.errstate(all="ignore"):
        at_init = (n_params == 0) | (np.abs(first["param_norm"].to_numpy(dtype=float)
                                            / np.sqrt(n_params / 2.0) - 1.0) <= _AT_INIT)
    std = first["act_std"].to_numpy(dtype=float)[at_init]
    std = std[np.isfinite(std) & (std > 0)]
    start = float(np.exp(np.median(np.abs(np.log(std))))) if std.size else float("nan")
    switch, step = _batchnorm_switch(rows, params_of)
    if math.isfinite(switch) and not start > switch:
        return switch, step
    return start, None


def _batchnorm_switch(rows: pd.DataFrame, params_of: pd.Series) -> tuple[float, int | None]:
    """The largest scale factor after the BatchNorm layers stopped normalising, and the step.

    Per recorded step, ``exp(median over layers of |ln(rms of the output / rms the affine
    parameters set)|)`` (see :data:`BATCHNORM_SWITCH`); the switch is the first step from
    which every finite factor to the end is at least :data:`BATCHNORM_SWITCH`, at least
    :data:`BATCHNORM_SWITCH_STEPS` of them, after a first step within it (a run off from
    the start is the first-step reading's). ``(NaN, None)`` without one.
    """
    channels = rows["module_name"].map(params_of).to_numpy(dtype=float) / 2.0
    with np.errstate(all="ignore"):
        scale = np.where(channels > 0,
                         rows["param_norm"].to_numpy(dtype=float) / np.sqrt(channels), 1.0)
        rms = np.hypot(rows["act_mean"].to_numpy(dtype=float),
                       rows["act_std"].to_numpy(dtype=float))
        off = np.abs(np.log(rms / scale))
    per_step = (pd.Series(off, index=rows["step"].to_numpy())
                .replace([np.inf, -np.inf], np.nan).dropna().groupby(level=0).median())
    factor = np.exp(per_step.to_numpy())
    if len(factor) <= BATCHNORM_SWITCH_STEPS or factor[0] >= BATCHNORM_SWITCH:
        return float("nan"), None
    begin = int(np.flatnonzero(factor < BATCHNORM_SWITCH)[-1]) + 1  # off from here on
    if len(factor) - begin < BATCHNORM_SWITCH_STEPS:
        return float("nan"), None
    return float(factor[begin:].max()), int(per_step.index[begin])


def batchnorm_not_normalising(trace: Trace, config: ThresholdConfig | None = None
                              ) -> str | None:
    """What to check when the BatchNorm layers did not normalise, or ``None`` when they did.

    They did not when :func:`batchnorm_off_factor` reaches ``batchnorm_std_high``.
    """
    cfg = config or ThresholdConfig()
    factor, step = batchnorm_off(trace)
    return batchnorm_hint(factor, step) if factor >= cfg.batchnorm_std_high else None


def batchnorm_hint(factor: float, step: int | None = None) -> str:
    """What to check when the BatchNorm outputs are ``factor`` times off normalising's scale.

    ``step``: the step they went off, after normalising before it (the model went to
    ``eval()`` then); ``None``: off from the first recorded step.
    """
    if step is None:
        return (f"the BatchNorm outputs are {factor:.3g}x off unit std at the first step, as "
                "when the model trains in eval() mode: is model.train() called before the "
                "training loop (after any validation)?")
    return (f"from step {step} the BatchNorm outputs are up to {factor:.3g}x off the scale "
            "normalising gives them, as when the model goes on training in eval() mode: is "
            "model.train() called again after each validation pass?")


def name_cause_unknown(hypotheses: list[Hypothesis], reason: str) -> list[Hypothesis]:
    """The failure a method claims, with cause ``unknown`` and ``metadata["hint"] = reason``.

    When the top hypothesis claims a failure (confidence >= 0.5) it keeps its failure type,
    layer, step and confidence, its cause becomes ``unknown``, and every other hypothesis is
    hedged below 0.5 (:func:`hedge`). A run no method claims is returned as it is.
    """
    ranked = sorted(hypotheses, key=lambda h: -h.confidence)
    if not ranked or ranked[0].confidence < 0.5:
        return ranked
    top = ranked[0]
    claim = dataclasses.replace(top, root_cause="unknown",
                                metadata={**top.metadata, "hint": reason})
    return [claim] + hedge(ranked[1:], reason)


def _updates_small(trace: Trace) -> bool:
    """Whether the run's median update ratio is under ``update_ratio_high``.

    A clip pinned at every step keeps the updates small only when they are: a GRU at SGD 3
    clipped at 1.0 moves its weights by 5-30% a step, and the rate is its cause.
    """
    if "update_ratio" not in trace.steps:
        return False
    u = trace.steps["update_ratio"].to_numpy(dtype=float)
    u = u[np.isfinite(u)]
    return bool(len(u)) and float(np.median(u)) < ThresholdConfig().update_ratio_high


def cause_outside_vocabulary(trace: Trace, hypotheses: list[Hypothesis]) -> str | None:
    """What to check when the trace shows a bug no cause in the vocabulary names, or None.

    Weights that collapsed (:func:`weights_collapsed`), BatchNorm layers that do not
    normalise (:func:`batchnorm_not_normalising`), modules the optimizer does not hold
    (:func:`parameters_outside_optimizer`), dropout that zeroes most units
    (:func:`heavy_dropout`), a loss that passes no gradient to the model's output
    (:func:`output_gradient_zero`), or, when the method's top hypothesis
    blames a learning rate too low or names a stall (the tiny steps a clip makes are not
    read as the rate's under SGD, nor, while the updates are small, the small gradients it
    leaves as a softmax's fed to a logits loss: a CNN under ``clip_grad_norm_(..., 1e-3)``
    was ``loss_output_mismatch`` at 0.51 for the network), a gradient norm a clip pinned at
    every step
    (:func:`gradient_norm_pinned`), or, when it claims a stall, frozen layers upstream of
    every trainable one (:func:`frozen_layers_upstream`), or, when it claims a stall or dead
    units, a hidden layer of one or two units (:func:`narrow_layer`). A model whose weights
    never moved is :func:`frozen_weights`'s.
    """
    hint = (weights_collapsed(trace) or batchnorm_not_normalising(trace)
            or parameters_outside_optimizer(trace) or heavy_dropout(trace)
            or output_gradient_zero(trace))
    top = max(hypotheses, key=lambda h: h.confidence, default=None)
    if not hint and top is not None and (
            top.root_cause == "learning_rate_too_low"
            or (top.failure_type == "training_plateau" and _updates_small(trace))):
        hint = gradient_norm_pinned(trace)  # the clip, not the rate, keeps updates small
    if not hint and top is not None and top.confidence >= 0.5 \
            and top.failure_type == "training_plateau":
        hint = frozen_layers_upstream(trace)
    if not hint and top is not None and top.confidence >= 0.5 \
            and top.failure_type in ("training_plateau", "dead_neurons"):
        hint = narrow_layer(trace)  # one unit that dies is the whole layer
    return hint
