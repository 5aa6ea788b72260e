"""PyTorch Lightning callback: record the run a ``Trainer`` fits.

Example
-------
>>> from neuraldbg.integrations.lightning import NeuralDbgCallback
>>> callback = NeuralDbgCallback(out="runs/my-run")          # doctest: +SKIP
>>> pl.Trainer(callbacks=[callback]).fit(module, loader)     # doctest: +SKIP
>>> callback.dbg.explain_failure()                           # doctest: +SKIP

Lightning steps the optimizer through ``optimizer.step(closure)``; the capture measures the
gradients inside the closure, so they are the step's own. With ``accumulate_grad_batches``
the step's loss is the mean of its micro-batches' losses, as the Hugging Face callback
records it (Lightning hands callbacks each micro-batch's loss divided by
``accumulate_grad_batches``; their sum over the step is that mean). Validation runs under
``torch.no_grad`` and is not recorded. A precision plugin's ``GradScaler`` is picked up, so
statistics are on the unscaled gradient scale.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from neuraldbg.capture import CaptureConfig
from neuraldbg.debugger import NeuralDbg

try:  # the unified package first, then the standalone one
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - depends on what is installed
    try:
        from pytorch_lightning import Callback
    except ImportError as exc:
        raise ImportError(
            "neuraldbg.integrations.lightning needs PyTorch Lightning: "
            "pip install 'neuraldbg[lightning]'."
        ) from exc

__all__ = ["NeuralDbgCallback"]


class NeuralDbgCallback(Callback):
    """Record the fitted ``LightningModule`` with :class:`neuraldbg.NeuralDbg`.

    Parameters
    ----------
    out : str or path-like, optional
        Stream the trace to this directory (see :class:`neuraldbg.NeuralDbg`).
    every : int, optional
        Record per-module statistics every ``every`` optimizer steps.
    config : dict, optional
        Run metadata stored with the trace; the module's ``hparams`` are added.
    capture_config : CaptureConfig, optional
        Capture thresholds and windows.
    **kwargs
        Passed on to :class:`neuraldbg.NeuralDbg` (``overwrite``, ``seed``, ...).

    Attributes
    ----------
    dbg : NeuralDbg or None
        The recorder, from the start of training on (``dbg.trace``, ``dbg.explain_failure()``).
    """

    def __init__(self, *, out: str | os.PathLike[str] | None = None, every: int | None = None,
                 config: dict[str, Any] | None = None,
                 capture_config: CaptureConfig | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.out, self.every, self.config = out, every, dict(config or {})
        self.capture_config = capture_config
        self.kwargs = kwargs
        self.dbg: NeuralDbg | None = None
        self._loss: torch.Tensor | float | None = None  # the open step's micro-batch sum

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Build the recorder on the module and its optimizers, and enter it."""
        hparams = dict(getattr(pl_module, "hparams", {}) or {})
        config = {**{k: v for k, v in hparams.items()
                     if isinstance(v, (int, float, str, bool, type(None)))}, **self.config}
        self._loss = None  # (a fit interrupted mid-accumulation left a partial sum)
        scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
        self.dbg = NeuralDbg(pl_module, optimizer=list(trainer.optimizers), every=self.every,
                             config=config, out=self.out, capture_config=self.capture_config,
                             scaler=scaler, **self.kwargs)
        self.dbg.__enter__()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """One ``dbg.step`` per optimizer step, with the mean loss of its micro-batches."""
        if self.dbg is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            loss = loss.detach()
        if isinstance(loss, (torch.Tensor, float)):  # divided by accumulate_grad_batches
            self._loss = loss if self._loss is None else self._loss + loss
        if not self.dbg.optimizer_stepped:
            return  # a micro-batch of an accumulated step
        total, self._loss = self._loss, None
        self.dbg.step(total)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Leave the recorder: hooks removed, the last chunk written."""
        if self.dbg is not None and self.dbg.active:
            self.dbg.__exit__(None, None, None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Leave the recorder, marking the trace failed with the exception."""
        if self.dbg is not None and self.dbg.active:
            self.dbg.__exit__(type(exception), exception, exception.__traceback__)
