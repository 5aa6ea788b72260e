"""Ported baselines: conformance on real runs, and each rule on the run it is made for."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from training import train_mlp

from benchmarks.baselines import BASELINES
from benchmarks.baselines.autotrainer import AutoTrainerBaseline
from benchmarks.baselines.deepdiagnosis import DeepDiagnosisBaseline
from neuraldbg.methods import available_methods, get_method
from neuraldbg.trace import Trace


def _train(kind: str) -> Trace:
    """A small real run under NeuralDbg: healthy, or broken in one known way."""
    act, depth = (nn.Sigmoid, 8) if kind == "vanish" else (nn.ReLU, 3)
    return train_mlp(act=act, depth=depth, lr={"explode": 20.0, "low": 1e-7}.get(kind, 0.2),
                     dead_bias=kind == "dead")


@pytest.fixture(scope="module")
def runs() -> dict[str, Trace]:
    torch.set_num_threads(1)
    return {k: _train(k) for k in ("healthy", "vanish", "dead", "explode", "low")}


def test_registered_by_name() -> None:
    for name in BASELINES:
        assert name in available_methods()
        assert hasattr(get_method(name), "explain")


# The contract every baseline meets (fields, vocabulary, sorted confidences) is checked for
# every registered method in tests/test_method_conformance.py.


def test_divergence_named_by_every_baseline(runs: dict[str, Trace]) -> None:
    trace = runs["explode"]
    assert not np.isfinite(trace.steps["loss"]).all(), "the lr=20 run must blow up"
    first_bad = int(trace.steps.loc[~np.isfinite(trace.steps["loss"]), "step"].iloc[0])
    for name in BASELINES:
        hyps = get_method(name).explain(trace)
        assert hyps and hyps[0].confidence >= 0.5, name
        div = [h for h in hyps if h.failure_type in ("loss_divergence", "exploding_gradients")]
        assert div and div[0].root_cause == "learning_rate_too_high", name
        assert div[0].origin_step <= first_bad, name
    # DeepDiagnosis stops at its first symptom: the gradient variance explodes a step early
    dd = get_method("deepdiagnosis").explain(trace)
    assert {h.failure_type for h in dd} == {"exploding_gradients"}
    assert dd[0].origin_step < first_bad
    # AutoTrainer reports the first symptom in time: the ReLUs die before the loss is NaN
    at = get_method("autotrainer").explain(trace)
    assert at[0].failure_type == "dead_neurons" and at[0].origin_step < first_bad


def test_autotrainer_rules_on_their_runs(runs: dict[str, Trace]) -> None:
    at = AutoTrainerBaseline()
    assert at.explain(runs["healthy"]) == []
    v = at.explain(runs["vanish"])
    assert v[0].failure_type == "vanishing_gradients" and v[0].origin_layer == "0"
    assert v[0].root_cause == "saturating_activation"
    low = at.explain(runs["low"])
    assert [h.failure_type for h in low] == ["training_plateau"]
    d = at.explain(runs["dead"])
    assert d[0].failure_type == "dead_neurons" and d[0].origin_layer == "3"


def test_autotrainer_ratio_rule_on_hand_built_trace() -> None:
    # one function's unit test: first/last gradient ratio 100 > 70 while the loss stalls
    steps = pd.DataFrame({"step": range(20), "loss": np.ones(20), "lr": 0.1,
                          "grad_norm": 1.0, "param_norm": 1.0, "update_norm": 0.1,
                          "update_ratio": 0.1, "recorded": True, "complete": True})
    rows = []
    for s in range(20):
        for name, g in (("a", 100.0 if s >= 5 else 1.0), ("b", 1.0)):
            rows.append({"step": s, "module_name": name, "calls": 1, "act_mean": 0.0,
                         "act_std": 1.0, "act_max_abs": 1.0, "act_frac_zero": 0.0,
                         "act_frac_dead": 0.0, "act_frac_saturated": 0.0, "act_nan": 0,
                         "act_inf": 0, "out_grad_norm": g, "param_grad_norm": g,
                         "param_norm": 1.0, "update_ratio": 0.1})
    modules = pd.DataFrame({"module_name": ["a", "b"], "module_type": ["Linear", "Linear"],
                            "order": [1, 2], "forward_order": [0, 1], "depth": [0, 0],
                            "parent": ["", ""], "activation_family": ["linear", "linear"],
                            "n_params": [10, 10], "n_trainable": [10, 10]})
    trace = Trace(steps=steps, stats=pd.DataFrame(rows), modules=modules, meta={})
    hyps = AutoTrainerBaseline().explain(trace)
    assert hyps[0].failure_type == "exploding_gradients" and hyps[0].origin_step == 5
    # a stalled loss is also slow convergence, found later
    assert "training_plateau" in [h.failure_type for h in hyps]
    # the ratio rule is gated on "not converging": with a falling loss it stays silent
    falling = Trace(steps=steps.assign(loss=np.geomspace(1.0, 0.01, 20)), stats=trace.stats,
                    modules=modules, meta={})
    assert "exploding_gradients" not in [h.failure_type for h in
                                         AutoTrainerBaseline().explain(falling)]


def test_deepdiagnosis_stops_at_first_symptom(runs: dict[str, Trace]) -> None:
    dd = DeepDiagnosisBaseline()
    assert dd.explain(runs["healthy"]) == []
    d = dd.explain(runs["dead"])
    # one symptom only, its causes in table order
    assert len({h.failure_type for h in d}) == 1
    assert d[0].failure_type == "dead_neurons" and d[0].origin_layer == "3"
    assert d[0].origin_step == 0


def test_anomaly_rank_points_at_the_broken_layer(runs: dict[str, Trace]) -> None:
    ar = get_method("anomaly_rank")
    d = ar.explain(runs["dead"])
    assert d[0].failure_type == "dead_neurons" and d[0].origin_layer == "3"
    assert d[0].origin_step == 0 and d[0].confidence >= 0.5
    # a rise every layer shares is discounted: the slowly learning run is not flagged
    assert all(h.confidence < 0.5 for h in ar.explain(runs["low"]))


def test_sagemaker_debugger_rules_on_their_runs(runs: dict[str, Trace]) -> None:
    from benchmarks.baselines.sagemaker_debugger import SageMakerDebuggerBaseline

    sm = SageMakerDebuggerBaseline()
    # dead_relu: the second ReLU ("3") has > 50% units dead for the whole batch from step 0
    fired = sm.fired(runs["dead"])
    assert fired["dead_relu"][:2] == ("dead_neurons", 0) and fired["dead_relu"][2] == "3"
    # exploding_tensor is ranked first when the loss goes non-finite
    ex = sm.explain(runs["explode"])
    assert ex[0].failure_type == "loss_divergence"
    assert "exploding_tensor" in sm.fired(runs["explode"])
    # an 8-deep sigmoid stack: the first layer's gradient RMS is below 1e-7 from step 0
    v = sm.explain(runs["vanish"])
    assert v[0].failure_type == "vanishing_gradients" and v[0].origin_layer == "0"
    assert sm.fired(runs["vanish"])["vanishing_gradient"][1] == 0
    # lr 1e-7: updates 1e-8 of the weights trip weight_update_ratio's small_threshold
    assert sm.fired(runs["low"])["weight_update_ratio"][0] == "training_plateau"
    # the healthy run trips none of the tensor rules at their documented defaults ...
    healthy = sm.fired(runs["healthy"])
    assert not {"exploding_tensor", "vanishing_gradient", "dead_relu"} & set(healthy)
    # ... and the thresholds are live: loosened, vanishing_gradient fires on it too
    assert "vanishing_gradient" in SageMakerDebuggerBaseline(vanishing_threshold=10.0).fired(
        runs["healthy"])
