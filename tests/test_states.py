"""State Classifier: thresholds, hysteresis, per-family saturation, sparse and NaN traces."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from reasoner_traces import make_trace
from torch import nn

import neuraldbg as ndb
from neuraldbg.stat_tables import wide_stats
from neuraldbg.states import (
    ActivationHealth,
    GradientHealth,
    classify_states,
)
from neuraldbg.thresholds import ThresholdConfig


def _frame(trace, kind="gradient", **kw):
    return classify_states(trace, ThresholdConfig(**kw) if kw else None).frame(kind)


def test_threshold_config_is_frozen_and_validated():
    cfg = ThresholdConfig()
    with pytest.raises(AttributeError):
        cfg.rel_vanish = 1.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="rel_vanish"):
        ThresholdConfig(rel_vanish=-1.0)
    assert ThresholdConfig.from_dict(cfg.to_dict()) == cfg


def test_wide_stats_matches_trace_stat_pivot():
    rng = np.random.default_rng(0)
    tr = make_trace(["Linear", "ReLU", "Linear"], 12, grad=rng.random((12, 3)),
                    recorded=np.arange(12) % 3 == 0)
    steps, names, tables = wide_stats(tr, ["out_grad_norm"])
    ref = tr.stat("out_grad_norm")
    assert list(steps) == list(ref.index) == [0, 3, 6, 9]
    assert names == list(ref.columns)
    np.testing.assert_allclose(tables["out_grad_norm"], ref.to_numpy())


def test_vanishing_is_relative_to_the_largest_gradient_at_the_same_step():
    # Layer 0 is 1e-5 of the top: vanishing. Everything shrinking together (a converged run)
    # is not, even below the absolute 1e-6.
    grad = np.tile([1e-6, 3e-3, 1e-1], (10, 1))
    grad[5:] *= 1e-6  # whole net converges: relative profile unchanged
    states = _frame(make_trace(["Linear", "ReLU", "Linear"], 10, grad=grad))
    assert (states["0"] == "vanishing").all()
    assert (states["1"] == "healthy").all() and (states["2"] == "healthy").all()


def test_absolute_vanishing_rule_needs_a_gap_to_the_top():
    grad = np.tile([5e-7, 1e-4], (6, 1))  # below 1e-6 and 200x under the top
    states = _frame(make_trace(["Linear", "Linear"], 6, grad=grad))
    assert (states["0"] == "vanishing").all()
    grad = np.tile([5e-7, 6e-7], (6, 1))  # below 1e-6 but level with the top: converged
    assert (_frame(make_trace(["Linear", "Linear"], 6, grad=grad))["0"] == "healthy").all()


def test_exploding_against_own_early_baseline_with_hysteresis():
    g = np.full((20, 2), 0.1)
    g[10:, 0] = 0.1 * np.array([200, 200, 50, 50, 50, 5, 5, 5, 5, 5])  # 200x, then 50x, 5x
    states = _frame(make_trace(["Linear", "Linear"], 20, grad=g))
    col = states["0"].tolist()
    assert col[:10] == ["healthy"] * 10
    assert col[10:15] == ["exploding"] * 5  # enters at 100x, stays while above 10x
    assert col[15:] == ["healthy"] * 5      # leaves below 10x


def test_dead_and_saturated_per_family_and_never_on_linear_outputs():
    n = 8
    types = ["Linear", "ReLU", "Linear", "Sigmoid", "Linear", "Tanh"]
    dead = np.zeros((n, 6))
    dead[:, 1] = 0.9
    sat = np.zeros((n, 6))
    sat[:, 3] = 0.8   # sigmoid stuck (near 0 or 1: the capture counts both)
    sat[:, 4] = 0.99  # a Linear output can never be "saturated", whatever the value says
    std = np.full((n, 6), 0.5)
    std[:, 0] = 300.0  # huge Linear outputs are not saturation either
    acts = _frame(make_trace(types, n, dead=dead, sat=sat, std=std), "activation")
    assert (acts["1"] == "dead").all()
    assert (acts["3"] == "saturated").all()
    assert (acts["4"] == "normal").all() and (acts["0"] == "normal").all()
    assert (acts["5"] == "normal").all()


def test_saturated_activation_that_blocks_the_gradient():
    n = 6
    grad = np.tile([1e-3, 0.1, 0.2], (n, 1))   # input side of the tanh gets 1% of its output's
    sat = np.zeros((n, 3))
    sat[:, 1] = 0.9
    states = _frame(make_trace(["Linear", "Tanh", "Linear"], n, grad=grad, sat=sat))
    assert (states["1"] == GradientHealth.SATURATED.value).all()


def test_nonfinite_outputs_are_anomalous_and_exploding():
    n = 6
    nan = np.zeros((n, 2))
    nan[3:] = 100
    grad = np.full((n, 2), 0.1)
    grad[3:] = np.nan
    st = classify_states(make_trace(["Linear", "ReLU"], n, grad=grad, nan=nan))
    acts, grads = st.frame("activation"), st.frame("gradient")
    assert (acts.iloc[3:] == ActivationHealth.ANOMALOUS.value).all().all()
    assert (grads.iloc[3:] == GradientHealth.EXPLODING.value).all().all()
    assert (acts.iloc[:3] == "normal").all().all()


def test_uncalled_module_is_unobserved_not_vanishing():
    tr = make_trace(["Linear", "Linear"], 5, grad=np.tile([0.0, 0.1], (5, 1)))
    tr.stats.loc[tr.stats["module_name"] == "0", "calls"] = 0  # never called: no gradient
    states = _frame(tr)
    assert (states["0"] == "unobserved").all()


def test_real_capture_sigmoid_stuck_near_zero_is_saturated_linear_never():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Sigmoid(), nn.Linear(16, 1))
    with torch.no_grad():
        model[0].bias.fill_(-30.0)  # sigmoid outputs ~1e-13: stuck near 0
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(3):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            dbg.step(loss)
    acts = classify_states(dbg.trace).frame("activation")
    assert (acts["1"] == "saturated").all()
    assert (acts["0"] == "normal").all()  # |x| ~ 30 on the Linear: not saturation
