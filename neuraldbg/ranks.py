"""A distributed run's ranks combined into one run, for the diagnosis methods.

``load_trace`` keeps every rank's rows (a ``rank`` column). Under DDP the gradients are
averaged across ranks before the optimizer step, so gradient, parameter and update norms
agree between ranks; losses and activations differ, since each rank sees its own shard of
the batch. :func:`combine_ranks` forms one row per step and per (step, module): the mean loss
(the loss of the global batch), the largest |x|, summed NaN/Inf counts and calls, activation
shares, moments and norms averaged over the ranks.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from neuraldbg.trace import Trace

__all__ = ["combine_ranks"]

_STEP_AGG = {"loss": "mean", "lr": "first", "grad_norm": "mean", "param_norm": "mean",
             "update_norm": "mean", "update_ratio": "mean", "recorded": "any",
             "complete": "all", "stepped": "all"}
_STAT_AGG = {"calls": "sum", "act_mean": "mean", "act_max_abs": "max", "act_frac_zero": "mean",
             "act_frac_dead": "mean", "act_frac_saturated": "mean", "act_nan": "sum",
             "act_inf": "sum", "out_grad_norm": "mean", "param_grad_norm": "mean",
             "param_norm": "mean", "update_ratio": "mean"}


def combine_ranks(trace: Trace) -> Trace:
    """One row per step (and per step and module) from a trace with a ``rank`` column.

    A trace without ranks (or with one) is returned unchanged, less its ``rank`` column.

    Parameters
    ----------
    trace : Trace
        A trace from :func:`neuraldbg.load_trace`.

    Returns
    -------
    Trace
        The combined run; ``meta["ranks"]`` still lists the ranks.
    """
    if "rank" not in trace.steps.columns:
        return trace
    if trace.steps["rank"].nunique() <= 1:
        return Trace(steps=trace.steps.drop(columns="rank"),
                     stats=trace.stats.drop(columns="rank", errors="ignore"),
                     modules=trace.modules, meta=trace.meta)
    steps = trace.steps.groupby("step", sort=True).agg(
        {c: a for c, a in _STEP_AGG.items() if c in trace.steps.columns}).reset_index()
    st = trace.stats
    agg = {c: a for c, a in _STAT_AGG.items() if c in st.columns}
    stats = st.groupby(["step", "module_name"], sort=False).agg(agg)
    if "act_std" in st.columns:
        # pooled standard deviation over the ranks' outputs (equal sizes)
        second = (st["act_std"] ** 2 + st["act_mean"] ** 2).groupby(
            [st["step"], st["module_name"]], sort=False).mean()
        stats["act_std"] = np.sqrt(np.maximum(second - stats["act_mean"] ** 2, 0.0))
    stats = stats.reset_index()[[c for c in st.columns if c != "rank"]]
    return Trace(steps=steps[[c for c in trace.steps.columns if c != "rank"]],
                 stats=pd.DataFrame(stats), modules=trace.modules, meta=trace.meta)
