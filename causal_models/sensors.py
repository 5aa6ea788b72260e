"""The sensors of the network: what a run shows of its knobs, its failure and the rules' verdict.

- **Knob evidence** (children of a knob level, and of the faults that sign it): the early
  update ratio and the configured rate read ``lr_level``, the forward gain and configured
  init gain read ``init_level``, the input scale reads ``input_level``.
- **Run evidence** (children of ``failure_type``, and of the faults that sign it): progress,
  gradient spikes, the early gradient ratio.
- **Cause evidence** (children of ``root_cause``): what a run shows of a cause that no knob
  or failure type carries: weight rows that are copies of each other from the start (a
  symmetric initialisation), rectifier units dead before the first update, switched off by
  an offset (a negative bias) or fed exactly zero (all-zero weights).
- **The rules' verdict** (``rule_strength``, ``rule_failure``, ``rule_cause``): the heuristic
  reasoner's graded top hypothesis, a noisy sensor of the failure type and the cause.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from causal_models.bins import (
    GAIN_STATES,
    GRAD_RATIO_STATES,
    INIT_CONFIG_STATES,
    INPUT_CONFIG_STATES,
    INPUT_STATES,
    LR_CONFIG_STATES,
    PROGRESS_STATES,
    SPIKE_STATES,
    UPDATE_STATES,
    WEIGHT_SCALE_STATES,
)
from causal_models.evidence import RULE_STRENGTH_STATES
from causal_models.priors import NO_CAUSE, PRIOR_SHAPE, NodeTables, normalised
from causal_models.registry import CauseFragment, FailureMode
from neuraldbg.records import HEALTHY

__all__ = ["KNOB_EVIDENCE", "RUN_EVIDENCE", "CAUSE_EVIDENCE", "UNSTATED", "stated_evidence",
           "check_signs",
           "add_knob_evidence", "add_run_evidence", "add_cause_evidence", "add_rule_nodes"]

#: Knob evidence: node -> (parent, states, {parent state: {state: weight}}).
KNOB_EVIDENCE: dict[str, tuple[str, tuple[str, ...], dict[str, dict[str, float]]]] = {
    "update": ("lr_level", UPDATE_STATES, {
        "very_low": {"tiny": 1.0, "small": 0.3}, "low": {"tiny": 0.6, "small": 1.0},
        "ok": {"small": 1.0, "normal": 1.0}, "high": {"normal": 0.6, "large": 1.0},
        "very_high": {"large": 1.0, "nonfinite": 0.3}}),
    "lr_config": ("lr_level", LR_CONFIG_STATES, {
        "very_low": {"low": 1.0, "unknown": 0.3}, "low": {"low": 1.0, "typical": 0.6,
                                                          "unknown": 0.3},
        "ok": {"typical": 1.0, "unknown": 0.3}, "high": {"typical": 0.6, "high": 1.0,
                                                         "unknown": 0.3},
        "very_high": {"high": 1.0, "unknown": 0.3}}),
    "fwd_gain": ("init_level", GAIN_STATES, {
        "very_small": {"shrinking": 1.0}, "small": {"shrinking": 1.0, "stable": 0.6},
        "ok": {"stable": 1.0}, "large": {"growing": 1.0, "stable": 0.6},
        "very_large": {"growing": 1.0}}),
    # the weights' own norm against PyTorch's default at the first step
    # (RunFacts.weight_scale): read from the weights, it holds where the forward gain does
    # not (biases that dominate the outputs of weights far too small)
    "weight_scale": ("init_level", WEIGHT_SCALE_STATES, {
        "very_small": {"small": 1.0, "unknown": 0.3},
        "small": {"small": 1.0, "default": 0.5, "unknown": 0.3},
        "ok": {"default": 1.0, "unknown": 0.3},
        "large": {"large": 1.0, "default": 0.5, "unknown": 0.3},
        "very_large": {"large": 1.0, "unknown": 0.3}}),
    "init_config": ("init_level", INIT_CONFIG_STATES, {
        "very_small": {"small": 1.0, "default": 0.3, "unknown": 0.3},
        "small": {"small": 1.0, "default": 0.5, "unknown": 0.3},
        "ok": {"default": 1.0, "unknown": 0.3},
        "large": {"large": 1.0, "default": 0.5, "unknown": 0.3},
        "very_large": {"large": 1.0, "default": 0.3, "unknown": 0.3}}),
    "input_config": ("input_level", INPUT_CONFIG_STATES, {
        "ok": {"standardized": 1.0, "unknown": 0.3},
        "large": {"raw": 1.0, "standardized": 0.3, "unknown": 0.3},
        "very_large": {"raw": 1.0, "standardized": 0.2, "unknown": 0.3}}),
    "input_mag": ("input_level", INPUT_STATES, {
        "ok": {"normal": 1.0}, "large": {"large": 1.0, "normal": 0.5},
        "very_large": {"large": 1.0}}),
}
#: Sensor states that say nothing was stated or measured: a query leaves the node out of the
#: evidence (it is marginalised), whatever its fitted table says. The zoo's runs always carry
#: a config, so "unknown" is rare in the fitting data at the common levels and its table
#: entries there shrink toward 0 while the rare levels keep their priors: read as a state,
#: a run without a config (most users' runs) counted 7x for a large init and 14x for large
#: inputs against the usual level.
UNSTATED: dict[str, str] = {"lr_config": "unknown", "init_config": "unknown",
                            "input_config": "unknown", "weight_rows": "unknown",
                            "weight_scale": "unknown"}


def stated_evidence(states: Mapping[str, Any], nodes: list[str]) -> dict[str, Any]:
    """The states of ``nodes`` to observe: those present, less the sensors that read nothing.

    Every query of the network (explain, what_if, the calibration's held-out scores) reads
    its evidence through this, so a run without a config is judged alike everywhere.
    """
    return {n: states[n] for n in nodes if n in states and states[n] != UNSTATED.get(n)}
#: Run-level evidence on the failure (children of ``failure_type``; a cause's ``signs`` may
#: add its fault as a parent).
RUN_EVIDENCE: dict[str, tuple[str, ...]] = {
    "progress": PROGRESS_STATES, "spikes": SPIKE_STATES, "grad_ratio": GRAD_RATIO_STATES}
#: Cause evidence: node -> (states, prior P(state | any cause), {cause: P(state | cause)}).
#: The priors say what the mechanism implies; the zoo's runs fit the tables.
CAUSE_EVIDENCE: dict[str, tuple[tuple[str, ...], dict[str, float],
                                dict[str, dict[str, float]]]] = {
    # identical weight rows stay identical under training (every unit gets the same
    # gradient): only a symmetric initialisation shows them
    # (``unknown``: not measured, equally likely under every cause)
    "weight_rows": (("diverse", "identical", "unknown"),
                    {"diverse": 0.99, "identical": 0.01, "unknown": 0.1},
                    {"symmetric_init": {"identical": 0.9, "diverse": 0.1, "unknown": 0.1}}),
    # a negative bias switches units off before any update; weights that are all zero feed
    # them exactly zero (silent). Units that die later, or never, are ``other``: the rate,
    # the init scale or the inputs kill them through the updates, too many causes for one
    # state to tell apart (it would favour the causes the zoo has the most runs of)
    "dead_onset": (("other", "start", "silent"),
                   {"other": 0.9, "start": 0.09, "silent": 0.01},
                   {"negative_bias_init": {"start": 0.8, "silent": 0.01, "other": 0.2},
                    "symmetric_init": {"other": 0.65, "start": 0.05, "silent": 0.3}}),
    # the loss turned non-finite while every output was finite, right after it reached the
    # bottom (:func:`neuraldbg.cause_evidence.unsafe_loss_support`): the loss computation
    # failed (a hand-written loss on probabilities at log(0)). A cause that acts through the
    # weights or the signals (a rate, an init, the inputs, depth) blows the outputs up first,
    # so it all but never shows this; a non-finite target (a cause outside the vocabulary)
    # can
    "nonfinite_loss": (("other", "from_floor"),
                       {"other": 0.999, "from_floor": 0.001},
                       {"loss_output_mismatch": {"other": 0.7, "from_floor": 0.3},
                        "unknown": {"other": 0.9, "from_floor": 0.1}}),
    # where a non-finite loss came from, when it came out of a calm run (a cause that acts
    # through the weights or the signals, a rate, an init, the inputs' scale, depth, grows
    # them first, so it all but never shows these): ``input``, the first module's output
    # turned non-finite from sound weights (``RunFacts.nonfinite_input_step``: the batch
    # carried NaN or Inf); ``target``, every output and weight was sound at that recorded
    # step (``nonfinite_target_step``: the targets did, or the loss computation failed);
    # ``unseen``, that step has no module statistics (``calm_nonfinite_step``), or the value
    # entered between modules (``nonfinite_entry_module``): either, or a numerical bug
    # outside the vocabulary
    "nonfinite_source": (("other", "input", "target", "unseen"),
                         {"other": 0.996, "input": 0.001, "target": 0.001,
                          "unseen": 0.002},
                         {"data_problem": {"other": 0.5, "input": 0.2, "target": 0.2,
                                           "unseen": 0.1},
                          "loss_output_mismatch": {"other": 0.95, "input": 0.001,
                                                   "target": 0.05, "unseen": 0.02},
                          "unknown": {"other": 0.8, "input": 0.05, "target": 0.05,
                                      "unseen": 0.1}}),
    # the gradients against the weights at the first step, before any update
    # (``RunFacts.start_grad_ratio`` against ``Bins.start_grad_ratio_low`` / ``_high``).
    # ``large``: what a too-large init, raw inputs, targets on another scale or a residual
    # stream that grows did; ``small``: a signal fading through depth, units switched off by
    # their biases, a softmax before a loss that applies its own. No learning rate has
    # acted yet, so a rate too high or too low shows neither; under SGD those causes make
    # the updates large or small too, which then say little of the rate
    "start_grad": (("small", "normal", "large"),
                   {"small": 0.02, "normal": 0.96, "large": 0.02},
                   {"init_scale_too_large": {"small": 0.01, "normal": 0.2, "large": 0.8},
                    "unnormalized_inputs": {"small": 0.01, "normal": 0.5, "large": 0.5},
                    "unscaled_targets": {"small": 0.01, "normal": 0.3, "large": 0.7},
                    "missing_normalization": {"small": 0.3, "normal": 0.4, "large": 0.3},
                    "init_scale_too_small": {"small": 0.3, "normal": 0.7, "large": 0.01},
                    "negative_bias_init": {"small": 0.5, "normal": 0.5, "large": 0.01},
                    "loss_output_mismatch": {"small": 0.4, "normal": 0.6, "large": 0.01},
                    "unknown": {"small": 0.1, "normal": 0.7, "large": 0.2}}),
}
#: Knob evidence that reads a steady learning rate (uninformative about the level a schedule
#: spike reaches: the node also hangs on ``lr_schedule``).
STEADY_RATE_EVIDENCE: frozenset[str] = frozenset({"update", "lr_config"})
#: The rules' abstention ("no registered cause fits"), and its share of the rules' errors under
#: any true cause (they abstain about as often as they name a wrong cause).
_ABSTAIN = "unknown"
_ABSTAIN_SHARE = 0.5



#: Prior P(rule_strength | failure type): the rules name nothing on most healthy runs and back
#: most failures strongly (the fitted tables learn the real shares from the zoo).
_STRENGTH_PRIOR: dict[bool, dict[str, float]] = {
    False: {"none": 0.85, "weak": 0.08, "moderate": 0.04, "strong": 0.02, "certain": 0.01},
    True: {"none": 0.05, "weak": 0.05, "moderate": 0.1, "strong": 0.3, "certain": 0.5},
}
#: Prior probability that the rules' top failure type is the true one, per strength, as a
#: share of ``rule_trust`` (which applies to a ``certain`` verdict).
_STRENGTH_TRUST: dict[str, float] = {"weak": 0.55, "moderate": 0.65, "strong": 0.85,
                                     "certain": 1.0}


def check_signs(causes: list[CauseFragment]) -> None:
    """Raise ValueError if a cause gives signs on a node that is not knob or run evidence."""
    signed = {*KNOB_EVIDENCE, *RUN_EVIDENCE}
    for cause in causes:
        unknown = sorted(set(cause.signs) - signed)
        if unknown:
            raise ValueError(f"Root cause {cause.name!r} gives signs on {unknown}; valid "
                             f"evidence nodes for signs are: {sorted(signed)}.")


def _knob_evidence_row(table: dict[str, dict[str, float]], states: tuple[str, ...],
                       parent: str, signs: Mapping[str, Mapping[str, float]]) -> Any:
    def row(**kw: str) -> np.ndarray:
        # the knob level's table, joined (state-wise max) with the signs of the faults
        # present: either may produce the evidence
        weights = dict(table[kw[parent]])
        if kw.get("lr_schedule") == "spike":
            # the configured rate and the early updates read the rate before a schedule
            # spike, not the level at its peak: any level may show any of their states
            weights = {x: max(r.get(x, 0.0) for r in table.values())
                       for x in set().union(*table.values())}
        for fault, sign in signs.items():
            if kw[fault] == "yes":
                weights = {x: max(weights.get(x, 0.0), sign.get(x, 0.0))
                           for x in set(weights) | set(sign)}
        return normalised(weights, states, PRIOR_SHAPE.evidence_floor)

    return row


def add_knob_evidence(nodes: NodeTables, causes: list[CauseFragment]) -> None:
    """What a run shows of its knob levels (early updates, forward gain, config)."""
    for node, (parent, sts, table) in KNOB_EVIDENCE.items():
        signs = {c.fault_node: c.signs[node] for c in causes if node in c.signs}
        steady = node in STEADY_RATE_EVIDENCE
        nodes.add(node, sts,
                  tuple(sorted((parent, *signs, *(("lr_schedule",) if steady else ())))),
                  "knob_evidence", _knob_evidence_row(table, sts, parent, signs))


def _run_evidence_row(mode_of: dict[str, FailureMode], node: str, states: tuple[str, ...],
                      signs: Mapping[str, Mapping[str, float]]) -> Any:
    def row(**kw: str) -> np.ndarray:
        # the failure mode's signature, joined (state-wise max, on its own scale) with
        # the signs of the faults present: a fault may produce this evidence whatever
        # the failure it shows (bursts from a missing clip under a stalled loss)
        base = np.array(mode_of[kw["failure_type"]].weights(node, (), states))
        base = base / base.max()
        for fault, sign in signs.items():
            if kw[fault] == "yes":
                base = np.maximum(base, [sign.get(x, 0.0) for x in states])
        return base / base.sum()

    return row


def add_run_evidence(nodes: NodeTables, causes: list[CauseFragment],
                      mode_of: dict[str, FailureMode]) -> None:
    """Run-level evidence on the failure, and on the faults that sign it."""
    for node, sts in RUN_EVIDENCE.items():
        signs = {c.fault_node: c.signs[node] for c in causes if node in c.signs}
        nodes.add(node, sts, tuple(sorted(("failure_type", *signs))), "run_evidence",
                  _run_evidence_row(mode_of, node, sts, signs))


def add_cause_evidence(nodes: NodeTables, rc_states: tuple[str, ...]) -> None:
    """What a run shows of its cause directly (:data:`CAUSE_EVIDENCE`), children of the cause."""
    for node, (sts, default, by_cause) in CAUSE_EVIDENCE.items():
        def row(root_cause: str, sts: tuple[str, ...] = sts,
                default: dict[str, float] = default,
                by_cause: dict[str, dict[str, float]] = by_cause) -> np.ndarray:
            return normalised(by_cause.get(root_cause, default), sts,
                              PRIOR_SHAPE.evidence_floor)

        nodes.add(node, sts, ("root_cause",), "cause_evidence", row)


def add_rule_nodes(nodes: NodeTables, ft_states: tuple[str, ...], rc_states: tuple[str, ...],
                rule_trust: float) -> None:
    """The rules' verdict as three nodes.

    How strongly they back their top hypothesis
    (``rule_strength`` <- failure_type), the failure type it names (``rule_failure`` <-
    failure_type, rule_strength) and its cause (``rule_cause`` <- root_cause, rule_failure).

    A verdict under the contract's 0.5 line still names a failure type and a cause; only a
    run where the rules name no hypothesis at all reads ``healthy`` / ``none``, so the one
    observation is not counted twice (once per node).
    """
    strengths = RULE_STRENGTH_STATES
    miss = PRIOR_SHAPE.rule_miss
    nodes.add("rule_strength", strengths, ("failure_type",), "rule_evidence",
              lambda **kw: normalised(_STRENGTH_PRIOR[kw["failure_type"] != HEALTHY],
                                       strengths, PRIOR_SHAPE.strength_floor))
    named_ft = [x for x in ft_states if x != HEALTHY]

    def rule_failure_row(failure_type: str, rule_strength: str) -> np.ndarray:
        if rule_strength == strengths[0]:
            return np.array([1.0 if x == HEALTHY else miss for x in ft_states])
        if failure_type == HEALTHY:  # a hypothesis on a healthy run names any failure
            return np.array([miss if x == HEALTHY else 1.0 for x in ft_states])
        trust = rule_trust * _STRENGTH_TRUST[rule_strength]
        return np.array([miss if x == HEALTHY else trust if x == failure_type
                         else (1 - trust) / (len(named_ft) - 1) for x in ft_states])

    nodes.add("rule_failure", ft_states, ("failure_type", "rule_strength"), "rule_evidence",
              rule_failure_row)
    named = [x for x in rc_states if x != NO_CAUSE]

    def rule_cause_row(root_cause: str, rule_failure: str) -> np.ndarray:
        if rule_failure == HEALTHY:
            return np.array([1.0 if x == NO_CAUSE else miss for x in rc_states])
        if root_cause in named and root_cause != _ABSTAIN and _ABSTAIN in named:
            # "unknown" from the rules is an abstention, as likely under any true cause:
            # not the evidence against it that naming another cause is
            abstain = (1 - rule_trust) * _ABSTAIN_SHARE
            other = (1 - rule_trust - abstain) / (len(named) - 2)
            return np.array([0.0 if x == NO_CAUSE else rule_trust if x == root_cause
                             else abstain if x == _ABSTAIN else other
                             for x in rc_states]) + miss
        return np.array([0.0 if x == NO_CAUSE else rule_trust if x == root_cause
                         else (1 - rule_trust) / (len(named) - 1) for x in rc_states]) + miss

    nodes.add("rule_cause", rc_states, ("root_cause", "rule_failure"), "rule_evidence",
              rule_cause_row)
