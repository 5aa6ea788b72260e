"""A diagnosis in words.

The verdict, each hypothesis's evidence measured on the trace, the meaning of a what-if
answer, and why two methods disagree.

Every number said here is read from the trace (statistics at the hypothesis's origin layer,
the loss) or from the public fields of a :class:`~neuraldbg.Hypothesis` or a counterfactual
(``p_failure_factual``, ``p_failure``, ``failure_type``), never from a method's private
metadata, so the sentences stay right for any registered method. Two metadata keys are
read, both set by :func:`neuraldbg.explain` whatever the method: ``"hint"`` (what to check when
the cause is ``unknown``, or the batch or target behind ``data_problem``) and
``"thin_evidence"`` (why a suspicion was kept below 0.5), and
from a counterfactual's metadata ``"outside_vocabulary"`` (:func:`what_if_caveat`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from neuraldbg.records import HEALTHY, Hypothesis
from neuraldbg.reporting.summary import RunSummary, layer_label, module_types
from neuraldbg.stat_tables import wide_stats
from neuraldbg.trace import Trace

__all__ = ["Verdict", "TraceEvidence", "verdict", "failure_words", "cause_words",
           "sureness", "fmt_num", "fmt_factor", "evidence_sentence", "what_if_meaning",
           "what_if_caveat", "what_if_method_note", "status_words",
           "knobs_words", "disagreement"]

#: Confidence at or above which a hypothesis is a claim (the contract's line).
CLAIM = 0.5

_FAILURE_WORDS = {
    "vanishing_gradients": "vanishing gradients",
    "exploding_gradients": "exploding gradients",
    "dead_neurons": "dead neurons",
    "saturated_activations": "saturated activations",
    "loss_divergence": "a diverging loss",
    "training_plateau": "a training plateau",
    HEALTHY: "healthy training",
}
_CAUSE_WORDS = {
    "learning_rate_too_high": "the learning rate is too high",
    "learning_rate_too_low": "the learning rate is too low",
    "init_scale_too_large": "the initial weights are too large",
    "init_scale_too_small": "the initial weights are too small",
    "saturating_activation": "the activation saturates (sigmoid/tanh)",
    "negative_bias_init": "the biases start too negative",
    "unnormalized_inputs": "the inputs are not normalized",
    "missing_normalization": "the network has no normalization layers",
    "missing_gradient_clipping": "gradients are not clipped",
    "missing_zero_grad": "gradients are never reset (no zero_grad)",
    "loss_output_mismatch": "the loss does not match the model's outputs",
    "unscaled_targets": "the targets are on a scale far from the outputs",
    "symmetric_init": "the initial weights are identical (symmetric)",
    "data_problem": "the labels or data are corrupted",
    "gradient_blocked": "the gradient is cut off from some layers",
    "unknown": "the cause is unknown",
}


def failure_words(failure_type: str) -> str:
    """``exploding_gradients`` -> ``exploding gradients`` (any registered name works)."""
    return _FAILURE_WORDS.get(failure_type, failure_type.replace("_", " "))


def cause_words(root_cause: str) -> str:
    """``learning_rate_too_high`` -> ``the learning rate is too high``."""
    return _CAUSE_WORDS.get(root_cause, root_cause.replace("_", " "))


def sureness(confidence: float) -> str:
    """How sure, in words: ``very sure`` (>= 0.9), ``fairly sure`` (>= 0.7), ``unsure``."""
    if confidence >= 0.9:
        return "very sure"
    if confidence >= 0.7:
        return "fairly sure"
    return "unsure"


def status_words(status: str) -> str:
    """The capture's run status as a reader takes it.

    ``running`` on disk is a run still going, or one whose process died without a clean exit
    (killed, out of memory): nothing tells the two apart from the trace.
    """
    if status == "running":
        return "running, or killed (no clean exit was recorded)"
    return status


def fmt_num(x: float | None) -> str:
    """Three significant digits; ``nan``/``inf`` spelled out; ``-`` for None."""
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return f"{x:.3g}"


def fmt_factor(ratio: float) -> str:
    """A growth or shrink factor: ``37x``, ``10^6x``, ``10^-7x``."""
    if not math.isfinite(ratio) or ratio <= 0:
        return "an unbounded factor"
    if 1e-2 <= ratio < 1e3:
        return f"{ratio:.3g}x"
    return f"10^{round(math.log10(ratio))}x"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The run's verdict in one plain sentence.

    Attributes
    ----------
    failed : bool
        A hypothesis reached confidence 0.5.
    sentence : str
    confidence : float
        Confidence of the top hypothesis (0 when there is none).
    top : Hypothesis or None
    """

    failed: bool
    sentence: str
    confidence: float
    top: Hypothesis | None


def verdict(hypotheses: Sequence[Hypothesis], types: Mapping[str, str] | None = None
            ) -> Verdict:
    """The verdict of a ranked list of hypotheses, in one sentence.

    Parameters
    ----------
    hypotheses : sequence of Hypothesis
        Highest confidence first (any method).
    types : mapping, optional
        ``module_name -> module_type`` so the layer is named with its type.
    """
    types = types or {}
    top = max(hypotheses, key=lambda h: h.confidence, default=None)
    if top is None:
        return Verdict(False, "The run looks healthy: no failure was found.", 0.0, None)
    if top.confidence < CLAIM:
        return Verdict(False, (
            f"The run looks healthy: no failure reaches confidence {CLAIM} (the strongest "
            f"suspicion, {failure_words(top.failure_type)}, stays at {top.confidence:.2f}"
            f"{_because(top, 'thin_evidence', ': ')})."), top.confidence, top)
    where = layer_label(top.origin_layer, dict(types))
    if top.root_cause == "unknown":
        why = f"; the cause could not be determined{_because(top, 'hint', ': ')}"
    else:
        why = f", most likely because {cause_words(top.root_cause)}{_because(top, 'hint', ': ')}"
    return Verdict(True, (
        f"The run failed: {failure_words(top.failure_type)} began in {where} at step "
        f"{top.origin_step}{why} (confidence {top.confidence:.2f}, {sureness(top.confidence)})."),
        top.confidence, top)


def _because(h: Hypothesis, key: str, lead: str) -> str:
    """``lead`` and ``h.metadata[key]`` when that is a non-empty string, else nothing."""
    said = h.metadata.get(key)
    return f"{lead}{said}" if isinstance(said, str) and said else ""


class TraceEvidence:
    """Per-module statistics of one trace as dense arrays, read once for many sentences.

    Parameters
    ----------
    trace : Trace
    summary : RunSummary
    """

    _COLUMNS = ("out_grad_norm", "param_grad_norm", "act_frac_dead", "act_frac_saturated",
                "update_ratio")

    def __init__(self, trace: Trace, summary: RunSummary) -> None:
        self.trace = trace
        self.summary = summary
        self.types = module_types(trace)
        self.steps, self.names, self.tables = wide_stats(trace, self._COLUMNS)
        self.column = {name: i for i, name in enumerate(self.names)}

    def series(self, stat: str, module_name: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of one statistic of one module, finite values only."""
        col = self.column.get(module_name)
        if col is None or len(self.steps) == 0:
            return np.zeros(0, np.int64), np.zeros(0)
        v = self.tables[stat][:, col]
        ok = np.isfinite(v)
        return self.steps[ok], v[ok]

    def label(self, module_name: str) -> str:
        """Module name with its type."""
        return layer_label(module_name, self.types)


def _loss_context(s: RunSummary) -> str:
    if s.first_nonfinite_loss is not None:
        return f"the loss went non-finite ({s.first_nonfinite_loss.value}) at step " \
               f"{s.first_nonfinite_loss.step}"
    if s.loss_first is None or s.loss_last is None:
        return "no finite loss was recorded"
    if s.loss_peak is not None and s.loss_peak > 10 * max(abs(s.loss_first), 1e-12):
        # loss_first is the median of the first steps (one minibatch is noisy), which a
        # peak at the very start sits far above: say what it is
        return (f"the loss peaked at {fmt_num(s.loss_peak)} at step {s.loss_peak_step} "
                f"(median of its first steps {fmt_num(s.loss_first)}, of its last "
                f"{fmt_num(s.loss_last)})")
    change = (s.loss_last - s.loss_first) / max(abs(s.loss_first), 1e-12)
    if change > -0.05:
        return (f"the loss went from {fmt_num(s.loss_first)} to {fmt_num(s.loss_last)} "
                f"({change:+.0%}) over {s.n_steps} steps")
    return f"the loss fell from {fmt_num(s.loss_first)} to {fmt_num(s.loss_last)}"


#: Growth below which a gradient norm's rise is not said as a growth (minibatch noise moves
#: a gradient norm by a few times; an explosion by orders of magnitude).
_NOTABLE_GROWTH = 10.0


def _growth(steps: np.ndarray, vals: np.ndarray) -> tuple[float, int, int]:
    """(growth, i0, i1): the largest value from the early low on over that low."""
    k = min(5, len(vals))
    i0 = int(np.argmin(vals[:k]))
    i1 = i0 + int(np.argmax(vals[i0:]))  # never before the low point
    return float(vals[i1] / vals[i0]), i0, i1


def _exploding(ev: TraceEvidence, h: Hypothesis) -> str:
    # the output gradient's norm, or the parameters' when it grew more (gradients that pile
    # up in .grad, an overflowing input's weight gradient)
    series = []
    for stat, what in (("out_grad_norm", "gradient norm"),
                       ("param_grad_norm", "parameter gradient norm")):
        steps, vals = ev.series(stat, h.origin_layer)
        pos = vals > 0
        if pos.sum() >= 2:
            series.append((_growth(steps[pos], vals[pos]), steps[pos], vals[pos], what))
    if not series:
        return f"the gradient norm of {ev.label(h.origin_layer)} was not measured often enough"
    (growth, i0, i1), steps, vals, what = max(series, key=lambda x: x[0][0])
    if growth < _NOTABLE_GROWTH:
        return (f"the {what} of {ev.label(h.origin_layer)} stayed within {fmt_factor(growth)} "
                f"of its early low ({fmt_num(vals[i0])} at step {steps[i0]}, at most "
                f"{fmt_num(vals[i1])}) while finite")
    return (f"the {what} of {ev.label(h.origin_layer)} grew {fmt_factor(growth)} "
            f"between steps {steps[i0]} and {steps[i1]} ({fmt_num(vals[i0])} -> "
            f"{fmt_num(vals[i1])})")


def _vanishing(ev: TraceEvidence, h: Hypothesis) -> str:
    col = ev.column.get(h.origin_layer)
    if col is None or len(ev.steps) == 0:
        return f"the gradient of {ev.label(h.origin_layer)} was not measured"
    g = ev.tables["out_grad_norm"]
    top = np.where(np.isfinite(g), g, -np.inf).max(axis=1, initial=-np.inf)
    rows = ev.steps >= h.origin_step
    # a layer whose own parameters get no gradient while its output does: the gradient
    # vanished inside it (saturated units, a cut graph), whatever reached its output
    own, out = ev.tables["param_grad_norm"][rows, col], g[rows, col]
    reached = np.isfinite(own) & np.isfinite(out) & (out > 0)
    if reached.sum() and (own[reached] == 0).mean() >= 0.5:
        return (f"from step {h.origin_step} on, the parameters of {ev.label(h.origin_layer)} "
                f"received no gradient at {int((own[reached] == 0).sum())} of "
                f"{int(reached.sum())} recorded steps, although a gradient of "
                f"{fmt_num(float(np.median(out[reached])))} (median) reached its output: it "
                "vanished inside the layer")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = g[rows, col] / top[rows]
    ratio = ratio[np.isfinite(ratio) & (ratio > 0)]
    if not len(ratio):
        return f"no gradient reached {ev.label(h.origin_layer)} from step {h.origin_step} on"
    return (f"from step {h.origin_step} on, the gradient reaching {ev.label(h.origin_layer)} "
            f"was {fmt_factor(float(np.median(ratio)))} the largest gradient in the network "
            "(median)")


def _share(ev: TraceEvidence, h: Hypothesis, stat: str, noun: str, state: str) -> str:
    steps, vals = ev.series(stat, h.origin_layer)
    if not len(vals):
        return f"the {noun} of {ev.label(h.origin_layer)} were not measured"
    at = vals[steps >= h.origin_step]
    start = float(at[0]) if len(at) else float(vals[-1])
    return (f"{start:.0%} of the {noun} of {ev.label(h.origin_layer)} were {state} at step "
            f"{h.origin_step}, {float(vals[-1]):.0%} at the last recorded step")


def _divergence(ev: TraceEvidence, h: Hypothesis) -> str:
    s = ev.summary
    parts = []
    rose = (s.loss_peak is not None and s.loss_first is not None
            and s.loss_peak > _NOTABLE_GROWTH * max(abs(s.loss_first), 1e-12))
    if rose:
        parts.append(f"the loss rose from {fmt_num(s.loss_first)} to {fmt_num(s.loss_peak)} "
                     f"(step {s.loss_peak_step})")
    elif s.first_nonfinite_loss is not None:  # out of a loss that never rose: say where it was
        steps = ev.trace.steps
        before = steps[(steps["step"] < s.first_nonfinite_loss.step)
                       & np.isfinite(steps["loss"].to_numpy(dtype=float))]
        if len(before):
            parts.append(f"the loss was {fmt_num(float(before['loss'].iloc[-1]))} at step "
                         f"{int(before['step'].iloc[-1])}, having started at "
                         f"{fmt_num(s.loss_first)}")
    if s.first_nonfinite is not None:
        bad = s.first_nonfinite
        where = (bad.where if bad.module is None
                 else f"{bad.where.split(' of ')[0]} of {ev.label(bad.module)}")
        parts.append(f"the first non-finite value ({s.first_nonfinite.value}) was the "
                     f"{where} at step {s.first_nonfinite.step}")
    return "; ".join(parts) or "the loss diverged"


def _plateau(ev: TraceEvidence, h: Hypothesis) -> str:
    steps = ev.trace.steps
    ratio = steps["update_ratio"].to_numpy(dtype=float) if "update_ratio" in steps else []
    ratio = np.asarray(ratio)[np.isfinite(ratio)] if len(ratio) else np.zeros(0)
    said_by_cause = h.root_cause in ("learning_rate_too_high", "learning_rate_too_low")
    upd = (f"; a step changed the weights by {fmt_num(float(np.median(ratio)))} of their "
           "norm (median update ratio)") if len(ratio) and not said_by_cause else ""
    return _loss_context(ev.summary) + upd


def _cause_fact(ev: TraceEvidence, h: Hypothesis) -> str:
    if h.root_cause not in ("learning_rate_too_high", "learning_rate_too_low"):
        return ""
    steps = ev.trace.steps
    if "update_ratio" not in steps or len(steps) == 0:
        return ""
    before = steps[steps["step"] <= max(h.origin_step, 0)]
    ratio = before["update_ratio"].to_numpy(dtype=float)
    ratio = ratio[np.isfinite(ratio)]
    if not len(ratio):
        return ""
    lrs = steps["lr"].to_numpy(dtype=float) if "lr" in steps else np.full(1, np.nan)
    lr_txt = ""
    if np.isfinite(lrs).any():
        # the rate the run trained at, and its range when a schedule moved it (a warmup's
        # first rate is not the run's: a user read 2.5e-05 as their AdamW's 1e-3)
        lr_txt = f"learning rate {fmt_num(float(np.nanmedian(lrs)))}"
        i, j = int(np.nanargmin(lrs)), int(np.nanargmax(lrs))
        if lrs[j] > 2 * lrs[i]:
            step = steps["step"].to_numpy()
            lr_txt += (f" (from {fmt_num(float(lrs[i]))} at step {int(step[i])} to "
                       f"{fmt_num(float(lrs[j]))} at step {int(step[j])})")
    lr_txt += ": " if lr_txt else ""
    return (f"{lr_txt}a step changed the weights by {fmt_num(float(np.median(ratio)))} of their "
            "norm before the onset (median update ratio; about 1e-3 is usual)")


_EVIDENCE = {
    "exploding_gradients": _exploding,
    "vanishing_gradients": _vanishing,
    "dead_neurons": lambda ev, h: _share(ev, h, "act_frac_dead", "units",
                                         "dead (zero for the whole batch)"),
    "saturated_activations": lambda ev, h: _share(ev, h, "act_frac_saturated", "outputs",
                                                  "saturated"),
    "loss_divergence": _divergence,
    "training_plateau": _plateau,
}


def evidence_sentence(ev: TraceEvidence, h: Hypothesis) -> str:
    """What the trace shows for one hypothesis, in words, with the measured numbers.

    E.g. "the gradient norm of fc2 (Linear) grew 10^6x between steps 3 and 9 (...), while
    the loss went non-finite (nan) at step 12".
    """
    first = _EVIDENCE.get(h.failure_type)
    text = first(ev, h) if first else f"{failure_words(h.failure_type)} at step {h.origin_step}"
    if h.failure_type not in ("loss_divergence", "training_plateau"):
        text += ", while " + _loss_context(ev.summary)
    fact = _cause_fact(ev, h)
    if fact:
        text += "; " + fact
    return text[0].upper() + text[1:] + "."


def knobs_words(knobs: Mapping[str, Any]) -> str:
    """``{"lr_scale": 0.1}`` -> ``learning rate x0.1``."""
    names = {"lr_scale": "learning rate x{}", "init_scale": "initial weights x{}",
             "input_scale": "inputs x{}", "grad_clip": "gradients clipped at {}",
             "activation": "activation {}", "normalization": "normalization {}"}
    return ", ".join(names.get(k, k + "={}").format(
        fmt_num(v) if isinstance(v, float) else v) for k, v in knobs.items()) or "no change"


def what_if_caveat(metadata: Mapping[str, Any]) -> str:
    """What the user should check before trusting a counterfactual, or ``""``.

    From ``metadata`` as :func:`neuraldbg.what_if` sets it: ``"thin_evidence"``, a trace too
    short for a verdict, ``"outside_vocabulary"``, a bug the trace shows that none of the
    model's knobs or causes names, ``"cause_undetermined"``, a failure no known cause takes
    half of (a change aimed at one cause moves only its share), and ``"plateau_unclaimable"``,
    ``"saturation_unclaimable"`` or ``"explosion_unclaimable"``, a stall, a saturation or an
    explosion the model reads that :func:`neuraldbg.explain` may not claim.
    """
    notes = []
    thin = metadata.get("thin_evidence")
    if isinstance(thin, str) and thin:
        notes.append(f"Caution: {thin.rstrip('.')}. Read both probabilities as a guess: "
                     "the trace is too short for a verdict on this run.")
    said = metadata.get("outside_vocabulary")
    if isinstance(said, str) and said:
        end = "" if said.rstrip()[-1:] in ".?!" else "."
        notes.append(f"Caution: {said.rstrip()}{end} The causal model has no knob for this, so "
                     "its answer may not hold for this run.")
    stall = metadata.get("plateau_unclaimable")
    if isinstance(stall, str) and stall:
        notes.append(f"Caution: the causal model reads this run as stalled, but {stall}, so "
                     "explain does not call it a plateau: read P(failure) as the model's "
                     "reading, not a verdict.")
    undetermined = metadata.get("cause_undetermined")
    if isinstance(undetermined, str) and undetermined:
        notes.append(f"Caution: {undetermined.rstrip('.')}.")
    for key, reading in (("saturation_unclaimable", "saturated"),
                         ("explosion_unclaimable", "exploding")):
        why = metadata.get(key)
        if isinstance(why, str) and why:
            notes.append(f"Caution: the causal model reads this run as {reading}, but {why} "
                         "(explain does not claim it): read P(failure) as the model's reading, "
                         "not a verdict.")
    return " ".join(notes)


def what_if_method_note(p_factual: float, default_failed: bool) -> str:
    """A note when ``explain``'s default method and the causal model read the run apart, or ``""``.

    ``what_if`` answers with the causal model; ``neuraldbg explain`` and
    ``dbg.explain_failure()`` with the heuristic by default. Where one calls the run failed
    and the other healthy, the user is told both, and where to read each.
    """
    model_failed = p_factual >= CLAIM
    if model_failed == default_failed:
        return ""
    if model_failed:
        return (f"Note: the causal model that answers this reads the run as failed (P(failure) "
                f"{p_factual:.2f}), while explain's default method, the heuristic, finds no "
                "failure at 0.5: see explain --method probabilistic for the model's reading, "
                "and the report for both side by side.")
    return (f"Note: explain's default method, the heuristic, calls the run failed, while the "
            f"causal model that answers this gives it P(failure) {p_factual:.2f}: see explain "
            "--method probabilistic, and the report for both side by side.")


def what_if_meaning(p_before: float, p_after: float, outcome: str,
                    p_outcomes: Mapping[str, float] | None = None) -> str:
    """One consistent reading of a counterfactual: the change in P(failure) and the outcome.

    ``outcome`` is the single most likely outcome; when it is ``healthy`` while
    ``P(failure) >= 0.5`` the failure mass is split over several failure types, and the
    sentence says so instead of printing two answers that read as a contradiction.
    """
    if abs(p_after - p_before) < 0.05:
        change = f"changes little (P(failure) {p_before:.0%} -> {p_after:.0%})"
    elif p_after < p_before:
        change = f"lowers P(failure) from {p_before:.0%} to {p_after:.0%}"
    else:
        change = f"raises P(failure) from {p_before:.0%} to {p_after:.0%}"
    if p_after < CLAIM:
        result = "the run would most likely have trained healthily"
    elif outcome != HEALTHY:
        result = f"the run would most likely still fail, with {failure_words(outcome)}"
    else:
        p_h = (p_outcomes or {}).get(HEALTHY, 1.0 - p_after)
        fails = sorted(((p, k) for k, p in (p_outcomes or {}).items() if k != HEALTHY),
                       reverse=True)
        best = (f", ahead of {failure_words(fails[0][1])} at {fails[0][0]:.0%}"
                if fails else "")
        result = (f"the run would still more likely fail than not ({p_after:.0%}), though no "
                  f"single failure dominates: healthy is the most likely single outcome "
                  f"({p_h:.0%}{best})")
    return f"It {change}: {result}."


def disagreement(ev: TraceEvidence, named: Mapping[str, Sequence[Hypothesis]]
                 ) -> list[str]:
    """Where two methods' top answers differ, and why, in sentences (empty when they agree).

    Parameters
    ----------
    ev : TraceEvidence
    named : mapping of method name to its hypotheses
        Exactly the two methods to compare.
    """
    (a_name, a_hyps), (b_name, b_hyps) = list(named.items())[:2]
    va, vb = verdict(a_hyps, ev.types), verdict(b_hyps, ev.types)
    out: list[str] = []
    if va.failed != vb.failed:
        sick, well = (a_name, b_name) if va.failed else (b_name, a_name)
        claim = va.top if va.failed else vb.top
        assert claim is not None, "a failed verdict has a top hypothesis"  # invariant
        other = b_hyps if va.failed else a_hyps
        p_other = max((h.confidence for h in other if claim and h.failure_type ==
                       claim.failure_type), default=0.0)
        out.append(f"The {sick} method calls the run failed and the {well} method healthy. "
                   f"The {sick} method rests on: {evidence_sentence(ev, claim)} "
                   f"The {well} method gives {failure_words(claim.failure_type)} "
                   f"{p_other:.2f}, under its 0.5 line.")
        return out
    if not va.failed or va.top is None or vb.top is None:
        return out
    ta, tb = va.top, vb.top
    if ta.failure_type != tb.failure_type:
        pa = max((h.confidence for h in a_hyps if h.failure_type == tb.failure_type), default=0)
        pb = max((h.confidence for h in b_hyps if h.failure_type == ta.failure_type), default=0)
        first, later = sorted((ta, tb), key=lambda h: h.origin_step)
        order = ("Both began at the same step." if first.origin_step == later.origin_step else
                 f"{failure_words(first.failure_type).capitalize()} showed first (step "
                 f"{first.origin_step}, {later.origin_step - first.origin_step} steps before "
                 f"{failure_words(later.failure_type)}); the earlier failure is usually the "
                 "cause of the later one.")
        out.append(
            f"The {a_name} method names {failure_words(ta.failure_type)} and gives "
            f"{failure_words(tb.failure_type)} {pa:.2f}; the {b_name} method names "
            f"{failure_words(tb.failure_type)} and gives {failure_words(ta.failure_type)} "
            f"{pb:.2f}. Evidence for the first: {evidence_sentence(ev, ta)} Evidence for the "
            f"second: {evidence_sentence(ev, tb)} {order} The rules fire on the first "
            "threshold a statistic crosses; the probabilistic model weighs the whole run "
            "against the failures it was fitted on, so it can prefer the pattern that fits "
            "better overall.")
    elif ta.root_cause != tb.root_cause:
        out.append(f"Both name {failure_words(ta.failure_type)}, but the {a_name} method "
                   f"blames {ta.root_cause} ({ta.confidence:.2f}) and the {b_name} method "
                   f"{tb.root_cause} ({tb.confidence:.2f}). {evidence_sentence(ev, ta)}")
    elif ta.origin_layer != tb.origin_layer:
        out.append(f"Both name {failure_words(ta.failure_type)} caused by {ta.root_cause}, "
                   f"but place its origin differently: {ev.label(ta.origin_layer)} at step "
                   f"{ta.origin_step} ({a_name}) and {ev.label(tb.origin_layer)} at step "
                   f"{tb.origin_step} ({b_name}).")
    return out
