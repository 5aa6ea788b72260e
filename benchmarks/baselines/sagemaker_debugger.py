"""Amazon SageMaker Debugger's built-in rules, ported onto NeuralDBG traces (the industrial
anchor of docs/evaluation.md).

Written from the rules' public documentation ("List of Debugger built-in rules", Amazon
SageMaker developer guide); no SageMaker or smdebug code is used. Each rule keeps its
documented default threshold; where a trace does not hold the tensor a rule reads, the nearest
recorded statistic stands in, as said per rule:

- ``exploding_tensor``: any NaN or Inf in a recorded tensor (``only_nan`` default False):
  a layer output (``act_nan``, ``act_inf``), a gradient or weight norm, the loss ->
  ``loss_divergence``;
- ``vanishing_gradient``: the mean absolute value of a gradient below ``threshold`` 1e-7;
  the root mean square ``param_grad_norm / sqrt(n_params)`` stands in for the mean
  (it is never smaller, so the port fires no more often than the rule) ->
  ``vanishing_gradients``;
- ``dead_relu``: a ReLU is dead when active on less than ``threshold_inactivity`` 1% of the
  samples; the layer fires when more than ``threshold_layer`` 50% of its units are dead. The
  trace's ``act_frac_dead`` (units exactly zero for the whole batch) is that share with an
  activity of 0% -> ``dead_neurons``;
- ``saturated_activation``: more than ``threshold_layer`` 50% of a tanh/sigmoid layer's nodes
  saturated (inputs beyond (-9.4999, 9.4999) for tanh, about (-23, 17) for sigmoid). The trace
  records the share of *outputs* in the flat region (|pre-activation| > 2.65 for tanh, > 4.6
  for sigmoid): a looser cut than the rule's, so the port fires earlier ->
  ``saturated_activations``;
- ``weight_update_ratio``: the ratio of the update to the weights above ``large_threshold``
  10.0 (-> ``exploding_gradients``) or below ``small_threshold`` 1e-8 (->
  ``training_plateau``), per layer (``update_ratio``);
- ``poor_weight_initialization``: over the first ``steps`` 10 steps, the ratio between the
  largest and smallest variance of the activation inputs across layers above ``threshold``
  10.0; the variance of each parameterised layer's output (``act_std ** 2``, the input of the
  activation that follows it) stands in. The rule's gradient-percentile check
  (``distribution_range`` 0.001) needs gradient histograms the trace does not hold and is left
  out -> ``vanishing_gradients`` when the deepest layer's variance is the smallest, else
  ``exploding_gradients``;
- ``loss_not_decreasing``: every ``num_steps`` 10 steps the loss is compared with the loss
  ``num_steps`` earlier and the rule fires when it fell by less than ``diff_percent`` 0% ->
  ``training_plateau``;
- ``stalled_training``: no progress for ``threshold`` 1800 s of wall clock. A trace has no
  per-step timestamps, so this rule cannot be evaluated and never fires here.

The rules run on every recorded step (as with ``save_interval`` 1; the documented default of
500 would leave a few-hundred-step zoo run with one or two saved steps). SageMaker Debugger
reports each rule separately; to rank a diagnosis, every rule that fired gives its failure
type, in the order above (the first fired rule is the top hypothesis), each cause from the
shared symptom -> cause table. Rules are binary: confidence 1.

References
----------
Rauschmayr et al. Amazon SageMaker Debugger: A System for Real-Time Insights into Machine
Learning Model Training. MLSys 2021.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchmarks.baselines._common import BaselineMethod, families, hypotheses_for, loss_array, wide
from neuraldbg.methods import register_method
from neuraldbg.records import Hypothesis
from neuraldbg.trace import Trace

__all__ = ["SageMakerDebuggerBaseline", "RULES"]

#: The ported rules, in the order their findings are ranked.
RULES: tuple[str, ...] = ("exploding_tensor", "vanishing_gradient", "dead_relu",
                          "saturated_activation", "weight_update_ratio",
                          "poor_weight_initialization", "loss_not_decreasing",
                          "stalled_training")


def _first(table: pd.DataFrame, order: list[str]) -> tuple[int, str] | None:
    """(step, first module in forward order) of the first True cell, or None."""
    if table.empty or not table.to_numpy().any():
        return None
    row = table[table.any(axis=1)].iloc[0]
    cols = [m for m in order if m in row.index and bool(row[m])]
    return int(row.name), (cols[0] if cols else "")


@register_method("sagemaker_debugger")
class SageMakerDebuggerBaseline(BaselineMethod):
    """SageMaker Debugger's built-in rules (documented defaults) as a diagnosis method.

    Parameters
    ----------
    vanishing_threshold : float, default=1e-7
        ``vanishing_gradient.threshold``.
    dead_threshold_layer : float, default=0.5
        ``dead_relu.threshold_layer`` (50%, as a share).
    saturated_threshold_layer : float, default=0.5
        ``saturated_activation.threshold_layer`` (50%, as a share).
    large_threshold, small_threshold : float, default=10.0, 1e-8
        ``weight_update_ratio`` bounds.
    init_threshold : float, default=10.0
        ``poor_weight_initialization.threshold``.
    init_steps : int, default=10
        ``poor_weight_initialization.steps``.
    loss_num_steps : int, default=10
        ``loss_not_decreasing.num_steps``.
    loss_diff_percent : float, default=0.0
        ``loss_not_decreasing.diff_percent``.
    """

    def __init__(self, *, vanishing_threshold: float = 1e-7, dead_threshold_layer: float = 0.5,
                 saturated_threshold_layer: float = 0.5, large_threshold: float = 10.0,
                 small_threshold: float = 1e-8, init_threshold: float = 10.0,
                 init_steps: int = 10, loss_num_steps: int = 10,
                 loss_diff_percent: float = 0.0) -> None:
        self.vanishing_threshold = vanishing_threshold
        self.dead_threshold_layer = dead_threshold_layer
        self.saturated_threshold_layer = saturated_threshold_layer
        self.large_threshold = large_threshold
        self.small_threshold = small_threshold
        self.init_threshold = init_threshold
        self.init_steps = init_steps
        self.loss_num_steps = loss_num_steps
        self.loss_diff_percent = loss_diff_percent

    # ----------------------------------------------------------------- rules
    def _exploding_tensor(self, trace: Trace, order: list[str]) -> tuple[str, int, str] | None:
        hits = []
        nan, inf = wide(trace, "act_nan"), wide(trace, "act_inf")
        if not nan.empty:
            hit = _first((nan.fillna(0) + inf.fillna(0)) > 0, order)
            if hit:
                hits.append(hit)
        for col in ("param_grad_norm", "param_norm"):
            t = wide(trace, col)
            if not t.empty:
                hit = _first(pd.DataFrame(~np.isfinite(t.astype(float).to_numpy()),
                                          index=t.index, columns=t.columns)
                             & t.notna(), order)
                if hit:
                    hits.append(hit)
        loss = loss_array(trace)
        bad = np.flatnonzero(~np.isfinite(loss) & trace.steps["complete"].to_numpy(bool)) \
            if "complete" in trace.steps else np.flatnonzero(~np.isfinite(loss))
        if bad.size:
            hits.append((int(trace.steps["step"].iloc[bad[0]]), order[0] if order else ""))
        if not hits:
            return None
        step, layer = min(hits)
        return "loss_divergence", step, layer

    def _vanishing_gradient(self, trace: Trace, order: list[str]) -> tuple[str, int, str] | None:
        gn = wide(trace, "param_grad_norm")
        n_par = trace.modules.set_index("module_name")["n_params"].astype(float)
        owned = [m for m in gn.columns if n_par.get(m, 0) > 0]
        if gn.empty or not owned:
            return None
        rms = gn[owned].astype(float) / np.sqrt(n_par[owned])
        hit = _first(rms < self.vanishing_threshold, order)
        return ("vanishing_gradients", *hit) if hit else None

    def _dead_relu(self, trace: Trace, order: list[str]) -> tuple[str, int, str] | None:
        dead = wide(trace, "act_frac_dead")
        fam = families(trace)
        relu = [m for m in dead.columns if fam.get(m) == "relu"]
        if dead.empty or not relu:
            return None
        hit = _first(dead[relu].astype(float) > self.dead_threshold_layer, order)
        return ("dead_neurons", *hit) if hit else None

    def _saturated_activation(self, trace: Trace, order: list[str]
                              ) -> tuple[str, int, str] | None:
        sat = wide(trace, "act_frac_saturated")
        fam = families(trace)
        squash = [m for m in sat.columns if fam.get(m) in ("sigmoid", "tanh")]
        if sat.empty or not squash:
            return None
        hit = _first(sat[squash].astype(float) > self.saturated_threshold_layer, order)
        return ("saturated_activations", *hit) if hit else None

    def _weight_update_ratio(self, trace: Trace, order: list[str]
                             ) -> tuple[str, int, str] | None:
        ur = wide(trace, "update_ratio")
        if ur.empty:
            return None
        ur = ur.astype(float)
        large = _first(ur > self.large_threshold, order)
        small = _first((ur < self.small_threshold) & ur.notna(), order)
        found = [(h[0], k, t, h[1]) for k, (t, h) in enumerate(
            (("exploding_gradients", large), ("training_plateau", small))) if h]
        if not found:
            return None
        step, _, ftype, layer = min(found)
        return ftype, step, layer

    def _poor_weight_initialization(self, trace: Trace, order: list[str]
                                    ) -> tuple[str, int, str] | None:
        std = wide(trace, "act_std")
        n_par = trace.modules.set_index("module_name")["n_params"].astype(float)
        owned = [m for m in order if m in std.columns and n_par.get(m, 0) > 0]
        if std.empty or len(owned) < 2:
            return None
        early = std.loc[std.index < self.init_steps, owned].astype(float) ** 2
        for step, row in early.iterrows():
            v = row.to_numpy()
            v = v[np.isfinite(v)]
            if v.size < 2 or v.min() <= 0:
                continue
            if v.max() / v.min() > self.init_threshold:
                smallest = row.idxmin()
                ftype = ("vanishing_gradients" if owned.index(smallest) == len(owned) - 1
                         else "exploding_gradients")
                return ftype, int(step), str(smallest)
        return None

    def _loss_not_decreasing(self, trace: Trace, order: list[str]
                             ) -> tuple[str, int, str] | None:
        loss = loss_array(trace)
        steps = trace.steps["step"].to_numpy()
        k = self.loss_num_steps
        for i in range(k, loss.size, k):
            before, now = loss[i - k], loss[i]
            if not (np.isfinite(before) and np.isfinite(now)):
                return None  # exploding_tensor's finding
            if now > before * (1.0 - self.loss_diff_percent / 100.0):
                return "training_plateau", int(steps[i]), order[0] if order else ""
        return None

    # ----------------------------------------------------------------- method
    def fired(self, trace: Trace) -> dict[str, tuple[str, int, str]]:
        """Every rule that fired: rule name -> (failure type, first step, module)."""
        order = list(trace.module_names)
        if loss_array(trace).size == 0:
            return {}
        out = {}
        for rule in RULES:
            check = getattr(self, f"_{rule}", None)
            hit = check(trace, order) if check is not None else None  # stalled: no clock
            if hit is not None:
                out[rule] = hit
        return out

    def rules(self, trace: Trace, loss: np.ndarray) -> list[Hypothesis]:
        """Every fired rule, in :data:`RULES` order, each failure type once."""
        hyps: list[Hypothesis] = []
        seen: set[str] = set()
        for rule, (ftype, step, layer) in self.fired(trace).items():
            if ftype in seen:
                continue
            seen.add(ftype)
            hyps += hypotheses_for(ftype, layer, step, 1.0, "sagemaker_debugger",
                                   {"rule": rule, "step": step})
        return hyps
