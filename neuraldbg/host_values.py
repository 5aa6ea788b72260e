"""Values the capture reads on the host each step without synchronising the device.

The learning rate comes from the optimizer's param groups (a tensor learning rate is copied
and read at the flush); the loss value that drives the dense-recording trigger is read from
shared memory on the CPU and through a pinned buffer and an event on an accelerator.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["LossProbe", "read_lr"]


def read_lr(optimizer: torch.optim.Optimizer) -> float | torch.Tensor:
    """Learning rate of the first param group; a tensor lr is copied, read at the flush."""
    lr = optimizer.param_groups[0].get("lr", float("nan"))
    return lr.detach().clone() if isinstance(lr, torch.Tensor) else float(lr)


class LossProbe:
    """Host value of the loss for the spike/NaN trigger, without a device sync.

    On the CPU the tensor's memory is read directly (``Tensor.tolist()``, no aten op). On an
    accelerator the loss is copied without blocking into pinned host memory and read one
    step later, once its CUDA event has completed; until then the trigger waits.
    """

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._cuda = device.type == "cuda"
        self._host = torch.empty((), pin_memory=True) if self._cuda else None
        self._event: Any = None

    def take(self, loss: torch.Tensor | float) -> tuple[float | torch.Tensor, float | None]:
        """The step's loss to log, and its host value for the trigger when available.

        A tensor loss is detached, made a float32 scalar on the model's device and logged as
        a host float on the CPU (read without a sync), else as the device tensor (read at
        the flush).

        Raises
        ------
        ValueError
            If ``loss`` is a tensor with more than one element.
        """
        if not isinstance(loss, torch.Tensor):
            return float(loss), float(loss)
        if loss.numel() != 1:
            raise ValueError(
                f"dbg.step(loss) expects a scalar loss, got a tensor of shape "
                f"{tuple(loss.shape)}. Pass the reduced loss (e.g. loss.mean())."
            )
        if loss.is_cpu:
            # ``tolist`` reads the CPU tensor's memory: no aten op, no detach, and no numpy
            # call (each costs tens of microseconds on a training step's cold caches)
            value = loss.tolist()
            while isinstance(value, list):  # a (1,) or (1, 1) loss
                value = value[0]
            return float(value), float(value)
        lt = loss.detach()
        if lt.dim():
            lt = lt.reshape(())
        if lt.dtype != torch.float32 or lt.device != self._device:
            lt = lt.to(self._device, torch.float32)
        host = self.read(lt)
        # on the CPU the value was read without a sync: nothing to keep on the device
        return (host if lt.device.type == "cpu" and host is not None else lt), host

    def read(self, loss: torch.Tensor) -> float | None:
        """The newest loss value available on the host (this step's on the CPU)."""
        if loss.device.type == "cpu":
            return float(loss.numpy())  # a 0-dim tensor: a 0-dim array
        if not self._cuda or self._host is None:
            return None
        value = None
        if self._event is not None and self._event.query():
            value = float(self._host.numpy())
        if self._event is None or value is not None:
            self._host.copy_(loss, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        return value
