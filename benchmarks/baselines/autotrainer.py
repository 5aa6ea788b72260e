"""AutoTrainer's monitor rules (Zhang et al., ICSE 2021), ported onto NeuralDBG traces.

Written from the rule description in docs/evaluation.md ("Peer rule sets"); no AutoTrainer
code is used. AutoTrainer watches a Keras run per epoch; a trace has steps, so an "epoch" here
is one of ``n_epochs`` equal blocks of steps and the loss stands in for the accuracy it watches.

Rules (defaults are AutoTrainer's):

- vanishing: first-layer / last-layer gradient norm ratio < 1e-3 and first-layer gradient
  norm < 1e-4;
- exploding: that ratio > 70, or any NaN/Inf in the loss, the weights or the gradients, or
  loss >= 1e5 (the non-finite part is reported as ``loss_divergence``, the contract's label for
  a non-finite loss; the ratio part as ``exploding_gradients``);
- dying ReLU: share of exactly zero outputs of a ReLU-family layer >= 0.7 (a zero output
  passes a zero gradient, the trace's closest quantity to AutoTrainer's zero-gradient share);
- oscillating loss: local maxima of the epoch loss with amplitude >= 0.03 (relative to the
  first epoch's loss) in >= 20% of the epochs (reported as ``loss_divergence``);
- slow convergence: best loss gain per epoch < 0.01 (relative) -> ``training_plateau``.

The gradient rules fire only when the run is not converging (last epoch's loss above
``converge_ratio`` x the first's, or not finite). The first symptom in time wins; a tie at
one step breaks in AutoTrainer's fixed order: dying ReLU, exploding, vanishing. Each rule is
binary, so a hypothesis has confidence 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.baselines._common import (
    BaselineMethod,
    families,
    hypotheses_for,
    param_layers,
    wide,
)
from neuraldbg.methods import register_method
from neuraldbg.records import Hypothesis
from neuraldbg.trace import Trace

__all__ = ["AutoTrainerBaseline"]


@register_method("autotrainer")
class AutoTrainerBaseline(BaselineMethod):
    """AutoTrainer's problem checker as a diagnosis method.

    Parameters
    ----------
    vanish_ratio, vanish_abs : float, default=1e-3, 1e-4
    explode_ratio : float, default=70.0
    loss_limit : float, default=1e5
    dead_share : float, default=0.7
    oscillation_amplitude, oscillation_share : float, default=0.03, 0.2
    slow_gain : float, default=0.01
    n_epochs : int, default=20
        Blocks of steps that stand in for epochs.
    converge_ratio : float, default=0.5
        A run whose last-epoch loss is at most this share of the first epoch's converges.
    """

    def __init__(self, *, vanish_ratio: float = 1e-3, vanish_abs: float = 1e-4,
                 explode_ratio: float = 70.0, loss_limit: float = 1e5, dead_share: float = 0.7,
                 oscillation_amplitude: float = 0.03, oscillation_share: float = 0.2,
                 slow_gain: float = 0.01, n_epochs: int = 20, converge_ratio: float = 0.5) -> None:
        self.vanish_ratio = vanish_ratio
        self.vanish_abs = vanish_abs
        self.explode_ratio = explode_ratio
        self.loss_limit = loss_limit
        self.dead_share = dead_share
        self.oscillation_amplitude = oscillation_amplitude
        self.oscillation_share = oscillation_share
        self.slow_gain = slow_gain
        self.n_epochs = n_epochs
        self.converge_ratio = converge_ratio

    # ------------------------------------------------------------------ helpers
    def _epochs(self, loss: np.ndarray) -> np.ndarray:
        blocks = np.array_split(loss, min(self.n_epochs, max(len(loss), 1)))
        return np.array([b.mean() if b.size and np.all(np.isfinite(b)) else np.nan
                         for b in blocks])

    def _converging(self, ep: np.ndarray) -> bool:
        if ep.size < 2 or not np.all(np.isfinite(ep)):
            return False
        return bool(ep[-1] <= self.converge_ratio * ep[0])

    def _nonfinite_step(self, trace: Trace) -> tuple[int, str] | None:
        s = trace.steps
        bad = ~np.isfinite(s["loss"].astype(float)) | (s["loss"].astype(float) >= self.loss_limit)
        for col in ("grad_norm", "param_norm"):
            if col in s.columns:
                bad |= ~np.isfinite(s[col].astype(float))
        if not bad.any():
            return None
        step = int(s.loc[bad, "step"].iloc[0])
        layer = ""
        nan = wide(trace, "act_nan")
        inf = wide(trace, "act_inf")
        if not nan.empty:
            sick = (nan.fillna(0) + inf.fillna(0)) > 0
            sick = sick[sick.index >= step - 1]
            if sick.to_numpy().any():
                first = sick[sick.any(axis=1)].iloc[0]
                layer = str(first[first].index[0])
        return step, layer

    # ------------------------------------------------------------------ the method
    def rules(self, trace: Trace, loss: np.ndarray) -> list[Hypothesis]:
        """AutoTrainer's rules: first detected symptom first, each failure type once."""
        ep = self._epochs(loss)
        converging = self._converging(ep)
        layers = param_layers(trace)
        first_layer = layers[0] if layers else (trace.module_names or [""])[0]
        found: list[tuple[int, int, str, str, dict[str, Any]]] = []  # (step, prio, type, layer, ev)

        nf = self._nonfinite_step(trace)
        if nf is not None:
            found.append((nf[0], 1, "loss_divergence", nf[1] or first_layer,
                          {"rule": "nan_inf_or_loss>=1e5"}))
        if not converging and len(layers) >= 2:
            g = wide(trace, "param_grad_norm")
            if not g.empty:
                g_first, g_last = g[layers[0]].astype(float), g[layers[-1]].astype(float)
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratio = g_first / g_last
                van = (ratio < self.vanish_ratio) & (g_first < self.vanish_abs)
                exp = ratio > self.explode_ratio
                if van.any():
                    found.append((int(van.idxmax()), 3, "vanishing_gradients", layers[0],
                                  {"rule": "ratio<1e-3 and first<1e-4",
                                   "ratio": float(ratio[van].iloc[0])}))
                if exp.any():
                    found.append((int(exp.idxmax()), 2, "exploding_gradients", layers[0],
                                  {"rule": "ratio>70", "ratio": float(ratio[exp].iloc[0])}))
        if not converging:
            zero = wide(trace, "act_frac_zero")
            fam = families(trace)
            relu = [m for m in zero.columns if fam.get(m) == "relu"]
            if relu:
                dead = zero[relu].astype(float) >= self.dead_share
                if dead.to_numpy().any():
                    row = dead[dead.any(axis=1)].iloc[0]
                    found.append((int(row.name), 0, "dead_neurons", str(row[row].index[0]),
                                  {"rule": "zero share>=0.7"}))
        n = loss.size
        fin = ep[np.isfinite(ep)]
        if fin.size >= 3 and abs(fin[0]) > 0:
            amp = []
            for i in range(1, fin.size - 1):
                if fin[i] > fin[i - 1] and fin[i] > fin[i + 1]:
                    amp.append((fin[i] - min(fin[i - 1], fin[i + 1])) / abs(fin[0]))
            share = sum(a >= self.oscillation_amplitude for a in amp) / fin.size
            if share >= self.oscillation_share:
                found.append((n - 1, 4, "loss_divergence", first_layer,
                              {"rule": "oscillating loss", "share": share}))
            gain = (fin[0] - np.min(fin)) / abs(fin[0]) / fin.size
            if gain < self.slow_gain and nf is None:
                found.append((n - 1, 5, "training_plateau", first_layer,
                              {"rule": "slow convergence", "gain_per_epoch": float(gain)}))
        found.sort(key=lambda f: (f[0], f[1]))
        hyps: list[Hypothesis] = []
        seen: set[str] = set()
        for step, _, ftype, layer, ev in found:
            if ftype in seen:
                continue
            seen.add(ftype)
            hyps.extend(hypotheses_for(ftype, layer, step, 1.0, "autotrainer", ev))
        return hyps
