"""Whether a trace holds enough evidence for a verdict, and what a thin one may claim.

Every diagnosis method reads the same checked view of a trace (:func:`usable_trace`): steps
that never finished (an exception or a crash inside the step, a forward after the last
optimizer step written by an older capture) are left out, since their statistics describe a
step that did not happen. A run with fewer than :data:`MIN_STEPS` finished steps cannot be
told apart from the normal first steps of training (a loss that has not moved yet, gradients
without a baseline to compare with), so its hypotheses are kept but scaled below 0.5
(:func:`hedge`) and say why in their metadata: a thin trace gives no confident verdict.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from neuraldbg.records import Hypothesis
from neuraldbg.trace import Trace

__all__ = ["MIN_STEPS", "HEDGED_CONFIDENCE", "usable_trace", "thin_evidence", "hedge"]

#: Fewest finished steps for a confident verdict. The State Classifier compares each layer
#: with its own early baseline (its first recorded steps) and the loss dynamics fit a trend:
#: below five points neither separates a failure from the first steps of a healthy run.
MIN_STEPS = 5
#: The highest confidence a hypothesis of a thin trace keeps (below the 0.5 of a verdict).
HEDGED_CONFIDENCE = 0.45


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


def hedge(hypotheses: list[Hypothesis], reason: str) -> list[Hypothesis]:
    """The hypotheses scaled so the strongest stays at :data:`HEDGED_CONFIDENCE` at most.

    Their order and ratios are kept; each gets ``metadata["thin_evidence"] = reason``.
    """
    top = max((h.confidence for h in hypotheses), default=0.0)
    factor = min(1.0, HEDGED_CONFIDENCE / top) if top > 0 else 1.0
    return [dataclasses.replace(h, confidence=float(h.confidence * factor),
                                metadata={**h.metadata, "thin_evidence": reason})
            for h in hypotheses]
