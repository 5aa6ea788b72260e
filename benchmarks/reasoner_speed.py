"""Explain time of the heuristic Post-Mortem Reasoner on large synthetic traces.

A synthetic trace of ``steps x modules`` is built in memory (no training): Linear / ReLU /
Tanh modules, per-module statistics at every step with realistic noise, and three failures
for the reasoner to find: a ReLU layer that dies at 30% of the run, gradients that start to
explode at 60% and everything non-finite from 90% on (so the stats tables are NaN-filled at
the end, as after a real divergence). ``explain`` runs the whole pipeline (states, events,
compression, hypotheses).

Reported: the median seconds of ``repeat`` explains at two sizes (a quarter of the steps,
then all of them), the growth exponent ``log(t2 / t1) / log(n2 / n1)`` between them (1.0 =
linear in the number of rows), and whether the 10,000 x 100 target of < 1 s holds on this
machine. The time is a measurement printed here, never asserted in a test.

Usage::

    python -m benchmarks.reasoner_speed [--steps 10000] [--modules 100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["synthetic_trace", "median_explain_seconds", "main"]

_TYPES = ("Linear", "ReLU", "Linear", "Tanh")
_FAMILY = {"Linear": "linear", "ReLU": "relu", "Tanh": "tanh"}


def synthetic_trace(n_steps: int = 10_000, n_modules: int = 100, seed: int = 0) -> Any:
    """A trace with a dead layer (30%), exploding gradients (60%) and NaN (90% on).

    Parameters
    ----------
    n_steps, n_modules : int
    seed : int

    Returns
    -------
    neuraldbg.Trace
    """
    from neuraldbg.trace import Trace

    rng = np.random.default_rng(seed)
    names = [f"net.{i}" for i in range(n_modules)]
    types = [_TYPES[i % 4] for i in range(n_modules)]
    n_par = [1056 if t == "Linear" else 0 for t in types]
    modules = pd.DataFrame({
        "module_name": names, "module_type": types, "order": np.arange(1, n_modules + 1),
        "forward_order": np.arange(n_modules), "depth": 1, "parent": "net",
        "activation_family": [_FAMILY[t] for t in types], "n_params": n_par,
        "n_trainable": n_par})
    steps = np.arange(n_steps)
    dies, onset, nan_at = int(0.3 * n_steps), int(0.6 * n_steps), int(0.9 * n_steps)
    growth = np.clip((steps - onset) / max(1, nan_at - onset), 0, None) * 6.0  # decades
    loss = 2.3 * np.exp(-3 * steps / n_steps) + 0.05 * rng.standard_normal(n_steps) ** 2
    loss = np.where(steps >= onset, loss * 10 ** (growth / 3), loss)
    loss[steps >= nan_at] = np.nan
    gnorm = 10 ** (-1 + growth + 0.1 * rng.standard_normal(n_steps))
    gnorm[steps >= nan_at] = np.nan
    step_frame = pd.DataFrame({
        "step": steps, "loss": loss, "lr": 0.01, "grad_norm": gnorm,
        "param_norm": 50.0, "update_norm": 0.01 * gnorm, "update_ratio": 0.01 * gnorm / 50.0,
        "recorded": True, "complete": True})

    shape = (n_steps, n_modules)
    depth = np.arange(n_modules)[None, :]
    # Gradients decay mildly toward the input (healthy), then grow by `growth` decades.
    log_g = (-1.0 - 0.01 * (n_modules - 1 - depth) + growth[:, None]
             + 0.1 * rng.standard_normal(shape))
    g = 10 ** log_g
    is_relu = np.array([t == "ReLU" for t in types])[None, :]
    is_tanh = np.array([t == "Tanh" for t in types])[None, :]
    dead = np.where(is_relu, np.clip(0.05 + 0.02 * rng.standard_normal(shape), 0, 1), 0.0)
    victim = next((i for i, t in enumerate(types) if t == "ReLU" and i >= n_modules // 2), None)
    if victim is not None:
        dead[dies:, victim] = 1.0
        g[dies:, :victim] = 0.0  # nothing flows below a fully dead layer
    sat = np.where(is_tanh, np.clip(0.05 + 0.02 * rng.standard_normal(shape), 0, 1), 0.0)
    std = 10 ** (-0.3 + 0.05 * rng.standard_normal(shape) + growth[:, None] / 2)
    nan_rows = steps >= nan_at
    act_nan = np.where(nan_rows[:, None], 4096, 0) * np.ones(shape, dtype=np.int64)
    for arr in (g, std):
        arr[nan_rows] = np.nan
    has_par = np.array(n_par)[None, :] > 0
    stats = pd.DataFrame({
        "step": np.repeat(steps, n_modules),
        "module_name": np.tile(np.asarray(names, dtype=object), n_steps),
        "calls": 1,
        "act_mean": (0.1 * std).ravel(), "act_std": std.ravel(), "act_max_abs": (4 * std).ravel(),
        "act_frac_zero": np.where(is_relu, 0.5, 0.0).repeat(n_steps, 0).ravel(),
        "act_frac_dead": dead.ravel(), "act_frac_saturated": sat.ravel(),
        "act_nan": act_nan.ravel(), "act_inf": 0,
        "out_grad_norm": g.ravel(),
        "param_grad_norm": np.where(has_par, g, np.nan).ravel(),
        "param_norm": np.where(has_par, 5.0, np.nan).repeat(n_steps, 0).ravel(),
        "update_ratio": np.where(has_par, 1e-3, np.nan).repeat(n_steps, 0).ravel(),
    })
    meta = {"format": "neuraldbg-trace", "schema_version": 1, "config": {"lr": 0.01},
            "every": 1, "synthetic": True}
    return Trace(steps=step_frame, stats=stats, modules=modules, meta=meta)


def median_explain_seconds(trace: Any, repeat: int = 3) -> float:
    """Median seconds of ``repeat`` heuristic explains of ``trace``."""
    from neuraldbg.methods import explain

    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        explain(trace, "heuristic")
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark and print its figures (also returned as a dict)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--modules", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    from neuraldbg.methods import explain

    small_steps = max(args.steps // 4, 10)
    small = synthetic_trace(small_steps, args.modules, seed=0)
    big = synthetic_trace(args.steps, args.modules, seed=0)
    explain(small)  # warm-up: imports, first-call overheads
    t_small = median_explain_seconds(small, args.repeat)
    t_big = median_explain_seconds(big, args.repeat)
    n_small, n_big = small_steps * args.modules, args.steps * args.modules
    exponent = math.log(t_big / t_small) / math.log(n_big / n_small)
    top = explain(big)[:3]
    result = {
        "size_small": f"{small_steps} x {args.modules}", "seconds_small": round(t_small, 4),
        "size_big": f"{args.steps} x {args.modules}", "seconds_big": round(t_big, 4),
        "growth_exponent": round(exponent, 3),
        "under_1s": bool(t_big < 1.0),
        "top_hypotheses": [(h.failure_type, h.root_cause, h.origin_layer, h.origin_step,
                            round(h.confidence, 3)) for h in top],
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
