"""What the model's forward returns: logits, or rows of probabilities (a softmax).

A network that ends in an ``nn.Softmax`` module shows it in the module table. One that
applies ``F.softmax`` inside its ``forward`` does not:
its last module is the ``Linear`` that makes the logits, and a loss that applies its own
softmax (``CrossEntropyLoss``) then sees probabilities as logits and stalls on a floor, the
same bug. So the capture also reads the root module's output, on the first
:data:`MEASURED_FORWARDS` recorded training forwards (gradients enabled, the model in
``train()``): its smallest and largest value and the largest distance of a row's sum from 1,
kept on the device and read at the next flush. ``trace.meta["model_output"]`` holds them;
:func:`output_function` reads them back.

The tensor read is the output itself, the ``logits`` of a mapping or an object that has them
(Hugging Face outputs), else the first floating-point tensor of a tuple or mapping that has
a dimension (a loss returned first is passed over).

The same forwards' input is read too: the largest root mean square of the first
floating-point tensor the forward is given (token ids are not), ``"input_rms"`` in
``trace.meta["model_output"]`` and :func:`input_rms` to read it back. The diagnosis
otherwise infers the input's scale from the first weighted layer's output, which a recurrent
cell bounds (a GRU fed values in the thousands puts out +-1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from neuraldbg.capture_config import first_float_tensor

__all__ = ["OutputMeter", "output_function", "output_rows", "output_width", "input_rms",
           "MEASURED_FORWARDS", "ROW_SUM_TOLERANCE"]

#: Training forwards whose output is measured (the output's kind is the model's code, the
#: same at every step; a few guard against a first batch that happens to look like one).
MEASURED_FORWARDS = 8

#: Largest distance of a row's sum from 1 for a row of probabilities: float32 sums of a few
#: thousand probabilities are off by about 1e-6, a bfloat16 softmax's by a few 1e-3.
ROW_SUM_TOLERANCE = 1e-2


def _output_tensor(output: Any) -> torch.Tensor | None:
    logits = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits",
                                                                              None)
    if isinstance(logits, torch.Tensor):
        output = logits
    return first_float_tensor(output, with_dim=True)


class OutputMeter:
    """Range and row sums of the model's output over its first training forwards.

    Rows are taken along the last dimension and, for outputs of three or more dimensions,
    along dimension 1 too (the class dimension ``CrossEntropyLoss`` reads on a
    ``(N, C, H, W)`` output; a sequence model's ``(N, T, V)`` reshaped for the loss has it
    last). Outputs are grouped by shape (a forward of another head, a feature probe, is kept
    apart) and the shape most forwards returned is reported. No host synchronisation: the
    running figures stay on the device until :meth:`to_dict`, which the capture calls at a
    flush.
    """

    def __init__(self) -> None:
        # per output shape (batch dimension left out): (-min, max, max |row sum - 1| along
        # the last dimension, along dimension 1), how many forwards returned it, and the
        # batch size of the first
        self._stats: dict[tuple[int, ...], tuple[torch.Tensor, int, int]] = {}
        self.measured = 0
        self._final: dict[str, Any] | None = None  # read once, when done
        self._input_rms: torch.Tensor | None = None  # the largest rms of an input read

    @property
    def done(self) -> bool:
        """Whether enough forwards were measured."""
        return self.measured >= MEASURED_FORWARDS

    def add(self, output: Any, inputs: Any = None) -> None:
        """Fold one forward's output and input in (call with gradients off)."""
        x = _output_tensor(output)
        if x is None:
            return
        given = first_float_tensor(inputs, with_dim=True)
        if given is not None:
            rms = given.detach().float().square().mean().sqrt()
            self._input_rms = (rms if self._input_rms is None
                               else torch.maximum(self._input_rms, rms))
        x = x.detach().float()
        if x.dim() == 1:  # a squeezed (batch,) output holds one value a row
            x = x.unsqueeze(1)
        errs = [(x.sum(dim=-1) - 1.0).abs().amax()]
        errs.append((x.sum(dim=1) - 1.0).abs().amax() if x.dim() >= 3 else errs[0])
        stats = torch.stack([-x.amin(), x.amax(), *errs])
        key = tuple(int(n) for n in x.shape[1:])
        old = self._stats.get(key)
        self._stats[key] = ((stats, 1, int(x.shape[0])) if old is None
                            else (torch.maximum(old[0], stats), old[1] + 1, old[2]))
        self.measured += 1

    def to_dict(self) -> dict[str, Any] | None:
        """``{"width", "rows", "min", "max", "row_sum_error", "forwards"}``, or None before any.

        With ``"input_rms"`` too when a forward was given a floating-point tensor.

        ``width`` and ``row_sum_error`` are those of the axis whose rows came closer to
        summing to 1 (the last one on a tie), ``rows`` the rows of that width in the first
        forward (its batch times the other dimensions); ``forwards`` counts the forwards of
        the reported shape.
        """
        if self._final is not None:
            return self._final
        if not self._stats:
            return None
        shape, (stats, count, batch) = max(self._stats.items(), key=lambda kv: kv[1][1])
        neg_min, high, err_last, err_dim1 = (float(v) for v in stats.tolist())
        width, err = ((shape[0], err_dim1) if len(shape) >= 2 and err_dim1 < err_last
                      else (shape[-1], err_last))
        rows = batch * math.prod(shape) // max(width, 1)
        out = {"width": width, "rows": rows, "min": -neg_min, "max": high,
               "row_sum_error": err, "forwards": count}
        if self._input_rms is not None:
            out["input_rms"] = float(self._input_rms)
        if self.done:  # the figures stop changing: no device read at later flushes
            self._final = out
        return out


def input_rms(meta: Mapping[str, Any]) -> float:
    """Largest rms of the model's input over its first measured forwards (NaN when unread)."""
    value = (meta.get("model_output") or {}).get("input_rms")
    return float(value) if isinstance(value, (int, float)) else math.nan


def output_width(meta: Mapping[str, Any]) -> int:
    """Width of the rows of the model's output (its classes; 0 when not recorded)."""
    width = (meta.get("model_output") or {}).get("width")
    return width if isinstance(width, int) and width > 0 else 0


def output_rows(meta: Mapping[str, Any]) -> int:
    """Rows of the model's output in its first measured forward (0 when not recorded)."""
    rows = (meta.get("model_output") or {}).get("rows")
    return rows if isinstance(rows, int) and rows > 0 else 0


def output_function(meta: Mapping[str, Any]) -> tuple[str, int] | None:
    """The squashing function the model's output went through, and its width, or None.

    ``("Softmax", K)`` when the model returned probability rows over K classes. Read from
    ``meta["model_output"]`` (:class:`OutputMeter`); None for traces written before it was
    recorded. A softmax row over one class is 1 everywhere: not a reading. Values inside
    (0, 1) are not read as a sigmoid: an autoencoder's image or a probability trained by
    ``BCELoss`` is one by design, and a sigmoid's mismatch with ``BCEWithLogitsLoss`` has no
    floor the trace can check (an ``nn.Sigmoid`` module still counts as before).
    """
    rec = meta.get("model_output") or {}
    try:
        width, low, high, err = (rec["width"], float(rec["min"]), float(rec["max"]),
                                 float(rec["row_sum_error"]))
    except (KeyError, TypeError, ValueError):
        return None
    if not all(math.isfinite(v) for v in (low, high, err)) or not isinstance(width, int):
        return None
    if width >= 2 and low >= 0.0 and high <= 1.0 and err <= ROW_SUM_TOLERANCE:
        return "Softmax", width
    return None
