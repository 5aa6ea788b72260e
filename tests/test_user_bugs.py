"""Bugs in the training script, written the way users write them, against their healthy twin.

Each failing run has a twin that differs only by the bug; the heuristic must name the bug
(not a learning-rate story) on the failing run and raise nothing on the twin.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import neuraldbg as ndb

_X, _Y = load_digits(return_X_y=True)
X = torch.tensor(_X, dtype=torch.float32) / 16.0
Y = torch.tensor(_Y)


def _mlp(out: int = 10) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, out))


def _train(model: nn.Module, opt: torch.optim.Optimizer, loss_fn, targets: torch.Tensor, *,
           zero_grad: bool = True, steps: int = 150) -> ndb.Trace:
    g = torch.Generator().manual_seed(0)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(steps):
            idx = torch.randint(0, len(X), (64,), generator=g)
            if zero_grad:
                opt.zero_grad()
            loss = loss_fn(model(X[idx]), targets[idx])
            loss.backward()
            opt.step()
            dbg.step(loss)
    return dbg.trace


def _top(trace: ndb.Trace) -> ndb.Hypothesis | None:
    hyps = ndb.explain(trace)
    return hyps[0] if hyps and hyps[0].confidence >= 0.5 else None


def _assert_healthy(trace: ndb.Trace) -> None:
    assert _top(trace) is None, _top(trace)


def test_gradients_never_reset_are_named_not_the_learning_rate() -> None:
    model = _mlp()
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                   F.cross_entropy, Y, zero_grad=False)
    top = _top(trace)
    assert top is not None and top.root_cause == "missing_zero_grad", top
    assert top.metadata["cause_evidence"]["grad_growth_exponent"] > 0.8
    model = _mlp()
    _assert_healthy(_train(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                           F.cross_entropy, Y))


def test_a_softmax_before_cross_entropy_is_named_not_a_low_rate() -> None:
    model = nn.Sequential(_mlp(), nn.Softmax(dim=1))
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, Y)
    top = _top(trace)
    assert top is not None and top.root_cause == "loss_output_mismatch", top
    model = _mlp()
    _assert_healthy(_train(model, torch.optim.SGD(model.parameters(), lr=0.1),
                           F.cross_entropy, Y))


@pytest.mark.parametrize("scale, bug", [(5000.0, True), (1.0, False)])
def test_regression_targets_far_off_the_output_scale(scale: float, bug: bool) -> None:
    """A price in dollars (~1e5) against the same target standardised."""
    price = X.sum(1, keepdim=True)
    target = (price * scale + 20.0 * scale) if bug else (price - price.mean()) / price.std()
    model = _mlp(out=1)
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=1e-3), F.mse_loss, target)
    top = _top(trace)
    if bug:
        assert top is not None and top.root_cause == "unscaled_targets", top
    else:
        assert all(h.root_cause != "unscaled_targets" for h in ndb.explain(trace))
