"""The module table: which modules are monitored, what each one is and which parameters it owns.

Built once when the capture starts (never a ``named_modules()`` scan per hook call).

A monitored module is a leaf (a module without children) or a module that owns parameters
directly beside its children, such as ``nn.MultiheadAttention`` (``in_proj_weight``,
``in_proj_bias``). Some modules compute through a child's parameters without calling the
child: ``nn.MultiheadAttention`` passes ``out_proj.weight`` to a functional call, so
``out_proj`` never runs a forward of its own. Such children are folded into their parent's
row (:data:`FUNCTIONAL_CHILDREN`), so every parameter belongs to a row that is called. The
model's root is never a row: parameters it owns directly (a learned positional embedding)
count in the global norms of ``trace.steps`` and are listed in ``trace.meta``.
"""

from __future__ import annotations

import math

import pandas as pd
from torch import nn

from neuraldbg.statistics import activation_family
from neuraldbg.trace import MODULE_COLUMNS

__all__ = ["FUNCTIONAL_CHILDREN", "monitored_modules", "module_table", "parameter_owners",
           "leaf_modules"]

#: Module class name -> children whose parameters the module uses through a functional call
#: (the child's own forward never runs); their parameters are counted in the parent's row.
FUNCTIONAL_CHILDREN: dict[str, tuple[str, ...]] = {
    "MultiheadAttention": ("out_proj",),
}


def leaf_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Leaf modules (no children) with their qualified names, in ``named_modules()`` order."""
    return [(name, mod) for name, mod in model.named_modules()
            if next(mod.children(), None) is None]


def _folded_children(mod: nn.Module) -> tuple[str, ...]:
    for cls in type(mod).__mro__:
        found = FUNCTIONAL_CHILDREN.get(cls.__name__)
        if found is not None:
            return found
    return ()


def _row_of(model: nn.Module) -> dict[str, str]:
    """Qualified module name -> the name of the monitored row it belongs to ('' for none)."""
    rows: dict[str, str] = {}
    folded: dict[str, str] = {}
    for name, mod in model.named_modules():
        parent = next((folded[p] for p in _ancestors(name) if p in folded), None)
        if parent is not None:
            rows[name] = parent
            folded[name] = parent
            continue
        for child in _folded_children(mod):
            folded[f"{name}.{child}" if name else child] = name
        is_leaf = next(mod.children(), None) is None
        owns = next(mod.parameters(recurse=False), None) is not None
        if (name and (is_leaf or owns or _folded_children(mod))) or (not name and is_leaf):
            rows[name] = name  # a model that is one module (an nn.Linear) is its own row
    return rows


def _ancestors(name: str) -> list[str]:
    parts = name.split(".") if name else []
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def monitored_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules that get a row, in ``named_modules()`` order.

    Leaves (the root too, when the model is a single module) and non-root modules owning
    parameters directly, without the children folded into a functional parent.
    """
    rows = _row_of(model)
    return [(name, mod) for name, mod in model.named_modules() if rows.get(name) == name]


def _fans(mod: nn.Module) -> tuple[int, int]:
    """(fan_in, fan_out) of the module's weight matrix or kernel, (0, 0) without one."""
    weight = getattr(mod, "weight", None)
    if not isinstance(weight, nn.Parameter):
        weight = getattr(mod, "in_proj_weight", None)
    if not isinstance(weight, nn.Parameter) or weight.dim() < 2:
        return 0, 0
    receptive = math.prod(weight.shape[2:]) if weight.dim() > 2 else 1
    return int(weight.shape[1] * receptive), int(weight.shape[0] * receptive)


#: Attributes that give a weighted module's output units or channels, in the order tried.
_UNIT_ATTRIBUTES = ("out_features", "out_channels", "embedding_dim", "hidden_size", "embed_dim")


def _units(mod: nn.Module) -> int:
    """Output units or channels of a module with weights (:data:`_UNIT_ATTRIBUTES`), else 0."""
    for attr in _UNIT_ATTRIBUTES:
        value = getattr(mod, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
             nn.FeatureAlphaDropout)


def _dropout_rate(mod: nn.Module) -> float:
    """The share a dropout module zeroes (``nn.Dropout``, its 1-3-d and alpha kin), else NaN."""
    rate = getattr(mod, "p", None)
    if isinstance(mod, _DROPOUTS) and isinstance(rate, (int, float)):
        return float(rate)
    return math.nan


def _row_parameters(model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Row name -> (qualified parameter name, parameter) of the parameters it owns."""
    rows = _row_of(model)
    owned: dict[str, list[tuple[str, nn.Parameter]]] = {}
    seen: set[int] = set()
    for mod_name, mod in model.named_modules():
        for p_name, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            qual = f"{mod_name}.{p_name}" if mod_name else p_name
            owned.setdefault(rows.get(mod_name, ""), []).append((qual, p))
    return owned


def module_table(model: nn.Module) -> pd.DataFrame:
    """One row per monitored module; columns in :data:`neuraldbg.trace.MODULE_COLUMNS`."""
    order = {id(mod): i for i, (_, mod) in enumerate(model.named_modules())}
    owned = _row_parameters(model)
    rows = []
    for name, mod in monitored_modules(model):
        own = owned.get(name, [])
        fan_in, fan_out = _fans(mod)
        rows.append({
            "module_name": name,
            "module_type": type(mod).__name__,
            "order": order[id(mod)],
            "forward_order": -1,
            "depth": name.count(".") if name else 0,
            "parent": name.rsplit(".", 1)[0] if "." in name else "",
            "activation_family": activation_family(mod),
            "n_params": int(sum(p.numel() for _, p in own)),
            "n_trainable": int(sum(p.numel() for _, p in own if p.requires_grad)),
            "fan_in": fan_in,
            "fan_out": fan_out,
            "parameters": ",".join(q for q, p in own if p.requires_grad),
            "units": _units(mod),
            "dropout": _dropout_rate(mod),
        })
    return pd.DataFrame(rows, columns=list(MODULE_COLUMNS))


def parameter_owners(model: nn.Module, index: dict[str, int], bucket: int
                     ) -> tuple[list[nn.Parameter], list[int], list[str]]:
    """Trainable parameters (each once), the row that owns each, and their qualified names.

    ``index`` maps a monitored module's name to its row; parameters the root owns directly go
    to ``bucket`` (counted in the global norms only).
    """
    params: list[nn.Parameter] = []
    owner: list[int] = []
    names: list[str] = []
    for row, own in _row_parameters(model).items():
        for qual, p in own:
            if p.requires_grad:
                params.append(p)
                owner.append(index.get(row, bucket))
                names.append(qual)
    return params, owner, names
