"""Causal Compressor: first occurrences, origins (producer vs passers), coupled failures."""

from __future__ import annotations

import numpy as np
import pytest
from reasoner_traces import make_trace

from neuraldbg.compressor import (
    NONFINITE,
    CoupledFailure,
    compress,
    couple_onsets,
    first_occurrences,
)
from neuraldbg.events import extract_events
from neuraldbg.records import Event
from neuraldbg.states import classify_states


def _compress(trace, window=5):
    states = classify_states(trace)
    return compress(extract_events(trace, states), states, window)


def test_dead_origin_is_the_layer_that_died_first_not_the_first_in_order():
    n = 20
    types = ["Linear", "ReLU", "Linear", "ReLU", "Linear", "ReLU"]
    dead = np.zeros((n, 6))
    dead[8:, 3] = 1.0   # layer 3 dies at step 8
    dead[10:, 1] = 1.0  # layer 1 only at step 10
    dead[10:, 5] = 1.0
    prop = _compress(make_trace(types, n, dead=dead)).propagation["activation_dead"]
    assert (prop.origin_layer, prop.origin_step) == ("3", 8)
    assert prop.path == ("1", "5") and prop.path_steps == (10, 10)


def test_vanishing_origin_where_the_decay_starts_when_one_layer_blocks():
    # Output-side gradients healthy; a 4-decade drop across module 4: everything below it
    # vanishes, but module 4 produced the decay.
    grad = np.tile([1e-6, 2e-6, 4e-6, 8e-6, 0.1, 0.2], (10, 1))
    types = ["Linear", "ReLU", "Linear", "ReLU", "Linear", "Linear"]
    prop = _compress(make_trace(types, 10, grad=grad)).propagation["gradient_vanishing"]
    assert prop.origin_layer == "4"
    assert prop.evidence["rule"] == "concentrated_decay"
    assert prop.path == ("3", "2", "1", "0")  # gradients travel backward


def test_vanishing_origin_is_the_first_layer_when_decay_is_spread_evenly():
    grad = np.tile(10.0 ** -np.arange(8, 0, -1), (10, 1))  # one decade per layer
    types = ["Linear", "Sigmoid"] * 4
    prop = _compress(make_trace(types, 10, grad=grad)).propagation["gradient_vanishing"]
    assert prop.origin_layer == "0" and prop.evidence["rule"] == "first_vanished_layer"


def test_divergence_origin_is_the_first_nonfinite_module_in_forward_order():
    n = 12
    nan = np.zeros((n, 5))
    nan[6, 2:] = 10   # overflow starts in module 2 ...
    nan[7:, :] = 10   # ... and the next step everything is NaN
    prop = _compress(make_trace(["Linear"] * 5, n, nan=nan)).propagation[NONFINITE]
    assert (prop.origin_layer, prop.origin_step) == ("2", 6)
    assert prop.path[:2] == ("3", "4")


def test_first_occurrences_per_kind():
    evs = [Event("activation_dead", "b", 5, "normal", "dead", {"forward_index": 1}),
           Event("activation_dead", "a", 5, "normal", "dead", {"forward_index": 0}),
           Event("activation_dead", "c", 3, "normal", "dead", {"forward_index": 2})]
    assert first_occurrences(evs)["activation_dead"].module_name == "c"


def _ev(kind, name, step, idx):
    return Event(kind, name, step, "healthy", kind.split("_")[1], {"forward_index": idx})


def test_coupled_failures_window_and_cause_before_effect():
    evs = [_ev("activation_dead", "3", 2, 3), _ev("gradient_vanishing", "1", 2, 1),
           _ev("gradient_vanishing", "0", 4, 0), _ev("activation_saturated", "5", 20, 5)]
    coupled = couple_onsets(evs, window=5)
    pairs = {(c.cause.module_name, c.effect.module_name, c.relation, c.step_gap)
             for c in coupled}
    # Same step: the activation failure blocks the gradient (cause first), and gradients
    # travel backward (module 1 before module 0).
    assert pairs == {("3", "1", "blocks_gradient", 0), ("3", "0", "blocks_gradient", 2),
                     ("1", "0", "propagates", 2)}
    assert couple_onsets(evs, window=1) == [
        c for c in coupled if c.step_gap <= 1]
    c = coupled[0]
    assert CoupledFailure.from_dict(c.to_dict()) == c


def test_coupled_failures_rejects_a_bad_window():
    with pytest.raises(ValueError, match="window"):
        couple_onsets([], window=-1)


def test_recoveries_and_loss_events_are_not_coupled():
    evs = [Event("gradient_healthy", "0", 1, "vanishing", "healthy", {"forward_index": 0}),
           Event("loss_spike", "<loss>", 1, "normal", "spike", {}),
           _ev("activation_dead", "2", 1, 2)]
    assert couple_onsets(evs) == []
