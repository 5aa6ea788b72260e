"""Output-gradient norms of one recorded step: written by backward hooks, added at close.

The capture puts a pre-hook on the autograd node that produced each monitored output
(``grad_fn.register_prehook``), which costs less than ``Tensor.register_hook`` (no Python
hook dictionary per tensor) and sees the same gradient: a tensor hook also runs as a
pre-hook of that node, including when the output was later modified in place. The hook
writes the gradient's norm into one slot of a device buffer (``out=``, slot views made once);
when the step closes, the squared norms are added into the step's buffer row with one
``index_add_``. Nothing is read on the host.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["OutputGradNorms"]


class OutputGradNorms:
    """The norms of the output gradients seen in the open step, and their modules.

    Parameters
    ----------
    device : torch.device
        Where the model (and the buffer) live.
    n_rows : int
        Module rows of the step's buffers.
    """

    def __init__(self, device: torch.device, n_rows: int) -> None:
        self._device = device
        self._n_rows = n_rows
        self.modules: list[int] = []  # module row of each norm, in arrival order
        self._norms = torch.empty(0, dtype=torch.float32, device=device)
        self._slots: list[torch.Tensor] = []  # 0-dim views of _norms
        self._heads: dict[int, torch.Tensor] = {}  # first m norms
        # per pattern of modules: their device index and host counts per row
        self._index: dict[tuple[int, ...], tuple[torch.Tensor, np.ndarray]] = {}

    def __len__(self) -> int:
        """Number of norms taken in the open step."""
        return len(self.modules)

    def reset(self) -> None:
        """Forget the open step's norms (the buffer is rewritten next step)."""
        self.modules = []

    def add(self, module: int, grad: torch.Tensor) -> None:
        """Write ``||grad||`` (float32, no graph: ``grad`` must not require grad).

        A float64 gradient's norm is taken in float64 and stored as float32 (a norm above
        float32's range is stored as ``inf``).
        """
        k = len(self.modules)
        if k >= len(self._slots):
            self._grow(k + 1)
        if grad.dtype == torch.float64:  # (a float32 result may not narrow a double's norm)
            self._slots[k].copy_(torch.linalg.vector_norm(grad))
        else:
            torch.linalg.vector_norm(grad, dtype=torch.float32, out=self._slots[k])
        self.modules.append(module)

    def _grow(self, need: int) -> None:
        old, k = self._norms, len(self.modules)
        self._norms = torch.empty(max(2 * need, 64), dtype=torch.float32, device=self._device)
        self._norms[:k].copy_(old[:k])
        self._slots = list(self._norms.unbind(0))
        self._heads.clear()

    def _pattern(self) -> tuple[torch.Tensor, np.ndarray]:
        """The step's modules as a cached device index and host counts per row."""
        key = tuple(self.modules)
        pattern = self._index.get(key)
        if pattern is None:
            pattern = (torch.tensor(key, dtype=torch.long, device=self._device),
                       np.bincount(key, minlength=self._n_rows).astype(np.float64))
            pattern[1].flags.writeable = False
            if len(self._index) < 4096:
                self._index[key] = pattern
        return pattern

    def close(self, squares: torch.Tensor, scale: torch.Tensor | None) -> np.ndarray | None:
        """Add the step's squared norms into ``squares``; return the gradients per module.

        Parameters
        ----------
        squares : torch.Tensor
            ``(n_rows,)`` device view: the step's squared output-gradient norms.
        scale : torch.Tensor, optional
            The ``GradScaler`` scale of the backward the norms were measured on.

        Returns
        -------
        numpy.ndarray or None
            ``(n_rows,)`` read-only host counts: gradients seen per module in the step
            (``None`` when none was), for the caller to sum at the flush.
        """
        m = len(self.modules)
        if not m:
            return None
        head = self._heads.get(m)
        if head is None:
            head = self._heads[m] = self._norms[:m]
        sq = head.square_()  # (rewritten next step; nothing here requires grad)
        if scale is not None:  # measured on the scaled backward
            sq = sq / scale.square()
        index, counts = self._pattern()
        squares.index_add_(0, index, sq)
        return counts
