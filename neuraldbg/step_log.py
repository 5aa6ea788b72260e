"""The steps since the last flush: host-side scalars and the device rows of their statistics.

One buffer row per step slot: activation sums, max |x| and squared output-gradient norms on
the model's device (written with ``index_add_`` when a step closes, never read on the host
until :meth:`StepLog.drain`), denominators known from shapes on the host, and the per-step
scalars (step, learning rate, loss, recorded, complete, stepped). :meth:`StepLog.drain` is the
capture's one host synchronisation: it copies the first ``n`` rows and turns them into the
numpy columns of ``trace.steps`` and ``trace.stats``.
"""

from __future__ import annotations

import numpy as np
import torch

from neuraldbg.param_norms import ParamMeter
from neuraldbg.statistics import ACT_SUMS, DEN, finish_module_stats

__all__ = ["StepLog"]

Chunk = tuple[dict[str, np.ndarray], dict[str, np.ndarray]]

_GRADS = DEN.index("grads")
assert _GRADS == len(DEN) - 1  # the other columns come first, as ActivationBatch gives them


class StepLog:
    """Per-step buffers of one flush interval.

    Parameters
    ----------
    names : list of str
        Monitored module names (buffer rows; one more row holds the root's parameters).
    capacity : int
        Steps held between flushes.
    device : torch.device
        Where the model lives.
    has_params, complement : numpy.ndarray
        Per module: owns trainable parameters; GELU/SiLU (saturation counted as a complement).
    """

    def __init__(self, names: list[str], capacity: int, device: torch.device, *,
                 has_params: np.ndarray, complement: np.ndarray) -> None:
        n_rows = len(names) + 1
        self.names = np.asarray(names, dtype=object)
        self.has_params, self.complement = has_params, complement
        self.act = torch.zeros(capacity, n_rows, len(ACT_SUMS), dtype=torch.float32,
                               device=device)
        self.max = torch.zeros(capacity, n_rows, dtype=torch.float32, device=device)
        self.grad = torch.zeros(capacity, n_rows, dtype=torch.float32, device=device)
        # Per slot, views made once (a view is a dispatched op on the hot path): the sums of
        # sample_sums, ``saturated``, ``dead``, max |x|, squared output-gradient norms.
        sat, dead = ACT_SUMS.index("saturated"), ACT_SUMS.index("dead")
        assert sat == dead - 1 == len(ACT_SUMS) - 2
        self.rows = [(act[:, :sat], act[:, sat], act[:, dead], mx, grad) for act, mx, grad in
                     zip(self.act.unbind(0), self.max.unbind(0), self.grad.unbind(0),
                         strict=True)]
        # Per slot, the step's host denominators as the capture's parts gave them (cached,
        # read-only arrays): summed at the drain, since a numpy operation per step costs
        # tens of microseconds on a training step's cold caches.
        self.den_parts: list[tuple[np.ndarray | None, np.ndarray | None] | None] = \
            [None] * capacity
        # Per logged step, one tuple (one append per step: this runs on cold caches):
        # step, lr, loss (host value, or the device tensor), recorded, complete, stepped.
        self.scalars: list[tuple[int, float | torch.Tensor, float | torch.Tensor, bool, bool,
                                 bool]] = []

    def __len__(self) -> int:
        """Number of logged steps."""
        return len(self.scalars)

    def set_den(self, slot: int, activations: np.ndarray | None,
                grads: np.ndarray | None) -> None:
        """Step ``slot``'s denominators: every :data:`DEN` column but ``grads``, and those.

        ``activations`` is ``(n_rows, len(DEN) - 1)``, ``grads`` ``(n_rows,)``; either may
        be ``None`` (nothing measured). The arrays are kept, not copied.
        """
        self.den_parts[slot] = (activations, grads)

    def _den(self, n: int) -> np.ndarray:
        """``(n, n_rows, len(DEN))`` denominators of the first ``n`` slots; forget them."""
        den = np.zeros((n, len(self.names) + 1, len(DEN)))
        for i, parts in enumerate(self.den_parts[:n]):
            if parts is None:
                continue
            act, grads = parts
            if act is not None:
                den[i, :, :_GRADS] = act
            if grads is not None:
                den[i, :, _GRADS] = grads
        self.den_parts[:n] = [None] * n
        return den

    def append(self, step: int, lr: float | torch.Tensor, loss: float | torch.Tensor,
               recorded: bool, complete: bool, stepped: bool = True) -> None:
        """The scalars of the step whose statistics went into row ``len(self)``."""
        self.scalars.append((step, lr, loss, recorded, complete, stepped))

    def drain(self, n: int, meter: ParamMeter) -> Chunk:
        """Columns of ``trace.steps`` and ``trace.stats`` for the first ``n`` steps; reset them."""
        n_mod = len(self.names)
        totals, par = meter.drain(n)
        with torch.no_grad():
            # copy=True: on the CPU .cpu() would alias the buffers zeroed just below.
            act, mx, grad = [t.to("cpu", torch.float64, copy=True).numpy()
                             for t in (self.act[:n], self.max[:n], self.grad[:n])]
            for buf in (self.act, self.max, self.grad):
                buf[:n].zero_()
            step_ids, rates, losses, rec_flags, complete, stepped = \
                (list(col) for col in zip(*self.scalars[:n], strict=True))
            on_device = [i for i, v in enumerate(losses) if isinstance(v, torch.Tensor)]
            loss = np.asarray([float("nan") if isinstance(v, torch.Tensor) else v
                               for v in losses], dtype=np.float64)
            if on_device:
                tensors = [v for v in losses if isinstance(v, torch.Tensor)]  # on_device order
                loss[on_device] = torch.stack(tensors).to("cpu", torch.float64).numpy()
        den = self._den(n)
        steps_arr = np.asarray(step_ids, dtype=np.int64)
        recorded = np.asarray(rec_flags, dtype=bool)
        with np.errstate(divide="ignore", invalid="ignore"):
            update_ratio = totals[:, 2] / totals[:, 1]
        steps = {
            "step": steps_arr,
            "loss": loss,
            "lr": np.asarray([float(v) for v in rates], dtype=np.float64),
            "grad_norm": totals[:, 0],
            "param_norm": totals[:, 1],
            "update_norm": totals[:, 2],
            "update_ratio": update_ratio,
            "recorded": recorded,
            "complete": np.asarray(complete, dtype=bool),
            "stepped": np.asarray(stepped, dtype=bool),
        }
        del self.scalars[:n]
        rec = np.flatnonzero(recorded)
        stats = finish_module_stats(
            steps_arr[rec], self.names, act[rec, :n_mod], mx[rec, :n_mod], den[rec, :n_mod],
            grad[rec, :n_mod], par[rec, :n_mod], self.has_params, self.complement,
        )
        return steps, stats
