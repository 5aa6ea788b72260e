"""Real training under NeuralDbg for tests: a small regression task, real hooks."""

from __future__ import annotations

import torch
from torch import nn

import neuraldbg as ndb


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
