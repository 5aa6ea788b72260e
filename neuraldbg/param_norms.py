"""Parameter-side measurements around the optimizer step, kept per parameter on the device.

Each step the norm of every parameter's gradient goes into one row of a device buffer
(``torch._foreach_norm`` and one ``torch.stack`` into the row: two dispatches, whatever the
number of parameters). Gradient norms are exact. On recorded steps the measured elements of
every parameter are copied into a snapshot (one ``torch._foreach_copy_``), the parameters'
norms are taken on that snapshot beside the gradients' (the same ``_foreach_norm``), and after
the step the update ``||W_after - W_before||`` is the norm of the snapshot minus the
parameters (one ``_foreach_sub_``, one ``_foreach_norm``). The global norms and the per-module
sums are formed on the host at the flush, where they cost nothing on the training path.

A parameter tensor of at most ``sample_size`` elements (up to about twice that) is measured
whole, so its norm and update are exact. A larger one is measured on an even sample of
``sample_size`` of its elements and the norms are scaled up (``||W||^2 ~ numel / m * sum of
the m sampled squares``). The sample is taken in blocks of up to :data:`BLOCK` contiguous
elements (one 64-byte cache line of float32), spaced so that the blocks walk through the
columns; on a matrix with more than ``sample_size / BLOCK`` rows the blocks are narrower, down
to single elements, so that the sample reaches as many rows as single elements would (an
embedding whose step moves a few rows). Whole-tensor norms would read every weight twice more
at every recorded step (the parameters and the snapshot), and an element-strided sample
touches a cache line per element: 16-element blocks read one line per 16 elements, which on
the CPU halves the recorded step's parameter-side cost. For weights of similar size the
relative standard error of a norm is about ``sqrt(2 / m) / 2``, 1%, and of an evenly spread
update (Adam's) a few percent (``tests/test_capture.py`` checks both against exact norms); a
matrix whose rows differ in scale by orders of magnitude, or one whose step moves a handful
of rows, is estimated more loosely. Norms are accumulated in float32 whatever the parameters' dtype.
Sparse gradients (``nn.Embedding(sparse=True)``) are measured by their values.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from torch import nn

__all__ = ["ParamMeter", "BLOCK", "block_sample"]

GRAD, PARAM, UPDATE = 0, 1, 2
#: Contiguous elements per block of a sampled parameter.
BLOCK = 16


def block_sample(numel: int, per_row: int, sample_size: int) -> tuple[int, int, int] | None:
    """``(n_blocks, width, stride)`` of an even block sample of a contiguous tensor.

    ``None`` when the tensor is measured whole: it has at most ``sample_size`` elements, or
    fewer than about twice as many (a sample would save little). Blocks are up to
    :data:`BLOCK` contiguous elements wide, narrower when the tensor has more rows than
    ``sample_size / BLOCK``, so that the sample reaches as many rows as ``sample_size``
    single elements would (an embedding whose step updates a few rows must not be read
    from a few rows only). The stride is the largest that fits the blocks and is coprime
    with the elements per row, so the blocks start at different columns of successive rows.
    """
    if numel <= sample_size:
        return None
    rows = max(1, numel // max(per_row, 1))
    width = max(1, min(BLOCK, sample_size // rows))
    n_blocks = max(2, sample_size // width)
    stride = (numel - width) // (n_blocks - 1)
    if stride < 2 * width:
        return None
    while per_row > 1 and math.gcd(stride, per_row) != 1:
        stride -= 1
    return (n_blocks, width, stride) if stride >= width else None


def _norms(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The 2-norm of each tensor, accumulated and returned in float32 whatever its dtype.

    The norm of a bfloat16 tensor taken in bfloat16 is off by about 1e-3. A float64 tensor's
    norm is taken in float64 (PyTorch refuses a float32 result for it) and then made float32.
    """
    if any(t.dtype == torch.float64 for t in tensors):  # (a model.double(): rare, slower)
        return tuple(torch.linalg.vector_norm(t).float() if t.dtype == torch.float64 else
                     torch.linalg.vector_norm(t, dtype=torch.float32) for t in tensors)
    return torch._foreach_norm(tensors, 2, dtype=torch.float32)


def _stored_values(grad: torch.Tensor) -> torch.Tensor:
    """The values of a sparse gradient, duplicates summed: its norm is theirs."""
    return grad.coalesce().values() if grad.layout == torch.sparse_coo else grad.values()


class _Snapshot:
    """The measured elements of a group's parameters: live views and their copies.

    Views of a parameter made under ``no_grad`` track its in-place updates, so the views
    are made once per storage; the copies hold the values before the optimizer step.
    """

    def __init__(self, views: list[torch.Tensor], n_update: int) -> None:
        self.views = views
        self.copies = [torch.empty(v.shape, dtype=v.dtype, device=v.device) for v in views]
        # the parameters whose update the group's optimizer makes come first
        self.update_views, self.update_copies = views[:n_update], self.copies[:n_update]

    def take(self) -> None:
        """Copy the measured elements (before the step)."""
        torch._foreach_copy_(self.copies, self.views)

    def update_norms(self, out: torch.Tensor) -> None:
        """Write ``||W_now - W_snapshot||`` of each updated parameter into ``out``.

        The copies are overwritten (with ``W_snapshot - W_now``).
        """
        torch._foreach_sub_(self.update_copies, self.update_views)
        torch.stack(_norms(self.update_copies), out=out)


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
        Largest parameter tensor whose norm and update are measured exactly (see the
        module notes).
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
        self._samples = [self._sample(p, sample_size) for p in params]
        counts = [p.numel() if smp is None else smp[0] * smp[1]
                  for p, smp in zip(params, self._samples, strict=True)]
        self._sample_scale = np.sqrt([p.numel() / max(c, 1)
                                      for p, c in zip(params, counts, strict=True)])
        self._owner = np.zeros((len(params), n_rows))
        self._owner[np.arange(len(params)), owner] = 1.0
        self._norms = torch.full((capacity, 3, len(params)), math.nan, dtype=torch.float32,
                                 device=device)
        self._zero = torch.zeros((), device=device)
        self._fresh: set[int] = set()  # groups whose snapshot awaits their step
        # Views made once and reused every step (each view is a dispatched op on the hot
        # path): output rows of the buffer, and each group's snapshot (views of the measured
        # elements and their copies), rebuilt when a parameter's storage changes
        # (``p.data = ...``, ``module.to()``).
        self._out: dict[tuple[int, int, int], torch.Tensor] = {}
        self._snapshots: dict[int, tuple[tuple[int, ...], _Snapshot]] = {}

    @staticmethod
    def _sample(p: nn.Parameter, sample_size: int) -> tuple[int, int, int] | None:
        if not p.is_contiguous():
            return None
        per_row = p.numel() // p.shape[0] if p.dim() > 1 and p.shape[0] else 1
        return block_sample(p.numel(), per_row, sample_size)

    def _snapshot(self, key: int, start: int, stop: int, upd: int) -> _Snapshot:
        """The group's snapshot, cached while every parameter keeps its storage."""
        params = self.params[start:stop]
        ptrs = tuple(p.data_ptr() for p in params)
        cached = self._snapshots.get(key)
        if cached is not None and cached[0] == ptrs:
            return cached[1]
        with torch.no_grad():
            views = [p.detach() if smp is None else
                     torch.as_strided(p.detach(), smp[:2], (smp[2], 1))
                     for p, smp in zip(params, self._samples[start:stop], strict=True)]
        snap = _Snapshot(views, upd - start)
        self._snapshots[key] = (ptrs, snap)
        return snap

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
        # a parameter without a gradient this step counts as a zero gradient; a sparse one
        # (``nn.Embedding(sparse=True)``) by its values, which no norm kernel takes sparse
        return [self._zero if g is None else g if g.layout == torch.strided
                else _stored_values(g) for g in grads]

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
                    torch.stack(_norms(grads), out=self._row(slot, GRAD, key))
                return
            self._recorded_norms(slot, key, start, stop, upd, grads, snapshot)
        finally:
            torch._C._set_grad_enabled(enabled)

    def _recorded_norms(self, slot: int, key: int, start: int, stop: int, upd: int,
                        grads: list[torch.Tensor] | None, snapshot: bool) -> None:
        """Gradient norms, and the snapshot and parameter norms, of a recorded step."""
        snap = self._snapshot(key, start, stop, upd)
        snap.take()
        if grads is None:
            torch.stack(_norms(snap.copies),
                        out=self._norms[slot, PARAM, start:stop])
        else:
            out = self._row(slot, -1, key)
            norms = torch.stack(_norms(grads + snap.copies),
                                out=out if out.dim() == 1 else None)
            if out.dim() != 1:
                out.copy_(norms.view(2, -1))
        if snapshot and upd > start:
            self._fresh.add(key)

    def after_update(self, slot: int, *, group: int | None = None) -> None:
        """``||dW||`` per parameter across the step just taken (when a snapshot was taken)."""
        key = -1 if group is None else group
        if key not in self._fresh:
            return
        self._fresh.discard(key)
        with torch.no_grad():
            self._snapshots[key][1].update_norms(self._row(slot, UPDATE, key))

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
        host[:, PARAM:] *= self._sample_scale  # sampled tensors' norms, scaled up
        sq = host**2
        seen = ~np.isnan(sq)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            totals = np.where(seen.any(axis=2), np.sqrt(np.nansum(sq, axis=2)), math.nan)
        per_module = np.einsum("nkp,pm->nmk", np.where(np.isfinite(sq), sq, 0.0), self._owner)
        # an infinite norm stays infinite (not the largest float: sqrt of it read 1.3e154)
        per_module[np.einsum("nkp,pm->nmk", np.isinf(sq).astype(np.float64),
                             self._owner) > 0] = math.inf
        # a quantity not measured for any of a module's parameters stays NaN for it
        measured = np.einsum("nkp,pm->nmk", seen.astype(np.float64), self._owner) > 0
        per_module[~measured] = math.nan
        return totals, per_module
