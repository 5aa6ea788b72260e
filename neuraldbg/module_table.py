"""The module table: which modules are monitored, and what each one is.

Built once when the capture starts (never a ``named_modules()`` scan per hook call).
"""

from __future__ import annotations

import math

import pandas as pd
from torch import nn

from neuraldbg.statistics import activation_family
from neuraldbg.trace import MODULE_COLUMNS

__all__ = ["leaf_modules", "module_table", "parameter_owners"]


def leaf_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Leaf modules (no children) with their qualified names, in ``named_modules()`` order."""
    return [(name, mod) for name, mod in model.named_modules()
            if next(mod.children(), None) is None]


def _fans(mod: nn.Module) -> tuple[int, int]:
    """(fan_in, fan_out) of the module's weight matrix or kernel, (0, 0) without one."""
    weight = getattr(mod, "weight", None)
    if not isinstance(weight, nn.Parameter) or weight.dim() < 2:
        return 0, 0
    receptive = math.prod(weight.shape[2:]) if weight.dim() > 2 else 1
    return int(weight.shape[1] * receptive), int(weight.shape[0] * receptive)


def module_table(model: nn.Module) -> pd.DataFrame:
    """One row per leaf module; columns documented in :data:`neuraldbg.trace.MODULE_COLUMNS`."""
    order = {id(mod): i for i, (_, mod) in enumerate(model.named_modules())}
    rows = []
    for name, mod in leaf_modules(model):
        own = list(mod.parameters(recurse=False))
        fan_in, fan_out = _fans(mod)
        rows.append({
            "module_name": name,
            "module_type": type(mod).__name__,
            "order": order[id(mod)],
            "forward_order": -1,
            "depth": name.count(".") if name else 0,
            "parent": name.rsplit(".", 1)[0] if "." in name else "",
            "activation_family": activation_family(mod),
            "n_params": int(sum(p.numel() for p in own)),
            "n_trainable": int(sum(p.numel() for p in own if p.requires_grad)),
            "fan_in": fan_in,
            "fan_out": fan_out,
        })
    return pd.DataFrame(rows, columns=list(MODULE_COLUMNS))


def parameter_owners(model: nn.Module, index: dict[int, int], bucket: int
                     ) -> tuple[list[nn.Parameter], list[int]]:
    """Trainable parameters (each once) and the index of the leaf that owns each directly.

    ``index`` maps ``id(leaf)`` to its row; parameters owned by a container go to ``bucket``.
    """
    params: list[nn.Parameter] = []
    owner: list[int] = []
    seen: set[int] = set()
    for mod in model.modules():
        for p in mod.parameters(recurse=False):
            if id(p) not in seen and p.requires_grad:
                seen.add(id(p))
                params.append(p)
                owner.append(index.get(id(mod), bucket))
    return params, owner
