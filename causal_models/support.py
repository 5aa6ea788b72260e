"""How far the fitting data reached each conditional table (the data share of the fit).

A Dirichlet-smoothed table mixes the rules' pseudo-counts with the data; a column (one
configuration of the node's parents) the data never reached is the prior alone. For every
table this module counts the columns the (weighted) fitting data reached, the data's weight
there and whether it outweighs the prior's pseudo-counts, so a reader can tell a learned
table from a prior with a fitted label.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from causal_models.structure import Structure

__all__ = ["SUPPORT_COLUMNS", "table_support"]

#: Columns of :func:`table_support`'s frame.
SUPPORT_COLUMNS = ("node", "role", "columns", "reached", "share_reached", "data_weight",
                   "prior_per_column", "median_data_per_reached", "share_data_outweighs_prior")


def table_support(structure: Structure, data: pd.DataFrame, weights: np.ndarray
                  ) -> pd.DataFrame:
    """The data share of every conditional table.

    Parameters
    ----------
    structure : Structure
        The network's structure with its Dirichlet pseudo-counts (``prior``).
    data : pandas.DataFrame
        The fitting rows (one per run, a column per node).
    weights : numpy.ndarray
        The rows' fitting weights (as passed to the estimator).

    Returns
    -------
    pandas.DataFrame
        One row per node, :data:`SUPPORT_COLUMNS`: its parent configurations (``columns``),
        how many the data reached and their share, the data's total weight, the prior's
        pseudo-counts per column, the median data weight in a reached column, and the share
        of reached columns where the data outweigh the prior.
    """
    rows = []
    w = pd.Series(np.asarray(weights, dtype=float), index=data.index)
    for node, parents in structure.parents.items():
        n_cols = int(np.prod([len(structure.states[p]) for p in parents])) if parents else 1
        prior = structure.prior.get(node)
        per_col = float(prior.sum(axis=0).mean()) if prior is not None and prior.size \
            else float("nan")
        if parents:
            counts = w.groupby([data[p] for p in parents], observed=True).sum()
        else:
            counts = pd.Series([w.sum()])
        counts = counts[counts > 0]
        rows.append({
            "node": node, "role": structure.roles[node], "columns": n_cols,
            "reached": int(len(counts)), "share_reached": len(counts) / n_cols,
            "data_weight": float(w.sum()), "prior_per_column": per_col,
            "median_data_per_reached": float(counts.median()) if len(counts) else 0.0,
            "share_data_outweighs_prior": float((counts > per_col).mean()) if len(counts)
            else 0.0})
    return pd.DataFrame(rows, columns=list(SUPPORT_COLUMNS))
