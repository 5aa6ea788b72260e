"""One recorded step's activation statistics: gathered by forward hooks, reduced at once.

On a small model the cost of a hook is the number of tensor operations it dispatches, not
their arithmetic (a few microseconds each on the CPU). A hook therefore does four, and
allocates nothing: ``|x|`` into a reused tensor and the largest of each unit over the batch
straight into the step's unit buffer (``out=``), and a strided sample of the output copied
into a row of a preallocated work block. When the step closes, :meth:`ActivationBatch.close`
reduces every call's sample in one pass (:func:`~neuraldbg.statistics.sample_sums`: four
operations write squares and condition indicators beside the samples and one ``nansum``
reduces them all) and adds the results into the capture's buffer rows with ``index_add_``,
about ten operations per step whatever the number of modules.

The buffer holds samples only until the step closes; no activation outlives its step, and
nothing is read on the host.

A call whose output needed a gradient but never got one before the step closed, of a
module whose other calls in the step did get one (a validation or generation forward with
gradients enabled, a probe), took no part in the training step: :meth:`ActivationBatch.close`
leaves it out. A module none of whose calls got a gradient (an LSTM read only through its
final state, a layer before a detach) keeps them all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from neuraldbg.statistics import (
    DEN,
    WORK_ROWS,
    condition_table,
    sample_stride,
    sample_sums,
    saturated_counts,
    unit_dims,
    work_views,
)

__all__ = ["ActivationBatch"]

_LARGE = 1 << 16  # outputs above this many elements avoid a full-size |x| temporary


#: Views of the first n calls: work blocks, scratch, units, zero indicators, work_views.
_Heads = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
               tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass(frozen=True, slots=True)
class _Plan:
    """Index tensors and tables for one pattern of calls (cached: patterns repeat)."""

    call_index: torch.Tensor   # (n_calls,) module row of each call
    in_order: bool             # the calls are modules 0, 1, ..., n_calls - 1, once each
    unit_index: torch.Tensor   # (n_units,) module row of each unit of every call
    sat_calls: torch.Tensor | None  # call rows whose family saturates (None: no such call)
    sat_index: torch.Tensor | None  # their module rows
    sat_centres: torch.Tensor | None     # (n_sat_calls, 1) centre of the saturated condition
    sat_thresholds: torch.Tensor | None  # (n_sat_calls, 1) its threshold
    den: np.ndarray            # (n_modules + 1, 5) the step's DEN sums, without "grads"
    softmax_index: torch.Tensor | None  # module row of each softmax call, in call order


def _unit_max(x: torch.Tensor, channel_first: bool, out: torch.Tensor,
              scratch: torch.Tensor | None, nonnegative: bool = False) -> torch.Tensor | None:
    """Largest |x| of each unit over the batch (NaN where a NaN is present).

    A float32 output is reduced straight into ``out`` (the ``(n_units,)`` slot of the
    step's unit buffer) and ``None`` is returned: one of at most ``_LARGE`` elements has
    its ``|x|`` written into ``scratch`` (a reused tensor of x's shape, so no temporary is
    allocated), a larger one is reduced through its max and min. Another dtype's result is
    returned for the caller to copy in. The output of a ``nonnegative`` module (a ReLU, a
    sigmoid) is its own ``|x|``: one reduction, no ``|x|`` and no minimum.
    """
    if x.dim() < 2:
        if x.dtype == torch.float32:
            torch.abs(x, out=out.view(x.shape))
            return None
        return x.abs().reshape(-1)
    dims = unit_dims(x.dim(), channel_first)
    if nonnegative:
        if x.dtype == torch.float32:
            torch.amax(x, dim=dims, out=out)
            return None
        return x.amax(dim=dims)
    if x.numel() <= _LARGE:
        if x.dtype == torch.float32:
            torch.amax(torch.abs(x, out=scratch) if scratch is not None else x.abs(), dim=dims,
                       out=out)
            return None
        return x.abs().amax(dim=dims)
    # A large output: no |x| temporary of its size; inner (contiguous) dims reduce first.
    # A float32 result goes straight into ``out`` (no copy afterwards).
    f32 = x.dtype == torch.float32
    inner = tuple(d for d in dims if d > 1) if dims[0] == 0 and 1 not in dims else ()
    if inner:
        hi, lo = x.amax(dim=inner), x.amin(dim=inner)
        both = torch.maximum(hi, lo.neg_(), out=hi)
        if not f32:
            return both.amax(dim=0)
        torch.amax(both, dim=0, out=out)
        return None
    hi, lo = x.amax(dim=dims), x.amin(dim=dims).neg_()
    if not f32:
        return torch.maximum(hi, lo)
    torch.maximum(hi, lo, out=out)
    return None


class ActivationBatch:
    """Per-step collector of activation statistics for the capture's forward hooks.

    Parameters
    ----------
    families : list of str
        Activation family of each monitored module (its row in the buffers).
    channel_first : list of bool
        Whether each module's units lie along dim 1.
    nonnegative : list of bool
        Whether each module's output is never negative (its class is in
        :data:`~neuraldbg.statistics.NONNEGATIVE_OUTPUTS`).
    device : torch.device
        Where the model (and the buffers) live.
    sample_size : int
        Elements sampled per output.
    margins : dict of str to float
        ``sigmoid_margin``, ``tanh_margin``, ``softmax_margin``, ``smooth_tail``.
    """

    def __init__(self, families: list[str], channel_first: list[bool],
                 nonnegative: list[bool], device: torch.device, *, sample_size: int,
                 margins: dict[str, float]) -> None:
        self._families = families
        self._channel_first = channel_first
        self._nonnegative = nonnegative
        self._device = device
        self._size = sample_size
        self._softmax_cut = 1.0 - margins["softmax_margin"]
        self._conditions = [condition_table(
            f, sigmoid_margin=margins["sigmoid_margin"], tanh_margin=margins["tanh_margin"],
            smooth_tail=margins["smooth_tail"]) for f in families]
        # One work block per call: row 0 the sample, rows 1-4 filled by sample_sums.
        self._work = torch.full((max(len(families), 1), WORK_ROWS, sample_size), math.nan,
                                dtype=torch.float32, device=device)
        self._buf = self._work[:, 0]
        self._scratch = torch.empty((self._buf.shape[0], 1, sample_size), dtype=torch.float32,
                                    device=device)
        self._filled = [0] * self._buf.shape[0]  # sampled length last written in each row
        # Per call, its units' largest |x| (written by the hook), concatenated in call order,
        # and their zero indicators (written at close); views of slots are cached.
        self._ubuf = torch.empty(1024, dtype=torch.float32, device=device)
        self._ueq = torch.empty(1024, dtype=torch.float32, device=device)
        self._uviews: dict[tuple[int, int], torch.Tensor] = {}
        self._abs_flat = torch.empty(_LARGE, dtype=torch.float32, device=device)
        self._abs: dict[torch.Size, torch.Tensor] = {}  # views of _abs_flat per shape
        self._plans: dict[tuple[Any, ...], _Plan] = {}
        # per (module, output shape, contiguous): denominators and the sampling stride
        self._shapes: dict[tuple[Any, ...], tuple[int, int, int, int, int, int]] = {}
        self._rows: dict[tuple[int, int], torch.Tensor] = {}  # buffer row views, reused
        # first n calls' work blocks and scratch, and the step's units (keyed by both counts)
        self._heads: dict[tuple[int, int], _Heads] = {}
        self.reset()

    def reset(self) -> None:
        """Forget the step's calls (the buffer rows are simply overwritten next step)."""
        self.calls: list[int] = []
        self._n_units = 0  # units written into the unit buffer this step
        self._den: list[tuple[int, int, int, int, int]] = []
        self._softmax: list[tuple[int, torch.Tensor]] = []
        self._softmax_rows: list[int] = []
        self._needs_grad: list[bool] = []
        self._got_grad: list[bool] = []
        self._waiting = 0  # calls whose output needs a gradient not seen yet

    def __len__(self) -> int:
        """Number of recorded calls."""
        return len(self.calls)

    # ------------------------------------------------------------------ hook side
    def add(self, idx: int, x: torch.Tensor, *, needs_grad: bool) -> int:
        """Measure one call of module ``idx`` with (detached, floating) output ``x``.

        ``needs_grad`` tells whether the output took part in autograd; such a call counts
        only once :meth:`mark_grad` has seen its gradient. Returns the call's row.
        """
        row = len(self.calls)
        if row >= self._buf.shape[0]:
            self._grow(rows=2 * self._buf.shape[0])
        contiguous = x.is_contiguous()
        shape = self._shapes.get((idx, x.shape, contiguous))
        if shape is None:
            shape = self._shape_plan(idx, x, contiguous)
        n_s, n_u, stride = shape[1], shape[3], shape[5]
        off = self._n_units
        if off + n_u > self._ubuf.shape[0]:
            self._grow_units(off + n_u)
        uv = self._uviews.get((off, n_u))
        if uv is None:
            uv = self._uviews[(off, n_u)] = self._ubuf[off:off + n_u]
        scratch = None
        nonnegative = self._nonnegative[idx]
        if n_u < shape[2] <= _LARGE and not nonnegative:
            scratch = self._abs.get(x.shape)  # |x| of a small output goes into a reused tensor
            if scratch is None:
                scratch = self._abs[x.shape] = self._abs_flat[:shape[2]].view(x.shape)
        units = _unit_max(x, self._channel_first[idx], uv, scratch, nonnegative)
        if units is not None:
            uv.copy_(units)
        self._n_units = off + n_u
        if contiguous:  # one strided view of the whole output (its storage offset kept)
            sample = torch.as_strided(x, (n_s,), (stride,))
        else:  # whole samples of the batch, so no copy of the full output is made
            sample = x[::stride] if x.dim() >= 1 else x
        if n_s > self._buf.shape[1]:
            self._grow(width=n_s)
        dst = self._rows.get((row, n_s))
        if dst is None:
            dst = self._rows[(row, n_s)] = self._buf[row, :n_s]
        dst.copy_(sample) if sample.dim() == 1 else dst.view(sample.shape).copy_(sample)
        if self._filled[row] > n_s:
            self._buf[row, n_s:self._filled[row]].fill_(math.nan)
        self._filled[row] = n_s
        den = shape[:5]
        if self._families[idx] == "softmax" and x.dim() >= 1:
            # one-hot rows: judged per row of the last dim, on whole rows of a batch sample
            keep = max(1, self._size // max(x.shape[-1], 1))
            rows = x.reshape(-1, x.shape[-1]) if x.dim() >= 2 else x.reshape(1, -1)
            rows = rows[::-(-rows.shape[0] // keep)]
            self._softmax.append((idx, (rows.amax(dim=-1) > self._softmax_cut).sum()))
            self._softmax_rows.append(row)
            den = (*den[:4], rows.shape[0])
        self.calls.append(idx)
        self._den.append(den)
        self._needs_grad.append(needs_grad)
        self._got_grad.append(False)
        self._waiting += needs_grad
        return row

    def _shape_plan(self, idx: int, x: torch.Tensor,
                    contiguous: bool) -> tuple[int, int, int, int, int, int]:
        """``(1, n_sample, n_total, n_units, n_sat, stride)`` of an output shape (cached).

        ``stride`` is the element stride of the sample of a contiguous output, else the
        step over the batch dim of the whole samples taken.
        """
        numel = x.numel()
        per_sample = numel // x.shape[0] if x.dim() >= 1 and x.shape[0] else numel
        if contiguous:
            stride = sample_stride(numel, per_sample, self._size) if numel > self._size else 1
            n_s = len(range(0, numel, stride))
        else:
            keep = max(1, self._size // max(per_sample, 1))
            stride = -(-x.shape[0] // keep) if x.dim() >= 1 else 1
            n_s = (len(range(0, x.shape[0], stride)) * per_sample if x.dim() >= 1 else numel)
        if x.dim() < 2:
            n_units = numel
        else:
            dims = unit_dims(x.dim(), self._channel_first[idx])
            n_units = math.prod(n for d, n in enumerate(x.shape) if d not in dims)
        plan = (1, n_s, numel, n_units, n_s, stride)
        if len(self._shapes) < 4096:
            self._shapes[(idx, x.shape, contiguous)] = plan
        return plan

    def mark_grad(self, row: int) -> None:
        """The output of call ``row`` received its gradient: it belongs to a training step."""
        got = self._got_grad
        if row < len(got) and not got[row]:
            got[row] = True
            self._waiting -= self._needs_grad[row]

    def _drop_untrained(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Leave out calls that took no part in the step's backward.

        Returns ``None`` when every call is kept (the buffers are used as they are), else
        the kept calls' work blocks and unit maxima, gathered.
        """
        if not self._waiting:
            return None  # every call that needed a gradient got one
        trained = {idx for idx, got in zip(self.calls, self._got_grad, strict=True) if got}
        keep = [i for i, (idx, need, got) in
                enumerate(zip(self.calls, self._needs_grad, self._got_grad, strict=True))
                if got or not need or idx not in trained]
        if len(keep) == len(self.calls):
            return None
        kept = set(keep)
        self._softmax = [sm for sm, row in zip(self._softmax, self._softmax_rows, strict=True)
                         if row in kept]
        starts = np.cumsum([0] + [d[3] for d in self._den])
        unit_pos = [u for i in keep for u in range(starts[i], starts[i + 1])]
        self.calls = [self.calls[i] for i in keep]
        self._den = [self._den[i] for i in keep]
        self._needs_grad = [True] * len(keep)
        self._got_grad = [True] * len(keep)
        self._waiting = 0
        if not keep:
            return self._work[:0], self._ubuf[:0]
        index = torch.tensor(keep, dtype=torch.long, device=self._device)
        units = self._ubuf.index_select(0, torch.tensor(unit_pos, dtype=torch.long,
                                                        device=self._device))
        return self._work.index_select(0, index), units

    def _grow_units(self, need: int) -> None:
        """Room for ``need`` unit maxima (the step's values so far are kept)."""
        old = self._ubuf
        self._ubuf = torch.empty(2 * need, dtype=torch.float32, device=self._device)
        self._ubuf[:self._n_units].copy_(old[:self._n_units])
        self._ueq = torch.empty(2 * need, dtype=torch.float32, device=self._device)
        self._uviews.clear()
        self._heads.clear()

    def _grow(self, *, rows: int | None = None, width: int | None = None) -> None:
        old = self._work
        r, w = rows or old.shape[0], width or old.shape[2]
        self._work = torch.full((r, WORK_ROWS, w), math.nan, dtype=torch.float32,
                                device=self._device)
        self._work[:old.shape[0], 0, :old.shape[2]].copy_(old[:, 0])
        self._buf = self._work[:, 0]
        self._scratch = torch.empty((r, 1, w), dtype=torch.float32, device=self._device)
        self._filled += [0] * (r - len(self._filled))
        self._rows.clear()
        self._heads.clear()

    # ------------------------------------------------------------------ step close
    def _plan(self) -> _Plan:
        key = (tuple(self.calls), tuple(self._den))
        plan = self._plans.get(key)
        if plan is None:
            dev = self._device
            unit_rows = np.repeat(self.calls, [d[3] for d in self._den])
            den = np.zeros((len(self._families) + 1, len(DEN) - 1))
            np.add.at(den, self.calls, np.asarray(self._den, dtype=np.float64))
            sat = [(row, idx, self._conditions[idx]) for row, idx in enumerate(self.calls)
                   if math.isfinite(self._conditions[idx][1][-1])]

            def column(values: list[Any], dtype: torch.dtype) -> torch.Tensor | None:
                return torch.tensor(values, dtype=dtype, device=dev) if sat else None

            plan = _Plan(
                call_index=torch.tensor(self.calls, dtype=torch.long, device=dev),
                in_order=self.calls == list(range(len(self.calls))),
                unit_index=torch.as_tensor(unit_rows, dtype=torch.long, device=dev),
                sat_calls=column([r for r, _, _ in sat], torch.long),
                sat_index=column([i for _, i, _ in sat], torch.long),
                sat_centres=column([[c[0][-1]] for _, _, c in sat], torch.float32),
                sat_thresholds=column([[c[1][-1]] for _, _, c in sat], torch.float32),
                den=den,
                softmax_index=torch.tensor([i for i, _ in self._softmax], dtype=torch.long,
                                           device=dev) if self._softmax else None)
            if len(self._plans) < 1024:
                self._plans[key] = plan
        return plan

    def close(self, act_sums: torch.Tensor, saturated: torch.Tensor, dead: torch.Tensor,
              max_abs: torch.Tensor) -> np.ndarray | None:
        """Add the step's statistics into one step's buffer rows (the caller then resets).

        No gradient mode is needed: no tensor involved requires a gradient.

        Parameters
        ----------
        act_sums : torch.Tensor
            ``(n_modules + 1, 5)`` sums of the step: the columns of :func:`sample_sums`
            (a device view).
        saturated : torch.Tensor
            ``(n_modules + 1,)`` saturated counts of the step (a device view).
        dead : torch.Tensor
            ``(n_modules + 1,)`` dead-unit counts of the step (a device view).
        max_abs : torch.Tensor
            ``(n_modules + 1,)`` running max |x| of the step (device).

        Returns
        -------
        numpy.ndarray or None
            ``(n_modules + 1, len(DEN) - 1)`` host denominators of the step (every column
            of :data:`~neuraldbg.statistics.DEN` but ``grads``; cached per pattern of
            calls, so read-only), or ``None`` when no call was recorded. The caller sums
            them at the flush: a numpy operation per step costs tens of microseconds on a
            training step's cold caches.
        """
        gathered = self._drop_untrained()
        n = len(self.calls)
        if not n:
            return None
        if gathered is None:
            key = (n, self._n_units)
            views = self._heads.get(key)
            if views is None:
                work = self._work[:n]
                views = self._heads[key] = (work, self._scratch[:n], self._ubuf[:self._n_units],
                                            self._ueq[:self._n_units], work_views(work))
            work, scratch, units, zero, parts = views
        else:
            (work, units), scratch = gathered, self._scratch[:n]
            zero, parts = self._ueq[:units.shape[0]], work_views(work)
        plan = self._plan()
        if plan.in_order:  # (a sequential model's usual step) one reduction into the rows
            sample_sums(work, scratch=scratch, views=parts, out=act_sums[:n])
        else:
            act_sums.index_add_(0, plan.call_index,
                                sample_sums(work, scratch=scratch, views=parts))
        if plan.sat_calls is not None:  # only families with a saturated range
            assert plan.sat_index is not None and plan.sat_centres is not None
            assert plan.sat_thresholds is not None
            saturated.index_add_(0, plan.sat_index, saturated_counts(
                work[:, 0].index_select(0, plan.sat_calls), plan.sat_centres,
                plan.sat_thresholds))
        dead.index_add_(0, plan.unit_index, torch.eq(units, 0, out=zero))
        max_abs.scatter_reduce_(0, plan.unit_index, units, "amax")
        if plan.softmax_index is not None:  # index tensors are cached: no copy per step
            saturated.index_add_(0, plan.softmax_index,
                                 torch.stack([c for _, c in self._softmax]).to(torch.float32))
        return plan.den
