"""DeepDiagnosis's symptom checks (Wardat et al., ICSE 2022), ported onto NeuralDBG traces.

Written from the rule description in docs/evaluation.md ("Peer rule sets"); no DeepDiagnosis
code is used.
DeepDiagnosis checks every recorded step and stops at the first symptom it finds; so does
this port. Checks, in order, on each recorded step:

1. numerical error: a non-finite loss, or NaN/Inf in a layer's output -> ``loss_divergence``
   at the first such layer in forward order;
2. exploding tensor: the variance of a layer's weights or weight gradients above 10
   (variance from the trace's L2 norms: ``norm**2 / n_params``) -> ``exploding_gradients``;
3. saturated activation: more than 50% of a sigmoid/tanh layer's outputs saturated
   (the trace's ``act_frac_saturated``; its cut, |pre-activation| > 4.6 for sigmoid and > 2.65
   for tanh, is the nearest recorded quantity to DeepDiagnosis's +-5) ->
   ``saturated_activations``;
4. dead node: at least 70% of a ReLU-family layer's outputs <= 0 (exactly zero after a ReLU)
   -> ``dead_neurons``;
5. vanishing gradient: mean |dW| below 1e-7, with the root mean square
   ``param_grad_norm / sqrt(n_params)`` standing in for the mean -> ``vanishing_gradients``;
   a weight variance below 1e-5 is reported the same way;
6. unchanged weights: a layer's update ratio ||dW||/||W|| below 1e-10 -> ``training_plateau``;
7. loss not decreasing: no improvement of the best loss within a window of a tenth of the
   run while the loss is still above half its start -> ``training_plateau``.

"Accuracy not increasing" and "out-of-range outputs" need labels and output ranges that a
trace does not hold and are left out. Each check is binary: confidence 1.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchmarks.baselines._common import BaselineMethod, families, hypotheses_for, wide
from neuraldbg.methods import register_method
from neuraldbg.records import Hypothesis
from neuraldbg.trace import Trace

__all__ = ["DeepDiagnosisBaseline"]


@register_method("deepdiagnosis")
class DeepDiagnosisBaseline(BaselineMethod):
    """DeepDiagnosis's symptom checks as a diagnosis method.

    Parameters
    ----------
    dead_share : float, default=0.7
    saturated_share : float, default=0.5
    vanish_mean_grad : float, default=1e-7
    variance_low, variance_high : float, default=1e-5, 10.0
    unchanged_ratio : float, default=1e-10
    patience_share : float, default=0.1
        Window of the "loss not decreasing" check, as a share of the run's steps.
    """

    def __init__(self, *, dead_share: float = 0.7, saturated_share: float = 0.5,
                 vanish_mean_grad: float = 1e-7, variance_low: float = 1e-5,
                 variance_high: float = 10.0, unchanged_ratio: float = 1e-10,
                 patience_share: float = 0.1) -> None:
        self.dead_share = dead_share
        self.saturated_share = saturated_share
        self.vanish_mean_grad = vanish_mean_grad
        self.variance_low = variance_low
        self.variance_high = variance_high
        self.unchanged_ratio = unchanged_ratio
        self.patience_share = patience_share

    def _checks(self, trace: Trace) -> list[tuple[str, pd.DataFrame]]:
        """(failure type, steps x modules boolean table) in DeepDiagnosis's order."""
        fam = families(trace)
        n_par = trace.modules.set_index("module_name")["n_params"].astype(float)
        out: list[tuple[str, pd.DataFrame]] = []
        nan, inf = wide(trace, "act_nan"), wide(trace, "act_inf")
        if nan.empty:
            return out
        out.append(("loss_divergence", (nan.fillna(0) + inf.fillna(0)) > 0))
        pn, gn = wide(trace, "param_norm"), wide(trace, "param_grad_norm")
        owned = [m for m in pn.columns if n_par.get(m, 0) > 0]
        var_w = pn[owned].astype(float) ** 2 / n_par[owned]
        var_g = gn[owned].astype(float) ** 2 / n_par[owned]
        out.append(("exploding_gradients", (var_w > self.variance_high)
                    | (var_g > self.variance_high)))
        sat = wide(trace, "act_frac_saturated")
        squash = [m for m in sat.columns if fam.get(m) in ("sigmoid", "tanh")]
        out.append(("saturated_activations", sat[squash].astype(float) > self.saturated_share))
        zero = wide(trace, "act_frac_zero")
        relu = [m for m in zero.columns if fam.get(m) == "relu"]
        out.append(("dead_neurons", zero[relu].astype(float) >= self.dead_share))
        rms = gn[owned].astype(float) / np.sqrt(n_par[owned])
        out.append(("vanishing_gradients", (rms < self.vanish_mean_grad)
                    | (var_w < self.variance_low)))
        ur = wide(trace, "update_ratio")
        own_ur = [m for m in owned if m in ur.columns]
        out.append(("training_plateau", ur[own_ur].astype(float) < self.unchanged_ratio))
        return out

    def _loss_not_decreasing(self, loss: np.ndarray) -> int | None:
        n = loss.size
        w = max(5, int(round(self.patience_share * n)))
        if n < 2 * w or not np.isfinite(loss[:w]).all():
            return None
        start = float(np.mean(loss[: max(1, w // 2)]))
        best = np.fmin.accumulate(loss)
        for t in range(2 * w, n):
            if not np.isfinite(loss[t]):
                return None
            if best[t] >= best[t - w] and best[t] > 0.5 * start:
                return t
        return None

    def rules(self, trace: Trace, loss: np.ndarray) -> list[Hypothesis]:
        """The first symptom found, walking the recorded steps in order."""
        order = trace.module_names
        first_layer = order[0] if order else ""
        steps = trace.steps["step"].to_numpy()
        bad_loss = steps[~np.isfinite(loss)]
        hits: list[tuple[int, float, str, str]] = []  # (step, check order, type, layer)
        if bad_loss.size:  # after the layer check of the same step, which names the layer
            hits.append((int(bad_loss[0]), 0.5, "loss_divergence", first_layer))
        for k, (ftype, table) in enumerate(self._checks(trace)):
            if table.empty or not table.to_numpy().any():
                continue
            row = table[table.any(axis=1)].iloc[0]
            cols = [m for m in order if m in row.index and bool(row[m])]
            hits.append((int(row.name), k, ftype, cols[0] if cols else first_layer))
        t = self._loss_not_decreasing(loss)
        if t is not None:
            hits.append((int(steps[t]), 99, "training_plateau", first_layer))
        if not hits:
            return []
        step, _, ftype, layer = min(hits, key=lambda h: (h[0], h[1]))
        return hypotheses_for(ftype, layer, step, 1.0, "deepdiagnosis",
                              {"check": ftype, "step": step})
