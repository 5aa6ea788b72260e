"""``what_if`` on runs written the way users write them, checked against real re-runs.

Each test trains a small model in the usual loop, asks ``what_if`` about a knob, and re-runs
the same seed with the knob changed: the prediction must match what the re-run did.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import neuraldbg as ndb

_X, _Y = load_digits(return_X_y=True)
X = (torch.tensor(_X, dtype=torch.float32) / 16.0 - 0.5) * 2  # in [-1, 1]
Y = torch.tensor(_Y)


def _train(lr: float, *, record: bool, steps: int = 120, seed: int = 0
           ) -> tuple[list[float], ndb.Trace | None]:
    """A one-hidden-layer ReLU MLP on digits, full batch, Adam at ``lr``."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    dbg = ndb.NeuralDbg(model, optimizer=opt) if record else None
    losses = []
    with dbg if dbg is not None else torch.enable_grad():
        for _ in range(steps):
            opt.zero_grad()
            loss = F.cross_entropy(model(X), Y)
            loss.backward()
            opt.step()
            if dbg is not None:
                dbg.step(loss)
            losses.append(loss.item())
    return losses, dbg.trace if dbg is not None else None


def _learned(losses: list[float]) -> bool:
    return sum(losses[-10:]) / 10 < 0.5 * losses[0]


def test_a_rate_three_decades_too_low_needs_a_1000x_rise_not_a_10x_one() -> None:
    """Adam at 1e-6: the loss does not move in 120 steps. At 1e-3 (x1000) the re-run
    learns, at 1e-5 (x10) it still stalls. The run sits three decades under the usual rate,
    beyond the centre of the lowest level: ``what_if`` used to land a 1,000x rise two
    levels too high ("high", P(failure) 0.61) and to call a 10x rise a fix (0.12)."""
    losses, trace = _train(1e-6, record=True)
    assert trace is not None and not _learned(losses)
    assert _learned(_train(1e-3, record=False)[0])
    assert not _learned(_train(1e-5, record=False)[0])
    big, small = ndb.what_if(trace, lr_scale=1000.0), ndb.what_if(trace, lr_scale=10.0)
    assert big.p_failure_factual > 0.9
    assert big.p_failure < 0.5, big.metadata["action"]
    assert small.p_failure >= 0.5, small.metadata["action"]


def _train_offset(lr: float, *, record: bool, seed: int = 0) -> tuple[float, ndb.Trace | None]:
    """A two-hidden-layer ReLU MLP on digits whose pixels carry an offset of 20,000 (a
    column left in raw units), minibatches of 64, Adam at ``lr``: the final loss."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    raw = torch.tensor(_X, dtype=torch.float32) / 16.0 + 20000.0
    dbg = ndb.NeuralDbg(model, optimizer=opt) if record else None
    losses = []
    with dbg if dbg is not None else torch.enable_grad():
        for _ in range(300):
            idx = torch.randint(0, len(raw), (64,), generator=g)
            opt.zero_grad()
            loss = F.cross_entropy(model(raw[idx]), Y[idx])
            loss.backward()
            opt.step()
            if dbg is not None:
                dbg.step(loss)
            losses.append(loss.item())
    return sum(losses[-30:]) / 30, dbg.trace if dbg is not None else None


def test_a_tenth_of_adam_s_rate_does_not_rescue_inputs_far_off_scale() -> None:
    """Adam steps each weight by about the rate whatever the gradient's scale, so a lower
    rate does not hold off what raw inputs do to it, as it does under SGD: here the loss
    ends far above chance at 1e-3 and at 1e-4 alike. The network names the inputs, and its
    what_if said a tenth of the rate fixes the run (0.06); a new user's 1-D CNN on inputs
    x1000 + 20000 the same (0.06), where the re-runs fail."""
    final, trace = _train_offset(1e-3, record=True)
    assert trace is not None and final > 5.0  # far above chance (2.30)
    assert _train_offset(1e-4, record=False)[0] > 5.0  # a tenth of the rate fails as well
    top = ndb.explain(trace, method="probabilistic")[0]
    assert top.root_cause == "unnormalized_inputs", top
    assert ndb.what_if(trace, lr_scale=0.1).p_failure >= 0.5
