"""Method registry and the diagnosis functions of a trace."""

from __future__ import annotations

import numpy as np
import pytest
from reasoner_traces import make_trace

import neuraldbg as ndb
from neuraldbg.methods import available_methods, get_method, register_method, unregister_method
from neuraldbg.records import Hypothesis


def test_heuristic_is_registered_and_duplicates_are_rejected():
    assert isinstance(get_method("heuristic"), ndb.HeuristicReasoner)
    with pytest.raises(ValueError, match="already registered.*heuristic"):
        register_method("heuristic")(type("Other", (), {"explain": lambda self, t: []}))


def test_unknown_method_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"Unknown diagnosis method 'nope'.*heuristic"):
        get_method("nope")
    with pytest.raises(TypeError, match="explain"):
        get_method(42)


def test_register_a_custom_method_and_pass_an_instance():
    class Always:
        def explain(self, trace):
            return [Hypothesis("training_plateau", "unknown", "0", 0, 0.7)]

    try:
        register_method("always_plateau_test")(Always)
        trace = make_trace(["Linear"], 5)
        assert ndb.explain(trace, "always_plateau_test")[0].confidence == 0.7
        assert ndb.explain(trace, Always())[0].failure_type == "training_plateau"
        assert "always_plateau_test" in available_methods()
        with pytest.raises(TypeError, match="explain"):
            register_method("no_explain_test")(type("NoExplain", (), {}))
    finally:
        unregister_method("always_plateau_test")


def test_probabilistic_method_is_found_through_its_entry_point_and_explains():
    """neuraldbg never imports causal_models: the method comes from the entry point the
    package declares, on first use, and it diagnoses a real diverging run."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys, torch
        import neuraldbg as ndb
        from neuraldbg.methods import ENTRY_POINT_GROUP, available_methods
        from importlib.metadata import entry_points
        assert "causal_models" not in sys.modules
        declared = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
        assert declared["probabilistic"] == "causal_models:ProbabilisticMethod", declared
        assert "probabilistic" in available_methods()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 1))
        opt = torch.optim.SGD(model.parameters(), lr=5.0)
        x = torch.randn(128, 16); y = x[:, :1].sin()
        with ndb.NeuralDbg(model, optimizer=opt) as dbg:
            for _ in range(40):
                opt.zero_grad(); loss = ((model(x) - y) ** 2).mean()
                loss.backward(); opt.step(); dbg.step(loss)
        assert "causal_models" not in sys.modules
        top = dbg.explain_failure(method="probabilistic")[0]
        assert "causal_models" in sys.modules
        assert top.confidence >= 0.5, top
        assert top.failure_type in ("loss_divergence", "exploding_gradients"), top
        assert top.root_cause == "learning_rate_too_high", top
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_predict_proba_shape_and_healthy_column():
    reasoner = ndb.HeuristicReasoner()
    assert reasoner.fit() is reasoner
    proba = reasoner.predict_proba(make_trace(["Linear", "ReLU"], 30))
    assert proba.shape == (1, 7) and reasoner.classes_[-1] == "healthy"
    assert proba[0, -1] == pytest.approx(1.0)
    np.testing.assert_allclose(reasoner.predict_proba([]).shape, (0, 7))


def test_explaining_before_any_step_is_a_clear_error():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with ndb.NeuralDbg(model) as dbg:
        with pytest.raises(ValueError, match=r"no recorded step yet.*dbg.step\(loss\)"):
            dbg.explain_failure()
