"""The causal direction of the shipped network: knobs act on the layer states, the failure
follows from them, and do() on a layer state moves what is downstream only.

Read with networkx (d-separation on the fitted graph) and with pgmpy's ``CausalInference``
(graph surgery) on the shipped default model.
"""

from __future__ import annotations

import warnings

import networkx as nx
import numpy as np
import pytest

import causal_models
from causal_models import to_networkx
from causal_models.structure import UNSEEN


@pytest.fixture(scope="module")
def model() -> causal_models.ProbabilisticReasoner:
    return causal_models.load_default_model()


def _do(model, variable: str, do: dict[str, str]) -> np.ndarray:
    from pgmpy.inference import CausalInference

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        factor = CausalInference(model.network_).query([variable], do=do, show_progress=False)
    return np.asarray(factor.values, dtype=float)


def test_layer_states_are_not_d_separated_from_the_knobs_given_the_failure(model) -> None:
    """The old network hung every slice node on failure_type alone, which d-separated the
    slices from every knob given the failure type; now knobs reach the states directly."""
    graph = to_networkx(model)
    slices = [n for n, r in model.structure_.roles.items() if r == "slice"]
    for knob in ("lr_level", "init_level", "activation", "clipping"):
        assert not nx.is_d_separator(graph, {knob}, set(slices), {"failure_type"}), knob
    # and the failure type is a consequence: of the layer states, and of the root cause only
    # through the failure those states do not show
    assert set(graph.predecessors("failure_type")) <= set(slices) | {UNSEEN}
    assert set(graph.predecessors(UNSEEN)) == {"root_cause"}


def test_do_on_a_knob_changes_the_predicted_layer_states(model) -> None:
    high = _do(model, "grad[0]@1", {"lr_level": "very_high"})
    ok = _do(model, "grad[0]@1", {"lr_level": "ok"})
    assert 0.5 * np.abs(high - ok).sum() > 0.05  # total variation
    states = list(model.structure_.states["grad[0]@1"])
    assert high[states.index("exploding")] + high[states.index("nonfinite")] > \
        ok[states.index("exploding")] + ok[states.index("nonfinite")]


def test_do_on_a_layer_state_moves_the_failure_not_the_cause(model) -> None:
    exploding = {"grad[0]@1": "nonfinite", "grad[1]@1": "nonfinite", "loss@1": "nonfinite"}
    healthy = {"grad[0]@1": "healthy", "grad[1]@1": "healthy", "loss@1": "low"}
    classes = list(model.structure_.states["failure_type"])
    p_bad = _do(model, "failure_type", exploding)
    p_good = _do(model, "failure_type", healthy)
    assert p_bad[classes.index("healthy")] < 0.2 < p_good[classes.index("healthy")]
    # graph surgery (pgmpy's do(): the set nodes lose their parents): the root cause upstream
    # keeps its prior whatever the layer states are set to, where observing them moves it
    from pgmpy.inference import VariableElimination

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cut = VariableElimination(model.network_.do(list(exploding)))
        whole = VariableElimination(model.network_)
        prior = whole.query(["root_cause"], show_progress=False).values
        set_bad = cut.query(["root_cause"], evidence=exploding, show_progress=False).values
        seen_bad = whole.query(["root_cause"], evidence=exploding, show_progress=False).values
    np.testing.assert_allclose(set_bad, prior, atol=1e-9)
    assert 0.5 * np.abs(seen_bad - prior).sum() > 0.1


def test_intervene_accepts_a_slice_node_and_refuses_do_on_evidence(model) -> None:
    p = model.intervene(do={"grad[0]@1": "vanishing"})
    assert abs(float(p.sum()) - 1.0) < 1e-9
    with pytest.raises(ValueError, match="both set by do"):
        model.intervene(do={"grad[0]@1": "vanishing"}, evidence={"grad[0]@1": "healthy"})
