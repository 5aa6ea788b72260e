"""Count host synchronisations (``aten._local_scalar_dense``) under a dispatch mode.

Used by the tests and by ``benchmarks.overhead`` to prove that the capture adds none: every
``.item()``, ``float(tensor)`` or Python branch on a tensor value goes through that op.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostSyncCounter"]


class HostSyncCounter(TorchDispatchMode):
    """Context manager counting ``aten._local_scalar_dense`` calls in ``count``.

    Examples
    --------
    >>> import torch
    >>> with HostSyncCounter() as syncs:
    ...     _ = torch.ones(2).sum().item()
    >>> syncs.count
    1
    """

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        """Count a host sync (``aten._local_scalar_dense``), then run the op unchanged."""
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))
