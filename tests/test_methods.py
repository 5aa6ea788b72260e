"""Method registry and the diagnosis functions of a trace."""

from __future__ import annotations

import numpy as np
import pytest
from reasoner_traces import make_trace

import neuraldbg as ndb
from neuraldbg.methods import _METHODS, available_methods, get_method, register_method
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
        _METHODS.pop("always_plateau_test", None)


def test_probabilistic_method_is_imported_on_demand_and_explains():
    assert "probabilistic" in available_methods()
    method = get_method("probabilistic")  # imports causal_models, loads the shipped model
    hyps = method.explain(make_trace(["Linear", "ReLU"], 30))
    assert isinstance(hyps, list) and all(isinstance(h, ndb.Hypothesis) for h in hyps)
    assert all(0.0 <= h.confidence <= 1.0 for h in hyps)


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
