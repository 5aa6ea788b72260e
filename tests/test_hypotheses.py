"""Hypothesis Generator: confidence function, vocabulary rules, root causes from evidence."""

from __future__ import annotations

import numpy as np
import pytest
from reasoner_traces import make_trace

from neuraldbg.cause_evidence import logistic_support
from neuraldbg.methods import explain, heuristic_diagnosis
from neuraldbg.symptoms import ratio_strength, share_strength


def _dead_trace(share, n=60, stall=True):
    dead = np.zeros((n, 3))
    dead[:, 1] = share
    loss = np.ones(n) if stall else None
    return make_trace(["Linear", "ReLU", "Linear"], n, dead=dead, loss=loss)


def test_strength_functions_are_half_at_the_threshold_and_monotone():
    assert ratio_strength(100.0, 100.0) == pytest.approx(0.5)
    assert ratio_strength(1000.0, 100.0) == pytest.approx(0.75)
    assert ratio_strength(50.0, 100.0) == 0.0 and ratio_strength(np.inf, 1.0) == 1.0
    assert share_strength(0.6, 0.6) == pytest.approx(0.5) and share_strength(1.0, 0.6) == 1.0
    assert logistic_support(1.0, 1.0) == pytest.approx(0.5)
    assert logistic_support(10 ** 0.5, 1.0) == pytest.approx(0.75)
    assert logistic_support(10 ** -0.5, 1.0) == pytest.approx(0.25)
    assert logistic_support(float("nan"), 1.0) == 0.0


def test_confidence_grows_with_the_strength_of_the_evidence():
    confs = []
    for share in (0.65, 0.8, 1.0):
        hyps = explain(_dead_trace(share))
        confs.append(max(h.confidence for h in hyps if h.failure_type == "dead_neurons"))
        if share >= 0.8:  # clear evidence: the dead layer, not a bare plateau, explains the stall
            assert hyps[0].failure_type == "dead_neurons"
    assert confs[0] < confs[1] < confs[2] <= 1.0
    assert len(set(confs)) == 3  # not a constant


def test_dead_units_without_a_stall_are_not_a_confident_failure():
    # 65% dead but the loss keeps falling: reported, but below the 0.5 line.
    hyps = explain(_dead_trace(0.65, stall=False))
    assert hyps and all(h.confidence < 0.5 for h in hyps)


def test_causes_of_one_symptom_rank_by_support_and_unknown_cannot_outrank_evidence():
    n = 60
    dead = np.zeros((n, 3))
    dead[:, 1] = 1.0
    mean = np.zeros((n, 3))
    mean[:, 0] = -8.0          # the Linear feeding the dead ReLU sits 16 std below zero
    hyps = explain(make_trace(["Linear", "ReLU", "Linear"], n, dead=dead, mean=mean,
                              loss=np.ones(n)))
    dead_h = [h for h in hyps if h.failure_type == "dead_neurons"]
    assert dead_h[0].root_cause == "negative_bias_init"
    support = dead_h[0].metadata["cause_support"]
    assert support["negative_bias_init"] > 0.9
    ranked = [h.root_cause for h in dead_h]
    assert ranked.index("negative_bias_init") < (ranked.index("unknown") if "unknown" in ranked
                                                 else len(ranked))
    assert all(0.0 <= h.confidence <= 1.0 for h in hyps)


def _divergence_trace(grad_lead: bool, lr_jump: bool, n=40, nan_at=30):
    grad_norm = np.full(n, 0.1)
    if grad_lead:
        grad_norm[nan_at - 8:nan_at] = 0.1 * 10.0 ** np.arange(1, 9)  # 8 steps of growth
    grad_norm[nan_at:] = np.nan
    loss = np.ones(n)
    loss[nan_at - 1] = 1e3 if not grad_lead else 1.0
    loss[nan_at:] = np.nan
    lr = np.full(n, 0.01)
    if lr_jump:
        lr[nan_at - 2:] = 1.0
    nan = np.zeros((n, 2))
    nan[nan_at:] = 5
    grad = np.tile([0.05, 0.1], (n, 1)) * (grad_norm / 0.1)[:, None]
    return make_trace(["Linear", "Linear"], n, grad=grad, grad_norm=grad_norm, loss=loss,
                      lr=lr, nan=nan)


def test_vocabulary_exploding_when_gradients_lead_the_nonfinite_loss():
    top = explain(_divergence_trace(grad_lead=True, lr_jump=False))[0]
    assert top.failure_type == "exploding_gradients"
    assert top.metadata["evidence"]["gradient_lead_steps"] > 0


def test_vocabulary_divergence_without_a_gradient_lead_or_after_an_lr_jump():
    top = explain(_divergence_trace(grad_lead=False, lr_jump=False))[0]
    assert top.failure_type == "loss_divergence"
    top = explain(_divergence_trace(grad_lead=True, lr_jump=True))[0]
    assert (top.failure_type, top.root_cause) == ("loss_divergence", "learning_rate_too_high")


def test_missing_clipping_ranks_for_a_recurrent_net_only_when_no_clip_is_configured():
    base = _divergence_trace(grad_lead=True, lr_jump=False)
    base.modules.loc[0, "module_type"] = "GRU"
    causes = [h.root_cause for h in explain(base) if h.failure_type == "exploding_gradients"]
    assert causes[0] == "missing_gradient_clipping"
    base.meta["config"] = {"grad_clip": 1.0}
    assert "missing_gradient_clipping" not in [h.root_cause for h in explain(base)]


def test_init_scale_too_large_from_layer_gains_at_the_first_step():
    n = 30
    types = ["Linear", "Tanh", "Linear", "Tanh", "Linear", "Tanh", "Linear"]
    std = np.tile([4.0, 1.0, 5.0, 1.0, 5.0, 1.0, 5.0], (n, 1))  # each Linear gains ~5x
    sat = np.zeros((n, 7))
    sat[:, [1, 3, 5]] = 0.9
    diag = heuristic_diagnosis(make_trace(types, n, std=std, sat=sat, loss=np.ones(n)))
    assert diag.facts.init_gain == pytest.approx(5.0)
    top = diag.hypotheses[0]
    assert (top.failure_type, top.origin_layer) == ("saturated_activations", "1")
    assert top.root_cause == "init_scale_too_large"


def test_vocabulary_a_loss_that_ended_ten_times_above_its_start_diverged_not_stalled():
    """A loss that climbs from 1.4 to 13-19 and stays there did not stall: the contract keeps
    training_plateau for a loss that does not improve, and one that blew up past the line
    and ended beyond it is a divergence. (An RNN at lr 1.0 without clipping, 1.39 -> 19.5,
    was a plateau to the rules: the stall outweighed a blow-up whose peak was not far past
    the line.)"""
    rng = np.random.default_rng(0)
    n = 96
    loss = np.concatenate([1.39 + 0.05 * rng.standard_normal(10), np.linspace(1.6, 13, 10),
                           13 + 6 * rng.random(n - 20)])
    hyps = explain(make_trace(["RNN", "Linear"], n, loss=loss))
    assert hyps[0].failure_type == "loss_divergence", hyps[:2]
    assert not [h for h in hyps if h.failure_type == "training_plateau" and h.confidence >= 0.5]


def test_gradients_reset_every_4_steps_are_read_even_when_a_step_in_a_window_dips() -> None:
    """A pile-up cleared every 4 optimizer steps rises on 3 steps of 4 at best, and a noisy
    step inside a window lowers that share (0.68 measured on a CNN under SGD, read as a rate
    too high while the rule asked for 0.7). The same norms out of order are no pattern."""
    from neuraldbg.cause_evidence import periodic_reset_support
    from neuraldbg.thresholds import ThresholdConfig

    cycles = 40
    window = np.array([1.0, 2.0, 3.0, 4.0])
    g = np.concatenate([window * (1.0 + 0.05 * c) for c in range(cycles)])
    for c in range(0, cycles, 4):  # one step in every fourth window falls back a little
        g[4 * c + 2] = g[4 * c + 1] * 0.9
    rising = float(np.mean(np.diff(g) > 0))
    assert 0.6 < rising < 0.7
    cfg = ThresholdConfig()
    trace = make_trace(["Linear", "ReLU", "Linear"], len(g), grad_norm=g)
    assert periodic_reset_support(heuristic_diagnosis(trace).facts, cfg) == 1.0
    shuffled = np.random.default_rng(0).permutation(g)
    trace = make_trace(["Linear", "ReLU", "Linear"], len(g), grad_norm=shuffled)
    assert periodic_reset_support(heuristic_diagnosis(trace).facts, cfg) == 0.0
