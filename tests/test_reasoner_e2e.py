"""End-to-end: small real models trained into each failure through real hooks, then explained.

Each scenario asserts the failure type, the root cause, the origin layer and the onset, and
something a broken reasoner would get wrong. Models are built here (not from the zoo).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from torch import nn

import neuraldbg as ndb

STEPS = 100


def _data(n: int = 256, d: int = 16, scale: float = 1.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = torch.tanh(x @ torch.randn(d, 1, generator=g))
    return x * scale, y


def _mlp(dims: list[int], act: type[nn.Module]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(dims[:-1], dims[1:], strict=True):
        layers += [nn.Linear(a, b), act()]
    return nn.Sequential(*layers[:-1])


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float, *,
           steps: int = STEPS, lr_at=None, every: int = 1, explain_during: list | None = None):
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with ndb.NeuralDbg(model, optimizer=opt, config={"lr": lr, "optimizer": "sgd"}, seed=0,
                       every=every) as dbg:
        for step in range(steps):
            if lr_at is not None:
                for group in opt.param_groups:
                    group["lr"] = lr_at(step)
            idx = torch.randint(0, len(x), (64,))
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            dbg.step(loss)
            if explain_during is not None and step == steps // 2:
                explain_during.extend(dbg.explain_failure())
    return dbg


def _top(hyps):
    assert hyps, "expected a diagnosis, got none"
    return hyps[0]


@pytest.fixture(scope="module")
def deep_sigmoid():
    torch.manual_seed(0)
    return _train(_mlp([16] + [32] * 10 + [1], nn.Sigmoid), *_data(), lr=0.1).trace


@pytest.fixture(scope="module")
def dead_relu():
    torch.manual_seed(0)
    model = _mlp([16, 64, 64, 64, 1], nn.ReLU)
    with torch.no_grad():
        model[2].bias.fill_(-10.0)  # the ReLU after it (module "3") never fires
    return _train(model, *_data(), lr=0.05)


def test_deep_sigmoid_mlp_vanishing_from_the_first_layers(deep_sigmoid):
    hyps = ndb.explain(deep_sigmoid)
    top = _top(hyps)
    assert top.failure_type == "vanishing_gradients"
    assert top.root_cause == "saturating_activation"
    assert deep_sigmoid.module_names.index(top.origin_layer) <= 2  # the first layers
    assert top.origin_step == 0 and top.confidence >= 0.5
    # Broken-reasoner checks: sick from step 0 still yields events (not transitions only);
    # the stall is explained by the vanishing gradient, not reported as a plain plateau.
    diag = ndb.HeuristicReasoner().diagnose(deep_sigmoid)
    first = [e for e in diag.events if e.kind == "gradient_vanishing" and e.step == 0]
    assert first and all(e.from_state == "unobserved" for e in first)
    plateau = [h for h in hyps if h.failure_type == "training_plateau"]
    assert all(h.confidence < 0.5 for h in plateau)
    # The sigmoids are not saturated (outputs ~0.3-0.7): no saturation hypothesis.
    assert not any(h.failure_type == "saturated_activations" for h in hyps)


def test_negative_bias_relu_layer_dead_at_that_layer(dead_relu):
    hyps = dead_relu.explain_failure()
    top = _top(hyps)
    assert (top.failure_type, top.root_cause) == ("dead_neurons", "negative_bias_init")
    assert top.origin_layer == "3" and top.origin_step == 0
    # The zero gradients below the dead layer are its effect: the vanishing hypothesis, if
    # any, starts where the decay starts (the dead layer), never at layer 0, and ranks low.
    vanish = [h for h in hyps if h.failure_type == "vanishing_gradients"]
    assert all(h.origin_layer == "3" and h.confidence < 0.5 for h in vanish)
    assert all("dead_neurons" in h.metadata["explained_by"] for h in vanish)
    # Coupled failures put the dead layer (cause) before the starved layers (effects).
    coupled = dead_relu.detect_coupled_failures()
    blocks = [c for c in coupled if c.relation == "blocks_gradient"]
    assert {c.effect.module_name for c in blocks} == {"0", "1", "2"}
    assert all(c.cause.module_name == "3" for c in blocks)
    roots = dead_relu.get_root_causes()
    assert roots[0].root_cause == "negative_bias_init"


def test_dead_relu_with_sparse_statistics_every_4():
    torch.manual_seed(0)
    model = _mlp([16, 64, 64, 64, 1], nn.ReLU)
    with torch.no_grad():
        model[2].bias.fill_(-10.0)
    trace = _train(model, *_data(), lr=0.05, every=4, steps=60).trace
    assert trace.stats["step"].nunique() < 20  # statistics really are sparse
    top = _top(ndb.explain(trace))
    assert (top.failure_type, top.origin_layer, top.origin_step) == ("dead_neurons", "3", 0)


def test_learning_rate_spike_diverges_with_onset_near_the_spike():
    torch.manual_seed(0)
    spike = 40
    dbg = _train(_mlp([16, 64, 64, 1], nn.ReLU), *_data(), lr=0.05,
                 lr_at=lambda s: 0.05 if s < spike else 5.0)
    trace = dbg.trace
    assert not np.isfinite(trace.steps["loss"].iloc[-1])  # it really diverged (NaN tail)
    hyps = ndb.explain(trace)
    top = _top(hyps)
    assert top.failure_type in ("exploding_gradients", "loss_divergence")
    assert top.root_cause == "learning_rate_too_high"
    assert abs(top.origin_step - spike) <= 3
    assert top.origin_layer in trace.module_names
    # The NaN-filled statistics after the divergence produce no spurious dead/vanishing
    # diagnosis, and nothing is dated before the spike.
    assert not any(h.confidence >= 0.5 and h.failure_type in
                   ("dead_neurons", "vanishing_gradients", "training_plateau") for h in hyps)
    assert all(h.origin_step >= spike for h in hyps if h.confidence >= 0.5)


def test_constant_too_high_learning_rate_explodes_before_nan_with_sparse_stats():
    torch.manual_seed(0)
    trace = _train(_mlp([16, 64, 64, 1], nn.ReLU), *_data(), lr=1.0, every=5, steps=40).trace
    steps = trace.steps
    nan_step = int(steps.loc[~np.isfinite(steps["loss"]), "step"].min())
    top = _top(ndb.explain(trace))
    # Gradients grow by orders of magnitude before the loss turns non-finite: exploding.
    assert top.failure_type == "exploding_gradients"
    assert top.root_cause == "learning_rate_too_high"
    assert top.origin_step < nan_step
    g = steps["grad_norm"].to_numpy()
    assert g[top.origin_step] > 100 * g[:3].min()  # onset from every step, not every 5th


def test_unnormalised_inputs_saturate_the_first_tanh():
    torch.manual_seed(0)
    trace = _train(_mlp([16, 64, 64, 1], nn.Tanh), *_data(scale=100.0), lr=0.05).trace
    top = _top(ndb.explain(trace))
    assert (top.failure_type, top.root_cause) == ("saturated_activations", "unnormalized_inputs")
    assert top.origin_layer == "1" and top.origin_step == 0  # the first Tanh
    # The Linear before it outputs |x| ~ 200: a |x| > 0.95 rule would call it saturated.
    sat = trace.stat("act_frac_saturated")
    assert (sat["0"] == 0).all() and trace.stat("act_max_abs")["0"].min() > 50
    assert top.metadata["cause_evidence"]["input_rms"] > 20


def test_learning_rate_far_too_low_plateaus():
    torch.manual_seed(0)
    trace = _train(_mlp([16, 64, 64, 1], nn.ReLU), *_data(), lr=1e-6).trace
    hyps = ndb.explain(trace)
    top = _top(hyps)
    assert (top.failure_type, top.root_cause) == ("training_plateau", "learning_rate_too_low")
    assert top.origin_step <= 5
    assert top.metadata["cause_evidence"]["update_ratio"] < 1e-5
    assert not any(h.root_cause == "learning_rate_too_high" and h.confidence >= 0.5
                   for h in hyps)


@pytest.mark.parametrize("act", [nn.ReLU, nn.Tanh])
def test_healthy_run_has_no_confident_hypothesis(act):
    torch.manual_seed(0)
    during: list = []
    dbg = _train(_mlp([16, 64, 64, 1], act), *_data(), lr=0.05, explain_during=during)
    assert float(dbg.trace.steps["loss"].iloc[-10:].mean()) < 0.3  # it really learned
    hyps = dbg.explain_failure()
    assert all(h.confidence < 0.5 for h in hyps)
    assert all(h.confidence < 0.5 for h in during)  # also while training
    proba = ndb.HeuristicReasoner().predict_proba([dbg.trace])
    assert ndb.HeuristicReasoner().classes_[int(proba.argmax())] == "healthy"


def test_saved_trace_gives_the_same_diagnosis_and_valid_mermaid(dead_relu, tmp_path):
    trace = dead_relu.trace
    trace.save(tmp_path / "run")
    loaded = ndb.load_trace(tmp_path / "run")
    a = [h.to_dict() for h in ndb.explain(trace)]
    b = [h.to_dict() for h in ndb.explain(tmp_path / "run")]
    assert a == b == [h.to_dict() for h in ndb.explain(loaded)]
    json.dumps(a)  # metadata is JSON-compatible
    text = ndb.export_mermaid_causal_graph(trace)
    assert text == dead_relu.export_mermaid_causal_graph()
    lines = text.strip().splitlines()
    assert lines[0] == "flowchart TD"
    node = re.compile(r'^    n\d+(\["[^"]*"\]|\(\["[^"]*"\]\)|\{\{"[^"]*"\}\})$')
    edge = re.compile(r'^    (n\d+) -->\|"([^"|]*)"\| (n\d+)$')
    style = re.compile(r"^    (classDef \w+ [\w:#,]+|class [n\d,]+ \w+)$")
    edges = []
    for line in lines[1:]:
        m = edge.match(line)
        if m:
            edges.append((m.group(1), m.group(3)))
            assert re.search(r"(causes|originates_in|propagates|explains|blocks_gradient)",
                             m.group(2))
        else:
            assert node.match(line) or style.match(line), f"invalid Mermaid line: {line!r}"
    assert edges and len(edges) == len(set(edges))  # no duplicate edges
    graph = dead_relu.causal_graph()
    assert graph.number_of_edges() == len(edges)
    assert graph.has_edge("cause:negative_bias_init", "failure:dead_neurons")


def test_predict_proba_rows_and_classes(deep_sigmoid, dead_relu):
    reasoner = ndb.HeuristicReasoner()
    proba = reasoner.predict_proba([deep_sigmoid, dead_relu.trace])
    assert proba.shape == (2, len(reasoner.classes_))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert list(reasoner.predict([deep_sigmoid, dead_relu.trace])) == [
        "vanishing_gradients", "dead_neurons"]
