"""Event Extractor: transitions, first observations, loss and run events."""

from __future__ import annotations

import json

import numpy as np
from reasoner_traces import make_trace

from neuraldbg.events import LOSS, MODEL, extract_events, loss_dynamics
from neuraldbg.states import classify_states


def _events(trace):
    return extract_events(trace, classify_states(trace))


def test_layer_sick_from_step_zero_still_yields_an_event():
    # The published prototype only emitted events on transitions: a layer dead from step 0
    # never transitions and produced nothing.
    dead = np.zeros((10, 3))
    dead[:, 1] = 1.0
    evs = _events(make_trace(["Linear", "ReLU", "Linear"], 10, dead=dead))
    dead_events = [e for e in evs if e.kind == "activation_dead"]
    assert len(dead_events) == 1
    ev = dead_events[0]
    assert (ev.module_name, ev.step, ev.from_state, ev.to_state) == ("1", 0, "unobserved", "dead")
    assert ev.evidence["act_frac_dead"] == 1.0 and ev.evidence["threshold"] == 0.6


def test_every_transition_into_and_out_of_a_state():
    dead = np.zeros((12, 2))
    dead[4:8, 1] = 0.9  # dies at 4, recovers at 8
    evs = [e for e in _events(make_trace(["Linear", "ReLU"], 12, dead=dead))
           if e.module_name == "1"]
    assert [(e.step, e.from_state, e.to_state) for e in evs] == [
        (4, "normal", "dead"), (8, "dead", "normal")]


def test_healthy_layers_produce_no_events():
    assert _events(make_trace(["Linear", "ReLU", "Linear"], 30)) == []


def test_sparse_statistics_onset_is_the_first_recorded_step():
    dead = np.zeros((20, 2))
    dead[6:, 1] = 1.0
    recorded = np.arange(20) % 4 == 0  # every=4: statistics at 0, 4, 8, ...
    evs = _events(make_trace(["Linear", "ReLU"], 20, dead=dead, recorded=recorded))
    assert [(e.kind, e.step) for e in evs] == [("activation_dead", 8)]


def test_loss_events_nonfinite_spike_blowup_and_lr_jump():
    n = 30
    loss = np.full(n, 1.0)
    loss[10] = 5.0            # a spike (5x the trailing median)
    loss[20:23] = [50.0, 1e4, 1e8]
    loss[23:] = np.nan        # diverged: NaN to the end
    lr = np.full(n, 0.01)
    lr[19:] = 1.0             # lr jump right before the blow-up
    tr = make_trace(["Linear", "ReLU"], n, loss=loss, lr=lr)
    evs = [e for e in _events(tr) if e.module_name in (LOSS, MODEL)]
    kinds = {(e.kind, e.step) for e in evs}
    assert ("loss_spike", 10) in kinds and ("loss_spike", 20) in kinds
    assert ("loss_blowup", 20) in kinds
    assert ("loss_nonfinite", 23) in kinds
    assert ("lr_increase", 19) in kinds
    assert sum(e.kind == "loss_nonfinite" for e in evs) == 1  # NaN to the end: one event


def test_nan_everywhere_after_divergence_gives_one_transition_per_module():
    n = 40
    nan = np.zeros((n, 3))
    nan[15:] = 64
    grad = np.full((n, 3), 0.1)
    grad[15:] = np.nan
    loss = np.full(n, 1.0)
    loss[15:] = np.nan
    evs = _events(make_trace(["Linear", "ReLU", "Linear"], n, nan=nan, grad=grad, loss=loss))
    module_evs = [e for e in evs if e.module_name not in (LOSS, MODEL)]
    assert {e.step for e in module_evs} == {15}
    assert sorted({e.kind for e in module_evs}) == ["activation_anomalous", "gradient_exploding"]
    assert not any(e.kind in ("activation_dead", "gradient_vanishing") for e in evs)


def test_plateau_and_loss_dynamics():
    n = 100
    flat = make_trace(["Linear", "ReLU"], n, loss=1.0 + 0.01 * np.sin(np.arange(n)))
    dyn = loss_dynamics(flat)
    assert dyn.plateau_step == 0 and dyn.stall > 0.9 and abs(dyn.improvement) < 0.05
    learning = make_trace(["Linear", "ReLU"], n)  # exp decay to 5% of its start
    dyn = loss_dynamics(learning)
    assert dyn.plateau_step is None and dyn.stall == 0.0 and dyn.improvement > 0.8
    assert ("loss_plateau", 0) in {(e.kind, e.step) for e in _events(flat)}


def test_events_are_ordered_and_json_serialisable():
    rng = np.random.default_rng(0)
    n = 25
    dead = (rng.random((n, 4)) > 0.7).astype(float)
    evs = _events(make_trace(["Linear", "ReLU", "Linear", "ReLU"], n, dead=dead))
    assert evs
    keys = [(e.step, e.evidence.get("forward_index", -1)) for e in evs]
    assert keys == sorted(keys)
    json.dumps([e.to_dict() for e in evs])


def test_a_leap_after_the_first_update_is_compared_median_to_loss():
    """A loss of 1.1 on the initial weights that leaps to 4-9 and falls back to a noisy 1.05
    stalled (8% under where it started). The lower-quartile test compared that one loss with
    the last window's lower quartile, which sits under any single loss by the minibatch noise
    alone (15% "better" here), and the stall was read as learning (a user's LSTM at Adam 1.0,
    loss 1.1 -> 8.7 -> 1.0, was no stall; now it is one, the rate named at 0.40)."""
    rng = np.random.default_rng(0)
    n = 128
    loss = np.concatenate([[1.1, 1.9, 8.7, 4.2, 3.8], 3.8 + 0.3 * rng.standard_normal(10),
                           np.linspace(3.5, 1.1, 20), 1.05 + 0.2 * rng.standard_normal(n - 35)])
    dyn = loss_dynamics(make_trace(["LSTM", "Linear"], n, loss=np.abs(loss)))
    assert 0 < dyn.improvement < 0.1, dyn
    assert dyn.lower_improvement == dyn.improvement
    assert dyn.plateau_step is not None
