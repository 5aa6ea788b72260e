"""What the capture needs from optimizers and gradient scalers, read without a host sync.

Framework wrappers (Hugging Face Accelerate's ``AcceleratedOptimizer``, Lightning's
``LightningOptimizer``) subclass or imitate ``torch.optim.Optimizer`` without its hook
registries; the capture hooks the optimizer they wrap, which is the one that really steps.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from neuraldbg.errors import NeuralDbgWarning

__all__ = ["unwrap_optimizer", "as_optimizers", "group_by_optimizer", "scaler_scale",
           "closure_then"]


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The ``torch.optim.Optimizer`` that really steps, under any framework wrappers.

    Raises
    ------
    TypeError
        If ``optimizer`` is neither an optimizer nor a wrapper of one.
    """
    seen = 0
    current = optimizer
    while seen < 8:
        if isinstance(current, torch.optim.Optimizer) and hasattr(
                current, "_optimizer_step_pre_hooks"):
            return current
        inner = getattr(current, "optimizer", None)
        if inner is None or inner is current:
            break
        current, seen = inner, seen + 1
    raise TypeError(
        f"optimizer must be a torch.optim.Optimizer (or a framework wrapper with an "
        f"`.optimizer` attribute), got {type(optimizer).__name__}. Pass the optimizer that "
        "steps, e.g. NeuralDbg(model, optimizer=opt) or optimizer=[opt_a, opt_b]."
    )


def as_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """One optimizer, a wrapper, or a list/tuple of them, as a list of unwrapped optimizers.

    Raises
    ------
    TypeError
        If an element is not an optimizer.
    ValueError
        If the same optimizer is given twice.
    """
    if optimizer is None:
        return []
    items = list(optimizer) if isinstance(optimizer, Sequence) else [optimizer]
    opts = [unwrap_optimizer(o) for o in items]
    if len({id(o) for o in opts}) != len(opts):
        raise ValueError("The same optimizer was given twice in optimizer=[...]; pass each "
                         "optimizer once.")
    return opts


def scaler_scale(scaler: Any) -> torch.Tensor | None:
    """The current loss scale of a ``torch.amp.GradScaler`` as a device tensor (no sync).

    ``GradScaler.get_scale()`` returns a Python float and so synchronises the device; the
    tensor comes from ``_get_scale_async()``, which Lightning and Accelerate use as well.
    ``None`` when the scaler is disabled or has not scaled a loss yet.
    """
    if scaler is None or not getattr(scaler, "_enabled", True):
        return None
    get = getattr(scaler, "_get_scale_async", None)
    scale = get() if callable(get) else None
    return scale.detach().clone() if isinstance(scale, torch.Tensor) else None


def group_by_optimizer(params: list[nn.Parameter], owner: list[int], names: list[str],
                       optimizers: list[torch.optim.Optimizer]
                       ) -> tuple[list[nn.Parameter], list[int], list[str],
                                  list[tuple[int, int, int]]]:
    """Parameters reordered optimizer by optimizer, and each optimizer's range.

    Returns the reordered ``params``, ``owner`` and ``names`` and, per optimizer,
    ``(start, stop, update_stop)`` as :class:`neuraldbg.param_norms.ParamMeter` takes them.
    Trainable parameters that no optimizer holds join the first optimizer's range for their
    gradient and parameter norms, not for the update (no hook sees them move); a warning
    names them.
    """
    if not optimizers:
        return params, owner, names, [(0, len(params), len(params))]
    pos = {id(p): i for i, p in enumerate(params)}
    taken: set[int] = set()
    per_opt: list[list[int]] = []
    for opt in optimizers:
        mine = []
        for group in opt.param_groups:
            for p in group["params"]:
                i = pos.get(id(p))
                if i is not None and i not in taken:
                    taken.add(i)
                    mine.append(i)
        per_opt.append(mine)
    loose = [i for i in range(len(params)) if i not in taken]
    if loose and len(loose) == len(params):
        warnings.warn(
            f"The optimizer(s) given hold none of the model's {len(params)} trainable "
            "parameters, so they will not train this model. Was the model re-created, or its "
            "parameters replaced, after the optimizer was built? Build the optimizer from "
            "this model: torch.optim.Adam(model.parameters(), ...).",
            NeuralDbgWarning, stacklevel=4)
    elif loose:
        shown = ", ".join(names[i] for i in loose[:4]) + (", ..." if len(loose) > 4 else "")
        warnings.warn(
            f"{len(loose)} trainable parameter(s) are in none of the optimizers given "
            f"({shown}): their update is not measured. Pass every optimizer that steps the "
            "model, e.g. NeuralDbg(model, optimizer=[opt_a, opt_b]).",
            NeuralDbgWarning, stacklevel=4)
    order: list[int] = []
    groups: list[tuple[int, int, int]] = []
    for k, mine in enumerate(per_opt):
        start = len(order)
        order += mine
        upd = len(order)
        if k == 0:
            order += loose
        groups.append((start, len(order), upd))
    return ([params[i] for i in order], [owner[i] for i in order], [names[i] for i in order],
            groups)


def closure_then(args: tuple[Any, ...], kwargs: dict[str, Any], after: Callable[..., None],
                 *after_args: Any) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """An ``optimizer.step`` call's arguments with ``after(*after_args)`` run after its closure.

    For a step pre-hook: ``args[0]`` is the optimizer, the closure comes by position
    (``args[1]``) or as ``closure=``. Returns ``None``, having built nothing, when the step
    has no closure (the common case, on the per-step path).
    ``after`` runs after the first call of the closure only: an optimizer that evaluates it
    several times in one step (``LBFGS`` with ``max_iter > 1``) moves the parameters between
    the calls, and the step's gradient and starting point are those of the first.
    """
    if len(args) < 2 and not kwargs:
        return None
    closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
    if closure is None:
        return None
    pending = [after]

    def closure_and_after() -> Any:
        result = closure()  # the step's forward and backward happen here
        if pending:
            pending.pop()(*after_args)
        return result

    if "closure" in kwargs:
        return args, {**kwargs, "closure": closure_and_after}
    return (args[0], closure_and_after, *args[2:]), kwargs
