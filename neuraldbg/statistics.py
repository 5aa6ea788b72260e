"""Per-output statistics: what the hooks measure, how a step reduces them, and the finishing.

A forward hook keeps two things of an output, with no host sync: the largest |x| of each unit
over the batch (dead units, max |x|) and a strided sample of at most ``sample_size``
elements, copied into a per-step device buffer (:mod:`neuraldbg.activation_batch`). When the
step closes, :func:`sample_sums` reduces the samples of every call at once; the
denominators (element, unit and row counts) are known from shapes on the host. At flush,
:func:`finish_module_stats` turns the accumulated sums into the columns of ``trace.stats``.

Saturation depends on the module that produced the output: sigmoid near 0 or 1, tanh near
+-1, softmax near one-hot, GELU/SiLU on the flat negative tail. A Linear or Conv output is
never "saturated" by a fixed |x| cut (a defect of the NeuralDBG prototype).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal

import numpy as np
import torch
from torch import nn

__all__ = [
    "ACTIVATION_FAMILIES",
    "NONNEGATIVE_OUTPUTS",
    "ActivationFamily",
    "activation_family",
    "is_channel_first",
    "unit_dims",
    "sample_stride",
    "condition_table",
    "sample_sums",
    "WORK_ROWS",
    "work_views",
    "saturated_counts",
    "CONDITIONS",
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

#: Module classes whose output is never negative: its largest |x| is its largest x.
NONNEGATIVE_OUTPUTS = frozenset(("ReLU", "ReLU6", "Sigmoid", "Hardsigmoid", "Softmax",
                                 "Softmax2d", "Softplus"))

_CHANNEL_FIRST = ("Conv", "BatchNorm", "InstanceNorm", "GroupNorm", "MaxPool", "AvgPool",
                  "AdaptiveAvgPool", "AdaptiveMaxPool", "Dropout2d", "Dropout3d")

#: Conditions counted on each activation sample, as ``|x - c| > t`` (:func:`condition_table`).
CONDITIONS = ("valid", "nonzero", "inf", "saturated")
#: Sums accumulated per (step, module) on the device, in buffer column order: the first six
#: from :func:`sample_sums` over the sampled output, ``dead`` from the whole output.
ACT_SUMS = ("sum", "sq", *CONDITIONS, "dead")
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
def unit_dims(ndim: int, channel_first: bool) -> tuple[int, ...]:
    """Dims reduced to get one value per unit (all but the unit dim)."""
    unit_dim = 1 if channel_first or ndim >= 4 else ndim - 1
    return tuple(d for d in range(ndim) if d != unit_dim)


@lru_cache(maxsize=256)
def sample_stride(numel: int, per_sample: int, sample_size: int) -> int:
    """Element stride that samples at most ``sample_size`` of ``numel`` elements evenly.

    The stride is the smallest at least ``ceil(numel / sample_size)`` that is coprime with
    the elements per sample, so the sampled positions walk through every feature (or channel
    and pixel) rather than hitting the same few in each sample.
    """
    k = max(1, -(-numel // sample_size))
    while per_sample > 1 and math.gcd(k, per_sample) != 1:
        k += 1
    return k


@lru_cache(maxsize=16)
def _zero_centred_thresholds(device: torch.device) -> torch.Tensor:
    """Thresholds of the zero-centred :data:`CONDITIONS` (not NaN, non-zero, infinite).

    Shape ``(1, 3, 1)`` on ``device``, as :func:`condition_table` gives them for every family.
    """
    return torch.tensor([-1.0, 0.0, float(torch.finfo(torch.float32).max)],
                        device=device).view(1, 3, 1)


def condition_table(family: str, *, sigmoid_margin: float, tanh_margin: float,
                    smooth_tail: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Centres c and thresholds t of the :data:`CONDITIONS` counted as ``|x - c| > t``.

    Not NaN (t = -1), non-zero (t = 0), infinite (t = the largest float) and the family's
    saturation: tanh |x| > 1 - margin, sigmoid |x - 0.5| > 0.5 - margin. For GELU/SiLU the
    count is the complement, |x + tail/2| > tail/2 (off the flat tail [-tail, 0]), turned
    into the saturated count by :func:`finish_module_stats`. Other families (and softmax,
    judged per row in the hook) count nothing (t = inf).
    """
    big = float(torch.finfo(torch.float32).max)
    c_sat, t_sat = 0.0, math.inf
    if family == "tanh":
        t_sat = 1.0 - tanh_margin
    elif family == "sigmoid":
        c_sat, t_sat = 0.5, 0.5 - sigmoid_margin
    elif family == "smooth":
        # |x + tail/2| <= tail/2 is the closed interval [-tail, 0]: widen by a hair so both
        # ends (GELU's -0.0 included) stay inside.
        c_sat, t_sat = -smooth_tail / 2, (smooth_tail / 2) * (1 + 1e-6)
    return (0.0, 0.0, 0.0, c_sat), (-1.0, 0.0, big, t_sat)


#: Rows of the per-call work block reduced by :func:`sample_sums`: the sample, its squares
#: and one indicator row per zero-centred condition (the first three :data:`CONDITIONS`).
WORK_ROWS = 5


def work_views(work: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views of a work block used by :func:`sample_sums` (cache them: a view is an op).

    Returns the samples ``(n, 1, width)``, the squares row and the indicator rows.
    """
    return work[:, :1], work[:, 1:2], work[:, 2:]


def sample_sums(work: torch.Tensor, *, scratch: torch.Tensor | None = None,
                views: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """Sums and counts of a step's activation samples, all calls at once, no host sync.

    Parameters
    ----------
    work : torch.Tensor
        ``(n_calls, WORK_ROWS, width)`` float32; ``work[:, 0]`` holds one sampled output per
        call, padded with NaN. Rows 1 to 4 are overwritten (squares, then the indicators of
        the first three :data:`CONDITIONS`), so that one reduction gives every column.
    scratch : torch.Tensor, optional
        ``(n_calls, 1, width)`` float32 work space for ``|x|``, so that no temporary is
        allocated per step (on the CPU each one costs page faults).
    views : tuple of torch.Tensor, optional
        ``work_views(work)``, made once by a caller that reuses ``work``.
    out : torch.Tensor, optional
        ``(n_calls, 5)`` float32 where the sums are written (replacing its values).

    Returns
    -------
    torch.Tensor
        ``(n_calls, 5)``: sum, sum of squares (NaN elements left out), then the counts of
        the first three :data:`CONDITIONS` (not NaN, non-zero, infinite), whose centre is 0
        for every family. A count is ``|x| > t`` written as 0.0/1.0 into the float work
        block (a NaN compares false) and summed with the moments in one ``nansum``: four
        dispatched operations whatever the number of calls. The family's saturation,
        counted only where a family has one, is :func:`saturated_counts`.
    """
    samples, squares, indicators = views if views is not None else work_views(work)
    torch.square(samples, out=squares)
    absolute = torch.abs(samples, out=scratch)
    torch.gt(absolute, _zero_centred_thresholds(work.device), out=indicators)
    return work.nansum(-1) if out is None else torch.nansum(work, -1, out=out)


def saturated_counts(samples: torch.Tensor, centres: torch.Tensor,
                     thresholds: torch.Tensor) -> torch.Tensor:
    """Count of ``|x - c| > t`` per row (the saturated condition of :func:`condition_table`).

    ``samples`` is ``(m, width)`` (a copy the function may overwrite: the rows of the calls
    whose family saturates), ``centres`` and ``thresholds`` ``(m, 1)``. Returns ``(m,)``.
    """
    return samples.sub_(centres).abs_().sub_(thresholds).relu_().sign_().nansum(1)


def finish_module_stats(
    steps: np.ndarray,
    names: np.ndarray,
    sums: np.ndarray,
    maxes: np.ndarray,
    den: np.ndarray,
    grad_sq: np.ndarray,
    param_sq: np.ndarray,
    has_params: np.ndarray,
    complement: np.ndarray,
) -> dict[str, np.ndarray]:
    """Turn accumulated sums of recorded steps into the columns of ``trace.stats`` rows.

    Arrays are ``(n_steps, n_modules, ...)``: ``sums`` in :data:`ACT_SUMS` order, ``den`` in
    :data:`DEN` order, ``grad_sq`` the squared output-gradient norm, ``param_sq`` squared
    norms of parameter gradients, parameters and updates. ``complement`` marks the modules
    (GELU/SiLU) whose saturation count is the complement of the counted condition. A row is
    kept where the module was called or owns trainable parameters. Plain numpy columns: a
    DataFrame is built only when the trace is read or written.
    """
    calls = den[..., 0]
    keep = (calls > 0) | has_params[None, :]
    ri, mi = np.nonzero(keep)
    s, d = sums[ri, mi], den[ri, mi]
    col = {name: s[:, i] for i, name in enumerate(ACT_SUMS)}
    valid = col["valid"]
    called = calls[ri, mi] > 0
    no_params = ~has_params[mi]
    nan_if = lambda cond, v: np.where(cond, np.nan, v)  # noqa: E731
    with np.errstate(divide="ignore", invalid="ignore"):
        n_s, n_tot = d[:, 1], d[:, 2]
        mean = col["sum"] / valid  # NaN elements are left out of the moments, and counted
        var = np.maximum(col["sq"] / valid - mean**2, 0.0)
        scale = n_tot / n_s
        sat = np.where(complement[mi], valid - col["saturated"], col["saturated"])
        p = param_sq[ri, mi]
        pnorm = np.sqrt(p[:, 1])
        upd = np.sqrt(p[:, 2]) / pnorm
        frac_zero = (valid - col["nonzero"]) / n_s
        frac_dead = col["dead"] / d[:, 3]
        frac_sat = sat / d[:, 4]
    return {
        "step": steps[ri],
        "module_name": names[mi],
        "calls": calls[ri, mi].astype(np.int64),
        "act_mean": nan_if(~called, mean),
        "act_std": nan_if(~called, np.sqrt(var)),
        "act_max_abs": nan_if(~called, maxes[ri, mi]),
        "act_frac_zero": nan_if(~called, frac_zero),
        "act_frac_dead": nan_if(~called, frac_dead),
        "act_frac_saturated": nan_if(~called, frac_sat),
        "act_nan": np.nan_to_num(np.rint((n_s - valid) * scale)).astype(np.int64),
        "act_inf": np.nan_to_num(np.rint(col["inf"] * scale)).astype(np.int64),
        "out_grad_norm": nan_if(d[:, 5] == 0, np.sqrt(grad_sq[ri, mi])),
        "param_grad_norm": nan_if(no_params, np.sqrt(p[:, 0])),
        "param_norm": nan_if(no_params, pnorm),
        "update_ratio": nan_if(no_params, upd),
    }
