"""Parameter-side measurements around the optimizer step, kept per parameter on the device.

Each step the norm of every parameter's gradient goes into one row of a device buffer
(``torch._foreach_norm`` and one ``torch.stack`` into the row: two dispatches, whatever the
number of parameters). On recorded steps the parameters' norms go in beside them, and the
update ``||W_after - W_before||`` is measured on a snapshot taken before the step and
subtracted in place after it. The global norms and the per-module sums are formed on the
host at the flush, where they cost nothing on the training path.

Gradient and parameter norms are exact. The update of a parameter tensor larger than
``sample_size`` elements is measured on a fixed strided sample of about that many of its
elements and scaled up (``||dW||^2 ~ numel / m * sum of the m sampled squares``): a full
snapshot would copy every weight at every recorded step (three passes over the model's
memory and a second copy of it), for a ratio whose use is its order of magnitude. With
``m = 4096`` the relative standard error of the estimate is about ``sqrt(2 / m)``, 2%, for
evenly spread updates (Adam's), more for heavy-tailed ones.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from neuraldbg.statistics import sample_stride

__all__ = ["ParamMeter"]

GRAD, PARAM, UPDATE = 0, 1, 2


class ParamMeter:
    """Gradient, parameter and update norms of the trainable parameters, per step.

    Parameters
    ----------
    params : list of torch.nn.Parameter
        Trainable parameters, each once.
    owner : list of int
        Buffer row (module) of each parameter.
    n_rows : int
        Module rows (monitored modules plus the bucket of container-owned parameters).
    capacity : int
        Steps held between flushes.
    device : torch.device
        Where the parameters live.
    sample_size : int
        Largest parameter tensor whose update is measured exactly (see the module notes).
    """

    def __init__(self, params: list[nn.Parameter], owner: list[int], n_rows: int,
                 capacity: int, device: torch.device, *, sample_size: int = 4096) -> None:
        self.params = params
        self._strides = [self._stride(p, sample_size) for p in params]
        counts = [p.numel() if k == 1 else len(range(0, p.numel(), k))
                  for p, k in zip(params, self._strides)]
        self._update_scale = np.sqrt([p.numel() / max(c, 1) for p, c in zip(params, counts)])
        self._owner = np.zeros((len(params), n_rows))
        self._owner[np.arange(len(params)), owner] = 1.0
        self._norms = torch.full((capacity, 3, len(params)), math.nan, dtype=torch.float32,
                                 device=device)
        self._zero = torch.zeros((), device=device)
        self._snapshot: list[torch.Tensor] | None = None
        self._fresh = False

    @staticmethod
    def _stride(p: nn.Parameter, sample_size: int) -> int:
        if p.numel() <= sample_size or not p.is_contiguous():
            return 1
        per_row = p.numel() // p.shape[0] if p.dim() > 1 else 1
        return sample_stride(p.numel(), per_row, sample_size)

    def _update_views(self) -> list[torch.Tensor]:
        """The elements of each parameter whose update is measured (views, no copy)."""
        return [p.detach() if k == 1 else p.detach().view(-1)[::k]
                for p, k in zip(self.params, self._strides)]

    def _grads(self) -> list[torch.Tensor] | None:
        grads = [p.grad for p in self.params]
        if all(g is None for g in grads):
            return None
        # a parameter without a gradient this step counts as a zero gradient
        return [g if g is not None else self._zero for g in grads]

    def before_update(self, slot: int, *, recorded: bool, snapshot: bool) -> None:
        """Gradient norms (every step); parameter norms and the snapshot (recorded steps)."""
        self._fresh = False
        if not self.params:
            return
        grads = self._grads()
        row = self._norms[slot]
        with torch.no_grad():
            if not recorded:
                if grads is not None:
                    torch.stack(torch._foreach_norm(grads), out=row[GRAD])
                return
            weights = [p.detach() for p in self.params]
            if grads is None:
                torch.stack(torch._foreach_norm(weights), out=row[PARAM])
            else:
                torch.stack(torch._foreach_norm(grads + weights), out=row[:2].view(-1))
            if snapshot:
                views = self._update_views()
                if self._snapshot is None:
                    self._snapshot = [v.clone() for v in views]
                else:
                    torch._foreach_copy_(self._snapshot, views)
                self._fresh = True

    def after_update(self, slot: int) -> None:
        """``||dW||`` per parameter across the step just taken (when a snapshot was taken)."""
        if not self._fresh or self._snapshot is None:
            return
        self._fresh = False
        with torch.no_grad():
            torch._foreach_sub_(self._snapshot, self._update_views())
            torch.stack(torch._foreach_norm(self._snapshot), out=self._norms[slot, UPDATE])

    def drain(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copy of the first ``n`` steps, then reset them.

        Returns
        -------
        totals : numpy.ndarray
            ``(n, 3)`` global gradient, parameter and update norms (NaN where not measured).
        per_module : numpy.ndarray
            ``(n, n_rows, 3)`` squared norms summed over each module's own parameters.
        """
        if not self.params:
            return np.full((n, 3), math.nan), np.zeros((n, self._owner.shape[1], 3))
        with torch.no_grad():
            host = self._norms[:n].to("cpu", torch.float64, copy=True).numpy()
            self._norms[:n].fill_(math.nan)
        host[:, UPDATE] *= self._update_scale
        sq = host**2
        totals = np.sqrt(sq.sum(axis=2))
        per_module = np.einsum("nkp,pm->nmk", np.nan_to_num(sq, nan=0.0), self._owner)
        # a quantity not measured at a step stays NaN for every module
        per_module[np.isnan(totals)[:, None, :].repeat(per_module.shape[1], 1)] = math.nan
        return totals, per_module
