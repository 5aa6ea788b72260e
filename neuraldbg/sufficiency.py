"""Whether a trace holds enough evidence for a verdict, and what a thin one may claim.

Every diagnosis method reads the same checked view of a trace (:func:`usable_trace`): steps
that never finished (an exception or a crash inside the step, a forward after the last
optimizer step written by an older capture) are left out, since their statistics describe a
step that did not happen. A run with fewer than :data:`MIN_STEPS` finished steps cannot be
told apart from the normal first steps of training (a loss that has not moved yet, gradients
without a baseline to compare with), so its hypotheses are kept but scaled below 0.5
(:func:`hedge`) and say why in their metadata: a thin trace gives no confident verdict.

A training plateau is a loss that stopped improving: while the loss still falls clearly at
the end of the run (:func:`still_improving`), the run has not shown one yet, whatever else
looks slow (a short run early in training), and when several optimizers step each step
(:func:`adversarial_loss`: a GAN's players, whose summed loss stays flat at equilibrium) a
flat loss is no evidence of one, so plateau hypotheses are kept below 0.5 too
(:func:`hedge_failure`).

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
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats

from neuraldbg.records import Hypothesis
from neuraldbg.thresholds import ThresholdConfig
from neuraldbg.trace import Trace

__all__ = ["MIN_STEPS", "HEDGED_CONFIDENCE", "TAIL_SHARE", "TREND_MIN_POINTS", "TREND_ALPHA",
           "usable_trace", "thin_evidence", "still_improving", "adversarial_loss",
           "plateau_unclaimable", "hedge", "hedge_failure", "FROZEN_CONFIDENCE",
           "NO_GRADIENT_HINT", "NO_STEP_HINT", "OTHER_PARAMETERS_HINT", "frozen_weights",
           "claim_unknown", "batchnorm_off_factor", "batchnorm_not_normalising",
           "batchnorm_hint", "name_cause_unknown",
           "PINNED_SHARE", "PINNED_TOLERANCE", "gradient_norm_pinned", "COLLAPSE_FACTOR",
           "weights_collapsed", "cause_outside_vocabulary"]

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
#: the weights collapsed (0.93 is the least any zoo run ends at, failing or healthy).
COLLAPSE_FACTOR = 0.1
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


def usable_trace(trace: Trace) -> Trace:
    """The trace without the steps that did not finish (``complete`` is False).

    Raises
    ------
    ValueError
        If no finished step is left: there is nothing to explain yet.
    """
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
    if len(trace.steps) == 0 or len(trace.stats) == 0:
        raise ValueError(
            "The trace holds no recorded step yet (no finished training step with "
            "statistics), so there is nothing to explain. Call dbg.step(loss) after at least "
            "one full training step (forward, backward, optimizer.step()) inside `with dbg:` "
            "before explaining.")
    return trace


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
    :data:`TREND_MIN_POINTS` losses), the loss falls when both hold: Kendall's trend test
    finds a decrease (one-sided, p < :data:`TREND_ALPHA`: a minibatch loss's noise alone does
    not pass it) and the Theil-Sen line drops by ``plateau_improvement`` or more of its start
    across that span (the share a whole run must improve by not to count as stalled).
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
    if not start > 0 or (start - end) / start < cfg.plateau_improvement:
        return None
    return (f"the loss is still falling at the end of the run ({start:.4g} -> {end:.4g} over "
            f"its last {len(tail)} steps): too early to call it a plateau")


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


def plateau_unclaimable(trace: Trace, config: ThresholdConfig | None = None) -> str | None:
    """Why no method may claim a training plateau on this run (see the module notes)."""
    return adversarial_loss(trace) or still_improving(trace, config)


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


def claim_unknown(hypotheses: list[Hypothesis], reason: str, trace: Trace
                  ) -> list[Hypothesis]:
    """The stall of a model that never moved, claimed with cause ``unknown``.

    The method's strongest ``training_plateau`` hypothesis (or, when it gave none, a new one
    from the trace's first module and step) becomes the top one with ``root_cause="unknown"``,
    at :data:`FROZEN_CONFIDENCE` or the method's top confidence when higher, and
    ``metadata["hint"] = reason``. Every other hypothesis is hedged below 0.5
    (:func:`hedge`), so no knob is claimed.
    """
    ranked = sorted(hypotheses, key=lambda h: -h.confidence)
    stall = next((h for h in ranked if h.failure_type == "training_plateau"), None)
    confidence = max([FROZEN_CONFIDENCE] + [h.confidence for h in ranked[:1]])
    if stall is None:
        first = next(iter(trace.module_names), "")
        stall = Hypothesis(failure_type="training_plateau", root_cause="unknown",
                           origin_layer=str(first), origin_step=int(trace.steps["step"].min()),
                           confidence=confidence)
    claim = dataclasses.replace(stall, root_cause="unknown", confidence=confidence,
                                metadata={**stall.metadata, "hint": reason})
    return [claim] + hedge([h for h in ranked if h is not stall], reason)


def gradient_norm_pinned(trace: Trace) -> str | None:
    """What to check when a clip capped the gradient norm at nearly every step, or ``None``.

    Pinned: over :data:`MIN_STEPS` or more measured steps, :data:`PINNED_SHARE` of the
    finite, positive global gradient norms lie within :data:`PINNED_TOLERANCE` of their
    median (``torch.nn.utils.clip_grad_norm_`` rescales every gradient above ``max_norm`` to
    it).
    """
    if "grad_norm" not in trace.steps:
        return None
    g = trace.steps["grad_norm"].to_numpy(dtype=float)
    g = g[np.isfinite(g) & (g > 0)]
    if len(g) < MIN_STEPS:
        return None
    c = float(np.median(g))
    share = float(np.mean(np.abs(g - c) <= PINNED_TOLERANCE * c))
    if share < PINNED_SHARE:
        return None
    return (f"the gradient norm is {c:.3g} at {share:.0%} of the steps, as a gradient clip "
            f"(clip_grad_norm_ with max_norm={c:.3g}) that caps every step makes it: each "
            "update is capped at the learning rate times that norm, so the clip, not the "
            "rate, keeps them small; is max_norm far too tight?")


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


def batchnorm_off_factor(trace: Trace) -> float:
    """How far the BatchNorm outputs' std is from 1 at the first recorded step (>= 1).

    ``exp(median over BatchNorm layers of |ln std|)``: ~1 when they normalise (train mode
    gives std 1 per channel at init, whatever the input), the scale of each layer's input
    when they run on their initial running statistics (``eval()``). Layers off in both
    directions count. NaN without BatchNorm or statistics.
    """
    mods, stats_ = trace.modules, trace.stats
    if not len(mods) or not len(stats_) or "act_std" not in stats_:
        return float("nan")
    bn = set(mods.loc[mods["module_type"].astype(str).str.contains("BatchNorm"),
                      "module_name"])
    rows = stats_.loc[stats_["module_name"].isin(bn)]
    if not len(rows):
        return float("nan")
    std = rows.loc[rows["step"] == rows["step"].min(), "act_std"].to_numpy(dtype=float)
    std = std[np.isfinite(std) & (std > 0)]
    return float(np.exp(np.median(np.abs(np.log(std))))) if std.size else float("nan")


def batchnorm_not_normalising(trace: Trace, config: ThresholdConfig | None = None
                              ) -> str | None:
    """What to check when the BatchNorm layers did not normalise, or ``None`` when they did.

    They did not when :func:`batchnorm_off_factor` reaches ``batchnorm_std_high``.
    """
    cfg = config or ThresholdConfig()
    factor = batchnorm_off_factor(trace)
    return batchnorm_hint(factor) if factor >= cfg.batchnorm_std_high else None


def batchnorm_hint(factor: float) -> str:
    """What to check when the BatchNorm outputs are ``factor`` times off unit std."""
    return (f"the BatchNorm outputs are {factor:.3g}x off unit std at the first step, as when "
            "the model trains in eval() mode: is model.train() called before the training "
            "loop (after any validation)?")


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


def cause_outside_vocabulary(trace: Trace, hypotheses: list[Hypothesis]) -> str | None:
    """What to check when the trace shows a bug no cause in the vocabulary names, or None.

    Weights that collapsed (:func:`weights_collapsed`), BatchNorm layers that do not
    normalise (:func:`batchnorm_not_normalising`), or, when the method's top hypothesis
    blames a learning rate too low, a gradient norm a clip pinned at every step
    (:func:`gradient_norm_pinned`). A model whose weights never moved is
    :func:`frozen_weights`'s.
    """
    hint = weights_collapsed(trace) or batchnorm_not_normalising(trace)
    top = max(hypotheses, key=lambda h: h.confidence, default=None)
    if not hint and top is not None and top.root_cause == "learning_rate_too_low":
        hint = gradient_norm_pinned(trace)  # the clip, not the rate, keeps updates small
    return hint


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
