"""Evidence beyond the time slices: the rules' graded verdict, the sigmoid-stack decay of a
run's depth and weights, and evidence a fault signs itself."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn
from training import train

import causal_models
import neuraldbg as ndb
from causal_models import registry
from causal_models.evidence import (
    RULE_STRENGTH_STATES,
    observe_stack,
    rule_strength,
    rule_verdict,
    sigmoid_decay,
)
from causal_models.structure import build_structure
from neuraldbg.methods import heuristic_diagnosis
from neuraldbg.records import Hypothesis


def _mlp(depth: int, kaiming: bool = False, steps: int = 20) -> ndb.Trace:
    """A real ReLU MLP of ``depth`` hidden layers (64 units), trained for a few steps."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i in range(depth):
        lin = nn.Linear(16 if i == 0 else 64, 64)
        if kaiming:
            nn.init.kaiming_normal_(lin.weight, nonlinearity="relu")
        layers += [lin, nn.ReLU()]
    return train(nn.Sequential(*layers, nn.Linear(64, 1)), steps).trace


def test_rule_strength_grades_the_top_confidence_around_the_healthy_line() -> None:
    grades = [rule_strength(c) for c in (0.05, 0.29, 0.3, 0.49, 0.5, 0.79, 0.8, 1.0)]
    assert grades == ["weak", "weak", "moderate", "moderate", "strong", "strong", "certain",
                      "certain"]
    assert set(grades) | {"none"} == set(RULE_STRENGTH_STATES)


def test_a_verdict_under_the_healthy_line_still_names_its_failure_and_cause() -> None:
    trace = _mlp(depth=2, steps=5)
    weak = Hypothesis(failure_type="dead_neurons", root_cause="learning_rate_too_high",
                      origin_layer="0", origin_step=3, confidence=0.48)
    strong = Hypothesis(failure_type="exploding_gradients", root_cause="unknown",
                        origin_layer="0", origin_step=1, confidence=0.2)
    assert rule_verdict(trace, [strong, weak]) == {
        "rule_failure": "dead_neurons", "rule_cause": "learning_rate_too_high",
        "rule_strength": "moderate"}
    assert rule_verdict(trace, []) == {"rule_failure": "healthy", "rule_cause": "none",
                                       "rule_strength": "none"}
    # without hypotheses given, the heuristic reasoner is asked
    assert set(rule_verdict(trace)) == {"rule_failure", "rule_cause", "rule_strength"}


def test_the_rules_nodes_read_a_weak_verdict_as_weaker_evidence_than_a_certain_one() -> None:
    s = build_structure(n_slices=2, n_blocks=2, rule_trust=0.9)
    assert s.parents["rule_failure"] == ("failure_type", "rule_strength")
    ft, strengths = s.states["failure_type"], s.states["rule_strength"]
    prior = s.prior["rule_failure"]
    configs = list(itertools.product(ft, strengths))

    def p(named: str, truth: str, strength: str) -> float:
        col = prior[:, configs.index((truth, strength))]
        return float(col[ft.index(named)] / col.sum())

    assert p("dead_neurons", "dead_neurons", "weak") < p("dead_neurons", "dead_neurons",
                                                          "certain")
    # no hypothesis at all is the only "healthy" the rules say; a named one never is
    assert p("healthy", "dead_neurons", "none") > 0.99
    assert p("healthy", "healthy", "weak") < 0.01
    rs = s.prior["rule_strength"]
    assert rs[strengths.index("none"), ft.index("healthy")] > rs[
        strengths.index("none"), ft.index("dead_neurons")]


def test_sigmoid_decay_is_depth_times_the_log_of_a_quarter_of_the_gain() -> None:
    assert sigmoid_decay(1.4, 3) == pytest.approx(3 * math.log10(0.35))
    assert sigmoid_decay(0.57, 3) < -2.0 < sigmoid_decay(1.4, 3)
    assert sigmoid_decay(1.0, 0) == 0.0
    assert math.isnan(sigmoid_decay(float("nan"), 3))


def test_stack_decay_reads_depth_and_weight_gain_from_a_real_run_whatever_its_activation(
) -> None:
    default = _mlp(depth=3)                 # PyTorch's default init: gain ~ 1/sqrt(3)
    he = _mlp(depth=3, kaiming=True)        # He init: gain ~ sqrt(2)
    deep_he = _mlp(depth=12, kaiming=True)
    states, features = {}, {}
    for name, trace in (("default", default), ("he", he), ("deep_he", deep_he)):
        st, feat = observe_stack(trace, heuristic_diagnosis(trace).facts)
        states[name], features[name] = st["sigmoid_decay"], feat
    assert features["default"]["hidden_layers"] == 3.0
    assert features["deep_he"]["hidden_layers"] == 12.0
    # the same depth: smaller weights, stronger decay (the stall of a sigmoid MLP with
    # PyTorch's default init, which He-initialised weights of that depth avoid)
    assert features["default"]["sigmoid_decay"] < features["he"]["sigmoid_decay"]
    assert (states["default"], states["he"], states["deep_he"]) == ("strong", "mild", "severe")


def test_a_fault_may_sign_run_evidence_whatever_failure_it_shows() -> None:
    @registry.register_root_cause("bursty_data", failure_types={"training_plateau": 1.0},
                                  signs={"spikes": {"spiky": 0.5}})
    def _rule() -> float:
        return 0.05

    try:
        s = build_structure(n_slices=2, n_blocks=2)
        assert ("fault:bursty_data", "spikes") in s.edges
        parents = s.parents["spikes"]
        configs = list(itertools.product(*(s.states[p] for p in parents)))
        sts = s.states["spikes"]

        def p_spiky(**kw: str) -> float:
            col = s.prior["spikes"][:, configs.index(tuple(kw[p] for p in parents))]
            return float(col[sts.index("spiky")] / col.sum())

        base = {p: "no" for p in parents if p.startswith("fault:")}
        plain = p_spiky(**base, failure_type="training_plateau")
        signed = p_spiky(**{**base, "fault:bursty_data": "yes"},
                         failure_type="training_plateau")
        assert signed > 10 * plain  # the fault explains the bursts a plateau does not
        # joined with the failure's own signature: where bursts are the failure's own sign,
        # the fault adds little
        burst = p_spiky(**base, failure_type="exploding_gradients")
        burst_signed = p_spiky(**{**base, "fault:bursty_data": "yes"},
                               failure_type="exploding_gradients")
        assert burst_signed / burst < signed / plain
    finally:
        registry.unregister("bursty_data")
    registry.register_root_cause("x", failure_types={"dead_neurons": 1.0},
                                 signs={"loss@0": {"flat": 1.0}})(lambda: 0.1)
    try:
        with pytest.raises(ValueError, match="valid evidence nodes for signs are"):
            build_structure()
    finally:
        registry.unregister("x")


def test_a_warmup_does_not_read_as_a_lower_rate() -> None:
    """The network reads the rate from the first steps' update ratio. Under a warmup those
    steps take a fraction of the rate the run trains at: a new user's AdamW at 1e-6 warmed
    up over 40 steps read 40x lower, and ``what_if(lr_scale=1000)``, whose re-run trains,
    still failed (0.98). Each early step is now read at the run's median rate."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    xs = torch.tensor((x - x.mean(0)) / (x.std(0) + 1e-6), dtype=torch.float32)
    ys = torch.tensor(y)
    features = []
    for warmup in (1, 40):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i, w=warmup: min(1.0, (i + 1) / w))
        g = torch.Generator().manual_seed(0)
        with ndb.NeuralDbg(model, optimizer=opt) as dbg:
            for _ in range(300):
                idx = torch.randint(0, len(xs), (64,), generator=g)
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(xs[idx]), ys[idx])
                loss.backward()
                opt.step()
                sched.step()
                dbg.step(loss)
        disc = causal_models.load_default_model().observe(dbg.trace)
        features.append(disc.features["update"])
    steady, warmed = features
    assert abs(warmed - steady) < 0.3, features
