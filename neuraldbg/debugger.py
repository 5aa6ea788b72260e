"""``NeuralDbg``: the user-facing object. Capture (from :mod:`neuraldbg.capture`) plus the
diagnosis entry points, which read the recorded trace and never touch the hooks."""

from __future__ import annotations

from neuraldbg.capture import Recorder

__all__ = ["NeuralDbg"]


class NeuralDbg(Recorder):
    """Record a training run and explain its failure.

    See :class:`neuraldbg.capture.Recorder` for the capture parameters.

    Examples
    --------
    >>> import torch, neuraldbg as ndb
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> with ndb.NeuralDbg(model, optimizer=opt) as dbg:
    ...     for _ in range(3):
    ...         opt.zero_grad()
    ...         loss = model(torch.randn(16, 4)).pow(2).mean()
    ...         loss.backward()
    ...         opt.step()
    ...         dbg.step(loss)
    >>> len(dbg.trace.steps)
    3
    """
