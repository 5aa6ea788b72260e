"""A trace's evidence for the network.

Its discretization, its knob and stack observations, and the heuristic reasoner's verdict
read as a sensor.

Leave-one-family-out evaluation fits many models on the same traces, so the result is cached
per live trace object and observation settings (:func:`neuraldbg.trace_memo.memoized`);
entries go when the trace is collected.
"""

from __future__ import annotations

from causal_models.bins import Bins
from causal_models.discretize import Discretized, discretize
from causal_models.evidence import (
    RULE_NO_CAUSE,
    observe_cause_signs,
    observe_knobs,
    observe_stack,
    rule_verdict,
)
from neuraldbg.methods import heuristic_diagnosis
from neuraldbg.trace import Trace
from neuraldbg.trace_memo import memoized

__all__ = ["observe"]


def observe(trace: Trace, *, n_slices: int, n_blocks: int, bins: Bins | None,
            rule_evidence: bool, cause_states: tuple[str, ...], slices: bool = True
            ) -> Discretized:
    """Every observed node's state for ``trace`` (cached per trace and settings).

    Parameters
    ----------
    trace : Trace
    n_slices, n_blocks : int
        The unrolling.
    bins : Bins or None
        Discretization thresholds.
    rule_evidence : bool
        Add the rules' graded verdict (``rule_strength``, ``rule_failure``, ``rule_cause``).
    cause_states : tuple of str
        The network's root-cause states: a rules' cause outside them reads ``unknown``.
    slices : bool, default=True
        False: one slice over the whole run (the run-level-only ablation).

    Returns
    -------
    Discretized
        States, slices, blocks, onset, continuous features, and the first event of each
        failure type the rules' extractor found (a sensor of the onset).
    """
    key = ("observe", n_slices if slices else 1, n_blocks, repr(bins), rule_evidence,
           cause_states)
    return memoized(trace, key, lambda: _observe(trace, n_slices, n_blocks, bins,
                                                 rule_evidence, cause_states, slices))


def _observe(trace: Trace, n_slices: int, n_blocks: int, bins: Bins | None,
             rule_evidence: bool, cause_states: tuple[str, ...], slices: bool) -> Discretized:
    diagnosis = heuristic_diagnosis(trace)  # the heuristic reasoner: its verdict and run facts
    disc = discretize(trace, n_slices=n_slices, n_blocks=n_blocks, bins=bins, slices=slices,
                      cut_off=diagnosis.facts.blocked_modules,
                      input_swing=diagnosis.facts.input_swing)
    disc.states.update(observe_knobs(trace, bins))
    for hyp in diagnosis.hypotheses:  # module-resolution onsets, read as a sensor
        disc.events.setdefault(hyp.failure_type, (hyp.origin_layer, hyp.origin_step))
    stack, stack_features = observe_stack(trace, diagnosis.facts, bins)
    disc.states.update(stack)
    disc.features.update(stack_features)
    signs, sign_features = observe_cause_signs(trace, diagnosis.facts, bins)
    disc.states.update(signs)
    disc.features.update(sign_features)
    if rule_evidence:
        verdict = rule_verdict(trace, diagnosis.hypotheses)
        if verdict["rule_cause"] not in set(cause_states):
            verdict["rule_cause"] = "unknown" if verdict["rule_cause"] != RULE_NO_CAUSE \
                else RULE_NO_CAUSE
        disc.states.update(verdict)
    return disc
