"""Losses as users write them, beyond cross-entropy and squared error.

A heteroscedastic regression trained with ``nn.GaussianNLLLoss`` (the negative log-likelihood
of a density, which goes below zero as the fit sharpens), through real hooks.
"""

from __future__ import annotations

import torch
from torch import nn

import neuraldbg as ndb

STEPS = 300


class _Heteroscedastic(nn.Module):
    """A mean and a variance head on a small tanh body."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.mean = nn.Linear(64, 1)
        self.logvar = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.mean(h), self.logvar(h).exp()


def _gaussian_nll_run(lr: float, shift: float = 0.0) -> ndb.Trace:
    """y = sin(x) with noise growing in |x|; ``shift`` is added to the loss (same gradients)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1500, 1, generator=g) * 6 - 3
    y = torch.sin(x) + (0.05 + 0.1 * x.abs()) * torch.randn(1500, 1, generator=g)
    model, nll = _Heteroscedastic(), nn.GaussianNLLLoss()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(STEPS):
            idx = torch.randint(0, len(x), (64,), generator=g)
            opt.zero_grad()
            mean, var = model(x[idx])
            loss = nll(mean, y[idx], var) + shift
            loss.backward()
            opt.step()
            dbg.step(loss)
    return dbg.trace


def test_a_negative_log_likelihood_falling_below_zero_is_learning():
    """The loss falls from about 0.4 to -1.2: read as a ratio to its start it 'rose'
    (the probabilistic method said training_plateau at 0.89 before the fix)."""
    trace = _gaussian_nll_run(lr=3e-3)
    loss = trace.steps["loss"]
    assert loss.iloc[0] > 0 > -1.0 > loss.iloc[-20:].mean()
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert all(h.confidence < 0.5 for h in hyps), (method, hyps[:2])


def test_a_negative_loss_that_does_not_move_is_still_a_stall():
    """The same model at a rate 3,000x too low, its loss shifted below zero throughout: the
    reading from the loss's own floor still sees no learning."""
    trace = _gaussian_nll_run(lr=1e-6, shift=-2.0)
    assert (trace.steps["loss"] < 0).all()
    top = ndb.explain(trace, method="probabilistic")[0]
    assert (top.failure_type, top.root_cause) == ("training_plateau", "learning_rate_too_low")
    assert top.confidence >= 0.5
