"""Weight-row diversity: measured at enter and at flushes, from real training under hooks."""

from __future__ import annotations

import torch
from torch import nn

import neuraldbg as ndb
from neuraldbg.weight_diversity import row_diversity


def test_row_diversity_is_zero_for_copies_and_about_one_for_a_random_init() -> None:
    assert float(row_diversity(torch.full((8, 5), 0.01))) == 0.0
    assert float(row_diversity(torch.zeros(4, 3))) == 0.0  # no 0/0
    rand = nn.Linear(64, 32).weight
    assert 0.8 < float(row_diversity(rand)) < 1.2
    conv = nn.Conv2d(3, 8, 3).weight  # rows are output channels
    assert 0.8 < float(row_diversity(conv)) < 1.2


def _train(model: nn.Module, steps: int, flush_every: int = 100,
           loss_fn=nn.functional.cross_entropy) -> ndb.Trace:  # noqa: ANN001
    torch.manual_seed(0)
    x, y = torch.randn(256, 10), torch.randint(0, 3, (256,))
    if loss_fn is not nn.functional.cross_entropy:
        y = y.float()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ndb.NeuralDbg(model, optimizer=opt, flush_every=flush_every) as dbg:
        for step in range(steps):
            idx = torch.arange(step * 16, step * 16 + 16) % 256
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            dbg.step(loss)
    return dbg.trace


def test_constant_fill_stays_symmetric_in_hidden_layers_and_is_recorded_at_enter() -> None:
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.05)
    div = _train(model, steps=30, flush_every=10).meta["weight_diversity"]
    assert div["steps"][0] == 0 and div["steps"][-1] == 30
    assert div["steps"] == sorted(set(div["steps"]))  # each step once
    assert all(v < 1e-6 for v in div["modules"]["0"])  # units of the hidden layer: copies
    assert div["modules"]["2"][0] == 0.0 and div["modules"]["2"][-1] > 0.05  # head moves


def test_a_zero_initialised_head_is_not_symmetric_once_it_trains() -> None:
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))
    with torch.no_grad():
        model[2].weight.zero_()
    trace = _train(model, steps=20)
    div = trace.meta["weight_diversity"]["modules"]
    assert div["0"][0] > 0.5 and div["2"][0] == 0.0 and div["2"][-1] > 0.05
    assert all(h.root_cause != "symmetric_init" for h in ndb.explain(trace))


def test_a_single_output_row_and_parameter_free_modules_are_not_measured() -> None:
    model = nn.Sequential(nn.Linear(10, 8), nn.Tanh(), nn.Linear(8, 1))
    div = _train(nn.Sequential(model, nn.Flatten(0)), steps=3,
                 loss_fn=nn.functional.mse_loss).meta["weight_diversity"]
    assert set(div["modules"]) == {"0.0"}
