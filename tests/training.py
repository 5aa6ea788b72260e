"""Real training under NeuralDbg for tests: a small regression task, real hooks."""

from __future__ import annotations

import torch
from torch import nn

import neuraldbg as ndb
from neuraldbg.trace import Trace


def train(model: nn.Module, steps: int, *, input_scale: float = 1.0, lr: float = 0.05,
          every: int = 1, out=None, seed: int = 0) -> ndb.NeuralDbg:
    """Train ``model`` (16 inputs, 1 output) on y = sin(x_0) with SGD; return the debugger."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(128, 16, generator=g)
    y = x[:, :1].sin()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    dbg = ndb.NeuralDbg(model, optimizer=opt, every=every, out=out,
                        config={"lr": lr, "optimizer": "sgd"})
    with dbg:
        for _ in range(steps):
            opt.zero_grad()
            loss = ((model(x * input_scale) - y) ** 2).mean()
            loss.backward()
            opt.step()
            dbg.step(loss)
    return dbg


def train_mlp(*, act: type[nn.Module], depth: int, lr: float, dead_bias: bool = False,
              steps: int = 60, seed: int = 0) -> Trace:
    """A small MLP (8 inputs, ``depth`` hidden layers of 16, 1 output) on a sign task, MSE, SGD.

    ``dead_bias`` sets the second hidden layer's bias to -8, so its ReLU units die. Returns
    the recorded trace.
    """
    torch.manual_seed(seed)
    x = torch.randn(128, 8)
    y = (x[:, :2].sum(1, keepdim=True) > 0).float()
    layers: list[nn.Module] = []
    width = 8
    for _ in range(depth):
        layers += [nn.Linear(width, 16), act()]
        width = 16
    model = nn.Sequential(*layers, nn.Linear(width, 1))
    if dead_bias:  # the second ReLU's inputs are all negative
        with torch.no_grad():
            model[2].bias.fill_(-8.0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with ndb.NeuralDbg(model, optimizer=opt, config={"lr": lr}, seed=seed) as dbg:
        for _ in range(steps):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            dbg.step(loss)
    return dbg.trace


def fit_full_batch(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                   y: torch.Tensor, steps: int) -> Trace:
    """``steps`` full-batch steps of mean squared error under NeuralDbg; the trace."""
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(steps):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            dbg.step(loss)
    return dbg.trace
