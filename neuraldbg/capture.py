"""Capture: hooks on leaf modules write compact statistics into a device buffer.

The hot path never synchronises the host. A forward hook takes each unit's largest |x| and a
strided sample of the output into a per-step device buffer
(:class:`neuraldbg.activation_batch.ActivationBatch`), and a pre-hook on the autograd node that
made the output the norm of its gradient (:class:`neuraldbg.grad_norms.OutputGradNorms`); when
:meth:`Recorder.step` closes the step, every call's sample is reduced at once and added into
preallocated buffers on the model's device with ``index_add_``. Parameter-side norms go into a
per-step device buffer too (:class:`neuraldbg.param_norms.ParamMeter`). The buffers are copied
to the host once per flush (``flush_every`` steps). No activation outlives its step; a hook
never changes an output or a gradient, and never branches on a tensor value. Between recorded
steps (``every > 1``) the forward hooks are removed, so the modules run on PyTorch's fast path;
the root carries a forward pre-hook only while ``dbg.step`` has come before ``opt.step`` (the
next forward then closes the step). On the CPU a small model's cost is the number of dispatched
operations: views of buffer rows and parameters are made once and reused.

Per step (every step, cheap): loss, learning rate, global gradient norm. On recorded steps
(every ``every`` steps, and every step for a window after a loss spike or a non-finite
loss) also per-module statistics, parameter norms and the update ``||dW|| / ||W||``.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from neuraldbg.activation_batch import ActivationBatch
from neuraldbg.capture_config import CaptureConfig, first_float_tensor, resolve_capture_config
from neuraldbg.capture_sink import CaptureSink, RunInfo, run_meta
from neuraldbg.errors import CaptureError, NeuralDbgWarning
from neuraldbg.grad_norms import OutputGradNorms
from neuraldbg.host_values import LossProbe, read_lr
from neuraldbg.model_output import OutputMeter
from neuraldbg.module_table import module_table, monitored_modules, parameter_owners
from neuraldbg.optimizers import (
    as_optimizers,
    closure_then,
    group_by_optimizer,
    scaler_scale,
)
from neuraldbg.param_norms import ParamMeter
from neuraldbg.sampling import SamplingSchedule
from neuraldbg.statistics import NONNEGATIVE_OUTPUTS, is_channel_first
from neuraldbg.step_log import StepLog
from neuraldbg.trace import Trace, check_json, rank_shard
from neuraldbg.weight_diversity import WeightDiversity

__all__ = ["Recorder", "CaptureConfig"]


class Recorder:
    """Record per-module statistics of a training run through PyTorch hooks.

    Use as a context manager; hooks are registered on enter and removed on exit, also when
    the training loop raises. Call :meth:`step` once per optimizer step, before or after
    ``optimizer.step()``. Steps are optimizer steps: statistics are measured when the
    optimizer steps (inside ``opt.step(closure)`` too, after a ``GradScaler`` has unscaled
    the gradients), and a forward that no optimizer step follows (validation, generation,
    the forward a run died in) is not a step.

    Entering the same object again (a ``with`` block per epoch) continues the trace: the
    step counter goes on and, with ``out=``, new chunks are appended to the same directory.

    Parameters
    ----------
    model : torch.nn.Module
        The model to monitor. Hooks go on its leaf modules and on modules that own
        parameters beside their children (``nn.MultiheadAttention``).
    optimizer : torch.optim.Optimizer or list of them, optional
        Every optimizer that steps the model's parameters (``[opt_d, opt_g]`` for a GAN).
        Framework wrappers (Accelerate's ``AcceleratedOptimizer``, Lightning's) are
        unwrapped. Each optimizer's parameters are measured when it steps: gradient norms,
        the learning rate (of the first optimizer's first param group) and the update
        ``||dW|| / ||W||``. Without an optimizer, gradients are read at :meth:`step`.
    every : int, optional
        Record per-module statistics every ``every`` steps (default: ``capture_config``'s,
        1). Per-step scalars are recorded every step, and a non-finite loss or a spike
        switches to every step for a window.
    config : dict, optional
        Run metadata (learning rate, architecture, ...) stored with the trace; JSON values.
    out : str or path-like, optional
        Stream the trace to this directory in chunks while the run goes, so a run that
        crashes or is killed leaves every finished chunk readable. Under
        ``torch.distributed`` with several processes, each rank writes its own shard
        ``out/rank-<r>/`` and :func:`neuraldbg.load_trace` merges them.
    seed : int, optional
        The run's seed, stored in the trace (defaults to ``torch.initial_seed()``).
    ground_truth : dict, optional
        Known truth about the run (failure-zoo scenarios), stored in ``meta.json``.
    flush_every : int, optional
        Steps between host copies of the statistics buffer (and chunk writes); default
        ``capture_config``'s, 100.
    overwrite : bool, default=False
        Allow ``out`` to replace an existing trace (on the first enter; later enters of the
        same object append).
    capture_config : CaptureConfig, optional
        Thresholds and windows. ``every`` and ``flush_every``, when passed here, take
        precedence over its values.
    scaler : torch.amp.GradScaler, optional
        The run's gradient scaler: output-gradient norms, measured during the scaled
        backward, are divided by its scale. Parameter gradients need nothing: the optimizer
        step sees them unscaled.
    loss_from_output : bool, default=False
        Read the loss from the model's output (``output.loss`` or ``output["loss"]``, as
        Hugging Face models return it) in every forward with gradients enabled; ``dbg.step()``
        without a loss then records the mean over the step's forwards (the micro-batches of
        an accumulated step). For framework callbacks that never see the loss.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        *,
        every: int | None = None,
        config: dict[str, Any] | None = None,
        out: str | os.PathLike[str] | None = None,
        seed: int | None = None,
        ground_truth: dict[str, Any] | None = None,
        flush_every: int | None = None,
        overwrite: bool = False,
        capture_config: CaptureConfig | None = None,
        scaler: Any = None,
        loss_from_output: bool = False,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"model must be a torch.nn.Module, got {type(model).__name__}. Pass the model "
                "you train, e.g. NeuralDbg(model, optimizer=opt)."
            )
        self._optimizers = as_optimizers(optimizer)
        if isinstance(config, CaptureConfig):
            raise TypeError("config is run metadata (a dict stored with the trace); pass "
                            "capture settings as capture_config=CaptureConfig(...).")
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(f"config must be a dict of run metadata, got {type(config).__name__}.")
        self.cfg = resolve_capture_config(capture_config, every=every, flush_every=flush_every)
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.loss_from_output = loss_from_output
        self.config = dict(config or {})
        check_json(self.config, "config")
        check_json(ground_truth, "ground_truth")
        self.out = Path(out) if out is not None else None
        self.seed = seed
        self.ground_truth = ground_truth
        self.overwrite = overwrite
        self._handles: list[Any] = []
        self._forward_handles: list[Any] = []  # only while a recorded step may run
        self._root_pre_handle: Any = None  # only while dbg.step waits for its optimizer
        self._active = False
        self._entered = False
        self._status = "not started"
        self._error: str | None = None
        self._rank: tuple[int, int] | None = None
        self._build_tables()
        opts = [type(o).__name__ for o in self._optimizers]
        self._info = RunInfo(
            config=self.config, seed=seed, cfg=self.cfg, model_class=type(model).__name__,
            optimizer_class=opts[0] if len(opts) == 1 else opts or None,
            grad_scaler=scaler is not None, root_parameters=self._root_params,
            device=str(self._device), ground_truth=ground_truth)
        self._step = 0
        self._schedule = SamplingSchedule(self.cfg)
        self._sink = CaptureSink()  # finished chunks, in memory or streamed to ``out``
        self._trace_cache: Trace | None = None

    # ------------------------------------------------------------------ set-up
    def _build_tables(self) -> None:
        """Module table, parameter ownership and buffers, built once."""
        leaves = monitored_modules(self.model)
        self._leaves = leaves
        self._modules = module_table(self.model)
        self._index = {id(mod): i for i, (_, mod) in enumerate(leaves)}
        self._families = self._modules["activation_family"].tolist()
        self._forward_seen: dict[int, int] = {}
        # Every trainable parameter counts in the global norms; one the root owns directly
        # counts there only (index len(leaves) is its bucket).
        params, owner, names = parameter_owners(
            self.model, {name: i for i, (name, _) in enumerate(leaves)}, len(leaves))
        params, owner, names, groups = group_by_optimizer(params, owner, names,
                                                          self._optimizers)
        self._root_params = [n for n, o in zip(names, owner, strict=True) if o == len(leaves)]
        first = next(self.model.parameters(), None)
        self._device = first.device if first is not None else torch.device("cpu")
        dev, n_mod, cap = self._device, len(leaves), self.cfg.flush_every
        self._has_params = self._modules["n_trainable"].to_numpy() > 0
        self._complement = self._modules["activation_family"].to_numpy() == "smooth"
        cfg = self.cfg
        self._batch = ActivationBatch(
            self._families, [is_channel_first(m) for _, m in leaves],
            [type(m).__name__ in NONNEGATIVE_OUTPUTS for _, m in leaves], dev,
            sample_size=cfg.sample_size,
            margins={"sigmoid_margin": cfg.sigmoid_margin, "tanh_margin": cfg.tanh_margin,
                     "softmax_margin": cfg.softmax_margin, "smooth_tail": cfg.smooth_tail})
        self._meter = ParamMeter(params, owner, n_mod + 1, cap, dev,
                                 sample_size=cfg.sample_size, groups=groups)
        # Device buffers, one row per step slot (+1 module row: the root's bucket).
        self._stepped: set[int] = set()  # optimizers that stepped in the open step
        self._output_losses: list[torch.Tensor] = []  # losses read from model outputs
        self._out_grads = OutputGradNorms(dev, n_mod + 1)  # output-gradient norms
        self._log = StepLog([name for name, _ in leaves], cap, dev,
                            has_params=self._has_params, complement=self._complement)
        self._diversity = WeightDiversity(leaves)
        self._output = OutputMeter()  # what the model's forward returns (logits, probabilities)
        self._output_handle: Any = None  # its root hook, while it measures
        self._diversity_at: int | None = None  # step of the last diversity flush
        # A parameter near the input, watched for gradients thrown away between a backward
        # and the next forward (``zero_grad`` after a probe's backward): the first trainable
        # one, which every backward through the whole model reaches.
        self._sentinel = next((p for p in self.model.parameters() if p.requires_grad), None)

    # --------------------------------------------------------------- lifecycle
    def __enter__(self) -> Recorder:
        """Register the hooks and start recording (see the class docstring)."""
        if self._active:
            raise CaptureError("This NeuralDbg is already active; enter it once.")
        opened = False
        try:
            self._reset_host_state()
            self._diversity.snapshot(self._step)
            self._diversity_at = None  # the enter snapshot goes to the host at the next flush
            self._status = "running"
            self._error = None
            if self.out is not None:
                # a later enter of the same object continues its own trace
                self._sink.open(self._shard_root(), overwrite=self.overwrite,
                                append=self._entered, modules=self._modules_table(),
                                meta=self._meta())
                opened = True
            if self.loss_from_output:
                self._handles.append(self.model.register_forward_hook(self._root_hook))
            if self._recording:
                self._attach_forward_hooks()
            if self._sentinel is not None:
                self._handles.append(self._sentinel.register_post_accumulate_grad_hook(
                    self._sentinel_hook))
            for k, opt in enumerate(self._optimizers):
                self._handles.append(opt.register_step_pre_hook(partial(self._pre_step_hook, k)))
                self._handles.append(opt.register_step_post_hook(partial(self._post_step_hook,
                                                                         k)))
        except BaseException:
            self._remove_hooks()
            if opened:
                self._sink.close()
            self._status = "not started" if not self._entered else "complete"
            raise  # the object stays usable: nothing is active
        self._active = True
        self._entered = True
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        """Remove every hook (also on error) and finish the trace."""
        try:
            self._remove_hooks()
        finally:
            self._active = False
            if exc_type is None:
                self._status = "complete"
            else:
                self._status = "failed"
                self._error = f"{exc_type.__name__}: {exc}"
            try:
                self._finish_pending()
                self.flush(final=True)
            except Exception as err:
                if exc_type is None:
                    raise
                warnings.warn(f"NeuralDBG could not finish the trace after the run failed: "
                              f"{err!r}", NeuralDbgWarning, stacklevel=2)
            finally:
                self._sink.close()

    def _shard_root(self) -> Path:
        """``out``, or this rank's shard of it when several processes train together."""
        assert self.out is not None
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self._rank = (dist.get_rank(), dist.get_world_size())
            return rank_shard(self.out, self._rank[0])
        return self.out

    def _attach_forward_hooks(self) -> None:
        self._forward_handles = [mod.register_forward_hook(self._forward_hook)
                                 for _, mod in self._leaves]
        if not self._output.done:  # (the hook removes itself once it has measured enough)
            self._output_handle = self.model.register_forward_hook(self._output_hook)
            self._forward_handles.append(self._output_handle)

    def _detach_forward_hooks(self) -> None:
        for handle in self._forward_handles:
            handle.remove()
        self._forward_handles = []

    def _remove_hooks(self) -> None:
        errors = []
        if self._root_pre_handle is not None:
            self._handles.append(self._root_pre_handle)
            self._root_pre_handle = None
        for handle in (*self._forward_handles, *self._handles):
            try:
                handle.remove()
            except Exception as exc:  # keep removing the others
                errors.append(exc)
        self._handles.clear()
        self._forward_handles = []
        if errors:
            warnings.warn(f"{len(errors)} hook(s) could not be removed: {errors[0]!r}",
                          NeuralDbgWarning, stacklevel=3)

    def _reset_host_state(self) -> None:
        self._slot = 0                 # buffer row of the current step
        self._loss_probe = LossProbe(self._device)
        # step 0 is always recorded; entering again later continues the every-k schedule
        self._recording = self._schedule.reset(self._step)
        self._started = time.time()
        self._clear_pending()

    def _clear_pending(self) -> None:
        """Forget the open step's state (its hook results are in the buffer or dropped)."""
        if self._root_pre_handle is not None:
            self._root_pre_handle.remove()
            self._root_pre_handle = None
        self._loss_given = False           # dbg.step(loss) was called for the open step
        self._has_loss = False             # ... with a loss
        self._host_loss: float | None = None
        if self._stepped:  # (emptied only when used: this runs every step)
            self._stepped = set()
        self._measured = False             # parameter-side norms taken for the open step
        self._in_step = False              # inside an optimizer's step (its closure runs)
        self._lr: float | torch.Tensor = float("nan")
        self._loss: float | torch.Tensor = float("nan")
        self._drop_queued()

    # ------------------------------------------------------------------ hooks
    # The module hooks run eagerly under ``torch.compile``: traced by Dynamo they recompiled
    # past its limit (a compiled MLP trained 20x slower than eager); a disabled call costs
    # about half a microsecond when nothing is compiled.
    @torch.compiler.disable
    def _root_pre_hook(self, module: nn.Module, inputs: Any) -> None:
        if self._loss_given:
            self._close_step()  # a forward after dbg.step: the next step has begun

    @torch.compiler.disable
    def _root_hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if not torch.is_grad_enabled():
            return  # evaluation
        loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss",
                                                                              None)
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._output_losses.append(loss.detach().reshape(()))

    @torch.compiler.disable
    def _output_hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if not (torch.is_grad_enabled() and module.training) or self._output.done:
            return  # evaluation (an eval() model may return probabilities), or measured
        torch._C._set_grad_enabled(False)
        try:
            self._output.add(output, inputs)
        finally:
            torch._C._set_grad_enabled(True)
        if self._output.done:  # no call on the forward path from here on
            self._output_handle.remove()

    @torch.compiler.disable
    def _forward_hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if self._loss_given:
            self._close_step()  # (a model whose root is never called, e.g. a GAN's dict)
        if not self._recording or not torch.is_grad_enabled():
            return  # not a recorded step, or an evaluation pass under no_grad
        sentinel = self._sentinel
        if self._backward_done and not self._in_step and sentinel is not None \
                and sentinel.grad is None:
            self._drop_queued()
        idx = self._index[id(module)]
        if idx not in self._forward_seen:  # (also a module whose output is not measured)
            self._forward_seen[idx] = len(self._forward_seen)
        x = output if type(output) is torch.Tensor else first_float_tensor(output)
        if x is None or not x.is_floating_point() or x.numel() == 0:
            return
        needs_grad = x.requires_grad
        # grad mode off (gradients were enabled: checked above) rather than x.detach(): no
        # graph is built and no dispatched op is spent per call
        torch._C._set_grad_enabled(False)
        try:
            row = self._batch.add(idx, x, needs_grad=needs_grad)
        finally:
            torch._C._set_grad_enabled(True)
        if needs_grad:
            node = x.grad_fn
            if node is not None:  # a pre-hook on the node that receives x's gradient
                node.register_prehook(partial(self._node_grad_hook, idx, row, x.output_nr))
            else:  # a leaf (an identity module's input)
                x.register_hook(partial(self._grad_hook, idx, row))

    def _sentinel_hook(self, param: torch.Tensor) -> None:
        self._backward_done = True

    def _drop_queued(self) -> None:
        """Forget the open step's forwards and backwards so far (what the hooks queued).

        Also when their gradients were reset before the next forward: a backward cleared
        by ``zero_grad`` (a saliency probe, a validation pass with ``loss.backward()`` for
        its own sake) did not train the step; an optimizer's closure (LBFGS) is left alone.
        """
        self._backward_done = False        # a backward reached the sentinel in the open step
        self._scale: torch.Tensor | None = None
        # (attributes tested rather than len(): this runs every step, on cold caches)
        if self._output_losses:
            self._output_losses = []
        if self._batch.calls:
            self._batch.reset()
        if self._out_grads.modules:
            self._out_grads.reset()

    def _node_grad_hook(self, idx: int, row: int, nr: int, grad_outputs: Any) -> None:
        """The gradient of output ``nr`` of the node that made a module's output."""
        grad = grad_outputs[nr]
        if grad is not None:
            self._grad_hook(idx, row, grad)

    def _grad_hook(self, idx: int, row: int, grad: torch.Tensor) -> None:
        if self.scaler is not None and self._scale is None:
            self._scale = scaler_scale(self.scaler)  # the scale of this backward
        if grad.requires_grad:  # a double backward (create_graph=True): build no graph
            grad = grad.detach()
        self._out_grads.add(idx, grad)
        self._batch.mark_grad(row)

    def _pre_step_hook(self, k: int, optimizer: torch.optim.Optimizer, args: Any,
                       kwargs: Any) -> tuple[Any, Any] | None:
        if self._loss_given and k in self._stepped:
            self._close_step()  # dbg.step came before opt.step and this is the next step
        self._in_step = True
        if k == 0 or not self._stepped:
            self._lr = read_lr(optimizer)
        wrapped = closure_then(args, kwargs, self._measure, k)
        if wrapped is None:  # no closure: the gradients are there now
            self._measure(k)
        return wrapped

    def _measure(self, k: int | None) -> None:
        self._meter.before_update(self._slot, recorded=self._recording, snapshot=True,
                                  group=k)
        self._measured = True

    def _post_step_hook(self, k: int, optimizer: torch.optim.Optimizer, args: Any,
                        kwargs: Any) -> None:
        self._meter.after_update(self._slot, group=k)
        self._stepped.add(k)
        self._in_step = False

    # ------------------------------------------------------------- step/flush
    @property
    def step_count(self) -> int:
        """Steps recorded so far (the index the next step will get)."""
        return self._step

    @property
    def active(self) -> bool:
        """Whether the recorder is inside its ``with`` block (hooks attached)."""
        return self._active

    @property
    def optimizer_stepped(self) -> bool:
        """Whether an optimizer has stepped since the last :meth:`step`.

        For callbacks that run after every micro-batch of an accumulated step.
        """
        return bool(self._stepped)

    def step(self, loss: torch.Tensor | float | None = None) -> None:
        """Record the loss of the current optimizer step.

        Call once per optimizer step, before or after ``optimizer.step()``. Called after
        it, the step closes here; called before, it closes once the optimizer has stepped.

        Parameters
        ----------
        loss : torch.Tensor or float, optional
            The step's loss; a tensor stays on its device until the next flush.

        Raises
        ------
        CaptureError
            If called outside the ``with`` block.
        ValueError
            If ``loss`` is a tensor with more than one element.
        """
        if not self._active:
            raise CaptureError(
                "dbg.step(loss) was called outside the `with dbg:` block. Wrap the training "
                "loop in `with dbg:` so that hooks are active."
            )
        if loss is None and self._output_losses:
            losses = self._output_losses
            loss = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
        value: float | torch.Tensor = float("nan")
        host_loss: float | None = None
        if loss is not None:
            value, host_loss = self._loss_probe.take(loss)
        if self._loss_given:
            self._close_step()  # the previous step's optimizer never stepped (skipped)
        self._loss = value
        self._host_loss = host_loss
        self._loss_given = True
        self._has_loss = loss is not None
        if self._stepped or not self._optimizers:
            self._close_step()
        elif self._root_pre_handle is None:
            # dbg.step came before opt.step: the next forward, if it comes first, closes the
            # step (the root is hooked only then, so it runs on PyTorch's fast path otherwise)
            self._root_pre_handle = self.model.register_forward_pre_hook(self._root_pre_hook)

    def _finish_pending(self) -> None:
        """At exit: close the open step if it was one; a forward alone is not a step."""
        if self._loss_given or self._stepped:
            self._close_step()
        else:
            self._clear_pending()

    def _close_step(self) -> None:
        """Add the step's queued statistics into its buffer row and move to the next step."""
        slot = self._slot
        complete = self._has_loss
        if not self._optimizers and not self._measured:
            self._meter.before_update(slot, recorded=self._recording, snapshot=False)
        elif self._optimizers and not self._stepped and not self._measured:
            self._lr = read_lr(self._optimizers[0])  # a skipped step: nothing was measured
        if self._batch.calls or self._out_grads.modules:
            self._add_queued(slot)
        self._log.append(self._step, self._lr, self._loss, self._recording, complete,
                         bool(self._stepped) or not self._optimizers)
        self._slot += 1
        host_loss = self._host_loss
        self._clear_pending()
        self._step += 1
        self._trace_cache = None
        self._update_sampling(host_loss)
        if self._slot >= self.cfg.flush_every:
            self.flush(periodic=True)

    def _add_queued(self, slot: int) -> None:
        """Add the step's queued hook results into buffer row ``slot`` (no host sync).

        Hooks only queue; rows are written here, when the step closes, so reading the trace
        in the middle of a step (which flushes) never splits a step across rows.
        """
        log = self._log
        act_sums, saturated, dead, max_abs, grad = log.rows[slot]
        log.set_den(slot, self._batch.close(act_sums, saturated, dead, max_abs),
                    self._out_grads.close(grad, self._scale))

    def _update_sampling(self, host_loss: float | None) -> None:
        self._recording = self._schedule.next(self._step, host_loss)
        # Between recorded steps the modules run without forward hooks (PyTorch's fast call
        # path): the hooks come back for the next recorded step.
        if self._active and self._recording != bool(self._forward_handles):
            (self._attach_forward_hooks if self._recording else self._detach_forward_hooks)()

    def flush(self, *, final: bool = False, periodic: bool = False) -> None:
        """Copy the buffer to the host and append a chunk (written to disk when streaming).

        The capture's only host synchronisation. Called every ``flush_every`` steps, on exit,
        and when the trace is read.

        Parameters
        ----------
        final : bool, default=False
            The flush at exit: the module table and meta are written even with no new step.
        periodic : bool, default=False
            A flush scheduled every ``flush_every`` steps: the weights' row diversity is
            measured at some of them only (:meth:`.WeightDiversity.flush`).

        Raises
        ------
        OSError
            When a chunk cannot be written (disk full, ...): the error names the file, the
            chunk stays in memory (``dbg.trace`` still has it, and the next flush tries it
            again) and ``meta.json`` says ``write_failed`` where it can still be written.
        """
        n = self._slot
        # (not again when no step closed since; a scheduled flush may skip measuring)
        if (n or self._diversity_at != self._step) and self._diversity.flush(
                self._step, periodic=periodic):
            self._diversity_at = self._step
        if n:
            chunk = self._log.drain(n, self._meter)
            if self._measured:  # the open step's parameter norms sit in row n
                self._meter.move(n, 0)
            self._slot = 0
            self._sink.add(chunk)
        self._trace_cache = None
        if not self._sink.streaming:
            return
        try:
            tables = final or bool(n)
            self._sink.write(self._modules_table() if tables else None,
                             self._meta() if tables else None)
        except OSError as err:
            self._status, self._error = "write_failed", f"{type(err).__name__}: {err}"
            self._sink.write_meta_quietly(self._meta())
            raise

    # ------------------------------------------------------------------ trace
    def _modules_table(self) -> pd.DataFrame:
        mods = self._modules.copy()
        for idx, order in self._forward_seen.items():
            mods.loc[idx, "forward_order"] = order
        return mods

    def _meta(self) -> dict[str, Any]:
        return run_meta(self._info, status=self._status, error=self._error, rank=self._rank,
                        n_steps=self._step, started=getattr(self, "_started", None),
                        weight_diversity=self._diversity.to_dict(),
                        model_output=self._output.to_dict())

    @property
    def trace(self) -> Trace:
        """The run recorded so far (flushes the buffer first)."""
        if self._trace_cache is not None:
            return self._trace_cache
        if self._active and self._loss_given and self._stepped:
            self._close_step()  # dbg.step came before opt.step, which has run: a whole step
        if self._active and (self._slot or self._diversity_at != self._step):
            with contextlib.suppress(OSError):  # a failed write keeps the chunk in memory
                self.flush()
        trace = self._sink.assemble(self._modules_table(), self._meta())
        self._trace_cache = trace
        return trace
