"""Per-run summary statistics used to tell a failure from its healthy baseline.

Each statistic is a function ``(trace, module) -> float`` registered by name. A non-finite
run maps to ``+inf`` for statistics where the failure makes the value larger, so a run that
blew up always ranks as the most extreme; the manifestation test works on ranks.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from neuraldbg.trace import Trace

__all__ = ["STATISTICS", "register_statistic", "compute_statistic", "health_report",
           "onset_series"]

Statistic = Callable[[Trace, "str | None"], float]
#: Registered statistics by name.
STATISTICS: dict[str, Statistic] = {}


def register_statistic(name: str) -> Callable[[Statistic], Statistic]:
    """Register a per-run statistic under ``name`` (duplicates are rejected)."""

    def decorator(fn: Statistic) -> Statistic:
        if name in STATISTICS:
            raise ValueError(f"A statistic named {name!r} is already registered; registered "
                             f"statistics are: {sorted(STATISTICS)}")
        STATISTICS[name] = fn
        return fn

    return decorator


def compute_statistic(trace: Trace, name: str, module: str | None = None) -> float:
    """Value of statistic ``name`` (about ``module`` where it takes one) for ``trace``.

    Raises
    ------
    ValueError
        For an unknown statistic, or a module the trace does not record.
    """
    try:
        fn = STATISTICS[name]
    except KeyError:
        raise ValueError(f"Unknown statistic {name!r}. Known statistics are: "
                         f"{sorted(STATISTICS)}") from None
    if module is not None and module not in set(trace.modules["module_name"]):
        raise ValueError(f"Statistic {name!r} asks for module {module!r}, which the trace does "
                         f"not record. Recorded modules: {trace.module_names}")
    return float(fn(trace, module))


def _loss(trace: Trace) -> np.ndarray:
    return trace.steps["loss"].to_numpy(dtype=np.float64)


def _nonfinite(values: np.ndarray) -> bool:
    return bool((~np.isfinite(values)).any())


def _module_series(trace: Trace, column: str, module: str | None) -> pd.Series:
    if module is None:
        raise ValueError(f"Statistic over {column!r} needs a module name.")
    rows = trace.stats[trace.stats["module_name"] == module]
    return rows.set_index("step")[column].astype(float)


@register_statistic("final_loss")
def _final_loss(trace: Trace, module: str | None) -> float:
    """Mean loss over the last 10% of steps (at least 5); +inf if the loss went non-finite."""
    loss = _loss(trace)
    if len(loss) == 0 or _nonfinite(loss):
        return math.inf
    k = max(5, len(loss) // 10)
    return float(loss[-k:].mean())


@register_statistic("loss_ratio")
def _loss_ratio(trace: Trace, module: str | None) -> float:
    """Final loss over the mean of the first 5 losses (1 = no learning); +inf if non-finite."""
    loss = _loss(trace)
    final = _final_loss(trace, None)
    if not math.isfinite(final):
        return math.inf
    return float(final / max(loss[:5].mean(), 1e-12))


@register_statistic("max_grad_norm")
def _max_grad_norm(trace: Trace, module: str | None) -> float:
    """Largest global gradient norm of the run; +inf if a gradient went non-finite."""
    g = trace.steps["grad_norm"].to_numpy(dtype=np.float64)
    if len(g) == 0 or _nonfinite(g) or _nonfinite(_loss(trace)):
        return math.inf
    return float(g.max())


@register_statistic("grad_growth")
def _grad_growth(trace: Trace, module: str | None) -> float:
    """Largest global gradient norm over the one at step 0; +inf if non-finite."""
    g = trace.steps["grad_norm"].to_numpy(dtype=np.float64)
    top = _max_grad_norm(trace, None)
    return top / max(float(g[0]), 1e-30) if math.isfinite(top) else math.inf


@register_statistic("max_loss_jump")
def _max_loss_jump(trace: Trace, module: str | None) -> float:
    """Largest loss over the median of the 10 losses before it; +inf if non-finite."""
    loss = _loss(trace)
    if _nonfinite(loss):
        return math.inf
    best = 1.0
    for t in range(10, len(loss)):
        best = max(best, loss[t] / max(np.median(loss[t - 10:t]), 1e-12))
    return float(best)


@register_statistic("nonfinite_step")
def _nonfinite_step(trace: Trace, module: str | None) -> float:
    """First step with a non-finite loss (the number of steps when there is none)."""
    loss = _loss(trace)
    bad = np.flatnonzero(~np.isfinite(loss))
    steps = trace.steps["step"].to_numpy()
    return float(steps[bad[0]]) if len(bad) else float(len(loss))


@register_statistic("dead_share")
def _dead_share(trace: Trace, module: str | None) -> float:
    """Mean share of the module's units dead for the whole batch, over the run."""
    return float(_module_series(trace, "act_frac_dead", module).mean())


@register_statistic("saturated_share")
def _saturated_share(trace: Trace, module: str | None) -> float:
    """Mean share of the module's outputs in its activation's flat region, over the run."""
    return float(_module_series(trace, "act_frac_saturated", module).mean())


@register_statistic("out_grad_norm")
def _out_grad_norm(trace: Trace, module: str | None) -> float:
    """Median norm of dLoss/d(output of the module) over the run; +inf if non-finite."""
    s = _module_series(trace, "out_grad_norm", module).to_numpy()
    if _nonfinite(s):
        return math.inf
    return float(np.median(s))


@register_statistic("param_grad_norm")
def _param_grad_norm(trace: Trace, module: str | None) -> float:
    """Median norm of the module's parameter gradients over the run; +inf if non-finite."""
    s = _module_series(trace, "param_grad_norm", module).to_numpy()
    if _nonfinite(s):
        return math.inf
    return float(np.median(s))


@register_statistic("max_act")
def _max_act(trace: Trace, module: str | None) -> float:
    """Largest |activation| of the module (of any module when None); +inf if non-finite."""
    stats = trace.stats if module is None else trace.stats[trace.stats["module_name"] == module]
    s = stats["act_max_abs"].to_numpy(dtype=np.float64)
    if len(s) == 0:
        return math.nan
    if _nonfinite(s[~np.isnan(s)]) or (stats["act_nan"] + stats["act_inf"]).sum() > 0:
        return math.inf
    return float(np.nanmax(s))


def onset_series(trace: Trace, statistic: str, module: str | None) -> pd.Series:
    """A recorded statistic over steps: a ``trace.steps`` column, or a ``trace.stats`` column
    of ``module``."""
    if module is None:
        if statistic not in trace.steps.columns:
            raise ValueError(f"{statistic!r} is not a column of trace.steps "
                             f"({list(trace.steps.columns)}); name a module for a stats column.")
        return trace.steps.set_index("step")[statistic].astype(float)
    return _module_series(trace, statistic, module)


def health_report(trace: Trace, *, max_loss_ratio: float = 0.7, max_dead: float = 0.5,
                  max_saturated: float = 0.5) -> dict[str, object]:
    """Generic health of one run, whatever its family: the loss stays finite and falls, no
    layer is mostly dead or mostly saturated.

    Parameters
    ----------
    trace : Trace
    max_loss_ratio : float, default=0.7
        Final loss over initial loss must stay below this (the run learned something).
    max_dead : float, default=0.5
        Largest mean share of dead units allowed in any layer.
    max_saturated : float, default=0.5
        Largest mean share of saturated outputs allowed in any sigmoid/tanh layer.

    Returns
    -------
    dict
        ``healthy`` (bool), ``reasons`` (list of str) and the measured values.
    """
    reasons: list[str] = []
    loss = _loss(trace)
    finite = not _nonfinite(loss)
    ratio = _loss_ratio(trace, None)
    if not finite:
        reasons.append("non-finite loss")
    elif ratio > max_loss_ratio:
        reasons.append(f"loss ratio {ratio:.3g} > {max_loss_ratio}")
    per_mod = trace.stats.groupby("module_name")[["act_frac_dead", "act_frac_saturated"]].mean()
    fam = trace.modules.set_index("module_name")["activation_family"]
    act_mods = [m for m in per_mod.index if fam.get(m) in ("relu", "sigmoid", "tanh", "smooth")]
    dead = float(per_mod.loc[act_mods, "act_frac_dead"].max()) if act_mods else 0.0
    sat_mods = [m for m in per_mod.index if fam.get(m) in ("sigmoid", "tanh")]
    sat = float(per_mod.loc[sat_mods, "act_frac_saturated"].max()) if sat_mods else 0.0
    if dead > max_dead:
        reasons.append(f"dead share {dead:.2f} > {max_dead}")
    if sat > max_saturated:
        reasons.append(f"saturated share {sat:.2f} > {max_saturated}")
    return {"healthy": not reasons, "reasons": reasons, "loss_ratio": ratio,
            "finite": finite, "max_dead_share": dead, "max_saturated_share": sat}
