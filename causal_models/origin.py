"""Where and when a failure began, read from the discretized evidence and the statistics.

The probabilistic reasoner names *which* failure and cause; this module names the origin
layer and step for the hypothesis, the way the heuristic's Causal Compressor does: the
earliest slice in which a block shows the failure's state, then the most extreme module of
that block.
"""

from __future__ import annotations

import numpy as np

from causal_models.discretize import Discretized, slice_node
from neuraldbg.trace import Trace

__all__ = ["locate_origin"]


# Failure type -> (slice-node kind, its unhealthy states, per-module statistic, direction).
_ORIGIN_RULES: dict[str, tuple[str, tuple[str, ...], str, str]] = {
    "vanishing_gradients": ("grad", ("vanishing",), "param_grad_norm", "min"),
    "exploding_gradients": ("grad", ("exploding", "nonfinite"), "param_grad_norm", "max"),
    "dead_neurons": ("act", ("dead",), "act_frac_dead", "max"),
    "saturated_activations": ("act", ("saturated",), "act_frac_saturated", "max"),
    "loss_divergence": ("act", ("anomalous",), "act_max_abs", "max"),
    "training_plateau": ("loss", ("flat",), "param_grad_norm", "max"),
}


def locate_origin(trace: Trace, disc: Discretized, failure_type: str
                  ) -> tuple[str, int, list[str]]:
    """Where and when a failure type first shows in the discretized evidence.

    The earliest slice in which a block takes one of the failure's unhealthy states gives the
    origin block (the upstream-most block for activations, the input-most for gradients,
    since gradients flow backward); within it, the module with the most extreme statistic
    (e.g. the largest dead share) is the origin layer, and the first step in that slice where
    that module is most extreme is the origin step.

    Parameters
    ----------
    trace : Trace
    disc : Discretized
        ``discretize(trace)``.
    failure_type : str

    Returns
    -------
    origin_layer : str
    origin_step : int
    propagation_path : list of str
        Blocks in the order the failure reached them, as ``"block b (first..last module)"``.
    """
    kind, bad, column, direction = _ORIGIN_RULES.get(
        failure_type, ("grad", ("vanishing", "exploding", "nonfinite"), "param_grad_norm", "max"))
    n_t, n_b = len(disc.slices), len(disc.blocks)
    first_seen: dict[int, int] = {}
    if kind == "loss":
        hit = [t for t in range(n_t) if disc.states[slice_node("loss", t)] in bad]
        t0 = hit[0] if hit else 0
        first_seen = {b: t0 for b in range(n_b)}
    else:
        for b in range(n_b):
            for t in range(n_t):
                if disc.states[slice_node(kind, t, b)] in bad:
                    first_seen[b] = t
                    break
    if not first_seen:
        first_seen = {0: 0}
    order = sorted(first_seen, key=lambda b: (first_seen[b], b if kind != "grad" else -b))
    if kind == "grad" and failure_type == "vanishing_gradients":
        order = sorted(first_seen, key=lambda b: (first_seen[b], b))
    block, t = order[0], first_seen[order[0]]
    start, end = disc.slices[t]
    if end <= start:  # an empty slice took a neighbour's state: search the whole run
        start, end = int(trace.steps["step"].min()), int(trace.steps["step"].max()) + 1
    names = list(disc.blocks[block])
    stats = trace.stats
    layer, step = (names[0] if names else ""), int(start)
    if len(stats) and column in stats.columns:
        sel = stats[(stats["step"] >= start) & (stats["step"] < end)
                    & stats["module_name"].isin(names)]
        vals = sel[column].to_numpy(dtype=float)
        if failure_type == "loss_divergence":
            nonfinite = (sel["act_nan"].to_numpy(dtype=float) + sel["act_inf"].to_numpy(
                dtype=float)) > 0
            vals = np.where(nonfinite, np.inf, vals)
        ok = ~np.isnan(vals)
        if ok.any():
            sub = sel[ok]
            v = vals[ok]
            pick = int(np.argmin(v) if direction == "min" else np.argmax(v))
            layer = str(sub["module_name"].iloc[pick])
            target = v[pick]
            same = sub[(sub["module_name"] == layer).to_numpy() & (v == target)]
            step = int(same["step"].min()) if len(same) else int(sub["step"].iloc[pick])
    path = [f"block {b} ({disc.blocks[b][0]}..{disc.blocks[b][-1]})" for b in order
            if disc.blocks[b]]
    return layer, step, path
