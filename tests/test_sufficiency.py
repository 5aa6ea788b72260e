"""Thin or broken evidence gives no confident verdict, and no exception (real training)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import neuraldbg as ndb
from neuraldbg.outside_vocabulary import (
    NO_GRADIENT_HINT,
    NO_STEP_HINT,
    OTHER_PARAMETERS_HINT,
    frozen_weights,
)
from neuraldbg.reporting.words import what_if_caveat
from neuraldbg.sufficiency import HEDGED_CONFIDENCE, MIN_STEPS, hedge, still_improving
from tests.training import train

METHODS = ["heuristic", "probabilistic"]


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("steps", [1, MIN_STEPS - 1])
def test_a_handful_of_steps_gives_no_confident_verdict(method: str, steps: int) -> None:
    dbg = train(_mlp(), steps)
    hyps = ndb.explain(dbg.trace, method=method)
    assert all(h.confidence < 0.5 for h in hyps)
    assert all("finished step" in h.metadata["thin_evidence"] for h in hyps)
    if method == "probabilistic":
        assert "finished step" in ndb.what_if(dbg.trace, lr_scale=0.1).metadata["thin_evidence"]


def test_a_healthy_run_read_early_is_no_plateau_yet() -> None:
    """SGD lr 0.05 with momentum on the digits: the loss barely moves for the first dozen
    steps while the momentum builds up, then falls. Read at step 10 (fewer steps than any
    plateau needs) and at step 30 (the loss down 14% and falling faster), neither method
    may call it stalled."""
    from sklearn.datasets import load_digits

    x_all, y_all = load_digits(return_X_y=True)
    x_all = torch.tensor(x_all, dtype=torch.float32) / 16.0
    y_all = torch.tensor(y_all)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    read: dict[int, dict[str, list]] = {}
    whatif: dict[int, Any] = {}
    falling: dict[int, str | None] = {}
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(30):
            idx = torch.randint(0, len(x_all), (64,), generator=g)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x_all[idx]), y_all[idx])
            loss.backward()
            opt.step()
            dbg.step(loss)
            if step + 1 in (10, 30):
                read[step + 1] = {m: dbg.explain_failure(method=m) for m in METHODS}
                whatif[step + 1] = ndb.what_if(dbg.trace, lr_scale=1.0)
                falling[step + 1] = still_improving(dbg.trace)
    loss = dbg.trace.steps["loss"].to_numpy()
    assert loss[-5:].mean() < 0.9 * loss[:5].mean()  # it is learning
    for n, by_method in read.items():
        for method, hyps in by_method.items():
            assert all(h.confidence < 0.5 for h in hyps), (n, method, hyps[:1])
    # the causal model's own reading is a stall: what_if says explain does not claim it
    for n, cf in whatif.items():
        factual = {k: v for k, v in cf.p_failure_types_factual.items() if k != "healthy"}
        assert cf.p_failure_factual >= 0.5 and max(factual, key=factual.get) == \
            "training_plateau", (n, cf.p_failure_types_factual)
        why = cf.metadata["plateau_unclaimable"]
        assert "fewer than 50" in why, (n, why)  # (PLATEAU_CLAIM_MIN_LOSSES)
        assert "explain does not call it a plateau" in what_if_caveat(cf.metadata)
    assert falling[10] is None and "still falling" in (falling[30] or "")  # at 30 it falls


@pytest.mark.parametrize("seed", [0, 1])
def test_full_batch_training_that_reaches_the_bottom_early_is_no_explosion(seed: int) -> None:
    """Full-batch Adam with weight decay on two moons: the loss falls from 0.69 to under
    0.002 by step 30 and then creeps up to about 0.001-0.003 as the decay pulls on the
    weights. The run's first steps carry its largest gradients (the loss is largest
    there), 100x the later median. The fall was read as the transient of an absurd start
    (weights far too large settle near chance within the first window) and the creep as a
    full stall, so the heuristic claimed exploding gradients at 0.54-0.74 (a graph
    network trained the same way: 0.57-0.77)."""
    from sklearn.datasets import make_moons

    x, y = make_moons(400, noise=0.1, random_state=seed)
    x = torch.tensor((x - x.mean(0)) / x.std(0), dtype=torch.float32)
    y = torch.tensor(y)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-3)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(300):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dbg.step(loss)
    loss = dbg.trace.steps["loss"].to_numpy()
    assert np.median(loss[30:60]) < 0.005 and np.median(loss[-30:]) > np.median(loss[30:60])
    for method in METHODS:
        claimed = [h for h in ndb.explain(dbg.trace, method=method) if h.confidence >= 0.5]
        assert not claimed, (method, claimed)


def test_a_thin_diverged_run_is_still_named_but_not_claimed() -> None:
    """A rate of 1e4 blows up at once: the failure is ranked, but below 0.5."""
    dbg = train(_mlp(), 3, lr=1e4)
    hyps = ndb.explain(dbg.trace)
    assert hyps, "the divergence is still reported"
    assert max(h.confidence for h in hyps) <= HEDGED_CONFIDENCE


@pytest.mark.parametrize("method", METHODS)
def test_a_model_with_one_leaf_module_is_explained(method: str) -> None:
    dbg = train(nn.Linear(16, 1), 40)
    hyps = ndb.explain(dbg.trace, method=method)
    assert all(h.confidence < 0.5 for h in hyps), hyps[:1]  # it trains fine


@pytest.mark.parametrize("method", METHODS)
def test_a_step_interrupted_by_an_exception_is_not_a_failure(method: str) -> None:
    """A healthy run whose loop raised inside a step (the forward ran, no dbg.step)."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(128, 16, generator=torch.Generator().manual_seed(0))
    y = x[:, :1].sin()
    dbg = ndb.NeuralDbg(model, optimizer=opt)
    with pytest.raises(RuntimeError, match="data loader"):
        with dbg:
            for step in range(41):
                opt.zero_grad()
                loss = ((model(x) - y) ** 2).mean()
                if step == 40:
                    raise RuntimeError("data loader worker died")
                loss.backward()
                opt.step()
                dbg.step(loss)
    hyps = ndb.explain(dbg.trace, method=method)
    assert all(h.confidence < 0.5 for h in hyps), hyps[:1]
    cf = ndb.what_if(dbg.trace)
    assert cf.p_failure == cf.p_failure_factual


def test_no_finished_step_is_a_clear_error() -> None:
    model = _mlp()
    dbg = ndb.NeuralDbg(model)
    with pytest.raises(ValueError, match="no finished training step"):
        with dbg:
            model(torch.randn(4, 16))
            dbg.explain_failure()


def test_steps_recorded_without_a_loss_say_so() -> None:
    """``dbg.step()`` with no argument on a model whose output holds no loss: every step is
    there but without a loss; the error names that, not an empty trace."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(10):
            opt.zero_grad()
            model(torch.randn(4, 16)).pow(2).mean().backward()
            opt.step()
            dbg.step()
    assert len(dbg.trace.steps) == 10
    with pytest.raises(ValueError, match=r"recorded without a loss.*dbg\.step\(loss\)"):
        ndb.explain(dbg.trace)


def test_hedge_keeps_order_and_ratios() -> None:
    hyps = [ndb.Hypothesis("loss_divergence", "learning_rate_too_high", "0", 0, 0.9, {}),
            ndb.Hypothesis("exploding_gradients", "unknown", "0", 0, 0.3, {})]
    out = hedge(hyps, "only 2 finished step(s) recorded")
    assert [h.confidence for h in out] == pytest.approx([HEDGED_CONFIDENCE,
                                                         HEDGED_CONFIDENCE / 3])
    assert out[0].metadata["thin_evidence"] == "only 2 finished step(s) recorded"


@pytest.mark.parametrize("grad, update, param, expected", [
    (0.0, 0.0, 3.0, NO_GRADIENT_HINT),  # loss.backward() forgotten
    (float("nan"), float("nan"), 3.0, NO_GRADIENT_HINT),  # no parameter had a .grad
    (float("inf"), float("nan"), 3.0, None),  # a GradScaler skipping overflowing steps
    (1.0, float("nan"), 3.0, OTHER_PARAMETERS_HINT),  # the optimizer holds other weights
    (1.0, 0.0, 3.0, None),  # a rate too small to change a float32 weight: update measured
    (1.0, 0.1, None, None),  # the weights moved
    (float("nan"), float("nan"), float("nan"), None),  # no optimizer given: nothing to say
])
def test_frozen_weights_tells_a_missing_gradient_from_other_stalls(grad, update, param,
                                                                   expected) -> None:
    """Unit test of one function on hand-built step rows (the real loops are in
    tests/test_user_bugs.py)."""
    n = MIN_STEPS + 3
    steps = pd.DataFrame({"step": range(n), "loss": 2.3, "grad_norm": grad,
                          "update_norm": update,
                          "param_norm": [param] * n if param else np.linspace(3, 4, n)})
    trace = ndb.Trace(steps=steps, stats=pd.DataFrame(), modules=pd.DataFrame())
    assert frozen_weights(trace) == expected
    assert frozen_weights(trace, min_steps=n + 1) is None  # too few steps to tell


def test_frozen_weights_tells_an_optimizer_that_never_stepped() -> None:
    """``opt.step()`` forgotten with the optimizer given to the capture: nothing measured."""
    nan = float("nan")
    steps = pd.DataFrame({"step": range(MIN_STEPS), "loss": 2.3, "grad_norm": nan,
                          "update_norm": nan, "param_norm": nan})
    trace = ndb.Trace(steps=steps, stats=pd.DataFrame(), modules=pd.DataFrame(),
                      meta={"optimizer_class": "Adam"})
    assert frozen_weights(trace) == NO_STEP_HINT
    assert frozen_weights(dataclasses.replace(trace, meta={})) is None


def test_what_a_hedge_quotes_of_a_loss_below_zero_is_the_loss_the_run_recorded() -> None:
    # a loss that goes below zero is measured from its own floor inside the diagnosis
    # (loss_above_floor); a new user's Poisson regression (-0.86 -> -2.14) was told "the
    # loss fell from 8.26 to 5.96", values they never saw. One function, on a trace built by
    # hand: a likelihood that fell early and settled, every value below zero
    from neuraldbg.sufficiency import fell_early_then_settled, loss_above_floor

    rng = np.random.default_rng(0)
    loss = np.concatenate([np.linspace(-0.5, -2.0, 20), -2.1 + 0.02 * rng.standard_normal(180)])
    steps = pd.DataFrame({"step": np.arange(len(loss)), "loss": loss})
    trace = loss_above_floor(ndb.Trace(steps=steps, stats=pd.DataFrame(), modules=pd.DataFrame(),
                                       meta={}))
    assert trace.steps["loss"].min() > 0  # the diagnosis reads it from its floor
    why = fell_early_then_settled(trace)
    assert why is not None
    quoted = [float(v) for v in re.findall(r"(?:from|to|at) (-?\d+(?:\.\d+)?)", why)]
    assert len(quoted) == 3 and all(loss.min() - 0.1 <= q <= loss.max() + 0.1
                                    for q in quoted), why
