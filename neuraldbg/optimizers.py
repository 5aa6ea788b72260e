"""What the capture needs from optimizers and gradient scalers, read without a host sync.

Framework wrappers (Hugging Face Accelerate's ``AcceleratedOptimizer``, Lightning's
``LightningOptimizer``) subclass or imitate ``torch.optim.Optimizer`` without its hook
registries; the capture hooks the optimizer they wrap, which is the one that really steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["unwrap_optimizer", "as_optimizers", "scaler_scale"]


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The ``torch.optim.Optimizer`` that really steps, under any framework wrappers.

    Raises
    ------
    TypeError
        If ``optimizer`` is neither an optimizer nor a wrapper of one.
    """
    seen = 0
    current = optimizer
    while seen < 8:
        if isinstance(current, torch.optim.Optimizer) and hasattr(
                current, "_optimizer_step_pre_hooks"):
            return current
        inner = getattr(current, "optimizer", None)
        if inner is None or inner is current:
            break
        current, seen = inner, seen + 1
    raise TypeError(
        f"optimizer must be a torch.optim.Optimizer (or a framework wrapper with an "
        f"`.optimizer` attribute), got {type(optimizer).__name__}. Pass the optimizer that "
        "steps, e.g. NeuralDbg(model, optimizer=opt) or optimizer=[opt_a, opt_b]."
    )


def as_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """One optimizer, a wrapper, or a list/tuple of them, as a list of unwrapped optimizers.

    Raises
    ------
    TypeError
        If an element is not an optimizer.
    ValueError
        If the same optimizer is given twice.
    """
    if optimizer is None:
        return []
    items = list(optimizer) if isinstance(optimizer, Sequence) else [optimizer]
    opts = [unwrap_optimizer(o) for o in items]
    if len({id(o) for o in opts}) != len(opts):
        raise ValueError("The same optimizer was given twice in optimizer=[...]; pass each "
                         "optimizer once.")
    return opts


def scaler_scale(scaler: Any) -> torch.Tensor | None:
    """The current loss scale of a ``torch.amp.GradScaler`` as a device tensor (no sync).

    ``GradScaler.get_scale()`` returns a Python float and so synchronises the device; the
    tensor comes from ``_get_scale_async()``, which Lightning and Accelerate use as well.
    ``None`` when the scaler is disabled or has not scaled a loss yet.
    """
    if scaler is None or not getattr(scaler, "_enabled", True):
        return None
    get = getattr(scaler, "_get_scale_async", None)
    scale = get() if callable(get) else None
    return scale.detach().clone() if isinstance(scale, torch.Tensor) else None
