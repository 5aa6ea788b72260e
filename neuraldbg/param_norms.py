"""Parameter-side measurements around the optimizer step, kept per parameter on the device.

Each step the norm of every parameter's gradient goes into one row of a device buffer
(``torch._foreach_norm`` and one ``torch.stack`` into the row: two dispatches, whatever the
number of parameters). On recorded steps the parameters' norms go in beside them, and the
update ``||W_after - W_before||`` is measured on a snapshot taken before the step: the
measured elements of every parameter side by side in one flat buffer, so the snapshot, the
difference and the per-parameter sums (``index_add_`` in float64) are a fixed handful of
operations however many parameters there are (a ``torch._foreach_*`` call on the CPU
dispatches one operation per tensor). The global norms and the per-module sums are formed on the
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
import warnings

import numpy as np
import torch
from torch import nn

from neuraldbg.statistics import sample_stride

__all__ = ["ParamMeter"]

GRAD, PARAM, UPDATE = 0, 1, 2


class _FlatUpdate:
    """Update norms of several parameters with a fixed number of operations.

    The measured elements of every parameter (1-D views that track the parameters) are
    copied side by side into one flat snapshot before the step; after it, one difference,
    one squaring and one ``index_add_`` give every parameter's ``||dW||^2`` (summed in
    float64), whatever the number of parameters: on the CPU a ``torch._foreach_*`` call
    dispatches one operation per tensor.
    """

    def __init__(self, views: list[torch.Tensor]) -> None:
        self.views = views
        sizes = [v.numel() for v in views]
        first = views[0]
        self._snap = torch.empty(sum(sizes), dtype=first.dtype, device=first.device)
        self._now = torch.empty_like(self._snap)
        self._diff = torch.empty(sum(sizes), dtype=torch.float64, device=first.device)
        self._zeros = torch.zeros(len(views), dtype=torch.float64, device=first.device)
        self._sums = torch.empty_like(self._zeros)
        self._index = torch.repeat_interleave(
            torch.arange(len(views), device=first.device),
            torch.tensor(sizes, device=first.device))
        self.take()

    def take(self) -> None:
        """Snapshot the measured elements (before the step)."""
        torch.cat(self.views, out=self._snap)

    def norms(self, out: torch.Tensor) -> None:
        """Write ``||W_now - W_snapshot||`` of each parameter into ``out``."""
        torch.cat(self.views, out=self._now)
        diff = torch.sub(self._now, self._snap, out=self._diff).square_()
        # out-of-place forms with ``out=``: one dispatch each instead of zero_ + index_add_
        # and sqrt_ + copy_ (same arithmetic: float64 sums, the square root cast to float32)
        torch.index_add(self._zeros, 0, self._index, diff, out=self._sums)
        torch.sqrt(self._sums, out=out)


class ParamMeter:
    """Gradient, parameter and update norms of the trainable parameters, per step.

    The parameters are split into contiguous groups, one per optimizer: each group is
    measured when its own optimizer steps (its gradients as that optimizer receives them,
    its update across that optimizer's step), so two optimizers on one model (a GAN, a
    separate head) each get their own parameters' figures.

    Parameters
    ----------
    params : list of torch.nn.Parameter
        Trainable parameters, each once, ordered group by group.
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
    groups : list of (int, int, int), optional
        ``(start, stop, update_stop)`` of each group: ``params[start:stop]`` are measured
        together and the update of ``params[start:update_stop]`` across the group's step
        (parameters no optimizer updates sit in ``[update_stop, stop)``). Default: one group
        holding every parameter.
    """

    def __init__(self, params: list[nn.Parameter], owner: list[int], n_rows: int,
                 capacity: int, device: torch.device, *, sample_size: int = 4096,
                 groups: list[tuple[int, int, int]] | None = None) -> None:
        self.params = params
        self.groups = groups or [(0, len(params), len(params))]
        self._strides = [self._stride(p, sample_size) for p in params]
        counts = [p.numel() if k == 1 else len(range(0, p.numel(), k))
                  for p, k in zip(params, self._strides, strict=True)]
        self._update_scale = np.sqrt([p.numel() / max(c, 1)
                                      for p, c in zip(params, counts, strict=True)])
        self._owner = np.zeros((len(params), n_rows))
        self._owner[np.arange(len(params)), owner] = 1.0
        self._norms = torch.full((capacity, 3, len(params)), math.nan, dtype=torch.float32,
                                 device=device)
        self._zero = torch.zeros((), device=device)
        self._snapshot: dict[int, _FlatUpdate | list[torch.Tensor]] = {}
        self._fresh: set[int] = set()
        # Views made once and reused every step (each view is a dispatched op on the hot
        # path): output rows of the buffer, and the measured elements of each parameter,
        # rebuilt when a parameter's storage changes (``p.data = ...``, ``module.to()``).
        self._out: dict[tuple[int, int, int], torch.Tensor] = {}
        self._views: dict[int, tuple[tuple[int, ...], list[torch.Tensor]]] = {}

    @staticmethod
    def _stride(p: nn.Parameter, sample_size: int) -> int:
        if p.numel() <= sample_size or not p.is_contiguous():
            return 1
        per_row = p.numel() // p.shape[0] if p.dim() > 1 else 1
        return sample_stride(p.numel(), per_row, sample_size)

    def _update_views(self, key: int, start: int, stop: int) -> list[torch.Tensor]:
        """The elements of each parameter whose update is measured (views, no copy).

        Cached per group while every parameter keeps its storage; a view of a parameter
        made under ``no_grad`` tracks its in-place updates.
        """
        params = self.params[start:stop]
        ptrs = tuple(p.data_ptr() for p in params)
        cached = self._views.get(key)
        if cached is not None and cached[0] == ptrs:
            return cached[1]
        with torch.no_grad():  # flat where the storage allows (see _FlatUpdate)
            views = [(p.detach().view(-1) if p.is_contiguous() else p.detach()) if k == 1
                     else p.detach().view(-1)[::k]
                     for p, k in zip(params, self._strides[start:stop], strict=True)]
        self._views[key] = (ptrs, views)
        return views

    def _row(self, slot: int, kind: int, group: int) -> torch.Tensor:
        """Cached view of buffer row ``slot`` for ``group``'s parameters.

        ``kind`` is ``GRAD``, ``UPDATE`` or ``-1`` (gradient and parameter norms together,
        ``(2 * n,)`` flat when the group holds every parameter, else ``(2, n)``).
        """
        key = (slot, kind, group)
        out = self._out.get(key)
        if out is None:
            start, stop, upd = (0, len(self.params), len(self.params)) if group < 0 else \
                self.groups[group]
            row = self._norms[slot]
            if kind == GRAD:
                out = row[GRAD, start:stop]
            elif kind == UPDATE:
                out = row[UPDATE, start:upd]
            elif start == 0 and stop == len(self.params):
                out = row[:2].view(-1)
            else:
                out = row[:2, start:stop]
            self._out[key] = out
        return out

    def _grads(self, start: int, stop: int) -> list[torch.Tensor] | None:
        grads = [p.grad for p in self.params[start:stop]]
        if all(g is None for g in grads):
            return None
        # a parameter without a gradient this step counts as a zero gradient
        return [g if g is not None else self._zero for g in grads]

    def before_update(self, slot: int, *, recorded: bool, snapshot: bool,
                      group: int | None = None) -> None:
        """Gradient norms (every step); parameter norms and the snapshot (recorded steps).

        ``group`` is the index of the optimizer about to step (``None``: every parameter,
        no optimizer).
        """
        if group is None:
            start, stop, upd = 0, len(self.params), len(self.params)
            key = -1
        else:
            start, stop, upd = self.groups[group]
            key = group
        self._fresh.discard(key)
        if stop <= start:
            return
        grads = self._grads(start, stop)
        # grad mode off while parameters are read directly (no detach per step); set and
        # restored by hand: ``torch.no_grad()`` costs more Python than the step's one op
        enabled = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            if not recorded:
                if grads is not None:
                    torch.stack(torch._foreach_norm(grads), out=self._row(slot, GRAD, key))
                return
            self._recorded_norms(slot, key, start, stop, upd, grads, snapshot)
        finally:
            torch._C._set_grad_enabled(enabled)

    def _recorded_norms(self, slot: int, key: int, start: int, stop: int, upd: int,
                        grads: list[torch.Tensor] | None, snapshot: bool) -> None:
        """Gradient and parameter norms, and the update snapshot, of a recorded step."""
        weights: list[torch.Tensor] = list(self.params[start:stop])
        if grads is None:
            torch.stack(torch._foreach_norm(weights), out=self._norms[slot, PARAM, start:stop])
        else:
            out = self._row(slot, -1, key)
            norms = torch.stack(torch._foreach_norm(grads + weights),
                                out=out if out.dim() == 1 else None)
            if out.dim() != 1:
                out.copy_(norms.view(2, -1))
        if snapshot and upd > start:
            views = self._update_views(key, start, upd)
            snap = self._snapshot.get(key)
            if isinstance(snap, _FlatUpdate) and snap.views is views:
                snap.take()
            elif all(v.dim() == 1 and v.dtype == views[0].dtype for v in views):
                self._snapshot[key] = _FlatUpdate(views)
            elif isinstance(snap, list):
                torch._foreach_copy_(snap, views)
            else:
                self._snapshot[key] = [v.clone() for v in views]
            self._fresh.add(key)

    def after_update(self, slot: int, *, group: int | None = None) -> None:
        """``||dW||`` per parameter across the step just taken (when a snapshot was taken)."""
        key = -1 if group is None else group
        if key not in self._fresh:
            return
        self._fresh.discard(key)
        start, upd = (0, len(self.params)) if group is None else (self.groups[group][0],
                                                                   self.groups[group][2])
        snap = self._snapshot[key]
        with torch.no_grad():
            if isinstance(snap, _FlatUpdate):
                snap.norms(self._row(slot, UPDATE, key))
                return
            torch._foreach_sub_(snap, self._update_views(key, start, upd))
            torch.stack(torch._foreach_norm(snap), out=self._row(slot, UPDATE, key))

    def move(self, src: int, dst: int) -> None:
        """Move step row ``src`` to ``dst`` (the open step's row when a flush renumbers)."""
        with torch.no_grad():
            self._norms[dst].copy_(self._norms[src])
            self._norms[src].fill_(math.nan)

    def drain(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copy of the first ``n`` steps, then reset them.

        Returns
        -------
        totals : numpy.ndarray
            ``(n, 3)`` global gradient, parameter and update norms over the parameters
            measured at each step (NaN where none was).
        per_module : numpy.ndarray
            ``(n, n_rows, 3)`` squared norms summed over each module's own parameters (NaN
            where none of them was measured).
        """
        if not self.params:
            return np.full((n, 3), math.nan), np.zeros((n, self._owner.shape[1], 3))
        with torch.no_grad():
            host = self._norms[:n].to("cpu", torch.float64, copy=True).numpy()
            self._norms[:n].fill_(math.nan)
        host[:, UPDATE] *= self._update_scale
        sq = host**2
        seen = ~np.isnan(sq)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            totals = np.where(seen.any(axis=2), np.sqrt(np.nansum(sq, axis=2)), math.nan)
        per_module = np.einsum("nkp,pm->nmk", np.nan_to_num(sq, nan=0.0), self._owner)
        # a quantity not measured for any of a module's parameters stays NaN for it
        measured = np.einsum("nkp,pm->nmk", seen.astype(np.float64), self._owner) > 0
        per_module[~measured] = math.nan
        return totals, per_module
