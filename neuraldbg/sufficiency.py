"""Whether a trace holds enough evidence for a verdict, and what a thin one may claim.

Every diagnosis method reads the same checked view of a trace (:func:`usable_trace`): steps
that never finished (an exception or a crash inside the step, a forward after the last
optimizer step written by an older capture) are left out, since their statistics describe a
step that did not happen; the gradients of steps no optimizer took (a ``GradScaler`` skipping
the steps whose scaled gradients overflowed, :func:`without_skipped_gradients`) are left out
too, and the rest of those steps kept; a loss that goes below zero is measured from its own
floor (:func:`loss_above_floor`).

A run with fewer than :data:`MIN_STEPS` finished steps cannot be told apart from the normal
first steps of training (a loss that has not moved yet, gradients without a baseline to
compare with), so its hypotheses are kept but scaled below 0.5 (:func:`hedge`) and say why
in their metadata: a thin trace gives no confident verdict.

A training plateau is a loss that stopped improving: in a run of fewer than
:data:`PLATEAU_CLAIM_MIN_LOSSES` losses (:func:`too_short_to_stall`) or while the loss
still falls clearly at the end of the run (:func:`still_improving`), the run has not shown
one yet, whatever else looks slow (a short run early in training), and when several
optimizers step each step (:func:`adversarial_loss`: a GAN's players, whose summed loss
stays flat at equilibrium) a flat loss is no evidence of one, so plateau hypotheses are
kept below 0.5 too (:func:`hedge_failure`). Nor is a loss that fell early and settled at
its task's floor (:func:`fell_early_then_settled`), and an output layer that saturates
while the loss falls far is a confident prediction, not saturated activations
(:func:`confident_output`).

Bugs a trace shows that no cause in the vocabulary names are
:mod:`neuraldbg.outside_vocabulary`'s.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from scipy import stats

from neuraldbg.events import loss_dynamics, rose_after_first_update
from neuraldbg.model_output import output_function
from neuraldbg.records import Hypothesis
from neuraldbg.thresholds import ThresholdConfig
from neuraldbg.trace import Trace

__all__ = ["MIN_STEPS", "HEDGED_CONFIDENCE", "TAIL_SHARE", "TREND_MIN_POINTS", "TREND_ALPHA",
           "PLATEAU_CLAIM_MIN_LOSSES", "calm_norm_growth", "spikes_while_settled",
           "signed_stall_unclaimable",
           "usable_trace", "why_no_step", "without_skipped_gradients", "loss_above_floor",
           "without_masking_infinities", "thin_evidence",
           "learned_the_training_data", "LEARNED_DROP", "LEARNED_LOSS", "loss_ends",
           "LOSS_WINDOW_MAX", "SIGNED_LOSS_MARGIN", "SKIPPED_GRADIENT_COLUMNS",
           "still_improving",
           "adversarial_loss", "too_short_to_stall", "improved_past_a_stall",
           "fell_early_then_settled", "SETTLED_CLIMB",
           "plateau_unclaimable", "adversarial_growth", "as_recorded", "squashing_output",
           "confident_output", "output_module", "CONFIDENT_OUTPUT_DROP", "hedge",
           "hedge_failure"]

#: Fewest finished steps for a confident verdict. The State Classifier compares each layer
#: with its own early baseline (its first recorded steps) and the loss dynamics fit a trend:
#: below five points neither separates a failure from the first steps of a healthy run.
MIN_STEPS = 5
#: The highest confidence a hypothesis of a thin trace keeps (below the 0.5 of a verdict).
HEDGED_CONFIDENCE = 0.45
#: The end of a run whose trend :func:`still_improving` reads: its last third, long enough to
#: average a minibatch loss's noise and short enough to be where the run is now.
TAIL_SHARE = 1.0 / 3.0
#: Fewest losses a trend is tested on, and the level of that test (Kendall's tau, one-sided):
#: below ten points a minibatch loss's noise passes for a trend too often.
TREND_MIN_POINTS = 10
TREND_ALPHA = 0.05


def usable_trace(trace: Trace) -> Trace:
    """The trace without the steps that did not finish (``complete`` is False).

    Also without the batches the training loop threw away, and with the gradients of the
    steps no optimizer took left out (:func:`without_skipped_gradients`); a loss below zero
    is measured from its floor (:func:`loss_above_floor`), and the outputs of modules that
    mask with infinities are not read (:func:`without_masking_infinities`).

    Raises
    ------
    ValueError
        If no finished step is left: there is nothing to explain yet.
    """
    trace = without_skipped_gradients(trace)  # (marks the batches a loop threw away)
    steps = trace.steps
    if "complete" in steps and len(steps):
        done = steps["complete"].fillna(True).astype(bool).to_numpy()
        if not done.all():
            kept = set(steps.loc[done, "step"].tolist())
            trace = Trace(steps=steps.loc[done].reset_index(drop=True),
                          stats=trace.stats.loc[trace.stats["step"].isin(kept)].reset_index(
                              drop=True),
                          modules=trace.modules,
                          meta={**trace.meta, "incomplete_steps_left_out":
                                [int(s) for s in steps.loc[~done, "step"]]})
    trace = loss_above_floor(trace)
    trace = without_masking_infinities(trace)
    if len(trace.steps) == 0 or len(trace.stats) == 0:
        error = trace.meta.get("error")
        if len(steps) and error and trace.meta.get("status") == "failed":
            raise ValueError(
                f"No training step of this run finished: it raised {error} in step "
                f"{int(steps['step'].max())}, before dbg.step(loss) closed the step, so there "
                "is nothing to explain yet. The steps that finish before an exception are kept "
                "and explained: fix the error and re-run.")
        if len(steps) and "loss" in steps and steps["loss"].isna().all():
            raise ValueError(
                f"The trace's {len(steps)} steps were recorded without a loss "
                "(dbg.step() called with no argument, and no loss in the model's output), so "
                "there is nothing to explain a failure from. Pass the step's loss: "
                "dbg.step(loss).")
        on_disk = (" Read from disk, a trace whose run is marked running: "
                   f"{why_no_step(trace.meta)}." if not len(steps)
                   and trace.meta.get("status") == "running" else "")
        raise ValueError(
            "The trace holds no recorded step yet (no finished training step with "
            "statistics), so there is nothing to explain. Call dbg.step(loss) after at least "
            "one full training step (forward, backward, optimizer.step()) inside `with dbg:` "
            "before explaining." + on_disk)
    return trace


def why_no_step(meta: dict[str, Any]) -> str:
    """Why a trace holds no step, from its metadata, in words for an error message.

    A trace on disk whose run is marked ``running`` is still being written or its process
    died before the first chunk was flushed (every ``flush_every`` steps); otherwise the run
    recorded none.
    """
    if meta.get("status") == "running":
        every = meta.get("flush_every")
        return ("its run is still going, or was killed before its first write to disk"
                + (f" (one every {every} steps)" if every else "")
                + "; a run that exits, even by an exception, writes what it recorded")
    return "record at least one dbg.step(loss)"


#: Activation statistics of a module that masks with infinities: not read (NaN, or 0 counts).
_MASK_UNREAD = {"act_mean": np.nan, "act_std": np.nan, "act_max_abs": np.nan,
                "act_frac_zero": np.nan, "act_frac_dead": np.nan, "act_frac_saturated": np.nan,
                "act_nan": 0, "act_inf": 0, "calls": 0}


def without_masking_infinities(trace: Trace) -> Trace:
    """The trace with the outputs of modules that mask with infinities left unread.

    Masked logits (``logits.masked_fill(~allowed, float("-inf"))`` in a module, an action
    mask, a ``LogSoftmax`` over them) hold infinities at every step by design, while the loss
    stays finite. A module whose output held infinities and no NaN at every recorded step
    that called it (two or more), in a run whose loss is finite at every step, is such a
    mask: its activation statistics are left unread (``calls`` 0, as a module not called),
    so no method reads them as values that overflowed; ``meta["masking_modules"]`` names
    them. An overflow that comes with training shows in some steps and not the first ones.
    """
    stats, steps = trace.stats, trace.steps
    if not len(stats) or not {"act_inf", "act_nan", "calls"} <= set(stats.columns) \
            or not np.isfinite(steps["loss"].to_numpy(dtype=float)).all():
        return trace
    called = stats.loc[np.nan_to_num(stats["calls"].to_numpy(dtype=float)) > 0]
    if not len(called):  # (no module call counted: nothing masks)
        return trace
    masks = called.groupby("module_name", sort=False).apply(
        lambda rows: len(rows) >= 2 and bool((rows["act_inf"] > 0).all())
        and bool((rows["act_nan"] == 0).all()), include_groups=False)
    names = [str(n) for n, is_mask in masks.items() if is_mask]
    if not names:
        return trace
    stats = stats.copy()
    rows = stats["module_name"].isin(names)
    for column, value in _MASK_UNREAD.items():
        if column in stats:
            stats.loc[rows, column] = value
    return Trace(steps=steps, stats=stats, modules=trace.modules,
                 meta={**trace.meta, "masking_modules": names})


#: A loss that goes below zero has no floor at zero to measure its fall against: it is
#: measured from its lowest finite value less this multiple of its finite range. Measured on
#: a heteroscedastic Gaussian NLL (tests/test_loss_styles.py and a new-user probe's runs):
#: a quarter of the range reads the healthy runs (0.4 -> -1.2, a negative cosine, an NLL
#: settling around 0) as learning in the causal model itself (top 0.14), and a stalled one
#: (lr 1e-8, loss shifted below zero) as a plateau for both methods (0.63, 0.91); half a
#: range and more read the NLL settling around 0 as a plateau the stall rule then has to
#: hedge (0.45), and 5% weakens the heuristic's claim on the stall (0.51).
SIGNED_LOSS_MARGIN = 0.25


def as_recorded(trace: Trace, loss: Any) -> Any:
    """A loss value (or an array of them) of a usable trace as the run recorded it.

    :func:`loss_above_floor` measures a loss that goes below zero from its floor
    (``meta["loss_floor"]``), which is added back: what a user is told quotes the values
    they saw.
    """
    return loss + float(trace.meta.get("loss_floor", 0.0))


def loss_above_floor(trace: Trace) -> Trace:
    """The trace with a loss that goes below zero measured from its own floor.

    The diagnosis reads a loss's fall as a ratio to its start (a cross-entropy or a squared
    error falls toward zero). A loss that can be negative (the negative log-likelihood of a
    density, a negative cosine similarity, a loss with a constant dropped) has no such
    floor, and a ratio of two negative numbers reads a fall as a rise. Such a loss is
    replaced by its height above ``min(loss) - SIGNED_LOSS_MARGIN * range``, which keeps
    every difference and makes the ratios mean what they do for a non-negative loss (the
    true floor is unknown: see :data:`SIGNED_LOSS_MARGIN` for why one range below it);
    ``meta["loss_floor"]`` holds the floor subtracted (loss values in hypotheses' metadata
    are measured from it). A loss that never goes below zero is returned unchanged.
    """
    steps = trace.steps
    if "loss" not in steps or not len(steps):
        return trace
    loss = steps["loss"].to_numpy(dtype=float, na_value=np.nan)
    finite = loss[np.isfinite(loss)]
    if not finite.size or finite.min() >= 0:
        return trace
    span = float(finite.max() - finite.min()) or max(abs(float(finite.min())), 1.0)
    floor = float(finite.min()) - SIGNED_LOSS_MARGIN * span
    return Trace(steps=steps.assign(loss=loss - floor), stats=trace.stats,
                 modules=trace.modules, meta={**trace.meta, "loss_floor": floor})


#: Per-module statistics of a step's gradients, which a step no optimizer took discarded.
SKIPPED_GRADIENT_COLUMNS = ("out_grad_norm", "param_grad_norm", "update_ratio")


def without_skipped_gradients(trace: Trace) -> Trace:
    """The trace with the gradient statistics of the steps no optimizer took set to NaN.

    A ``GradScaler`` skips the optimizer step when the scaled gradients overflow (to inf or
    NaN) and lowers the scale: the early steps of a float16 run often do. Those gradients
    never reached the weights and their overflow is the scaler's business, not the model's;
    the steps' losses and activations are kept. A skipped step whose loss is non-finite
    while a later loss is finite is a batch the user's loop threw away (``if not
    torch.isfinite(loss): dbg.step(loss); continue``): its loss counts as not given
    (``complete`` False) and its module statistics are left out. A run in which no
    optimizer ever stepped (``stepped`` False throughout: ``opt.step()`` never called, or an
    optimizer that is not the one given) is returned unchanged, since that itself is the
    finding.
    """
    steps = trace.steps
    if "stepped" not in steps or not len(steps):
        return trace
    stepped = steps["stepped"].fillna(True).astype(bool).to_numpy()
    if stepped.all() or not stepped.any():
        return trace
    skipped = steps.loc[~stepped, "step"].tolist()
    stats = trace.stats.copy()
    rows = stats["step"].isin(skipped).to_numpy()
    for column in SKIPPED_GRADIENT_COLUMNS:
        if column in stats:
            stats.loc[rows, column] = np.nan
    finite = np.isfinite(steps["loss"].to_numpy(dtype=float))
    later_finite = np.append(np.logical_or.accumulate(finite[::-1])[::-1][1:], False)
    thrown = ~stepped & ~finite & later_finite
    if thrown.any() and "complete" in steps:
        steps = steps.copy()
        steps.loc[thrown, "complete"] = False
        stats = stats[~stats["step"].isin(steps.loc[thrown, "step"])].reset_index(drop=True)
    return Trace(steps=steps, stats=stats, modules=trace.modules,
                 meta={**trace.meta, "skipped_steps": [int(s) for s in skipped]})


#: A loss that ended at or below this share of its start (three decades) ...
LEARNED_DROP = 1e-3
#: ... and below this value (a cross-entropy of 0.01 puts 99% on the right class on
#: average; a squared error of 0.01 on standardised targets explains 99% of their variance)
#: has learned its training data. Both together: a loss of thousands that collapses to 2
#: (weights far too large, the zoo's init_too_large) falls three decades without learning.
LEARNED_LOSS = 1e-2


#: Most losses the run's starting and final loss are the median of (a twentieth of the run,
#: at least 1): one minibatch's loss is noisy.
LOSS_WINDOW_MAX = 20


def loss_ends(loss: np.ndarray) -> tuple[float, float]:
    """The run's starting and final loss: medians of its first and last losses.

    Over a twentieth of ``loss`` (between 1 and :data:`LOSS_WINDOW_MAX` values), which must
    be non-empty; pass the finite losses where some are not.
    """
    w = max(1, min(LOSS_WINDOW_MAX, len(loss) // 20))
    return float(np.median(loss[:w])), float(np.median(loss[-w:]))


def learned_the_training_data(trace: Trace) -> str | None:
    """Why the run's loss says it learned its training data, or ``None``.

    Every loss finite, and the final one (:func:`loss_ends`) at most :data:`LEARNED_DROP`
    of the first and below :data:`LEARNED_LOSS`: the contract's failures all stall or blow
    up the loss, and this one reached the bottom. An easy task trained to a loss of exactly
    0 (gradients of 1e-11, a softmax output one-hot) was a training plateau at 0.58 for the
    heuristic and saturated activations at 0.67 for the causal model; none of the zoo's 678
    runs ends so low.

    Or the loss started under :data:`LEARNED_LOSS` and ended there: the model fit its
    training data before the recording began (trained weights fine-tuned, a probe on a
    trained network). Fine-tuning a trained CNN with Adam at 1e-4 (loss 0.0014 -> 0.0006)
    read as a loss blow-up from a too-large init at 0.51 and as loss divergence at 0.98: a
    batch at 0.05 against a median of 0.001 is a jump of fifty, and trained weights are
    larger than an initialisation. A regression whose targets are so small that its loss
    starts under 0.01 and stalls is then missed; nothing is claimed either way.
    """
    loss = trace.steps["loss"].to_numpy(dtype=float) if "loss" in trace.steps else None
    if loss is None or len(loss) < MIN_STEPS or not np.isfinite(loss).all():
        return None
    first, last = loss_ends(loss)
    if first > 0 and last <= LEARNED_DROP * first and last < LEARNED_LOSS:
        return (f"the loss fell from {as_recorded(trace, first):.3g} to "
                f"{as_recorded(trace, last):.3g} and stayed there: the run "
                "learned its training data, and no failure stalls or blows up a loss that "
                "reached the bottom")
    if 0 <= first < LEARNED_LOSS and 0 <= last < LEARNED_LOSS:
        return (f"the loss started at {as_recorded(trace, first):.3g} and ended at "
                f"{as_recorded(trace, last):.3g}, both under "
                f"{LEARNED_LOSS:g}: the model had learned its training data before the "
                "recording began (trained weights fine-tuned), and no failure stalls or blows "
                "up a loss at the bottom")
    return None


#: A loss that ended at or below this share of its start learned enough that an output
#: layer which saturates is predicting with confidence, not stuck (see
#: :func:`confident_output`).
CONFIDENT_OUTPUT_DROP = 0.25
#: Activation families whose output layer saturates when its predictions are confident.
_SQUASHING_OUTPUTS = ("sigmoid", "softmax")


def output_module(trace: Trace) -> str | None:
    """The network's output module: the last one the forward called.

    A module the model defines and never calls (an ``nn.Sigmoid`` kept for inference, a head
    for another task) is not its output, though it comes last in
    :attr:`~neuraldbg.trace.Trace.module_names`. The last in definition order when no call
    was recorded; None without modules.
    """
    mods = trace.modules
    if not len(mods):
        return None
    if "forward_order" in mods and (mods["forward_order"] >= 0).any():
        return str(mods.loc[mods["forward_order"].idxmax(), "module_name"])
    return trace.module_names[-1]


def _output_family(trace: Trace) -> tuple[str, str] | None:
    """``(name, activation family)`` of the network's output module (:func:`output_module`)."""
    output = output_module(trace)
    if output is None or "activation_family" not in trace.modules:
        return None
    family = trace.modules.set_index("module_name")["activation_family"].astype(str)
    return output, str(family.get(output))


def squashing_output(trace: Trace) -> bool:
    """Whether the network ends in a sigmoid or softmax.

    Its last module in forward order, or a function its ``forward`` applies to the output
    (:func:`neuraldbg.model_output.output_function`).
    """
    out = _output_family(trace)
    return (out is not None and out[1] in _SQUASHING_OUTPUTS) \
        or output_function(trace.meta) is not None


def confident_output(trace: Trace, config: ThresholdConfig | None = None) -> str | None:
    """Why saturated activations may not be claimed on this run, or ``None``.

    The last module in forward order is a sigmoid or softmax, no other module's outputs
    are saturated on average (above ``sat_frac``), and the loss is finite and ended at
    :data:`CONFIDENT_OUTPUT_DROP` of its start or below (:func:`loss_ends`). An output layer
    that saturates while the loss falls that far is predicting with confidence: a
    ``Sigmoid`` under ``BCELoss`` on targets that are mostly 0 (multi-label tags,
    segmentation masks, sparse images) is near 0 for most of them by design. The twin with
    ``BCEWithLogitsLoss`` has no such layer and raised nothing; the causal model said
    saturated activations at 0.68-0.87 on a helper's healthy runs.
    """
    cfg = config or ThresholdConfig()
    stats, out = trace.stats, _output_family(trace)
    if not len(stats) or "act_frac_saturated" not in stats or out is None \
            or out[1] not in _SQUASHING_OUTPUTS:
        return None
    output, family = out
    loss = trace.steps["loss"].to_numpy(dtype=float)
    if len(loss) < MIN_STEPS or not np.isfinite(loss).all():
        return None
    first, last = loss_ends(loss)
    if not (first > 0 and last <= CONFIDENT_OUTPUT_DROP * first):
        return None
    share = stats.groupby("module_name")["act_frac_saturated"].mean()
    hidden = share.drop(index=output, errors="ignore")
    if (hidden.fillna(0.0) > cfg.sat_frac).any():
        return None
    return (f"only the output layer {output} ({family}) saturates, and the loss fell "
            f"from {first:.3g} to {last:.3g}: an output that saturates while the loss falls is "
            "a confident prediction (a sigmoid under BCELoss on mostly-zero targets), not a "
            "failure")


def thin_evidence(trace: Trace) -> str | None:
    """Why the trace is too thin for a confident verdict, or ``None`` when it is not."""
    n_steps = int(len(trace.steps))
    if n_steps < MIN_STEPS:
        return (f"only {n_steps} finished step(s) recorded; at least {MIN_STEPS} are needed to "
                "tell a failure from the first steps of training")
    recorded = trace.steps["recorded"] if "recorded" in trace.steps else None
    if recorded is not None and int(np.sum(recorded.fillna(False).astype(bool))) == 0:
        return "no step has per-module statistics (every=k larger than the run)"
    return None


def still_improving(trace: Trace, config: ThresholdConfig | None = None) -> str | None:
    """Why the loss is still falling at the end of the run, or ``None`` when it is not.

    Over the last :data:`TAIL_SHARE` of the finite losses (the whole run when that is under
    :data:`TREND_MIN_POINTS` losses), the loss falls when Kendall's trend test finds a
    decrease (one-sided, p < :data:`TREND_ALPHA`: a minibatch loss's noise alone does not
    pass it) and either the Theil-Sen line drops by ``plateau_improvement`` or more of its
    start across that span (the share a whole run must improve by not to count as stalled),
    or the whole run already improved by that share (first and last ``plateau_window``
    medians, as the heuristic's plateau rule measures it) and its end falls no slower, per
    step, than the run did on average (it is not slowing down onto a floor).
    """
    cfg = config or ThresholdConfig()
    loss = trace.steps["loss"].to_numpy(dtype=float)
    loss = loss[np.isfinite(loss)]
    tail = loss[len(loss) - int(len(loss) * TAIL_SHARE):]
    if len(tail) < TREND_MIN_POINTS:
        tail = loss
    if len(tail) < TREND_MIN_POINTS:
        return None
    x = np.arange(len(tail), dtype=float)
    if stats.kendalltau(x, tail, alternative="less").pvalue >= TREND_ALPHA:
        return None
    slope, intercept = stats.theilslopes(tail, x)[:2]
    start, end = intercept, intercept + slope * x[-1]
    if start > 0 and (start - end) / start >= cfg.plateau_improvement:
        return (f"the loss is still falling at the end of the run "
                f"({as_recorded(trace, start):.4g} -> {as_recorded(trace, end):.4g} "
                f"over its last {len(tail)} steps): too early to call it a plateau")
    # a slower fall in a run that has already improved by the share a stall may not, and
    # whose end falls at least as fast as the run did on average (a healthy run read at step
    # 30, its loss 2.30 -> 1.98 and falling faster, was a plateau at 0.92); a loss that
    # slows down onto a floor (softmax before the cross-entropy) is not kept from the rules
    window = max(1, int(round(cfg.plateau_window * len(loss))))
    first, last = float(np.median(loss[:window])), float(np.median(loss[-window:]))
    if (start > 0 and first > 0 and (first - last) / first >= cfg.plateau_improvement
            and (start - end) / start / len(tail) >= (first - last) / first / len(loss)):
        return (f"the loss fell from {as_recorded(trace, first):.4g} to "
                f"{as_recorded(trace, last):.4g} over the run and is still "
                "falling: it has not stalled")
    return None


def adversarial_loss(trace: Trace) -> str | None:
    """Why the run's loss cannot show a plateau because several optimizers share it, or None.

    Several optimizers stepping one model (``optimizer=[opt_d, opt_g]``) are most often the
    players of a game (a GAN, an actor and a critic), each minimising its own loss against
    the other: the loss logged for the step does not fall when training works.
    """
    opts = trace.meta.get("optimizer_class")
    if isinstance(opts, list) and len(opts) > 1:
        return (f"{len(opts)} optimizers step the model ({', '.join(map(str, opts))}), as the "
                "players of a GAN do: a flat loss is their equilibrium, not a plateau")
    return None


def calm_norm_growth(trace: Trace, config: ThresholdConfig | None = None) -> float | None:
    """The global gradient norm's largest value over the median of its first five, or None.

    None unless every loss and global gradient norm is finite, there are :data:`MIN_STEPS`
    steps or more, and that growth stays under ``explode_growth``: no norm blew up
    (:func:`adversarial_growth`, :func:`spikes_while_settled`).
    """
    steps = trace.steps
    if not {"grad_norm", "loss"} <= set(steps.columns):
        return None
    cfg = config or ThresholdConfig()
    g = steps["grad_norm"].to_numpy(dtype=float)
    loss = steps["loss"].to_numpy(dtype=float)
    if len(g) < MIN_STEPS or not (np.isfinite(g).all() and np.isfinite(loss).all()):
        return None
    start = float(np.median(g[:5]))
    growth = float(g.max()) / start if start > 0 else math.inf
    return growth if growth < cfg.explode_growth else None


def adversarial_growth(trace: Trace, config: ThresholdConfig | None = None) -> str | None:
    """Why gradients that grew are no explosion in a game, or ``None``.

    In a game of several optimizers (:func:`adversarial_loss`), one player's gradient grows
    from a near-zero start as the other learns (a GAN's generator gets almost none from an
    untrained discriminator): the growth of a module's norm the heuristic reads as an
    explosion (1,000x in a healthy GAN's first layer) is the game starting. It is no
    evidence of one unless a norm blew up: every loss and global gradient norm finite, and
    the global norm's largest value under ``explode_growth`` times the median of its first
    five. A new user's GANs on a 2-D ring gave 5-17x healthy and 9-92x at rates 10-100x too
    high or with a ``.detach()`` forgotten: the same signal, which both methods read as a
    rate too high at 0.69-0.90 on the healthy runs as on the failing ones.
    """
    game = adversarial_loss(trace)
    growth = calm_norm_growth(trace, config) if game else None
    if game is None or growth is None:
        return None
    return (f"{game.split(':')[0]}; one player's gradient grows from a near-zero start as the "
            f"other learns, and no norm blew up (the global gradient norm peaked at "
            f"{growth:.3g}x its start, every loss finite): judge a GAN by its samples")


#: Fewest finite losses on which any method may claim a training plateau (more than the
#: heuristic's ``plateau_min_steps``, below which it computes no stall at all): a new user's
#: healthy runs of 30 steps (an MLP under Adam at 1e-3, its loss 1.37 -> 1.24 by five-step
#: means and on to 0.46 when run on) were plateaus on 6 of 8 seeds, at 0.56-0.68 by the
#: rules and 0.90-0.91 by the causal model, one of them with a data problem as the cause.
#: The zoo's stalls run 100 steps or more.
PLATEAU_CLAIM_MIN_LOSSES = 50


def too_short_to_stall(trace: Trace, config: ThresholdConfig | None = None) -> str | None:
    """Why the run is too short to show a plateau, or ``None``.

    Fewer finite losses than :data:`PLATEAU_CLAIM_MIN_LOSSES` (or ``plateau_min_steps``,
    if larger): the first steps of a healthy run move the loss little (a momentum still
    building up, a warm-up, a rate that takes a few dozen steps to show), so no method may
    judge so short a run stalled (a healthy MLP at SGD lr 0.05 with momentum, read after 5
    to 15 steps, was a plateau at 0.97 for the causal model).
    """
    cfg = config or ThresholdConfig()
    loss = trace.steps["loss"].to_numpy(dtype=float)
    n = int(np.isfinite(loss).sum())
    least = max(cfg.plateau_min_steps, PLATEAU_CLAIM_MIN_LOSSES)
    if n >= least:
        return None
    return (f"only {n} finite losses recorded (fewer than {least}): too few "
            "to tell a stall from the first steps of training")


def improved_past_a_stall(trace: Trace, config: ThresholdConfig | None = None) -> str | None:
    """Why the run's loss fell too far to be a plateau, or ``None``.

    A stall is a loss that improved by less than ``plateau_improvement`` from its first to
    its last window (the heuristic's plateau rule, :func:`neuraldbg.events.loss_dynamics`,
    measured after an initial transient as it does). A loss that fell further and settled
    may have reached its task's floor (label noise, a hard task, soft targets whose entropy
    bounds a distillation loss): unless a cause explains that floor (a softmax before the
    cross-entropy), the trace cannot tell it from a failure, and the causal model, fitted
    on stalls that never left their start, read such runs as plateaus of unknown cause at
    0.91 (a binary task at its Bayes ceiling, its loss 0.69 -> 0.58). The lower quartile
    of the windows' losses counts too (:attr:`neuraldbg.events.LossDynamics.lower_improvement`:
    a median can sit on the batches that hold a few bad labels). ``explain`` applies it to
    a plateau claimed with ``root_cause="unknown"``.
    """
    cfg = config or ThresholdConfig()
    dyn = loss_dynamics(trace, cfg)
    if dyn.settled >= cfg.plateau_improvement:
        return (f"the loss fell by {dyn.settled:.0%} over the run, more than "
                f"the {cfg.plateau_improvement:.0%} a stall allows: it may have reached its "
                "task's floor")
    if dyn.lower_improvement >= cfg.plateau_improvement:  # (NaN: too short to tell)
        return (f"the lower quartile of the minibatch losses fell by "
                f"{dyn.lower_improvement:.0%} over the run, more than the "
                f"{cfg.plateau_improvement:.0%} a stall allows (their median "
                f"{'fell' if dyn.improvement >= 0 else 'rose'} by {abs(dyn.improvement):.0%}: "
                "some batches learn while others, a few bad labels in them, hold it)")
    return None


#: Share of its early fall a settled loss may climb back by its last window (minibatch
#: medians over a tenth of the run move by ~20% of it at a noise floor; a loss driven back up
#: by gradients that pile up, the zoo's zero_grad_per_epoch, climbs back 47%).
SETTLED_CLIMB = 0.3


def fell_early_then_settled(trace: Trace, config: ThresholdConfig | None = None) -> str | None:
    """Why the run's loss fell and then settled, too far for a stall, or ``None``.

    From its start (the median of its first three finite losses) the loss fell by at least
    twice ``plateau_improvement`` by its last window, and by ``plateau_improvement`` already
    in its second window (windows of ``plateau_window`` of the run), and its last window
    climbed back no more than :data:`SETTLED_CLIMB` of that fall above its lowest window (a
    loss that rises again, as gradients left to pile up make it, has not settled): it learned
    early, then settled at its task's floor (a small language model reaching its source's
    entropy by step 40 of 400, a task with noisy labels). The heuristic's plateau rule measures from
    its first window, which that early fall is inside of, so it read such runs as stalls at
    0.57-0.63 (the causal model at 0.77-0.91) on a helper's healthy runs. No zoo stall at
    its default severity falls more than 5% from its start.
    """
    cfg = config or ThresholdConfig()
    loss = trace.steps["loss"].to_numpy(dtype=float)
    loss = loss[np.isfinite(loss)]
    n = len(loss)
    w = max(3, int(round(cfg.plateau_window * n)))
    if n < max(cfg.plateau_min_steps, 3 * w):
        return None
    # a loss that leapt after the first update started at its first value (the fall
    # back from the leap is no learning)
    start = float(loss[0]) if rose_after_first_update(loss, w) else float(np.median(loss[:3]))
    second, end = float(np.median(loss[w:2 * w])), float(np.median(loss[-w:]))
    lowest = min(float(np.median(loss[i:i + w])) for i in range(0, n - w + 1, w))
    if not (start > 0 and (start - end) / start >= 2 * cfg.plateau_improvement
            and (start - second) / start >= cfg.plateau_improvement
            and end - lowest <= SETTLED_CLIMB * (start - lowest)):
        return None
    return (f"the loss fell from {as_recorded(trace, start):.3g} to "
            f"{as_recorded(trace, second):.3g} within its first {2 * w} steps and settled at "
            f"{as_recorded(trace, end):.3g}: the run learned, then reached its task's floor (label "
            "noise, a source's entropy); a stall does not leave its start")


def spikes_while_settled(trace: Trace, config: ThresholdConfig | None = None) -> str | None:
    """Why gradient spikes in a run whose loss goes below zero are no explosion, or ``None``.

    A loss that goes below zero (measured from its own floor, :func:`loss_above_floor`) has
    no level that says how far the run got, so the harm an explosion does to it cannot be
    read off its level. Every loss and global gradient norm finite, the norm's largest value
    under ``explode_growth`` times the median of its first five, and the loss fell early and
    settled (:func:`fell_early_then_settled`): the spikes are batches far off the rest
    (heavy-tailed targets, counts) in a run that learned. A new user's healthy Poisson
    regressions (``PoissonNLLLoss(log_input=True)``, held-out R^2 0.92-0.95, spikes 8-14x)
    were exploding gradients at 0.50 for both methods; the same runs with ``full=True``,
    which only adds a constant to the loss and keeps it above zero, were healthy. A loss
    that stays above zero keeps its level (a cross-entropy that settles at 1.3 of its 2.3
    start has not learned), and this reading does not apply to it.
    """
    cfg = config or ThresholdConfig()
    growth = calm_norm_growth(trace, cfg) if "loss_floor" in trace.meta else None
    settled = fell_early_then_settled(trace, cfg) if growth is not None else None
    if growth is None or settled is None:
        return None
    return (f"the global gradient norm spiked to {growth:.3g}x its start without growing "
            f"{cfg.explode_growth:g}x, every loss stayed finite, and {settled}: the spikes "
            "are batches far off the rest, not an explosion that harmed training")


def signed_stall_unclaimable(trace: Trace) -> str | None:
    """Why a stall of a loss that goes below zero cannot be told from a surrogate, or None.

    A loss with no floor at zero (:func:`loss_above_floor` measured it from its own) that
    does not fall while the weights move may be a surrogate that does not track progress: a
    policy gradient's ``-(r - b) log pi(a)`` hovers near zero while the policy learns (a new
    user's REINFORCE bandits at 0.95 greedy accuracy were plateaus at 0.70-0.98; logging
    ``1 - reward`` instead made them healthy; with a value head the loss left unused, a
    "blocked gradient" at 1.00). :func:`neuraldbg.methods.explain` keeps a plateau below
    0.5 on such a loss whatever its cause but a rate too low: a stall whose weights did not
    move is still claimed.
    """
    if "loss_floor" not in trace.meta:
        return None
    return ("the loss goes below zero, so it has no floor to measure a stall from, and a "
            "loss that does not fall while the weights move may be a surrogate that does "
            "not track progress (a policy gradient): pass dbg.step a measure of performance "
            "(1 - reward, a validation loss) to judge the run")


def plateau_unclaimable(trace: Trace, config: ThresholdConfig | None = None) -> str | None:
    """Why no method may claim a training plateau on this run (see the module notes)."""
    return (adversarial_loss(trace) or too_short_to_stall(trace, config)
            or still_improving(trace, config))


def hedge_failure(hypotheses: list[Hypothesis], failure_type: str,
                  reason: str) -> list[Hypothesis]:
    """:func:`hedge` applied to the hypotheses of one failure type only, then re-sorted."""
    mine = hedge([h for h in hypotheses if h.failure_type == failure_type], reason)
    rest = [h for h in hypotheses if h.failure_type != failure_type]
    return sorted(mine + rest, key=lambda h: -h.confidence)


def hedge(hypotheses: list[Hypothesis], reason: str) -> list[Hypothesis]:
    """The hypotheses scaled so the strongest stays at :data:`HEDGED_CONFIDENCE` at most.

    Their order and ratios are kept; each gets ``metadata["thin_evidence"] = reason``.
    """
    top = max((h.confidence for h in hypotheses), default=0.0)
    factor = min(1.0, HEDGED_CONFIDENCE / top) if top > 0 else 1.0
    return [dataclasses.replace(h, confidence=float(h.confidence * factor),
                                metadata={**h.metadata, "thin_evidence": reason})
            for h in hypotheses]
