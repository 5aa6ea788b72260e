"""Root-cause evidence: what the trace and the run's configuration say about each cause.

Used by the Hypothesis Generator (:mod:`neuraldbg.hypotheses`) to rank the causes of a
symptom. Every support value is in [0, 1] and comes from a measured quantity compared with
a threshold of :class:`~neuraldbg.states.ThresholdConfig` through :func:`logistic_support`,
so a cause is favoured exactly as far as its evidence reaches:

- learning rate: the update ratio ||dW||/||W|| before the failure (too high above 1e-2, too
  low below 1e-5) and learning-rate jumps in ``trace.steps`` just before a blow-up;
- initialisation: the median gain std(output)/rms(input) of the Linear/Conv layers at the
  first step. For y = Wx, E[y^2] = fan_in * Var(w) * E[x^2], so the gain measures the init
  scale against each layer's fan-in without needing the fan-in itself: PyTorch's default
  (weights U(+-1/sqrt(fan_in))) gives 1/sqrt(3), Kaiming sqrt(2), Xavier/orthogonal ~1 for
  square layers. When the config names the init scheme the gain is compared with that
  scheme's (``init_scale`` = measured / expected), else with absolute bounds;
- depth amplification: rms of the last Linear/Conv output / rms of the first at the first
  step. Layers with a sound init that still amplify the signal 10x or more through depth
  point at missing normalization rather than at the init;
- inputs: the first layer's input rms, read directly where a shape-only module (Flatten)
  precedes it, else its output std divided by the gain of the other layers;
- pre-activations: mean/std of the output feeding a dead layer (a large negative bias puts
  it far below zero from the first step);
- architecture and config: activation families, normalization layers, recurrent modules,
  configured gradient clipping, the init scheme's name (``trace.meta["config"]``, never the
  ground truth, and never the init gain: that is what the trace measures).

Bugs in the training script, whatever symptom they produce (their evidence takes its share
from the generic causes above, which the bug itself inflates):

- gradients never reset (``missing_zero_grad``): the global gradient norm grows from the
  first steps like a running sum while the loss does not improve, or with that shape the
  parameter-gradient / output-gradient norm ratio grows ~10x over the run (the parameter
  gradient holds the steps before; Adam still lowers the loss a little);
- ``loss_output_mismatch``: a softmax (or sigmoid) module ends the network on a stall;
- ``unscaled_targets``: the first loss is orders of magnitude above the output scale;
- ``symmetric_init``: weight rows identical at enter and still at the latest flush
  (``trace.meta["weight_diversity"]``, :mod:`neuraldbg.weight_diversity`);
- ``gradient_blocked``: a trainable module the forward called never received a gradient
  while others did (a ``.detach()``, ``no_grad`` in the forward);
- ``data_problem``: a stall whose weights move as much as in healthy training, with no
  other cause supported (labels unrelated to the inputs);
- BatchNorm layers whose outputs are not normalised at the first step (a model left in
  ``eval()``): a cause outside the vocabulary, so its support goes to ``unknown``.

Two causes the trace cannot measure keep a fixed, low support so that they are offered as
alternatives: ``saturating_activation`` (0.35) for saturated units, since replacing the
activation is always a valid fix, and ``missing_gradient_clipping`` (0.25) for an
explosion in a non-recurrent net without configured clipping. Both rank below any cause
whose evidence is measured beyond its threshold (support > 0.5).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from neuraldbg.events import LossDynamics
from neuraldbg.states import StateTable, ThresholdConfig
from neuraldbg.trace import Trace

__all__ = ["RunFacts", "gather_facts", "logistic_support", "running_sum_support",
           "score_causes"]

_RECURRENT = ("RNN", "GRU", "LSTM", "RNNCell", "GRUCell", "LSTMCell")
#: Gain std(Wx)/rms(x) each init scheme gives a layer (square layers for Xavier/orthogonal).
SCHEME_GAINS: dict[str, float] = {
    "default": 1.0 / math.sqrt(3.0), "pytorch": 1.0 / math.sqrt(3.0),
    "kaiming": math.sqrt(2.0), "he": math.sqrt(2.0), "kaiming_normal": math.sqrt(2.0),
    "kaiming_uniform": math.sqrt(2.0), "xavier": 1.0, "glorot": 1.0, "xavier_normal": 1.0,
    "xavier_uniform": 1.0, "orthogonal": 1.0, "lecun": 1.0,
}
_WEIGHT_TYPES = ("Linear", "Conv1d", "Conv2d", "Conv3d", "Bilinear", "LazyLinear",
                 "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d")


def logistic_support(value: float, threshold: float, above: bool = True,
                     decades: float = 0.5) -> float:
    """Support in [0, 1] for "``value`` is beyond ``threshold``", graded on a log scale.

    0.5 at the threshold, 0.9 one ``2 * decades`` beyond it... precisely
    ``1 / (1 + 3 ** (-d / decades))`` with ``d`` the distance in decades past the threshold
    (negative before it): 0.75 at ``decades`` past, 0.25 at ``decades`` short.

    Parameters
    ----------
    value, threshold : float
        Positive numbers; NaN or non-positive values give 0.
    above : bool, default=True
        Support for ``value > threshold`` (else for ``value < threshold``).
    decades : float, default=0.5
    """
    if not (value > 0 and threshold > 0 and math.isfinite(value)):
        return 0.0
    d = math.log10(value / threshold)
    d = d if above else -d
    return float(1.0 / (1.0 + 3.0 ** (-d / decades)))


@dataclass(frozen=True, slots=True)
class RunFacts:
    """Cause-relevant facts about a run (see the module docstring).

    Attributes
    ----------
    update_ratio : float
        Median ||dW||/||W|| per step before any failure (NaN without an optimizer).
    total_update : float
        Sum of ||dW||/||W|| over the run.
    lr : float
        Median learning rate (steps table, else the config).
    lr_jump_steps : tuple of int
    init_gain : float
        Median gain std(out)/rms(in) of the Linear/Conv layers after the first, at the first
        recorded step (NaN if no layer pair is measured).
    init_scale : float
        ``init_gain`` / the gain of the init scheme named in the config (NaN when the config
        names none or an unknown one).
    depth_gain : float
        rms of the last Linear/Conv output / rms of the first, at the first recorded step.
    n_gain_pairs : int
    input_rms : float
        Estimated rms of the network input (NaN when unknown).
    first_layer : str
        First parameterised module in forward order.
    saturating_modules : tuple of str
        Sigmoid/tanh modules.
    rectifier_modules : tuple of str
    has_normalization : bool
    recurrent : bool
    grad_clip : float or None
        From the config.
    n_weight_layers : int
    config : dict
    grad_growth : tuple of float
        Growth of the global gradient norm over the first ``grad_sum_steps`` finite steps:
        (exponent of a power law in the step, R^2 of that power law, share of steps where
        the norm grew). NaNs with fewer than 8 such steps.
    loss_improved : bool
        The loss ends (mean of the last tenth, non-finite counting as worse) below where it
        began (mean of the first three steps).
    loss_scale_ratio : float
        First finite loss / (rms of the last module's output at the first recorded step^2
        + 1): how far the loss starts above the output scale.
    output_type : str
        Module type of the last module in forward order (``"Softmax"`` for a softmax
        output layer).
    row_diversity : float
        Weight-row diversity (:mod:`neuraldbg.weight_diversity`) of the most symmetric
        module: the larger of its values at enter and at the latest flush, the smallest over
        modules whose rows are not a single output (NaN when not recorded).
    symmetric_modules : tuple of str
        Modules whose rows stayed copies of each other (diversity below
        ``row_diversity_low`` at enter and at the latest flush).
    blocked_modules : tuple of str
        Trainable modules the forward pass called that never received a gradient (no
        output gradient at any recorded step, parameter gradients exactly zero or absent)
        while other trainable modules did.
    grad_accumulation : float
        Growth over the run of parameter-gradient norm / output-gradient norm of the
        weight layers (median over layers, late steps over the first ones): ~1 when each
        step's gradient is that step's, growing like the step when they pile up.
    batchnorm_output_std : float
        Median std of the BatchNorm outputs at the first recorded step: ~1 when they
        normalise (train mode), the raw input scale when they run on their initial running
        statistics (``eval()``). NaN without BatchNorm.
    """

    update_ratio: float
    total_update: float
    lr: float
    lr_jump_steps: tuple[int, ...]
    init_gain: float
    init_scale: float
    depth_gain: float
    n_gain_pairs: int
    input_rms: float
    first_layer: str
    saturating_modules: tuple[str, ...]
    rectifier_modules: tuple[str, ...]
    has_normalization: bool
    recurrent: bool
    grad_clip: float | None
    n_weight_layers: int
    config: dict[str, Any] = field(default_factory=dict)
    grad_growth: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    loss_improved: bool = True
    loss_scale_ratio: float = math.nan
    output_type: str = ""
    row_diversity: float = math.nan
    symmetric_modules: tuple[str, ...] = ()
    blocked_modules: tuple[str, ...] = ()
    grad_accumulation: float = math.nan
    batchnorm_output_std: float = math.nan


def _rms(states: StateTable, row: int) -> np.ndarray:
    m = states.measures
    return np.sqrt(m["act_std"][row] ** 2 + m["act_mean"][row] ** 2)


def gather_facts(trace: Trace, states: StateTable, dyn: LossDynamics) -> RunFacts:
    """Collect :class:`RunFacts` from a trace, its states and its loss dynamics."""
    cfg_run = dict(trace.meta.get("config") or {})
    names, types, fams = states.module_names, states.module_types, states.families
    mods = trace.modules.set_index("module_name").reindex(names)
    trainable = mods["n_trainable"].fillna(0).to_numpy() > 0
    weight = np.array([t in _WEIGHT_TYPES for t in types]) & trainable
    first_layer = (names[int(np.argmax(trainable))] if trainable.any()
                   else (names[0] if names else ""))

    init_gain, n_pairs, input_rms, depth_gain = float("nan"), 0, float("nan"), float("nan")
    loss_scale_ratio = float("nan")
    observed = states.measures["observed"]
    rows = np.flatnonzero(observed.any(axis=1))
    if len(rows) and len(names):
        r = int(rows[0])
        rms = _rms(states, r)
        std = states.measures["act_std"][r]
        ok = observed[r] & np.isfinite(rms) & (rms > 0)
        idx = np.flatnonzero(weight)
        # Gain std(out)/rms(in): with random weights E[Wx] = 0, so std(out) carries the
        # whole input signal while a constant bias (which moves only the mean) is ignored.
        gains = [std[j] / rms[j - 1] for j in idx[1:] if ok[j] and ok[j - 1]]
        n_pairs = len(gains)
        if gains:
            init_gain = float(np.median(gains))
        good = [j for j in idx if ok[j]]
        if len(good) >= 2:
            depth_gain = float(rms[good[-1]] / rms[good[0]])
        loss = trace.steps["loss"].to_numpy(dtype=float)
        loss = loss[np.isfinite(loss)]
        if loss.size and np.isfinite(rms[-1]):
            loss_scale_ratio = float(abs(loss[0]) / (float(rms[-1]) ** 2 + 1.0))
        if len(idx):
            j0 = int(idx[0])
            if j0 == 1 and ok[0] and fams[0] == "other":
                input_rms = float(rms[0])  # a Flatten/reshape in front shows the input itself
            elif ok[j0] and "norm" not in fams[:j0]:
                gain = (init_gain if math.isfinite(init_gain) and init_gain > 0
                        else states.config.default_gain)
                input_rms = float(std[j0] / gain)
    lr_col = (trace.steps["lr"].to_numpy(dtype=float, na_value=np.nan)
              if "lr" in trace.steps.columns else np.array([]))
    if np.isfinite(lr_col).any():
        lr = float(np.nanmedian(lr_col))
    else:
        try:
            lr = float(cfg_run.get("lr", "nan"))
        except (TypeError, ValueError):
            lr = float("nan")
    clip = cfg_run.get("grad_clip", cfg_run.get("clip_grad_norm"))
    try:
        clip = float(clip) if clip not in (None, False, "none", "None") else None
    except (TypeError, ValueError):
        clip = None
    init_cfg = cfg_run.get("init")
    scheme = str(init_cfg.get("scheme", "") if isinstance(init_cfg, dict) else init_cfg or "")
    expected = SCHEME_GAINS.get(scheme.lower())
    init_scale = init_gain / expected if expected else float("nan")
    norm_cfg = str(cfg_run.get("normalization", "")).lower()
    has_norm = any(f == "norm" for f in fams) or norm_cfg in ("batch", "layer")
    return RunFacts(
        update_ratio=dyn.update_ratio, total_update=dyn.total_update, lr=lr,
        lr_jump_steps=dyn.lr_jump_steps,
        init_gain=init_gain, init_scale=init_scale, depth_gain=depth_gain,
        n_gain_pairs=n_pairs, input_rms=input_rms, first_layer=first_layer,
        saturating_modules=tuple(n for n, f in zip(names, fams, strict=True)
                                 if f in ("sigmoid", "tanh")),
        rectifier_modules=tuple(n for n, f in zip(names, fams, strict=True) if f == "relu"),
        has_normalization=has_norm, recurrent=any(t in _RECURRENT for t in types),
        grad_clip=clip if clip and clip > 0 else None, n_weight_layers=int(weight.sum()),
        config=cfg_run, grad_growth=_grad_growth(trace, states.config.grad_sum_steps),
        loss_improved=_loss_improved(trace), loss_scale_ratio=loss_scale_ratio,
        output_type=types[-1] if types else "",
        **_symmetry(trace, states.config), blocked_modules=_blocked(trace, states),
        grad_accumulation=_grad_accumulation(states, weight),
        batchnorm_output_std=_batchnorm_std(states, rows))


def _symmetry(trace: Trace, cfg: ThresholdConfig) -> dict[str, Any]:
    """``row_diversity`` and ``symmetric_modules`` from ``trace.meta["weight_diversity"]``."""
    rec = trace.meta.get("weight_diversity") or {}
    mods = rec.get("modules") or {}
    ends = {name: max(v[0], v[-1]) for name, v in mods.items()
            if v and all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)}
    if not ends:
        return {"row_diversity": math.nan, "symmetric_modules": ()}
    return {"row_diversity": float(min(ends.values())),
            "symmetric_modules": tuple(n for n, d in ends.items()
                                       if d < cfg.row_diversity_low)}


def _blocked(trace: Trace, states: StateTable) -> tuple[str, ...]:
    """Trainable, called modules that never got a gradient while others did."""
    m = states.measures
    n_train = (trace.modules.set_index("module_name")["n_trainable"]
               .reindex(states.module_names).fillna(0).to_numpy())
    called = np.nan_to_num(m["calls"], nan=0.0).sum(axis=0) > 0
    out_g = m["out_grad_norm"]
    par_g = np.nan_to_num(m["param_grad_norm"], nan=0.0)
    no_out = ~np.isfinite(out_g).any(axis=0)
    no_par = (par_g == 0).all(axis=0)
    trainable = called & (n_train > 0)
    blocked = trainable & no_out & no_par
    learning = trainable & ~blocked & (par_g > 0).any(axis=0)
    if not learning.any() or len(states.steps) == 0:
        return ()
    return tuple(n for n, b in zip(states.module_names, blocked, strict=True) if b)


def _grad_accumulation(states: StateTable, weight: np.ndarray) -> float:
    """Late over early ratio of parameter-gradient to output-gradient norm.

    The median over weight layers; NaN with fewer than 8 recorded steps.
    """
    m = states.measures
    n = len(states.steps)
    if n < 8 or not weight.any():
        return math.nan
    with np.errstate(all="ignore"):
        ratio = m["param_grad_norm"][:, weight] / m["out_grad_norm"][:, weight]
    ratio = np.where(np.isfinite(ratio) & (ratio > 0), ratio, np.nan)
    k = max(3, n // 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        growth = np.nanmedian(ratio[-k:], axis=0) / np.nanmedian(ratio[:k], axis=0)
    growth = growth[np.isfinite(growth)]
    return float(np.median(growth)) if growth.size else math.nan


def _batchnorm_std(states: StateTable, rows: np.ndarray) -> float:
    """Median std of the BatchNorm outputs at the first recorded step (NaN without)."""
    cols = [j for j, t in enumerate(states.module_types) if "BatchNorm" in t]
    if not cols or not len(rows):
        return math.nan
    std = states.measures["act_std"][int(rows[0]), cols]
    std = std[np.isfinite(std) & (std > 0)]
    return float(np.median(std)) if std.size else math.nan


def _grad_growth(trace: Trace, n_steps: int) -> tuple[float, float, float]:
    """Growth of the global gradient norm: (power-law exponent, R^2, share of steps grown).

    Over the first ``n_steps`` steps before any non-finite or zero norm.
    """
    g = trace.steps["grad_norm"].to_numpy(dtype=float) if "grad_norm" in trace.steps \
        else np.zeros(0)
    ok = np.isfinite(g) & (g > 0)
    n = min(int(np.argmin(ok)) if not ok.all() else len(g), n_steps)
    if n < 8:
        return (math.nan, math.nan, math.nan)
    y = np.log(g[:n])
    if float(y.var()) <= 1e-12:
        return (0.0, 0.0, 0.0)

    def fit(x: np.ndarray) -> tuple[float, float]:
        coef = np.polyfit(x, y, 1)
        return float(coef[0]), float(1.0 - np.var(y - np.polyval(coef, x)) / np.var(y))

    exponent, power_fit = fit(np.log(np.arange(n, dtype=float) + 1.0))
    return (exponent, power_fit, float(np.mean(np.diff(g[:n]) > 0)))


def _loss_improved(trace: Trace) -> bool:
    """The loss ends below where it began (a non-finite end is no improvement)."""
    loss = trace.steps["loss"].to_numpy(dtype=float)
    if len(loss) < 4 or not np.isfinite(loss[:3]).any():
        return True
    start = float(np.nanmean(np.where(np.isfinite(loss[:3]), loss[:3], np.nan)))
    tail = loss[-max(3, len(loss) // 10):]
    if not np.isfinite(tail).all():
        return False
    return float(tail.mean()) < start


def _lr_jump_before(facts: RunFacts, step: int, window: int) -> bool:
    return any(step - window <= s <= step for s in facts.lr_jump_steps)


def _init_support(facts: RunFacts, cfg: ThresholdConfig) -> tuple[float, float]:
    """(support for an init too large, for an init too small)."""
    if not facts.n_gain_pairs:
        return 0.0, 0.0
    if math.isfinite(facts.init_scale):  # scheme known: compare with its own gain
        return (logistic_support(facts.init_scale, cfg.init_scale_high, decades=0.25),
                logistic_support(facts.init_scale, cfg.init_scale_low, above=False,
                                 decades=0.25))
    return (logistic_support(facts.init_gain, cfg.init_gain_high, decades=0.25),
            logistic_support(facts.init_gain, cfg.init_gain_low, above=False, decades=0.25))


#: Support for ``loss_output_mismatch`` by the type of the network's last module, on a run
#: that stalls or saturates: a softmax output is the classic bug (``CrossEntropyLoss``
#: applies its own); a sigmoid output is right for ``BCELoss`` and wrong for
#: ``BCEWithLogitsLoss``, which the trace cannot tell apart, so it stays below 0.5.
_OUTPUT_MISMATCH: dict[str, float] = {"Softmax": 0.85, "Softmax2d": 0.85, "Sigmoid": 0.45}
#: Bugs in the user's script: evidence for one of them takes its share from the generic
#: causes (a high update ratio, a small init gain) that the bug itself produces.
_BUGS = ("missing_zero_grad", "unscaled_targets", "symmetric_init", "gradient_blocked",
         "loss_output_mismatch", "data_problem")


def running_sum_support(facts: RunFacts, cfg: ThresholdConfig) -> float:
    """Support for "the gradients pile up across steps" (a missing ``zero_grad``).

    The global gradient norm grows from the first steps, step after step (at least
    ``cfg.grad_sum_monotone`` of them), like a power of the step with an exponent of at least
    ``cfg.grad_sum_exponent``, while the loss does not improve.
    """
    exponent, power_fit, rising = facts.grad_growth
    if facts.loss_improved or not (power_fit >= cfg.grad_sum_fit
                                   and rising >= cfg.grad_sum_monotone):
        return 0.0
    return logistic_support(exponent, cfg.grad_sum_exponent, decades=0.1)


def accumulation_support(facts: RunFacts, cfg: ThresholdConfig) -> float:
    """Support for "each step's parameter gradient holds the steps before it".

    The ratio of parameter-gradient to output-gradient norm grows
    ``cfg.grad_accumulation_growth``-fold
    or more over the run (a running sum grows like the step; a healthy run keeps it within a
    few-fold, a too-high rate grows both norms together), and the global gradient norm
    grows from the first steps like a running sum (:func:`running_sum_support`'s shape).
    Unlike that rule it does not ask the loss to stall: Adam still lowers the loss a little
    on a summed gradient. The ratio alone also grows when the weights blow up after a
    learning-rate spike (the layers' inputs grow), which the shape rules out.
    """
    exponent, power_fit, rising = facts.grad_growth
    if not (power_fit >= cfg.grad_sum_fit and rising >= cfg.grad_sum_monotone
            and exponent >= cfg.grad_sum_exponent):
        return 0.0  # a running sum also grows step after step from the start
    return logistic_support(facts.grad_accumulation, cfg.grad_accumulation_growth,
                            decades=0.25)


def symmetric_support(facts: RunFacts, cfg: ThresholdConfig) -> float:
    """Support for "a layer's units are copies of each other".

    Constant or identical initial weights: weight-row diversity below
    ``cfg.row_diversity_low`` at enter and
    still at the latest flush (1.0 for rows exactly equal).
    """
    if not facts.symmetric_modules:
        return 0.0
    return logistic_support(max(facts.row_diversity, 1e-12), cfg.row_diversity_low,
                            above=False, decades=0.5)


def batchnorm_off_support(facts: RunFacts, cfg: ThresholdConfig) -> float:
    """Support for "the BatchNorm layers do not normalise".

    A model left in ``eval()``, normalising with its initial running statistics: their
    outputs' std at the first step
    ``cfg.batchnorm_std_high`` times or more off 1 (train-mode BatchNorm outputs ~1).
    """
    std = facts.batchnorm_output_std
    if not (std > 0 and math.isfinite(std)):
        return 0.0
    return logistic_support(max(std, 1.0 / std), cfg.batchnorm_std_high, decades=0.25)


def score_causes(failure_type: str, *, onset: int, first_step: int, facts: RunFacts,
                 cfg: ThresholdConfig, extra: dict[str, float] | None = None
                 ) -> dict[str, tuple[float, dict[str, Any]]]:
    """Support of each candidate root cause of one symptom.

    Parameters
    ----------
    failure_type : str
        A failure type of the contract's vocabulary.
    onset : int
        Step the symptom appeared.
    first_step : int
        First recorded step. A symptom present there was measured before any update, so
        the learning rate cannot have caused it.
    facts : RunFacts
    cfg : ThresholdConfig
    extra : dict, optional
        Symptom-specific numbers: ``preact_z`` (mean/std feeding a dead layer),
        ``origin_is_first_activation`` (1.0/0.0), ``activation_decay_share`` (share of a
        vanishing gradient's decay across sigmoid/tanh modules), ``upstream_instability``
        (probability of an explosion before the symptom), ``grad_spikiness``.

    Returns
    -------
    dict of str to (float, dict)
        Cause -> (support in [0, 1], the evidence behind it). Causes without support are
        left out.
    """
    extra = extra or {}
    from_start = onset <= first_step
    ur = facts.update_ratio
    inputs = logistic_support(facts.input_rms, cfg.input_scale_high)
    init_large, init_small = _init_support(facts, cfg)
    init_large *= 1.0 - batchnorm_off_support(facts, cfg)
    piled = max(running_sum_support(facts, cfg), accumulation_support(facts, cfg))
    targets = logistic_support(facts.loss_scale_ratio, cfg.loss_scale_ratio)
    symmetric = symmetric_support(facts, cfg)
    blocked = 1.0 if facts.blocked_modules else 0.0
    # BatchNorm present but not normalising: whatever it was there to absorb (the input or
    # init scale, a high rate, depth) is not the root; the mode mix-up has no cause in the
    # vocabulary, so its support goes to "unknown" (see generate_hypotheses).
    bn_off = batchnorm_off_support(facts, cfg)
    inputs *= 1.0 - bn_off
    mismatch = _OUTPUT_MISMATCH.get(facts.output_type, 0.0)
    # Unnormalised inputs or a too-large init inflate every gradient and so the update
    # ratio: a high ratio is weaker evidence of a high learning rate when either holds.
    # Gradients that pile up (no zero_grad) or targets far off the output scale inflate it
    # whatever the rate: then a high ratio is hardly evidence of the rate at all.
    lr_high = (logistic_support(ur, cfg.update_ratio_high)
               * (1.0 - 0.5 * max(inputs, init_large))
               * (1.0 - max(piled, targets, symmetric, blocked, bn_off)))
    ev_piled = {"grad_growth_exponent": facts.grad_growth[0],
                "power_law_fit": facts.grad_growth[1], "share_rising": facts.grad_growth[2],
                "loss_improved": facts.loss_improved, "threshold": cfg.grad_sum_exponent,
                "param_over_output_grad_growth": facts.grad_accumulation,
                "accumulation_threshold": cfg.grad_accumulation_growth}
    ev_targets = {"loss_scale_ratio": facts.loss_scale_ratio,
                  "threshold": cfg.loss_scale_ratio}
    ev_output = {"output_module_type": facts.output_type}
    jump = _lr_jump_before(facts, onset, cfg.lr_jump_window)
    no_clip = facts.grad_clip is None
    plain = not facts.has_normalization
    amplifies = logistic_support(facts.depth_gain, cfg.depth_gain_high)
    attenuates = logistic_support(facts.depth_gain, 1.0 / cfg.depth_gain_high, above=False)
    ev_lr = {"update_ratio": ur, "threshold": cfg.update_ratio_high, "lr": facts.lr,
             "lr_jump_before_onset": jump, "present_from_first_step": from_start}
    ev_init = {"init_gain": facts.init_gain, "init_scale": facts.init_scale,
               "n_layers_measured": facts.n_gain_pairs}
    ev_norm = {"depth_gain": facts.depth_gain, "normalization_layers": not plain,
               "n_weight_layers": facts.n_weight_layers}
    out: dict[str, tuple[float, dict[str, Any]]] = {}

    def put(cause: str, support: float, evidence: dict[str, Any]) -> None:
        if support >= 0.05:
            out[cause] = (float(min(1.0, support)), evidence)

    # Bugs in the training script, whatever the symptom they produce.
    put("missing_zero_grad", 0.95 * piled, ev_piled)
    put("unscaled_targets", 0.9 * targets, ev_targets)
    put("symmetric_init", 0.95 * symmetric,
        {"row_diversity": facts.row_diversity, "threshold": cfg.row_diversity_low,
         "symmetric_modules": list(facts.symmetric_modules)})
    put("gradient_blocked", 0.9 * blocked, {"modules_without_gradient":
                                            list(facts.blocked_modules)})
    if bn_off >= 0.05:  # a cause outside the vocabulary: support for "unknown"
        out["unknown"] = (bn_off, {"batchnorm_output_std": facts.batchnorm_output_std,
                                   "threshold": cfg.batchnorm_std_high,
                                   "reading": "BatchNorm layers do not normalise: the model "
                                              "may be in eval() mode while it trains"})
    # Evidence of a bug in the script: the generic causes below lose what it explains.
    bug = max(piled, targets, symmetric, blocked, bn_off)

    if failure_type in ("exploding_gradients", "loss_divergence"):
        # A jump of the learning rate right before the blow-up is the strongest sign; a
        # failure already there before the first update cannot come from the learning rate.
        put("learning_rate_too_high",
            max(lr_high * (0.1 if from_start else 1.0), 0.95 if jump else 0.0), ev_lr)
        put("init_scale_too_large", init_large * (1.0 - targets), ev_init)
        put("unnormalized_inputs", 0.8 * inputs, {"input_rms": facts.input_rms,
                                                  "threshold": cfg.input_scale_high})
        if plain:  # sound layers that still amplify through depth: normalization missing
            put("missing_normalization", amplifies * (1.0 - init_large), ev_norm)
        if no_clip:
            spikes = logistic_support(float(extra.get("grad_spikiness", math.nan)),
                                      cfg.grad_spike)
            # Recurrent nets explode through time without clipping; spikes are its mark.
            put("missing_gradient_clipping", 0.5 + 0.45 * spikes if facts.recurrent
                else 0.25, {"grad_clip": None, "recurrent": facts.recurrent})
    elif failure_type == "vanishing_gradients":
        share = float(extra.get("activation_decay_share", 0.0))
        if facts.saturating_modules:
            put("saturating_activation", 0.1 + 0.85 * share,
                {"activation_decay_share": share,
                 "saturating_modules": list(facts.saturating_modules)})
        put("init_scale_too_small", init_small, ev_init)
        if plain:
            put("missing_normalization", attenuates * (1.0 - init_small) * (1.0 - share),
                ev_norm)
    elif failure_type == "dead_neurons":
        z = float(extra.get("preact_z", float("nan")))
        if math.isfinite(z):
            neg = 1.0 / (1.0 + 3.0 ** (-(-z - 2.0)))  # 0.5 at mean = -2 std, ~0.9 at -4 std
            put("negative_bias_init", neg * (1.0 if from_start else 0.5),
                {"preactivation_mean_over_std": z})
        later = 0.0 if from_start else max(lr_high, 0.9 if jump else 0.0,
                                           float(extra.get("upstream_instability", 0.0))
                                           * (1.0 - max(piled, targets)))
        put("learning_rate_too_high", later, ev_lr)
        put("init_scale_too_large", init_large * 0.5, ev_init)
    elif failure_type == "saturated_activations":
        first_act = float(extra.get("origin_is_first_activation", 0.0))
        put("unnormalized_inputs", inputs * (0.5 + 0.5 * first_act),
            {"input_rms": facts.input_rms, "threshold": cfg.input_scale_high})
        put("init_scale_too_large", init_large, ev_init)
        put("learning_rate_too_high", 0.0 if from_start else max(lr_high, 0.9 if jump else 0.0),
            ev_lr)
        put("saturating_activation", 0.35, {"saturating_modules": list(facts.saturating_modules)})
        put("loss_output_mismatch", mismatch, ev_output)
    elif failure_type == "training_plateau":
        # Tiny steps, or weights that moved little in the whole run, relative to their size.
        # A probability output (softmax, sigmoid) fed to a loss that applies its own
        # softmax saturates and shrinks every gradient, whatever the rate: small updates
        # are then weaker evidence of a low learning rate.
        low = max(logistic_support(ur, cfg.update_ratio_low, above=False),
                  logistic_support(facts.total_update, cfg.total_update_low, above=False)
                  ) * (1.0 - 0.8 * mismatch)
        put("loss_output_mismatch", mismatch, ev_output)
        put("learning_rate_too_low", low, {"update_ratio": ur, "threshold": cfg.update_ratio_low,
                                           "total_update": facts.total_update, "lr": facts.lr})
        put("learning_rate_too_high", 0.5 * lr_high, ev_lr)
        put("init_scale_too_small", 0.5 * init_small, ev_init)
        if no_clip and facts.recurrent:  # a recurrent net stalled by exploding spikes
            spikes = logistic_support(float(extra.get("grad_spikiness", math.nan)),
                                      cfg.grad_spike)
            put("missing_gradient_clipping", 0.8 * spikes,
                {"grad_clip": None, "recurrent": True,
                 "grad_spikiness": extra.get("grad_spikiness")})
        # Labels unrelated to the inputs: the loss sits at chance while the weights move as
        # much as in healthy training and no other cause has evidence.
        # Gradient spikes belong to an unstable run (a recurrent net without clipping), not
        # to labels that carry no signal: a shuffled dataset gives a flat, noisy gradient.
        moved = logistic_support(ur, cfg.data_update_ratio, decades=0.5)
        others = max([sup for c, (sup, _) in out.items() if c != "unknown"] + [0.0])
        spiky = logistic_support(float(extra.get("grad_spikiness", math.nan)), cfg.grad_spike)
        put("data_problem", 0.75 * moved * (1.0 - others) * (1.0 - spiky),
            {"update_ratio": ur, "threshold": cfg.data_update_ratio,
             "other_cause_support": others, "grad_spikiness": extra.get("grad_spikiness")})
    for cause in list(out):
        if cause not in _BUGS and cause != "unknown":
            sup, ev = out[cause]
            out[cause] = (sup * (1.0 - bug), ev)
    return {c: v for c, v in out.items() if v[0] >= 0.05}
