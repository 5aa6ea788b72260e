"""Capture: hooks on leaf modules write compact statistics into a device buffer.

The hot path never synchronises the host: every statistic is a 0-dim tensor written into a
preallocated buffer on the model's device, and the buffer is copied to the host once per
flush (``flush_every`` steps). A hook never keeps a live tensor, never changes an output or a
gradient, and never branches on a tensor value.

Per recorded step and leaf module the buffer accumulates, over the module's forward calls:

- sums: calls, mean, std, share zero, share of dead units, share saturated, NaN and Inf
  counts, squared norm of the gradient with respect to the output, squared norms of the
  module's parameter gradients, parameters and update;
- maxima: max |x| of the output.

Per step (every step, cheap): loss, learning rate, global gradient, parameter and update
norms.
"""

from __future__ import annotations

import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from torch import nn

from neuraldbg.errors import CaptureError, NeuralDbgWarning
from neuraldbg.trace import MODULE_COLUMNS, STAT_COLUMNS, STEP_COLUMNS, Trace, TraceWriter

__all__ = ["Recorder", "CaptureConfig", "activation_family", "ACTIVATION_FAMILIES"]

ActivationFamily = Literal["sigmoid", "tanh", "softmax", "relu", "smooth", "linear", "norm", "other"]

#: Module class name -> activation family (how saturation and death are judged).
ACTIVATION_FAMILIES: dict[str, ActivationFamily] = {
    "Sigmoid": "sigmoid",
    "Hardsigmoid": "sigmoid",
    "LogSigmoid": "other",
    "Tanh": "tanh",
    "Hardtanh": "tanh",
    "Softsign": "tanh",
    "Softmax": "softmax",
    "Softmax2d": "softmax",
    "ReLU": "relu",
    "ReLU6": "relu",
    "LeakyReLU": "relu",
    "PReLU": "relu",
    "RReLU": "relu",
    "ELU": "relu",
    "CELU": "relu",
    "SELU": "relu",
    "Softplus": "relu",
    "GELU": "smooth",
    "SiLU": "smooth",
    "Mish": "smooth",
    "Hardswish": "smooth",
    "Linear": "linear",
    "Bilinear": "linear",
    "LazyLinear": "linear",
    "Conv1d": "linear",
    "Conv2d": "linear",
    "Conv3d": "linear",
    "ConvTranspose1d": "linear",
    "ConvTranspose2d": "linear",
    "ConvTranspose3d": "linear",
    "Embedding": "linear",
    "BatchNorm1d": "norm",
    "BatchNorm2d": "norm",
    "BatchNorm3d": "norm",
    "LayerNorm": "norm",
    "GroupNorm": "norm",
    "InstanceNorm1d": "norm",
    "InstanceNorm2d": "norm",
    "RMSNorm": "norm",
}

_CHANNEL_FIRST = ("Conv", "BatchNorm", "InstanceNorm", "GroupNorm", "MaxPool", "AvgPool",
                  "AdaptiveAvgPool", "AdaptiveMaxPool", "Dropout2d", "Dropout3d")


def activation_family(module: nn.Module) -> ActivationFamily:
    """Return how NeuralDBG judges saturation for ``module``'s output.

    Subclasses of a known activation inherit its family.
    """
    for cls in type(module).__mro__:
        fam = ACTIVATION_FAMILIES.get(cls.__name__)
        if fam is not None:
            return fam
    return "other"


# Layout of the per-module sum buffer.
_SUM = ("calls", "mean", "std", "frac_zero", "frac_dead", "frac_sat", "nan", "inf",
        "out_grad_sq", "param_grad_sq", "param_sq", "update_sq")
_S = {name: i for i, name in enumerate(_SUM)}
_N_ACT = 8  # calls .. inf are written together by the forward hook
# Per-step buffer layout.
_STEP = ("loss", "grad_sq", "param_sq", "update_sq")
_T = {name: i for i, name in enumerate(_STEP)}


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
        A loss above ``spike_factor`` x its running mean counts as a spike.
    sigmoid_margin : float
        A sigmoid output within this distance of 0 or 1 is saturated (|pre-activation| > 4.6).
    tanh_margin : float
        A tanh output within this distance of +-1 is saturated (|pre-activation| > 2.65).
    softmax_margin : float
        A softmax row whose largest probability is above 1 - margin is saturated (one-hot).
    smooth_tail : float
        A GELU/SiLU output in [-smooth_tail, 0] lies on the flat negative tail.
    """

    every: int = 1
    flush_every: int = 100
    dense_window: int = 32
    spike_factor: float = 3.0
    sigmoid_margin: float = 0.01
    tanh_margin: float = 0.01
    softmax_margin: float = 0.01
    smooth_tail: float = 0.01


def _first_float_tensor(obj: Any) -> torch.Tensor | None:
    """The first floating-point tensor in a module output (tensor, tuple, list, dict, None)."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.is_floating_point() else None
    if isinstance(obj, Mapping):
        obj = list(obj.values())
    if isinstance(obj, (tuple, list)):
        for item in obj:
            found = _first_float_tensor(item)
            if found is not None:
                return found
    return None


def _read_scalar(t: torch.Tensor) -> float | None:
    """Host value of a 0-dim tensor without a device sync, or None when not yet available.

    On the CPU the memory is shared (no aten op runs). On an accelerator the caller gets
    ``None``; the flush reads the value later.
    """
    if t.device.type == "cpu":
        return float(t.detach().numpy().reshape(-1)[0]) if t.numel() else None
    return None


class Recorder:
    """Record per-module statistics of a training run through PyTorch hooks.

    Use as a context manager; hooks are registered on enter and removed on exit, also when
    the training loop raises. Call :meth:`step` once per training step, after
    ``optimizer.step()``.

    Parameters
    ----------
    model : torch.nn.Module
        The model to monitor. Hooks go on its leaf modules.
    optimizer : torch.optim.Optimizer, optional
        When given, the learning rate is read from its param groups at every step and the
        parameter update ``||dW|| / ||W||`` is measured across its step.
    every : int, default=1
        Record per-module statistics every ``every`` steps. Per-step scalars are recorded
        every step, and a non-finite loss or a spike switches to every step for a window.
    config : dict, optional
        Run metadata (learning rate, architecture, ...) stored with the trace.
    out : str or path-like, optional
        Stream the trace to this directory in chunks while the run goes, so a run that
        crashes or is killed leaves every finished chunk readable.
    seed : int, optional
        The run's seed, stored in the trace (defaults to ``torch.initial_seed()``).
    ground_truth : dict, optional
        Known truth about the run (failure-zoo scenarios), stored in ``meta.json``.
    flush_every : int, default=100
        Steps between host copies of the statistics buffer (and chunk writes).
    overwrite : bool, default=False
        Allow ``out`` to replace an existing trace.
    capture_config : CaptureConfig, optional
        Thresholds and windows; ``every`` and ``flush_every`` above take precedence.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        every: int = 1,
        config: dict[str, Any] | None = None,
        out: str | os.PathLike[str] | None = None,
        seed: int | None = None,
        ground_truth: dict[str, Any] | None = None,
        flush_every: int = 100,
        overwrite: bool = False,
        capture_config: CaptureConfig | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"model must be a torch.nn.Module, got {type(model).__name__}. Pass the model "
                "you train, e.g. NeuralDbg(model, optimizer=opt)."
            )
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer or None, got "
                f"{type(optimizer).__name__}."
            )
        for name, value in (("every", every), ("flush_every", flush_every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(f"config must be a dict of run metadata, got {type(config).__name__}.")
        base = capture_config or CaptureConfig()
        self.cfg = CaptureConfig(**{**{f: getattr(base, f) for f in base.__dataclass_fields__},
                                    "every": every, "flush_every": flush_every})
        self.model = model
        self.optimizer = optimizer
        self.config = dict(config or {})
        self.out = Path(out) if out is not None else None
        self.seed = seed
        self.ground_truth = ground_truth
        self.overwrite = overwrite
        self._handles: list[Any] = []
        self._active = False
        self._status = "not started"
        self._build_tables()
        self._step = 0
        self._chunks: list[tuple[pd.DataFrame, pd.DataFrame]] = []
        self._writer: TraceWriter | None = None
        self._trace_cache: Trace | None = None

    # ------------------------------------------------------------------ set-up
    def _build_tables(self) -> None:
        """Module table, parameter ownership and buffers, built once."""
        leaves: list[tuple[str, nn.Module]] = []
        rows = []
        for order, (name, mod) in enumerate(self.model.named_modules()):
            if name == "" and len(list(self.model.children())) > 0:
                continue
            if len(list(mod.children())) > 0:
                continue
            leaves.append((name, mod))
            own = list(mod.parameters(recurse=False))
            rows.append({
                "module_name": name,
                "module_type": type(mod).__name__,
                "order": order,
                "forward_order": -1,
                "depth": name.count(".") if name else 0,
                "parent": name.rsplit(".", 1)[0] if "." in name else "",
                "activation_family": activation_family(mod),
                "n_params": int(sum(p.numel() for p in own)),
                "n_trainable": int(sum(p.numel() for p in own if p.requires_grad)),
            })
        if not leaves:
            raise ValueError("The model has no modules to monitor.")
        self._leaves = leaves
        self._modules = pd.DataFrame(rows, columns=list(MODULE_COLUMNS))
        self._index = {id(mod): i for i, (_, mod) in enumerate(leaves)}
        self._forward_seen: dict[int, int] = {}
        self._families: list[str] = self._modules["activation_family"].tolist()
        self._channel_first = [
            any(t.startswith(p) for p in _CHANNEL_FIRST) for t in self._modules["module_type"]
        ]
        # Parameters: every trainable parameter counts in the global norms; those owned by a
        # leaf module also count for that module.
        params: list[nn.Parameter] = []
        owner: list[int] = []
        seen: set[int] = set()
        for name, mod in self.model.named_modules():
            idx = self._index.get(id(mod), len(leaves))  # len(leaves) = "no leaf" bucket
            for p in mod.parameters(recurse=False):
                if id(p) in seen or not p.requires_grad:
                    continue
                seen.add(id(p))
                params.append(p)
                owner.append(idx)
        self._params = params
        try:
            first = next(self.model.parameters())
            device = first.device
        except StopIteration:
            device = torch.device("cpu")
        self._device = device
        self._owner = torch.tensor(owner, dtype=torch.long, device=device)
        self._owner_list = owner
        n_mod, cap = len(leaves), self.cfg.flush_every
        # +1 row: the "no leaf" bucket for parameters owned by containers.
        self._sum = torch.zeros(cap, n_mod + 1, len(_SUM), dtype=torch.float32, device=device)
        self._max = torch.zeros(cap, n_mod, dtype=torch.float32, device=device)
        self._stepbuf = torch.full((cap, len(_STEP)), float("nan"), dtype=torch.float64,
                                   device=device)
        self._snapshot: list[torch.Tensor] | None = None

    # --------------------------------------------------------------- lifecycle
    def __enter__(self) -> Recorder:
        if self._active:
            raise CaptureError("This NeuralDbg is already active; enter it once.")
        self._active = True
        self._status = "running"
        self._reset_host_state()
        if self.out is not None:
            self._writer = TraceWriter(self.out, overwrite=self.overwrite)
            self._writer.write_modules(self._modules)
            self._writer.write_meta(self._meta())
        try:
            for _, mod in self._leaves:
                self._handles.append(mod.register_forward_hook(self._forward_hook))
            if self.optimizer is not None:
                self._handles.append(self.optimizer.register_step_pre_hook(self._pre_step_hook))
                self._handles.append(self.optimizer.register_step_post_hook(self._post_step_hook))
        except BaseException:
            self._remove_hooks()
            self._active = False
            raise
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            self._remove_hooks()
        finally:
            self._active = False
            if exc_type is None:
                self._status = "complete"
            else:
                self._status = "failed"
                self._error = f"{exc_type.__name__}: {exc}"
            self.flush(final=True)

    def _remove_hooks(self) -> None:
        errors = []
        for handle in self._handles:
            try:
                handle.remove()
            except Exception as exc:  # keep removing the others
                errors.append(exc)
        self._handles.clear()
        if errors:
            warnings.warn(f"{len(errors)} hook(s) could not be removed: {errors[0]!r}",
                          NeuralDbgWarning, stacklevel=3)

    def _reset_host_state(self) -> None:
        self._slot = 0                 # buffer row of the current step
        self._slot_steps: list[int] = []
        self._slot_lr: list[float] = []
        self._slot_recorded: list[bool] = []
        self._slot_complete: list[bool] = []
        self._recording = True         # step 0 is always recorded
        self._dense_until = -1
        self._loss_ema: float | None = None
        self._dirty = False
        self._opt_stepped = False
        self._lr: float = float("nan")
        self._error: str | None = None
        self._started = time.time()

    # ------------------------------------------------------------------ hooks
    def _forward_hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if not self._recording or not torch.is_grad_enabled():
            return  # not a recorded step, or an evaluation pass under no_grad
        x = _first_float_tensor(output)
        if x is None:
            return
        idx = self._index[id(module)]
        if idx not in self._forward_seen:
            self._forward_seen[idx] = len(self._forward_seen)
        self._dirty = True
        slot = self._slot
        with torch.no_grad():
            xd = x.detach()
            if xd.dtype != torch.float32:
                xd = xd.float()
            self._write_activation(slot, idx, xd, self._families[idx])
        if x.requires_grad:
            x.register_hook(self._make_grad_hook(slot, idx))

    def _write_activation(self, slot: int, idx: int, x: torch.Tensor, family: str) -> None:
        numel = max(x.numel(), 1)
        std, mean = torch.std_mean(x, correction=0) if x.numel() > 1 else (
            torch.zeros((), device=x.device), x.reshape(-1).sum())
        a = x.abs()
        if x.dim() >= 2:
            unit_dim = 1 if self._channel_first[idx] else x.dim() - 1
            dims = tuple(d for d in range(x.dim()) if d != unit_dim)
            unit_max = a.amax(dim=dims)
            frac_dead = (unit_max == 0).float().mean()
            max_abs = unit_max.amax()
        else:
            frac_dead = (a == 0).float().mean()
            max_abs = a.amax() if x.numel() else torch.zeros((), device=x.device)
        frac_zero = 1.0 - torch.count_nonzero(x) / numel
        cfg = self.cfg
        if family == "sigmoid":
            frac_sat = ((x - 0.5).abs() > 0.5 - cfg.sigmoid_margin).float().mean()
        elif family == "tanh":
            frac_sat = (a > 1.0 - cfg.tanh_margin).float().mean()
        elif family == "softmax":
            frac_sat = ((x.amax(dim=-1) > 1.0 - cfg.softmax_margin).float().mean()
                        if x.dim() else torch.zeros((), device=x.device))
        elif family == "smooth":
            frac_sat = ((x <= 0) & (x >= -cfg.smooth_tail)).float().mean()
        else:
            frac_sat = torch.zeros((), device=x.device)
        nan = torch.isnan(x).sum()
        inf = torch.isinf(x).sum()
        vals = torch.stack([torch.ones((), device=x.device), mean, std, frac_zero, frac_dead,
                            frac_sat, nan.float(), inf.float()])
        self._sum[slot, idx, :_N_ACT].add_(vals)
        torch.maximum(self._max[slot, idx], max_abs, out=self._max[slot, idx])

    def _make_grad_hook(self, slot: int, idx: int):  # noqa: ANN202 - closure
        buf = self._sum

        def grad_hook(grad: torch.Tensor) -> None:
            with torch.no_grad():
                g = grad.detach()
                buf[slot, idx, _S["out_grad_sq"]].add_(
                    torch.linalg.vector_norm(g, dtype=torch.float32).square())
            return None

        return grad_hook

    def _measure_params(self, *, before_update: bool) -> None:
        """Parameter-gradient and parameter norms (before the update) or update norms."""
        if not self._params:
            return
        slot = self._slot
        with torch.no_grad():
            if before_update:
                present = [i for i, p in enumerate(self._params) if p.grad is not None]
                if present:
                    grads = [self._params[i].grad for i in present]
                    gsq = torch.stack(torch._foreach_norm(grads)).double().square()
                    self._stepbuf[slot, _T["grad_sq"]] = gsq.sum()
                    if self._recording:
                        owner = (self._owner if len(present) == len(self._params)
                                 else self._owner[present])
                        self._sum[slot, :, _S["param_grad_sq"]].index_add_(0, owner, gsq.float())
                psq = torch.stack(torch._foreach_norm(self._params)).double().square()
                self._stepbuf[slot, _T["param_sq"]] = psq.sum()
                if self._recording:
                    self._sum[slot, :, _S["param_sq"]].index_add_(0, self._owner, psq.float())
                if self.optimizer is not None:
                    if self._snapshot is None:
                        self._snapshot = [p.detach().clone() for p in self._params]
                    else:
                        torch._foreach_copy_(self._snapshot, [p.detach() for p in self._params])
            elif self._snapshot is not None:
                diff = torch._foreach_sub([p.detach() for p in self._params], self._snapshot)
                usq = torch.stack(torch._foreach_norm(diff)).double().square()
                self._stepbuf[slot, _T["update_sq"]] = usq.sum()
                if self._recording:
                    self._sum[slot, :, _S["update_sq"]].index_add_(0, self._owner, usq.float())

    def _pre_step_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._lr = float(optimizer.param_groups[0].get("lr", float("nan")))
        self._measure_params(before_update=True)
        self._opt_stepped = True
        self._dirty = True

    def _post_step_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._measure_params(before_update=False)

    # ------------------------------------------------------------- step/flush
    @property
    def step_count(self) -> int:
        """Steps recorded so far (the index the next :meth:`step` call will get)."""
        return self._step

    def step(self, loss: torch.Tensor | float | None = None) -> None:
        """Record the loss and advance the step counter. Call once per step, after
        ``optimizer.step()``.

        Parameters
        ----------
        loss : torch.Tensor or float, optional
            The step's loss; a tensor stays on its device until the next flush.

        Raises
        ------
        CaptureError
            If called outside the ``with`` block.
        """
        if not self._active:
            raise CaptureError(
                "dbg.step(loss) was called outside the `with dbg:` block. Wrap the training "
                "loop in `with dbg:` so that hooks are active."
            )
        slot = self._slot
        if not self._opt_stepped:
            if self.optimizer is None:
                self._measure_params(before_update=True)
            else:
                self._lr = float(self.optimizer.param_groups[0].get("lr", float("nan")))
        host_loss: float | None = None
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                raise ValueError(
                    f"dbg.step(loss) expects a scalar loss, got a tensor of shape "
                    f"{tuple(loss.shape)}. Pass loss.mean() or the reduced loss."
                )
            lt = loss.detach().reshape(())
            self._stepbuf[slot, _T["loss"]].copy_(lt)
            host_loss = _read_scalar(lt)
        elif loss is not None:
            host_loss = float(loss)
            self._stepbuf[slot, _T["loss"]] = host_loss
        self._close_slot(complete=True)
        self._step += 1
        self._update_sampling(host_loss)
        if self._slot >= self.cfg.flush_every:
            self.flush()

    def _close_slot(self, *, complete: bool) -> None:
        self._slot_steps.append(self._step)
        self._slot_lr.append(self._lr)
        self._slot_recorded.append(self._recording)
        self._slot_complete.append(complete)
        self._slot += 1
        self._dirty = False
        self._opt_stepped = False
        self._trace_cache = None

    def _update_sampling(self, host_loss: float | None) -> None:
        cfg = self.cfg
        if host_loss is not None:
            if not math.isfinite(host_loss):
                self._dense_until = self._step + cfg.dense_window
            else:
                if self._loss_ema is not None and self._step > 5 and (
                        host_loss > cfg.spike_factor * max(self._loss_ema, 1e-12)):
                    self._dense_until = self._step + cfg.dense_window
                self._loss_ema = (host_loss if self._loss_ema is None
                                  else 0.9 * self._loss_ema + 0.1 * host_loss)
        self._recording = (self._step % cfg.every == 0) or self._step <= self._dense_until

    def flush(self, *, final: bool = False) -> None:
        """Copy the buffer to the host, append a chunk (and write it when streaming).

        The capture's only host synchronisation. Called every ``flush_every`` steps, on exit,
        and when the trace is read.
        """
        if final and self._dirty:
            # An interrupted step (exception, crash): keep what its hooks recorded.
            self._close_slot(complete=False)
        n = self._slot
        if n:
            steps, stats = self._drain(n)
            if self._writer is not None:
                self._writer.write_chunk(steps, stats)
            else:
                self._chunks.append((steps, stats))
            self._slot = 0
        if self._writer is not None:
            self._writer.write_modules(self._modules_table())
            if final or n:
                self._writer.write_meta(self._meta())
        self._trace_cache = None

    def _drain(self, n: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        # copy=True: on the CPU .cpu() would alias the buffer that is zeroed just below.
        sums = self._sum[:n].to("cpu", torch.float64, copy=True).numpy()
        maxes = self._max[:n].to("cpu", torch.float64, copy=True).numpy()
        stepbuf = self._stepbuf[:n].to("cpu", torch.float64, copy=True).numpy()
        self._sum[:n].zero_()
        self._max[:n].zero_()
        self._stepbuf[:n].fill_(float("nan"))
        steps_arr = np.asarray(self._slot_steps[:n], dtype=np.int64)
        grad_norm = np.sqrt(stepbuf[:, _T["grad_sq"]])
        param_norm = np.sqrt(stepbuf[:, _T["param_sq"]])
        update_norm = np.sqrt(stepbuf[:, _T["update_sq"]])
        with np.errstate(divide="ignore", invalid="ignore"):
            update_ratio = update_norm / param_norm
        steps = pd.DataFrame({
            "step": steps_arr,
            "loss": stepbuf[:, _T["loss"]],
            "lr": np.asarray(self._slot_lr[:n], dtype=np.float64),
            "grad_norm": grad_norm,
            "param_norm": param_norm,
            "update_norm": update_norm,
            "update_ratio": update_ratio,
            "recorded": np.asarray(self._slot_recorded[:n], dtype=bool),
            "complete": np.asarray(self._slot_complete[:n], dtype=bool),
        }, columns=list(STEP_COLUMNS))
        for lst in (self._slot_steps, self._slot_lr, self._slot_recorded, self._slot_complete):
            del lst[:n]

        n_mod = len(self._leaves)
        rec = np.flatnonzero(steps["recorded"].to_numpy())
        s = sums[rec, :n_mod, :]                          # (r, m, k)
        calls = s[:, :, _S["calls"]]
        has_params = (self._modules["n_trainable"].to_numpy() > 0)[None, :]
        keep = (calls > 0) | has_params
        with np.errstate(divide="ignore", invalid="ignore"):
            per_call = s[:, :, : _N_ACT] / np.where(calls > 0, calls, np.nan)[:, :, None]
            param_norm_m = np.sqrt(s[:, :, _S["param_sq"]])
            upd = np.sqrt(s[:, :, _S["update_sq"]]) / param_norm_m
        if self.optimizer is None:
            upd = np.full_like(upd, np.nan)
        no_params = ~np.broadcast_to(has_params, keep.shape)
        names = np.asarray([name for name, _ in self._leaves], dtype=object)
        ri, mi = np.nonzero(keep)
        stats = pd.DataFrame({
            "step": steps_arr[rec][ri],
            "module_name": names[mi],
            "calls": calls[ri, mi].astype(np.int64),
            "act_mean": per_call[ri, mi, _S["mean"]],
            "act_std": per_call[ri, mi, _S["std"]],
            "act_max_abs": np.where(calls[ri, mi] > 0, maxes[rec][ri, mi], np.nan),
            "act_frac_zero": per_call[ri, mi, _S["frac_zero"]],
            "act_frac_dead": per_call[ri, mi, _S["frac_dead"]],
            "act_frac_saturated": per_call[ri, mi, _S["frac_sat"]],
            "act_nan": s[ri, mi, _S["nan"]].astype(np.int64),
            "act_inf": s[ri, mi, _S["inf"]].astype(np.int64),
            "out_grad_norm": np.sqrt(s[ri, mi, _S["out_grad_sq"]]),
            "param_grad_norm": np.where(no_params[ri, mi], np.nan,
                                        np.sqrt(s[ri, mi, _S["param_grad_sq"]])),
            "param_norm": np.where(no_params[ri, mi], np.nan, param_norm_m[ri, mi]),
            "update_ratio": np.where(no_params[ri, mi], np.nan, upd[ri, mi]),
        }, columns=list(STAT_COLUMNS))
        return steps, stats

    # ------------------------------------------------------------------ trace
    def _modules_table(self) -> pd.DataFrame:
        mods = self._modules.copy()
        for idx, order in self._forward_seen.items():
            mods.loc[idx, "forward_order"] = order
        return mods

    def _meta(self) -> dict[str, Any]:
        import neuraldbg

        return {
            "status": self._status,
            "error": getattr(self, "_error", None),
            "config": self.config,
            "seed": self.seed if self.seed is not None else int(torch.initial_seed()),
            "every": self.cfg.every,
            "flush_every": self.cfg.flush_every,
            "capture_config": {f: getattr(self.cfg, f) for f in self.cfg.__dataclass_fields__},
            "model_class": type(self.model).__name__,
            "optimizer_class": type(self.optimizer).__name__ if self.optimizer else None,
            "device": str(self._device),
            "n_steps": self._step,
            "started_unix": getattr(self, "_started", None),
            "versions": {
                "neuraldbg": neuraldbg.__version__,
                "torch": torch.__version__,
                "python": sys.version.split()[0],
                "platform": platform.platform(),
            },
            "ground_truth": self.ground_truth,
        }

    @property
    def trace(self) -> Trace:
        """The run recorded so far (flushes the buffer first)."""
        if self._trace_cache is not None:
            return self._trace_cache
        if self._active and self._slot:
            self.flush()
        if self._writer is not None:
            from neuraldbg.trace import load_trace

            trace = load_trace(self._writer.root)
        else:
            steps = [c[0] for c in self._chunks]
            stats = [c[1] for c in self._chunks]
            trace = Trace(
                steps=(pd.concat(steps, ignore_index=True) if steps
                       else pd.DataFrame(columns=list(STEP_COLUMNS))),
                stats=(pd.concat(stats, ignore_index=True) if stats
                       else pd.DataFrame(columns=list(STAT_COLUMNS))),
                modules=self._modules_table(),
                meta={"format": "neuraldbg-trace", "schema_version": 1, **self._meta()},
            )
        self._trace_cache = trace
        return trace
