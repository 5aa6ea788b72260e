"""What the model's forward returns: logits, a probability distribution, or values in (0, 1).

A network that ends in an ``nn.Softmax`` or ``nn.Sigmoid`` module shows it in the module
table. One that applies ``F.softmax`` or ``torch.sigmoid`` inside its ``forward`` does not:
its last module is the ``Linear`` that makes the logits, and a loss that applies its own
softmax (``CrossEntropyLoss``) then sees probabilities as logits and stalls on a floor, the
same bug. So the capture also reads the root module's output, on the first
:data:`MEASURED_FORWARDS` recorded training forwards (gradients enabled): its smallest and
largest value and the largest distance of a row's sum (over the last dimension) from 1, kept
on the device and read at the next flush. ``trace.meta["model_output"]`` holds them;
:func:`output_function` reads them back.

The tensor read is the output itself, the ``logits`` of a mapping or an object that has them
(Hugging Face outputs), else the first floating-point tensor of a tuple or mapping.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from neuraldbg.capture_config import first_float_tensor

__all__ = ["OutputMeter", "output_function", "MEASURED_FORWARDS", "ROW_SUM_TOLERANCE"]

#: Training forwards whose output is measured (the output's kind is the model's code, the
#: same at every step; a few guard against a first batch that happens to look like one).
MEASURED_FORWARDS = 8

#: Largest distance of a row's sum from 1 for a row of probabilities: float32 sums of a few
#: thousand probabilities are off by about 1e-6, a bfloat16 softmax's by a few 1e-3.
ROW_SUM_TOLERANCE = 1e-2


def _output_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output if output.is_floating_point() else None
    logits = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits",
                                                                              None)
    if isinstance(logits, torch.Tensor) and logits.is_floating_point():
        return logits
    return first_float_tensor(output)


class OutputMeter:
    """Range and row sums of the model's output over its first training forwards.

    No host synchronisation: the running figures stay on the device until :meth:`to_dict`,
    which the capture calls at a flush.
    """

    def __init__(self) -> None:
        self._stats: torch.Tensor | None = None  # (-min, max, max |row sum - 1|)
        self._width = 0
        self.measured = 0

    @property
    def done(self) -> bool:
        """Whether enough forwards were measured."""
        return self.measured >= MEASURED_FORWARDS

    def add(self, output: Any) -> None:
        """Fold one forward's output in (call with gradients off)."""
        x = _output_tensor(output)
        if x is None or x.dim() == 0 or x.numel() == 0:
            return
        # (a squeezed (batch,) output holds one value a row)
        width = int(x.shape[-1]) if x.dim() > 1 else 1
        if self._width and width != self._width:
            return  # another head (a probe, a generation step): the first one's kind is kept
        flat = x.detach().float().reshape(-1, width)
        stats = torch.stack([-flat.amin(), flat.amax(), (flat.sum(dim=1) - 1.0).abs().amax()])
        self._stats = stats if self._stats is None else torch.maximum(self._stats, stats)
        self._width = width
        self.measured += 1

    def to_dict(self) -> dict[str, Any] | None:
        """``{"width", "min", "max", "row_sum_error", "forwards"}``, or None before any."""
        if self._stats is None:
            return None
        neg_min, high, err = (float(v) for v in self._stats.tolist())
        return {"width": self._width, "min": -neg_min, "max": high, "row_sum_error": err,
                "forwards": self.measured}


def output_function(meta: Mapping[str, Any]) -> tuple[str, int] | None:
    """The squashing function the model's output went through, and its width, or None.

    ``("Softmax", K)`` when the model returned probability rows over K classes,
    ``("Sigmoid", K)`` when every value it returned lay strictly inside (0, 1). Read from
    ``meta["model_output"]`` (:class:`OutputMeter`); None for traces written before it was
    recorded. A softmax row over one class is 1 everywhere: not a reading.
    """
    rec = meta.get("model_output") or {}
    try:
        width, low, high, err = (rec["width"], float(rec["min"]), float(rec["max"]),
                                 float(rec["row_sum_error"]))
    except (KeyError, TypeError, ValueError):
        return None
    if not all(math.isfinite(v) for v in (low, high, err)) or not isinstance(width, int):
        return None
    if width >= 2 and low >= 0.0 and err <= ROW_SUM_TOLERANCE:
        return "Softmax", width
    if low > 0.0 and high < 1.0:
        return "Sigmoid", width
    return None
