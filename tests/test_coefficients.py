"""Every number of the heuristic reasoner is a named field with its reason, and is the one used.

The thresholds (:class:`ThresholdConfig`) and the coefficients of each stage (run facts, loss
dynamics, symptoms, causes) live in frozen, slotted dataclasses whose docstrings give each
field's default and the reason for it; a record that drops a reason, documents a stale
default, or holds a field no rule reads fails here.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import numpy as np
import pytest
from reasoner_traces import make_trace

from neuraldbg.cause_evidence import CauseWeights
from neuraldbg.causes import score_causes
from neuraldbg.compressor import compress
from neuraldbg.events import CurveWindows, extract_events, loss_dynamics
from neuraldbg.hypotheses import HypothesisWeights, rank_causes
from neuraldbg.run_facts import FactWindows, RunFacts, gather_facts
from neuraldbg.states import classify_states
from neuraldbg.symptoms import SymptomWeights, find_symptoms
from neuraldbg.thresholds import ThresholdConfig

RECORDS = [ThresholdConfig, FactWindows, CurveWindows, SymptomWeights, CauseWeights,
           HypothesisWeights]
_HEADER = re.compile(r"^(\w+(?:, \w+)*) : [^,]+(?:, default=(.+))?$")


def _documented(cls: type) -> dict[str, tuple[str | None, str]]:
    """Field name -> (documented default, first line of its reason), from ``Attributes``."""
    doc = inspect.getdoc(cls) or ""
    lines = doc.split("Attributes\n----------\n", 1)[1].splitlines()
    out: dict[str, tuple[str | None, str]] = {}
    for i, line in enumerate(lines):
        m = _HEADER.match(line)
        if m is None:
            continue
        names = m.group(1).split(", ")
        defaults = m.group(2).split(", ") if m.group(2) else [None] * len(names)
        reason = lines[i + 1] if i + 1 < len(lines) else ""
        out.update({n: (d, reason) for n, d in zip(names, defaults, strict=True)})
    return out


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_every_field_documents_its_default_and_a_reason(cls: type) -> None:
    doc = _documented(cls)
    for f in dataclasses.fields(cls):
        assert f.name in doc, f"{cls.__name__}.{f.name} is not documented"
        default, reason = doc[f.name]
        assert default is not None, f"{cls.__name__}.{f.name} does not document its default"
        assert float(default) == f.default, (
            f"{cls.__name__}.{f.name}: documented default {default}, actual {f.default}")
        assert reason.startswith("    ") and len(reason.split()) >= 4, (
            f"{cls.__name__}.{f.name} has no reason under its header")


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_records_are_frozen_slotted_and_validated(cls: type) -> None:
    record = cls()
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(record, first, 1.0)
    assert not hasattr(record, "__dict__")
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.{first} must be a positive"):
        cls(**{first: -1.0})


def _saturated_run():
    """Tanh layers saturated from the first step behind Linear layers that gain ~5x."""
    n = 30
    types = ["Linear", "Tanh", "Linear", "Tanh", "Linear", "Tanh", "Linear"]
    std = np.tile([4.0, 1.0, 5.0, 1.0, 5.0, 1.0, 5.0], (n, 1))
    sat = np.zeros((n, 7))
    sat[:, [1, 3, 5]] = 0.9
    trace = make_trace(types, n, std=std, sat=sat, loss=np.ones(n))
    states = classify_states(trace)
    dyn = loss_dynamics(trace, states.config)
    comp = compress(extract_events(trace, states, dyn), states)
    return trace, states, dyn, comp, gather_facts(trace, states, dyn)


def test_symptom_weights_are_the_ones_the_rules_read() -> None:
    trace, states, dyn, comp, facts = _saturated_run()

    def saturation(weights: SymptomWeights | None):
        found = find_symptoms(trace, states, dyn, comp, facts, weights)
        return next(s for s in found if s.failure_type == "saturated_activations")

    default = saturation(None)
    assert default.impact == pytest.approx(1.0)  # 0.6 + 0.4 x (present from step 0)
    changed = saturation(SymptomWeights(saturation_impact_floor=0.3,
                                        saturation_impact_gain=0.2))
    assert changed.impact == pytest.approx(0.5)
    pers = default.evidence["persistence"]
    assert default.consistency == pytest.approx(0.5 + 0.5 * pers)
    assert saturation(SymptomWeights(consistency_floor=0.2, consistency_gain=0.3)
                      ).consistency == pytest.approx(0.2 + 0.3 * pers)


def test_cause_weights_are_the_ones_the_rules_read() -> None:
    _, states, _, _, facts = _saturated_run()

    def support(cause: str, weights: CauseWeights | None = None, **extra: float) -> float:
        causes = score_causes("saturated_activations", onset=0, first_step=0, facts=facts,
                              cfg=states.config, extra=dict(extra), weights=weights)
        return causes[cause][0] if cause in causes else 0.0

    fixed = support("saturating_activation")  # 0.35 less what the script bugs explain
    assert fixed == pytest.approx(0.35, abs=1e-3)
    assert support("saturating_activation", CauseWeights(saturating_fixed=0.2)) == (
        pytest.approx(fixed * 0.2 / 0.35))
    inputs = support("unnormalized_inputs", origin_is_first_activation=1.0)
    halved = support("unnormalized_inputs", CauseWeights(first_activation_gain=1e-9),
                     origin_is_first_activation=1.0)
    assert inputs > 0 and halved == pytest.approx(inputs / 2)  # 0.5 + 0.5 x first_act


def test_fact_windows_are_the_ones_the_facts_read() -> None:
    trace, states, dyn, _, _ = _saturated_run()
    facts: RunFacts = gather_facts(trace, states, dyn)
    assert facts.loss_scale_ratio == pytest.approx(
        1.0 / (float(np.hypot(5.0, 0.0)) ** 2 + 1.0))
    bigger = gather_facts(trace, states, dyn, FactWindows(target_variance=24.0))
    assert bigger.loss_scale_ratio == pytest.approx(1.0 / 49.0)
    short = gather_facts(trace, states, dyn, FactWindows(min_growth_steps=1000))
    assert np.isnan(short.grad_growth[0]) and np.isnan(short.grad_accumulation)


def test_curve_windows_are_the_ones_the_loss_dynamics_read() -> None:
    n = 60
    loss = np.linspace(1.0, 0.8, n)  # improved by 20%
    trace = make_trace(["Linear", "ReLU", "Linear"], n, loss=loss)
    stall = loss_dynamics(trace).stall
    assert stall == pytest.approx(1.0 - loss_dynamics(trace).improvement / 0.5)
    assert loss_dynamics(trace, windows=CurveWindows(stall_improvement=0.25)).stall == (
        pytest.approx(1.0 - loss_dynamics(trace).improvement / 0.25))


def test_alternatives_are_kept_down_to_the_documented_share_of_the_best() -> None:
    causes = {"a_cause": (0.8, {}), "b_cause": (0.3, {}), "c_cause": (0.15, {})}
    kept, _, _ = rank_causes(causes, 0.05, 5)  # unknown: 0.2 x 0.7 x 0.85 = 0.119
    assert [c for c, _, _ in kept] == ["a_cause", "b_cause"]  # 0.25 x 0.8 = 0.2 bar
    kept, _, _ = rank_causes(causes, 0.05, 5,
                             keep_share=HypothesisWeights(alternative_floor=0.1)
                             .alternative_floor)
    assert [c for c, _, _ in kept] == ["a_cause", "b_cause", "c_cause", "unknown"]
