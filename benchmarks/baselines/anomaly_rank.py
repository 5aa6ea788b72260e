"""Rank layers by anomaly score: the generic root-cause-analysis baseline.

No knowledge of training failures beyond "a statistic far from its usual value is
suspicious": each layer's statistics are compared with the layer's own early steps (robust
z-score: distance to the median of the first ``baseline_share`` of the recorded steps, in
units of the scaled median absolute deviation, floored), minus the median z-score of all
layers at that step for scale statistics (a drift every layer shares is the run's, not a
layer's), and share-type statistics
(``act_frac_dead``, ``act_frac_saturated``) also by their level (a share of 0.5 scores 5).
A layer's score is its largest over statistics and steps; layers are ranked by it and the
top layer is the origin. The statistic and direction that gave the score name the failure
type (gradient norm up: exploding; down: vanishing; dead share up: dead neurons; saturated
share up: saturation; activation scale up: exploding); a non-finite loss is
``loss_divergence`` at the first layer whose output turned non-finite. Confidence is
``s / (s + s0)`` with ``s0 = 5`` (a five-MAD deviation is even odds), not fitted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchmarks.baselines._common import BaselineMethod, hypotheses_for, wide
from neuraldbg.methods import register_method
from neuraldbg.records import Hypothesis
from neuraldbg.trace import Trace

__all__ = ["AnomalyRankBaseline"]

# statistic -> (transform, failure type when it rises, failure type when it falls)
_STATS: dict[str, tuple[str, str | None, str | None]] = {
    "out_grad_norm": ("log", "exploding_gradients", "vanishing_gradients"),
    "param_grad_norm": ("log", "exploding_gradients", "vanishing_gradients"),
    "act_std": ("log", "exploding_gradients", None),
    "act_frac_dead": ("share", "dead_neurons", None),
    "act_frac_saturated": ("share", "saturated_activations", None),
}


@register_method("anomaly_rank")
class AnomalyRankBaseline(BaselineMethod):
    """Layers ranked by a robust anomaly score of their statistics.

    Parameters
    ----------
    baseline_share : float, default=0.1
        Share of the recorded steps (at least 3) forming each layer's reference.
    mad_floor : float, default=0.1
        Floor of the MAD: 0.1 decade for log statistics, 0.1 for shares.
    s0 : float, default=5.0
        Score at which the confidence is 0.5.
    top_layers : int, default=3
        Layers reported (one hypothesis each, by decreasing score).
    """

    def __init__(self, *, baseline_share: float = 0.1, mad_floor: float = 0.1, s0: float = 5.0,
                 top_layers: int = 3) -> None:
        self.baseline_share = baseline_share
        self.mad_floor = mad_floor
        self.s0 = s0
        self.top_layers = top_layers

    def _scores(self, trace: Trace) -> pd.DataFrame:
        """One row per (layer, statistic): score, signed direction, first step over s0."""
        rows = []
        for stat, (kind, up, down) in _STATS.items():
            tab = wide(trace, stat)
            if tab.empty:
                continue
            x = tab.astype(float)
            if kind == "log":
                x = np.log10(x.where(x > 0))
            n_ref = max(3, int(np.ceil(self.baseline_share * len(x))))
            ref = x.iloc[:n_ref]
            med = ref.median()
            mad = (1.4826 * (ref - med).abs().median()).clip(lower=self.mad_floor)
            z = (x - med) / mad
            if kind == "log" and z.shape[1] > 2:
                # a change every layer shares (gradients shrinking as the loss falls) is the
                # run's, not a layer's: measure each layer against its peers at that step
                z = z.sub(z.median(axis=1), axis=0)
            if kind == "share":
                z = np.maximum(z, x / 0.1)  # the level itself: a share of 0.5 scores 5
            for layer in z.columns:
                col = z[layer].replace([np.inf, -np.inf], np.nan).dropna()
                if col.empty:
                    continue
                best = col.abs().idxmax()
                s = float(abs(col[best]))
                sign = np.sign(col[best])
                ftype = up if sign > 0 else down
                if ftype is None:
                    continue
                over = col[col.abs() >= self.s0]
                rows.append({"layer": layer, "stat": stat, "score": s, "failure_type": ftype,
                             "step": int(over.index[0]) if len(over) else int(best)})
        return pd.DataFrame(rows, columns=["layer", "stat", "score", "failure_type", "step"])

    def rules(self, trace: Trace, loss: np.ndarray) -> list[Hypothesis]:
        """Hypotheses for the most anomalous layers, highest score first."""
        hyps: list[Hypothesis] = []
        steps = trace.steps["step"].to_numpy()
        bad = steps[~np.isfinite(loss)]
        if bad.size:
            nan = wide(trace, "act_nan")
            inf = wide(trace, "act_inf")
            layer, step = (trace.module_names or [""])[0], int(bad[0])
            if not nan.empty:
                sick = (nan.fillna(0) + inf.fillna(0)) > 0
                if sick.to_numpy().any():
                    row = sick[sick.any(axis=1)].iloc[0]
                    layer, step = str(row[row].index[0]), int(row.name)
            hyps += hypotheses_for("loss_divergence", layer, step, 1.0, "anomaly_rank",
                                   {"stat": "loss", "score": float("inf")})
        scores = self._scores(trace)
        if scores.empty:
            return hyps
        per_layer = scores.sort_values("score", ascending=False).drop_duplicates("layer")
        for _, r in per_layer.head(self.top_layers).iterrows():
            conf = r["score"] / (r["score"] + self.s0)
            hyps += hypotheses_for(r["failure_type"], r["layer"], r["step"], conf,
                                   "anomaly_rank", {"stat": r["stat"], "score": r["score"]})
        return sorted(hyps, key=lambda h: -h.confidence)
