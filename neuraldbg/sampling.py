"""Which steps get per-module statistics: every ``every`` steps, and densely after trouble.

Per-step scalars (loss, learning rate, global gradient norm) are recorded at every step; the
per-module statistics, parameter norms and update only on *recorded* steps: every
``CaptureConfig.every`` steps, and at every step for ``dense_window`` steps after a
non-finite loss or a loss spike (``spike_factor`` times its running mean, and a rise of a
quarter of its starting level), since the steps
around an onset are the ones the reasoner needs (DESIGN.md, "Capture").
"""

from __future__ import annotations

import math

from neuraldbg.capture_config import CaptureConfig

__all__ = ["SamplingSchedule"]

#: Weight of the newest loss in the running mean that a spike is judged against.
_EMA_WEIGHT = 0.1
#: Steps before the running mean is trusted to judge a spike.
_EMA_WARMUP = 5
#: Floor of the running mean in the spike test (a loss that reached 0 is no reference).
_EMA_FLOOR = 1e-12
#: A spike also rises above the running mean by this share of the loss's starting level
#: (the running mean when it is first trusted): near convergence a minibatch loss at 4x a
#: running mean of 0.05 is noise (a digits MLP at every=16 recorded 81 of 300 steps where
#: 19 were due), and a loss that crosses zero has no ratio to judge by.
_SPIKE_MIN_RISE = 0.25


class SamplingSchedule:
    """The recorded-step decision, one host loss value at a time (no tensor is read).

    Parameters
    ----------
    cfg : CaptureConfig
        ``every``, ``dense_window`` and ``spike_factor`` are used.
    """

    def __init__(self, cfg: CaptureConfig) -> None:
        self._cfg = cfg
        self.reset(0)

    def reset(self, step: int) -> bool:
        """Start (or, entered again, continue) at ``step``; returns whether it is recorded.

        The every-``k`` schedule goes on across enters; the dense window and the running
        mean of the loss start afresh.
        """
        self._dense_until = -1
        self._loss_ema: float | None = None
        self._start: float | None = None  # |running mean| when first trusted
        return step % self._cfg.every == 0

    def next(self, step: int, host_loss: float | None) -> bool:
        """Whether ``step`` is recorded, given the host loss of the step before it.

        Parameters
        ----------
        step : int
            The step about to start.
        host_loss : float, optional
            The loss of the step just closed, when its value is on the host.
        """
        cfg = self._cfg
        if host_loss is not None:
            if not math.isfinite(host_loss):
                self._dense_until = step + cfg.dense_window
            else:
                ema = self._loss_ema
                if ema is not None and step > _EMA_WARMUP:
                    if self._start is None:
                        self._start = abs(ema)
                    if (host_loss > cfg.spike_factor * max(ema, _EMA_FLOOR)
                            and host_loss - ema > _SPIKE_MIN_RISE * self._start):
                        self._dense_until = step + cfg.dense_window
                self._loss_ema = (host_loss if ema is None
                                  else (1 - _EMA_WEIGHT) * ema + _EMA_WEIGHT * host_loss)
        return step % cfg.every == 0 or step <= self._dense_until
