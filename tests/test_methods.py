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
        trace = make_trace(["Linear"], 60, loss=[1.0] * 60)  # a flat loss, long enough to stall
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


def _declare(monkeypatch, tmp_path, name: str, module_source: str) -> str:
    """An installed-package method declared through a (patched) entry-point listing."""
    from importlib.metadata import EntryPoint

    import neuraldbg.methods as methods_module

    (tmp_path / f"{name}_pkg.py").write_text(module_source)
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = EntryPoint(name=name, value=f"{name}_pkg:Method", group=methods_module.ENTRY_POINT_GROUP)
    monkeypatch.setattr(methods_module, "entry_points",
                        lambda group: [ep] if group == methods_module.ENTRY_POINT_GROUP else [])
    return name


def test_a_declared_method_with_a_missing_dependency_is_skipped_with_the_reason(
        monkeypatch, tmp_path):
    from benchmarks.harness import runnable_methods

    name = _declare(monkeypatch, tmp_path, "needs_missing_dep",
                    "import not_installed_dependency_c16\n")
    with pytest.raises(ndb.MissingDependencyError, match="not_installed_dependency_c16"):
        get_method(name)
    ok, missing = runnable_methods(["heuristic", name])
    assert ok == ["heuristic"]
    assert "not_installed_dependency_c16" in missing[name]


def test_a_broken_method_fails_the_benchmark_loudly(monkeypatch, tmp_path):
    from benchmarks.harness import runnable_methods

    name = _declare(monkeypatch, tmp_path, "broken_on_import",
                    "raise RuntimeError('bug in the method')\n")
    with pytest.raises(RuntimeError, match="bug in the method"):
        runnable_methods(["heuristic", name])
    with pytest.raises(ValueError, match="Unknown diagnosis method 'no_such_method'"):
        runnable_methods(["no_such_method"])


def test_a_diagnosis_is_kept_with_its_trace_and_redone_when_its_tables_change():
    """One explain asks the heuristic diagnosis of a trace more than once (the network reads
    it as evidence, explain's checks read its facts): it is computed once per trace and kept.
    A list handed to a caller is the caller's, and a trace whose tables were replaced or
    grew is diagnosed afresh."""
    from neuraldbg.methods import heuristic_diagnosis

    trace = make_trace(["Linear"], 25, loss=[1.0] * 25)  # a flat loss: a stall
    first = heuristic_diagnosis(trace)
    assert heuristic_diagnosis(trace) is first
    claimed = get_method("heuristic").explain(trace)
    assert claimed and claimed[0].failure_type == "training_plateau"
    claimed.clear()  # the caller's list: the kept diagnosis keeps its hypotheses
    assert get_method("heuristic").explain(trace)[0].failure_type == "training_plateau"

    trace.steps = trace.steps.assign(loss=np.geomspace(2.0, 0.02, 25))  # a loss that fell
    fell = heuristic_diagnosis(trace)
    assert fell is not first
    assert not any(h.failure_type == "training_plateau" and h.confidence >= 0.5
                   for h in fell.hypotheses)
    grown = make_trace(["Linear"], 30, loss=[1.0] * 30)
    trace.steps, trace.stats = grown.steps, grown.stats
    assert heuristic_diagnosis(trace) is not fell
    again = heuristic_diagnosis(trace)
    trace.meta["config"] = {"grad_clip": 1.0}  # metadata set after the run
    assert heuristic_diagnosis(trace) is not again
