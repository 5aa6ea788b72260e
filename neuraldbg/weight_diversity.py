"""Weight-row diversity: whether a layer's units are still copies of each other.

A network whose weights start constant (``p.fill_(0.01)``) or with identical rows computes
the same value in every unit of a layer, receives the same gradient for each and so keeps
them identical for the whole run: the layer has the capacity of one unit (symmetric
initialisation; Goodfellow et al., *Deep Learning*, 2016, section 8.4). No activation or
gradient norm shows it, so the capture measures it directly, cheaply: for every weight
matrix (``ndim >= 2``, more than one row) of a monitored module, ::

    diversity = mean over columns of std over rows / rms of the matrix

0 when every row is the same, ~1 for a random initialisation. Its moments (per column, the
variance and the mean over rows: one reduction per matrix) are taken on the device when the
capture is entered (before any update) and at flushes, and the ratio is formed on the host
at the flush (the capture's existing host synchronisation, where the values of enter are
brought over too), never on the training path. Of the flushes the capture schedules every
``flush_every`` steps, the first few and then the 4th, 8th, 16th, ... measure (a long run
keeps only those and the latest); the flush at exit and one for a read of the trace always
do. A large matrix is measured on
an evenly strided grid of at most ``MAX_ROWS x MAX_COLUMNS`` of its entries: copies stay
copies on any subset of rows and columns (0 exactly), and a random matrix reads about 1 on
any sizeable one, so the verdict does not change while a flush of a model with several
large matrices stops costing a pass over all of their weights (about a millisecond per
200,000 weights on the CPU). The trace keeps the values at enter, at the first few flushes
and at the latest one, in ``trace.meta["weight_diversity"]``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["WeightDiversity", "row_diversity"]

#: Flushes kept besides the enter value and the latest flush (a long run's meta stays small).
_FIRST_POINTS = 3
_TINY = 1e-30
#: Largest grid of a matrix that is measured (rows, columns); larger ones are strided.
MAX_ROWS, MAX_COLUMNS = 256, 64


def _grid(weight: torch.Tensor) -> torch.Tensor:
    """The measured grid of a matrix or kernel (a kernel's trailing dims flattened).

    A strided view of at most ``MAX_ROWS x MAX_COLUMNS`` of its entries.
    """
    w = weight.detach().reshape(weight.shape[0], -1)
    rows, cols = w.shape
    return w[::-(-rows // MAX_ROWS), ::-(-cols // MAX_COLUMNS)]


def _moments(grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per column of the grid, the variance and the mean over rows (one reduction)."""
    return torch.var_mean(grid if grid.dtype == torch.float32 else grid.float(), dim=0,
                          correction=0)


def _rms(var: np.ndarray, mean: np.ndarray) -> float:
    """The grid's rms from its per-column moments: ``rms^2 = mean(var + mean^2)``."""
    var, mean = np.maximum(var.astype(np.float64), 0.0), mean.astype(np.float64)
    return math.sqrt(float(np.mean(var + mean * mean)))


def _ratio(var: np.ndarray, mean: np.ndarray) -> float:
    """Mean over columns of the std, over the rms of the grid."""
    return float(np.mean(np.sqrt(np.maximum(var.astype(np.float64), 0.0)))) / max(
        _rms(var, mean), _TINY)


def row_diversity(weight: torch.Tensor) -> float:
    """Mean over columns of the std over rows, over the rms of the matrix.

    Parameters
    ----------
    weight : torch.Tensor
        A matrix or kernel ``(rows, ...)`` with at least two rows; one larger than
        ``MAX_ROWS x MAX_COLUMNS`` (a kernel's trailing dims flattened) is measured on an
        evenly strided grid of that many rows and columns.
    """
    with torch.no_grad():
        var, mean = _moments(_grid(weight))
        return _ratio(var.cpu().numpy(), mean.cpu().numpy())


class WeightDiversity:
    """Row diversity of each monitored module's weight matrices over the run.

    A module with several matrices (a GRU's input and recurrent weights) reports the
    smallest: one symmetric matrix is enough to keep its units copies.

    Parameters
    ----------
    leaves : list of (str, torch.nn.Module)
        The monitored modules, in table order.
    """

    def __init__(self, leaves: list[tuple[str, nn.Module]]) -> None:
        self._names: list[str] = []
        self._matrices: list[torch.Tensor] = []
        self._module_of: list[int] = []  # row in ``_names`` of each matrix
        for name, mod in leaves:
            mats: list[torch.Tensor] = [p for p in mod.parameters(recurse=False)
                                        if p.ndim >= 2 and p.shape[0] > 1]
            if mats:
                self._module_of += [len(self._names)] * len(mats)
                self._names.append(name)
                self._matrices += mats
        # (step, moments, columns of each matrix's grid) measured, not yet on the host
        self._pending: list[tuple[int, torch.Tensor, tuple[int, ...]]] = []
        self._points: list[tuple[int, list[float]]] = []
        self._last: tuple[int, list[float]] | None = None
        # each module's first matrix's rms at the first measurement (enter, before any update)
        self._rms: list[float] | None = None
        self._periodic = 0  # scheduled flushes seen
        # the grid views, made once while every matrix keeps its storage
        self._grids: tuple[tuple[int, ...], list[torch.Tensor]] | None = None

    def _measure(self, step: int) -> tuple[int, torch.Tensor, tuple[int, ...]] | None:
        """Every matrix's per-column variances and means, concatenated on the device.

        One reduction per matrix and one concatenation, whatever the matrices' sizes.
        """
        if not self._names:
            return None
        ptrs = tuple(m.data_ptr() for m in self._matrices)
        with torch.no_grad():
            if self._grids is None or self._grids[0] != ptrs:
                self._grids = (ptrs, [_grid(m) for m in self._matrices])
            grids = self._grids[1]
            return (int(step), torch.cat([t for g in grids for t in _moments(g)]),
                    tuple(g.shape[1] for g in grids))

    def _diversities(self, moments: torch.Tensor, columns: tuple[int, ...]
                     ) -> tuple[list[float], list[float]]:
        """Each module's smallest row diversity and its first matrix's rms (:meth:`_measure`)."""
        host = moments.cpu().numpy()
        out = [math.inf] * len(self._names)
        rms = [math.nan] * len(self._names)
        start = 0
        for cols, module in zip(columns, self._module_of, strict=True):
            var, mean = host[start:start + cols], host[start + cols:start + 2 * cols]
            start += 2 * cols
            out[module] = min(out[module], _ratio(var, mean))
            if math.isnan(rms[module]):
                rms[module] = _rms(var, mean)
        return out, rms

    def snapshot(self, step: int) -> None:
        """Measure now on the device; the values reach the host at the next :meth:`flush`."""
        measured = self._measure(step)
        if measured is not None:
            self._pending.append(measured)

    def flush(self, step: int, *, periodic: bool = False) -> bool:
        """Bring pending values to the host and measure the weights at ``step``.

        A ``periodic`` flush (one the capture schedules every ``flush_every`` steps)
        measures only while the first points fill and then at every power-of-two-th one:
        the points between would be dropped anyway, and each costs a pass over the
        weights' grids.

        Returns
        -------
        bool
            Whether the weights were measured at ``step``.
        """
        if not self._names:
            return True
        measure = True
        if periodic:
            self._periodic += 1
            k = self._periodic
            measure = k <= _FIRST_POINTS or k & (k - 1) == 0
        now = self._measure(step) if measure else None
        for s, values, columns in [*self._pending, *([now] if now is not None else [])]:
            diversities, rms = self._diversities(values, columns)
            if self._rms is None:
                self._rms = rms
            point = (s, diversities)
            if len(self._points) < _FIRST_POINTS + 1 and all(p[0] != s for p in self._points):
                self._points.append(point)
            self._last = point
        self._pending.clear()
        return measure

    def to_dict(self) -> dict[str, Any] | None:
        """``{"steps": [...], "modules": {name: [diversity per step]}, "rms": {name: rms}}``.

        ``rms`` is each module's first weight matrix's rms at the first measurement (the
        capture's enter, before any update), on the measured grid; None when nothing was
        measured.
        """
        points = list(self._points)
        if self._last is not None and all(p[0] != self._last[0] for p in points):
            points.append(self._last)
        if not points:
            return None
        out: dict[str, Any] = {
            "steps": [p[0] for p in points],
            "modules": {n: [p[1][i] for p in points] for i, n in enumerate(self._names)}}
        if self._rms is not None:
            out["rms"] = {n: self._rms[i] for i, n in enumerate(self._names)
                          if math.isfinite(self._rms[i])}
        return out
