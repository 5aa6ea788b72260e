"""Hugging Face ``Trainer`` callback: record the run a ``Trainer`` trains.

Example
-------
>>> from neuraldbg.integrations.transformers import NeuralDbgTrainerCallback
>>> callback = NeuralDbgTrainerCallback(out="runs/my-run")              # doctest: +SKIP
>>> Trainer(model=model, args=args, train_dataset=ds,
...         callbacks=[callback]).train()                                  # doctest: +SKIP
>>> callback.dbg.explain_failure()                                      # doctest: +SKIP

The optimizer the ``Trainer`` hands to callbacks is Accelerate's ``AcceleratedOptimizer``;
the capture hooks the optimizer it wraps, which is the one that steps (once per optimizer
step, after the accumulated micro-batches). Callbacks never see the loss, so it is read from
the model's output (``output.loss``, what a Hugging Face model returns when given labels) and
averaged over the micro-batches of each step. A model that returns no loss (a custom
``compute_loss``) records the steps without one. Evaluation runs under ``torch.no_grad`` and
is not recorded. The ``Trainer`` has no callback for an exception: if training raises, call
``callback.close()`` (the trace is then marked failed).
"""

from __future__ import annotations

import os
from typing import Any

from neuraldbg.capture import CaptureConfig
from neuraldbg.debugger import NeuralDbg

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "neuraldbg.integrations.transformers needs transformers: "
        "pip install 'neuraldbg[transformers]'."
    ) from exc

__all__ = ["NeuralDbgTrainerCallback"]


class NeuralDbgTrainerCallback(TrainerCallback):
    """Record the trained model with :class:`neuraldbg.NeuralDbg`.

    Parameters
    ----------
    out : str or path-like, optional
        Stream the trace to this directory (see :class:`neuraldbg.NeuralDbg`).
    every : int, optional
        Record per-module statistics every ``every`` optimizer steps.
    config : dict, optional
        Run metadata stored with the trace; learning rate, batch size, accumulation and
        clipping from ``TrainingArguments`` are added.
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
        self.out, self.every, self.config = out, every, dict(config or {})
        self.capture_config = capture_config
        self.kwargs = kwargs
        self.dbg: NeuralDbg | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, **kwargs: Any) -> None:
        """Build the recorder on the model and the (unwrapped) optimizer, and enter it."""
        config = {"lr": args.learning_rate, "batch_size": args.per_device_train_batch_size,
                  "gradient_accumulation_steps": args.gradient_accumulation_steps,
                  "max_grad_norm": args.max_grad_norm, "optimizer": str(args.optim),
                  **self.config}
        kwargs = dict(self.kwargs)
        # under fp16 mixed precision Accelerate's optimizer holds the run's GradScaler
        kwargs.setdefault("scaler", getattr(optimizer, "scaler", None))
        self.dbg = NeuralDbg(model, optimizer=optimizer, every=self.every, config=config,
                             out=self.out, capture_config=self.capture_config,
                             seed=args.seed, loss_from_output=True, **kwargs)
        self.dbg.__enter__()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """One ``dbg.step`` per optimizer step (called after it), with the step's loss."""
        if self.dbg is not None and self.dbg.active:
            self.dbg.step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Leave the recorder: hooks removed, the last chunk written."""
        self.close()

    def close(self, exception: BaseException | None = None) -> None:
        """Leave the recorder (also after a failed ``trainer.train()``); safe to call twice."""
        if self.dbg is not None and self.dbg.active:
            if exception is None:
                self.dbg.__exit__(None, None, None)
            else:
                self.dbg.__exit__(type(exception), exception, exception.__traceback__)
