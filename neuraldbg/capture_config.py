"""Capture settings, and how a module output is read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

__all__ = ["CaptureConfig", "first_float_tensor", "resolve_capture_config"]


@dataclass(frozen=True, slots=True)
class CaptureConfig:
    """Capture settings.

    Attributes
    ----------
    every : int
        Record per-module statistics every ``every`` steps (per-step scalars every step).
    flush_every : int
        Copy the device buffer to the host (and write a chunk when streaming) every this many
        steps. The only host synchronisation of the capture.
    dense_window : int
        After a non-finite loss or a loss spike, record every step for this many steps.
    spike_factor : float
        A loss above ``spike_factor`` x its running mean counts as a spike (when it also
        rises by a quarter of the loss's starting level: :mod:`neuraldbg.sampling`).
    sigmoid_margin : float
        A sigmoid output within this distance of 0 or 1 is saturated (|pre-activation| > 4.6).
    tanh_margin : float
        A tanh output within this distance of +-1 is saturated (|pre-activation| > 2.65).
    softmax_margin : float
        A softmax row whose largest probability is above 1 - margin is saturated (one-hot).
    smooth_tail : float
        A GELU/SiLU output in [-smooth_tail, 0] lies on the flat negative tail.
    sample_size : int
        Shares, mean, std and NaN/Inf counts of an output larger than this are computed on a
        strided sample of about this many of its elements (counts scaled up; a share then
        has a standard error below 0.8 points); max |x| and dead units always use the whole
        output. Likewise the update ``||dW||`` of a parameter tensor larger than this is
        measured on a strided sample of its elements (:mod:`neuraldbg.param_norms`).
    """

    every: int = 1
    flush_every: int = 100
    dense_window: int = 32
    spike_factor: float = 3.0
    sigmoid_margin: float = 0.01
    tanh_margin: float = 0.01
    softmax_margin: float = 0.01
    smooth_tail: float = 0.01
    sample_size: int = 4096


def resolve_capture_config(capture_config: CaptureConfig | None, *, every: int | None,
                           flush_every: int | None) -> CaptureConfig:
    """``capture_config`` (default ``CaptureConfig()``) with ``every``/``flush_every`` given.

    Raises
    ------
    TypeError
        If ``capture_config`` is not a :class:`CaptureConfig`.
    ValueError
        If ``every`` or ``flush_every`` (given or from the config) is not a positive int.
    """
    if capture_config is not None and not isinstance(capture_config, CaptureConfig):
        raise TypeError(f"capture_config must be a CaptureConfig, got "
                        f"{type(capture_config).__name__}.")
    base = capture_config or CaptureConfig()
    overrides = {k: v for k, v in (("every", every), ("flush_every", flush_every))
                 if v is not None}
    for name, value in {"every": base.every, "flush_every": base.flush_every,
                        **overrides}.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return replace(base, **overrides)


def first_float_tensor(obj: Any, *, with_dim: bool = False) -> torch.Tensor | None:
    """The first floating-point tensor in a module output (tensor, tuple, list, dict, None).

    With ``with_dim``, the first with a dimension and an element (a scalar loss returned
    first is passed over).
    """
    if isinstance(obj, torch.Tensor):
        return obj if obj.is_floating_point() and (
            not with_dim or (obj.dim() > 0 and obj.numel() > 0)) else None
    if isinstance(obj, Mapping):
        obj = list(obj.values())
    if isinstance(obj, (tuple, list)):
        for item in obj:
            found = first_float_tensor(item, with_dim=with_dim)
            if found is not None:
                return found
    return None
