"""Hand-built traces for unit tests of single reasoner functions (not for end-to-end tests,
which train real models through real hooks)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from neuraldbg.trace import Trace

FAMILY = {"Linear": "linear", "ReLU": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid",
          "Softmax": "softmax", "GELU": "smooth", "BatchNorm1d": "norm", "Flatten": "other"}


def make_trace(types: Sequence[str], n_steps: int, *, grad: np.ndarray | None = None,
               dead: np.ndarray | None = None, sat: np.ndarray | None = None,
               std: np.ndarray | None = None, mean: np.ndarray | None = None,
               nan: np.ndarray | None = None, loss: np.ndarray | None = None,
               lr: np.ndarray | float = 0.01, update_ratio: float = 1e-3,
               grad_norm: np.ndarray | None = None, recorded: np.ndarray | None = None,
               names: Sequence[str] | None = None, config: dict | None = None) -> Trace:
    """A trace whose per-module statistics are given as (n_steps, n_modules) arrays.

    Unspecified statistics are healthy defaults; ``recorded`` selects the steps that have
    module rows (``every > 1``).
    """
    m = len(types)
    names = list(names) if names is not None else [str(i) for i in range(m)]
    shape = (n_steps, m)

    def full(a: np.ndarray | None, v: float) -> np.ndarray:
        return np.full(shape, v, dtype=float) if a is None else np.asarray(a, float)

    grad = full(grad, 0.1)
    dead, sat = full(dead, 0.0), full(sat, 0.0)
    std, mean = full(std, 0.5), full(mean, 0.0)
    nan = full(nan, 0.0)
    steps = np.arange(n_steps)
    loss = (np.asarray(loss, float) if loss is not None
            else 1.0 * np.exp(-3 * steps / n_steps) + 0.05)
    if grad_norm is None:
        top = np.where(np.isnan(grad), -np.inf, grad).max(axis=1)
        grad_norm = np.where(np.isfinite(top), top, np.nan)
    gnorm = np.asarray(grad_norm, float)
    recorded = np.ones(n_steps, bool) if recorded is None else np.asarray(recorded, bool)
    n_par = [1056 if t == "Linear" else 0 for t in types]
    modules = pd.DataFrame({
        "module_name": names, "module_type": list(types), "order": np.arange(1, m + 1),
        "forward_order": np.arange(m), "depth": 0, "parent": "",
        "activation_family": [FAMILY.get(t, "other") for t in types], "n_params": n_par,
        "n_trainable": n_par})
    step_frame = pd.DataFrame({
        "step": steps, "loss": loss, "lr": np.broadcast_to(np.asarray(lr, float), n_steps),
        "grad_norm": gnorm, "param_norm": 10.0, "update_norm": update_ratio * 10.0,
        "update_ratio": update_ratio, "recorded": recorded, "complete": True})
    rows = np.flatnonzero(recorded)
    r = np.repeat(rows, m)
    c = np.tile(np.arange(m), len(rows))
    has_par = np.array(n_par)[c] > 0
    stats = pd.DataFrame({
        "step": steps[r], "module_name": np.asarray(names, dtype=object)[c], "calls": 1,
        "act_mean": mean[r, c], "act_std": std[r, c],
        "act_max_abs": 3 * std[r, c] + abs(mean[r, c]),
        "act_frac_zero": dead[r, c], "act_frac_dead": dead[r, c],
        "act_frac_saturated": sat[r, c], "act_nan": nan[r, c].astype(np.int64), "act_inf": 0,
        "out_grad_norm": grad[r, c], "param_grad_norm": np.where(has_par, grad[r, c], np.nan),
        "param_norm": np.where(has_par, 5.0, np.nan), "update_ratio": np.where(has_par, 1e-3,
                                                                              np.nan)})
    meta = {"format": "neuraldbg-trace", "schema_version": 1, "config": config or {},
            "every": 1}
    return Trace(steps=step_frame, stats=stats, modules=modules, meta=meta)
