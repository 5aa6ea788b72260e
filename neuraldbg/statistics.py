"""Per-output statistics computed inside the forward hook, and their host-side finishing.

The hook computes a handful of 0-dim tensors (sums and counts) with no host sync; the
denominators (element, unit and row counts) are known from shapes on the host. At flush,
:func:`finish_module_stats` turns the accumulated sums into the columns of ``trace.stats``.

Saturation depends on the module that produced the output: sigmoid near 0 or 1, tanh near
+-1, softmax near one-hot, GELU/SiLU on the flat negative tail. A Linear or Conv output is
never "saturated" by a fixed |x| cut (a defect of the NeuralDBG prototype).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

import numpy as np
import pandas as pd
import torch
from torch import nn

__all__ = [
    "ACTIVATION_FAMILIES",
    "ActivationFamily",
    "activation_family",
    "is_channel_first",
    "activation_sums",
    "count_thresholds",
    "ACT_SUMS",
    "DEN",
    "finish_module_stats",
]

ActivationFamily = Literal["sigmoid", "tanh", "softmax", "relu", "smooth", "linear", "norm",
                           "other"]

#: Module class name -> activation family (how saturation is judged).
ACTIVATION_FAMILIES: dict[str, ActivationFamily] = {
    **dict.fromkeys(("Sigmoid", "Hardsigmoid"), "sigmoid"),
    **dict.fromkeys(("Tanh", "Hardtanh", "Softsign"), "tanh"),
    **dict.fromkeys(("Softmax", "Softmax2d"), "softmax"),
    **dict.fromkeys(("ReLU", "ReLU6", "LeakyReLU", "PReLU", "RReLU", "ELU", "CELU", "SELU",
                     "Softplus"), "relu"),
    **dict.fromkeys(("GELU", "SiLU", "Mish", "Hardswish"), "smooth"),
    **dict.fromkeys(("Linear", "Bilinear", "LazyLinear", "Conv1d", "Conv2d", "Conv3d",
                     "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "Embedding"),
                    "linear"),
    **dict.fromkeys(("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "GroupNorm",
                     "InstanceNorm1d", "InstanceNorm2d", "RMSNorm"), "norm"),
}

_CHANNEL_FIRST = ("Conv", "BatchNorm", "InstanceNorm", "GroupNorm", "MaxPool", "AvgPool",
                  "AdaptiveAvgPool", "AdaptiveMaxPool", "Dropout2d", "Dropout3d")

#: Sums accumulated per (step, module) on the device, in this order. The four counts come
#: from one broadcast comparison of |x| against :func:`count_thresholds`: elements that are
#: not NaN, not zero, infinite, and (tanh) saturated.
ACT_SUMS = ("sum", "norm", "dead", "saturated", "valid", "nonzero", "inf", "saturated_abs")
#: Host-side denominators per (step, module): calls, sampled elements, all elements,
#: units, saturation denominator (elements, or rows for softmax), output gradients seen.
DEN = ("calls", "n_sample", "n_total", "n_units", "n_sat", "grads")


def activation_family(module: nn.Module) -> ActivationFamily:
    """Return how NeuralDBG judges saturation for ``module``'s output.

    Subclasses of a known activation inherit its family; unknown modules are ``"other"``.
    """
    for cls in type(module).__mro__:
        fam = ACTIVATION_FAMILIES.get(cls.__name__)
        if fam is not None:
            return fam
    return "other"


def is_channel_first(module: nn.Module) -> bool:
    """True when the module's units are along dim 1 (channels), else along the last dim."""
    return any(cls.__name__.startswith(_CHANNEL_FIRST) for cls in type(module).__mro__)


@lru_cache(maxsize=64)
def _other_dims(ndim: int, channel_first: bool) -> tuple[int, ...]:
    """Dims reduced to get one value per unit (all but the unit dim)."""
    unit_dim = 1 if channel_first or ndim >= 4 else ndim - 1
    return tuple(d for d in range(ndim) if d != unit_dim)


@lru_cache(maxsize=8)
def _zero(device: torch.device) -> torch.Tensor:
    """A cached 0 (no fill kernel per hook call for families without a saturation count)."""
    return torch.zeros((), dtype=torch.long, device=device)


def count_thresholds(family: str, tanh_margin: float, device: torch.device) -> torch.Tensor:
    """Thresholds t for the counts ``|x| > t``: not NaN, non-zero, infinite, tanh-saturated."""
    big = float(torch.finfo(torch.float32).max)
    sat = 1.0 - tanh_margin if family == "tanh" else float("inf")
    return torch.tensor([[-1.0], [0.0], [big], [sat]], dtype=torch.float32, device=device)


def activation_sums(
    x: torch.Tensor,
    family: str,
    channel_first: bool,
    thresholds: torch.Tensor,
    *,
    sample_size: int,
    margins: tuple[float, float, float],
) -> tuple[torch.Tensor, torch.Tensor, tuple[float, float, float, float, float]]:
    """Sums and counts of one module output, with no host synchronisation.

    About a dozen tensor operations: on a small CPU model the dispatch of each costs more
    than its arithmetic, so the counts share one broadcast comparison.

    Parameters
    ----------
    x : torch.Tensor
        The (detached, float32) output.
    family : str
        Activation family of the producing module.
    channel_first : bool
        Units along dim 1 (convolutions, batch norm) rather than the last dim; outputs with
        four or more dims always have their units along dim 1.
    thresholds : torch.Tensor
        From :func:`count_thresholds` for this family.
    sample_size : int
        Moments, shares and NaN/Inf counts of a larger output are computed on a strided
        sample of the batch of about this many elements (comparisons over booleans cost ~10x
        a float reduction on the CPU). Max |x| and dead units always use the whole output.
    margins : tuple of float
        Saturation margins (sigmoid, softmax, smooth tail); tanh's is in ``thresholds``.

    Returns
    -------
    sums : torch.Tensor
        Shape (8,), in :data:`ACT_SUMS` order (``norm`` is squared when queued).
    max_abs : 0-dim tensor
        Largest |x| (NaN when a NaN is present).
    den : tuple of float
        Denominators in :data:`DEN` order, without the gradient count.
    """
    a = x.abs()
    if x.dim() >= 2:
        # Units: channels of feature maps (any 4-D/5-D output, e.g. a ReLU after a Conv2d,
        # and the outputs of channel-first modules), else features along the last dim.
        unit_max = a.amax(dim=_other_dims(x.dim(), channel_first))
    else:
        unit_max = a.reshape(-1)
    dead = (unit_max == 0).sum()
    max_abs = unit_max.amax()
    xs, as_ = x, a
    if x.dim() >= 1 and x.shape[0] > 1 and x.numel() > sample_size:
        keep = max(1, sample_size // max(x.numel() // x.shape[0], 1))
        stride = -(-x.shape[0] // keep)
        xs, as_ = x[::stride], a[::stride]
    n_s = xs.numel()
    n_sat = float(n_s)
    sig_m, soft_m, tail = margins
    if family == "sigmoid":
        sat = ((xs - 0.5).abs() > 0.5 - sig_m).sum()
    elif family == "softmax":
        rows = xs.amax(dim=-1)
        sat = (rows > 1.0 - soft_m).sum()
        n_sat = float(rows.numel())
    elif family == "smooth":
        sat = ((xs <= 0) & (xs >= -tail)).sum()
    else:
        sat = _zero(x.device)
    counts = (as_.reshape(1, -1) > thresholds).sum(dim=1)
    head = torch.stack([xs.sum(), torch.linalg.vector_norm(xs), dead, sat])  # promotes to float
    den = (1.0, float(n_s), float(x.numel()), float(unit_max.numel()), n_sat)
    return torch.cat([head, counts]), max_abs, den


def finish_module_stats(
    steps: np.ndarray,
    names: np.ndarray,
    sums: np.ndarray,
    maxes: np.ndarray,
    den: np.ndarray,
    grad_sq: np.ndarray,
    param_sq: np.ndarray,
    has_params: np.ndarray,
) -> pd.DataFrame:
    """Turn accumulated sums of recorded steps into ``trace.stats`` rows.

    Arrays are ``(n_steps, n_modules, ...)``: ``sums`` in :data:`ACT_SUMS` order (with the
    norm squared), ``den`` in :data:`DEN` order, ``grad_sq`` the squared output-gradient
    norm, ``param_sq`` squared norms of parameter gradients, parameters and updates. A row is kept where the
    module was called or owns trainable parameters.
    """
    calls = den[..., 0]
    keep = (calls > 0) | has_params[None, :]
    ri, mi = np.nonzero(keep)
    s, d = sums[ri, mi], den[ri, mi]
    with np.errstate(divide="ignore", invalid="ignore"):
        n_s, n_tot = d[:, 1], d[:, 2]
        mean = s[:, 0] / n_s
        var = np.maximum(s[:, 1] / n_s - mean**2, 0.0)
        scale = n_tot / n_s
        valid, nonzero, inf = s[:, 4], s[:, 5], s[:, 6]
        p = param_sq[ri, mi]
        pnorm = np.sqrt(p[:, 1])
        upd = np.sqrt(p[:, 2]) / pnorm
    called = calls[ri, mi] > 0
    no_params = ~has_params[mi]
    nan_if = lambda cond, v: np.where(cond, np.nan, v)  # noqa: E731
    return pd.DataFrame({
        "step": steps[ri],
        "module_name": names[mi],
        "calls": calls[ri, mi].astype(np.int64),
        "act_mean": nan_if(~called, mean),
        "act_std": nan_if(~called, np.sqrt(var)),
        "act_max_abs": nan_if(~called, maxes[ri, mi]),
        "act_frac_zero": nan_if(~called, (valid - nonzero) / n_s),
        "act_frac_dead": nan_if(~called, s[:, 2] / d[:, 3]),
        "act_frac_saturated": nan_if(~called, (s[:, 3] + s[:, 7]) / d[:, 4]),
        "act_nan": np.nan_to_num(np.rint((n_s - valid) * scale)).astype(np.int64),
        "act_inf": np.nan_to_num(np.rint(inf * scale)).astype(np.int64),
        "out_grad_norm": nan_if(d[:, 5] == 0, np.sqrt(grad_sq[ri, mi])),
        "param_grad_norm": nan_if(no_params, np.sqrt(p[:, 0])),
        "param_norm": nan_if(no_params, pnorm),
        "update_ratio": nan_if(no_params, upd),
    })
