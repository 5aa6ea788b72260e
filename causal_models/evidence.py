"""Evidence that is not a time slice.

The observed knobs and context of a run, and the heuristic reasoner's verdict.

The knob and context states come from the module table first (what actually ran) and the
run config second (what a user wrote down); the rules' verdict is the Post-Mortem
Reasoner's top hypothesis. Nothing here reads ``trace.meta["ground_truth"]``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from causal_models.bins import NORMALIZATION_STATES, Bins
from neuraldbg.cause_evidence import unsafe_loss_support
from neuraldbg.trace import Trace

__all__ = ["observe_knobs", "observe_stack", "observe_cause_signs", "sigmoid_decay",
           "clip_share", "clipping_state", "sigmoid_decay_state", "rule_verdict", "rule_strength",
           "RULE_HEALTHY", "RULE_NO_CAUSE", "RULE_STRENGTH_STATES", "RULE_STRENGTH_EDGES"]

_ACT_TYPES = {
    "ReLU": "relu", "ReLU6": "relu", "ELU": "relu", "CELU": "relu", "SELU": "relu",
    "LeakyReLU": "leaky_relu", "PReLU": "leaky_relu", "RReLU": "leaky_relu",
    "GELU": "gelu", "SiLU": "gelu", "Mish": "gelu", "Hardswish": "gelu",
    "Tanh": "tanh", "Hardtanh": "tanh", "Softsign": "tanh",
    "Sigmoid": "sigmoid", "Hardsigmoid": "sigmoid",
}
_ACT_NAMES = {"relu": "relu", "leaky_relu": "leaky_relu", "leakyrelu": "leaky_relu",
              "gelu": "gelu", "silu": "gelu", "swish": "gelu", "tanh": "tanh",
              "sigmoid": "sigmoid"}
_LR_REFERENCE = {"sgd": 3e-2, "adam": 1e-3, "adamw": 1e-3, "rmsprop": 1e-3, "adagrad": 1e-2}
_WEIGHTED_TYPES = ("Linear", "Conv", "RNN", "GRU", "LSTM", "Embedding", "Bilinear",
                   "MultiheadAttention")


def clip_share(grad_norm: np.ndarray, clip: float, bins: Bins | None = None) -> float:
    """Share of a run's steps whose total gradient norm clipping at ``clip`` caps.

    Parameters
    ----------
    grad_norm : array
        The run's recorded global gradient norm per step (``trace.steps["grad_norm"]``).
        A run clipped at ``c`` records its norms after the cap, at ``c``: those count as
        capped. A non-finite norm counts as capped only when the clip also caps a finite
        norm of the run: a threshold above every finite norm would have acted only once the
        run had already overflowed, too late to change it.
    clip : float
        The clipping threshold (a positive total norm).
    bins : Bins, optional
        ``clip_engage``: the fraction of ``clip`` from which a norm counts as capped.

    Returns
    -------
    float
        In [0, 1]; 0 when no step is recorded.
    """
    bins = bins or Bins()
    g = np.asarray(grad_norm, dtype=float)
    if not g.size:
        return 0.0
    finite = np.isfinite(g)
    capped = finite & (g >= bins.clip_engage * float(clip))
    if capped.any():
        capped |= ~finite
    return float(np.mean(capped))


def clipping_state(share: float, bins: Bins | None = None) -> str:
    """The ``clipping`` node's state for a clip that caps ``share`` of the steps.

    ``none`` when it caps no step (clipping above every gradient norm of the run changes
    nothing), ``peaks`` when it caps fewer than ``bins.clip_tight`` of them (the bursts
    only), ``tight`` when it caps most (every update is rescaled to the threshold).
    """
    bins = bins or Bins()
    if share <= 0.0:
        return "none"
    return "tight" if share >= bins.clip_tight else "peaks"


def observe_knobs(trace: Trace, bins: Bins | None = None) -> dict[str, str]:
    """Observed knob and context states of a run, from its module table and config.

    Parameters
    ----------
    trace : Trace
        The run.
    bins : Bins, optional
        Thresholds (only ``deep_layers`` and ``lr_config_edges`` are used).

    Returns
    -------
    dict
        ``activation``, ``normalization``, ``clipping`` (how much of the run the configured
        ``grad_clip`` capped: :func:`clipping_state`), ``depth``, ``arch``,
        ``lr_config``, ``init_config``, ``input_config`` and ``lr_schedule`` (``spike``
        when the recorded learning rate jumps above ``lr_spike_factor`` x its median).
    """
    bins = bins or Bins()
    config = trace.meta.get("config") or {}
    types = trace.modules["module_type"].astype(str).tolist()
    arch, depth = _architecture(types, config, bins)
    return {"activation": _activation(types, config),
            "normalization": _normalization(types, config),
            "clipping": _clipping(trace, config, bins), "depth": depth, "arch": arch,
            "lr_config": _lr_config(trace, config, bins),
            "init_config": _init_config(config, bins),
            "input_config": _input_config(config, bins),
            "lr_schedule": _lr_schedule(trace, bins)}


def _activation(types: list[str], config: dict[str, Any]) -> str:
    """The most common activation module (ties: by name), else the configured one."""
    acts = [_ACT_TYPES[t] for t in types if t in _ACT_TYPES]
    if acts:
        return max(set(acts), key=lambda a: (acts.count(a), a))
    return _ACT_NAMES.get(str(config.get("activation", "")).lower(), "other")


def _normalization(types: list[str], config: dict[str, Any]) -> str:
    """Batch or layer normalization among the modules, else the configured one."""
    if any(t.startswith("BatchNorm") for t in types):
        return "batch"
    if any(t in ("LayerNorm", "GroupNorm", "RMSNorm") for t in types):
        return "layer"
    norm_cfg = str(config.get("normalization") or "none").lower()
    return norm_cfg if norm_cfg in NORMALIZATION_STATES else "none"


def _clipping(trace: Trace, config: dict[str, Any], bins: Bins) -> str:
    """How much of the run the configured ``grad_clip`` capped (:func:`clipping_state`)."""
    clip = config.get("grad_clip")
    if not (isinstance(clip, (int, float)) and not isinstance(clip, bool) and clip > 0):
        return "none"
    norms = trace.steps["grad_norm"].to_numpy(dtype=float) if "grad_norm" in trace.steps \
        else np.zeros(0)
    return clipping_state(clip_share(norms, clip, bins), bins) if norms.size else "peaks"


def _architecture(types: list[str], config: dict[str, Any], bins: Bins) -> tuple[str, str]:
    """The architecture family and the depth (weighted layers, or stacked recurrent layers)."""
    n_weighted = sum(any(t.startswith(w) for w in _WEIGHTED_TYPES) for t in types)
    recurrent_layers = int(config.get("num_layers", 1) or 1)
    depth = "deep" if n_weighted >= bins.deep_layers else "shallow"
    if any(t in ("RNN", "GRU", "LSTM", "RNNCell", "GRUCell", "LSTMCell") for t in types):
        depth = "deep" if recurrent_layers >= 4 or n_weighted >= bins.deep_layers else depth
        return "recurrent", depth
    if any("Attention" in t for t in types):
        return "attention", depth
    if any(t.startswith("Conv") for t in types):
        return "convolutional", depth
    return "feedforward", depth


def _lr_config(trace: Trace, config: dict[str, Any], bins: Bins) -> str:
    """The configured learning rate against the optimizer's usual one: low | typical | high.

    The rate is the config's ``lr``, else the median of the rates the capture read from the
    optimizer (most users pass no config; "unknown" is left for a run without either).
    """
    lr = config.get("lr")
    if not isinstance(lr, (int, float)) and "lr" in trace.steps:
        rates = trace.steps["lr"].to_numpy(dtype=float)
        rates = rates[np.isfinite(rates) & (rates > 0)]
        lr = float(np.median(rates)) if rates.size else None
    opt = str(config.get("optimizer") or trace.meta.get("optimizer_class") or "").lower()
    ref = _LR_REFERENCE.get(opt)
    if not (isinstance(lr, (int, float)) and lr > 0 and ref is not None):
        return "unknown"
    decades = math.log10(lr / ref)
    lo, hi = bins.lr_config_edges
    return "low" if decades < lo else ("high" if decades > hi else "typical")


def _init_config(config: dict[str, Any], bins: Bins) -> str:
    """The configured init gain: small | default | large."""
    init = config.get("init")
    gain = init.get("gain") if isinstance(init, dict) else config.get("init_gain")
    if not (isinstance(gain, (int, float)) and gain > 0):
        return "unknown"
    lo, hi = bins.init_gain_edges
    return "small" if gain < lo else ("large" if gain > hi else "default")


def _input_config(config: dict[str, Any], bins: Bins) -> str:
    """Whether the config says the inputs are standardized (and not scaled up)."""
    norm_in = config.get("input_normalization")
    scale_in = config.get("input_scale", 1.0)
    scale_in = scale_in if isinstance(scale_in, (int, float)) else 1.0
    if norm_in is None:
        return "unknown" if scale_in <= bins.input_scale_raw else "raw"
    standardized = str(norm_in).lower() not in ("none", "raw", "false", "")
    return "standardized" if standardized and scale_in <= bins.input_scale_raw else "raw"


def _lr_schedule(trace: Trace, bins: Bins) -> str:
    """``spike`` when the recorded rate jumps above ``lr_spike_factor`` x its median."""
    lr_steps = trace.steps["lr"].to_numpy(dtype=float) if "lr" in trace.steps else np.zeros(0)
    lr_steps = lr_steps[np.isfinite(lr_steps) & (lr_steps > 0)] if len(lr_steps) else lr_steps
    spike = len(lr_steps) > 0 and lr_steps.max() > bins.lr_spike_factor * np.median(lr_steps)
    return "spike" if spike else "steady"


#: Largest slope of the logistic sigmoid (at 0): each sigmoid layer passes at most this share
#: of the backward signal, times its weights' gain (Glorot and Bengio, 2010).
SIGMOID_SLOPE = 0.25
_LAYER_TYPES = ("Linear", "Conv", "Bilinear", "LazyLinear")


def sigmoid_decay(init_gain: float, hidden_layers: int) -> float:
    """Decades by which a stack of sigmoid units would shrink the backward signal.

    Each hidden layer scales the gradient by at most ``SIGMOID_SLOPE`` times its weights'
    gain, so ``hidden_layers`` of them shrink it by ``hidden_layers * log10(0.25 * gain)``
    decades: about -1.4 for three sigmoid layers of He-initialised 64-unit weights (gain
    1.4), which still train, and -2.6 for the same with PyTorch's default init (gain 0.57),
    which stall. It describes the run's depth and weights, whatever its activation is, so a
    what-if that swaps the activation for a sigmoid can ask how that stack would fare.

    Parameters
    ----------
    init_gain : float
        Median std(output)/rms(input) of the run's Linear/Conv layers at its first step
        (``neuraldbg.run_facts.RunFacts.init_gain``).
    hidden_layers : int
        Weighted layers between the first and the output layer's input (weighted layers - 1).

    Returns
    -------
    float
        Non-positive decades (0 without hidden layers); NaN when the gain is unknown.
    """
    if hidden_layers <= 0:
        return 0.0
    if not (math.isfinite(init_gain) and init_gain > 0):
        return float("nan")
    return float(hidden_layers * math.log10(SIGMOID_SLOPE * init_gain))


def sigmoid_decay_state(decades: float, bins: Bins | None = None) -> str:
    """The ``sigmoid_decay`` node's state: ``mild``, ``strong`` or ``severe``."""
    bins = bins or Bins()
    strong, severe = bins.sigmoid_decay_edges
    if not math.isfinite(decades) or decades > strong:
        return "mild"
    return "strong" if decades > severe else "severe"


def observe_stack(trace: Trace, facts: Any, bins: Bins | None = None
                  ) -> tuple[dict[str, str], dict[str, float]]:
    """The ``sigmoid_decay`` and ``optimizer`` context states, the ``weight_scale`` evidence.

    ``optimizer``: ``sgd`` when the optimizer's step grows with the gradient (SGD, with or
    without momentum, and an optimizer the trace does not name:
    :attr:`neuraldbg.run_facts.RunFacts.step_scales_with_gradient`), ``adaptive`` when it
    divides by a running gradient size (Adam and its kin: every step is bounded by the rate).
    ``weight_scale``: ``small`` / ``large`` when the Linear/Conv weights' norm at the first
    step over PyTorch's default (:attr:`neuraldbg.run_facts.RunFacts.weight_scale`) is
    below ``bins.weight_scale_low`` / above ``bins.weight_scale_high``, ``default`` between,
    ``unknown`` when not measured (left out of the evidence).

    Parameters
    ----------
    trace : Trace
    facts : neuraldbg.run_facts.RunFacts
        The heuristic reasoner's run facts (its measured init gain, its optimizer).
    bins : Bins, optional

    Returns
    -------
    states : dict
        ``{"sigmoid_decay": state, "optimizer": state, "weight_scale": state}``.
    features : dict
        ``sigmoid_decay`` (decades, :func:`sigmoid_decay`), ``hidden_layers`` and
        ``weight_scale`` (decades).
    """
    b = bins or Bins()
    types = trace.modules["module_type"].astype(str).tolist()
    hidden = max(0, sum(t.startswith(_LAYER_TYPES) for t in types) - 1)
    decades = sigmoid_decay(float(facts.init_gain), hidden)
    scale = float(facts.weight_scale)
    measured = math.isfinite(scale) and scale > 0
    state = ("unknown" if not measured else "small" if scale < b.weight_scale_low
             else "large" if scale > b.weight_scale_high else "default")
    return ({"sigmoid_decay": sigmoid_decay_state(decades, bins),
             "optimizer": "sgd" if facts.step_scales_with_gradient else "adaptive",
             "weight_scale": state},
            {"sigmoid_decay": decades, "hidden_layers": float(hidden),
             "weight_scale": math.log10(scale) if measured else math.nan})


def observe_cause_signs(trace: Trace, facts: Any, bins: Bins | None = None
                        ) -> tuple[dict[str, str], dict[str, float]]:
    """What the run shows of its cause directly (the ``cause_evidence`` nodes).

    ``weight_rows``: ``identical`` when a weight matrix's rows are copies of each other at
    enter and at the latest flush (the heuristic's ``symmetric_modules``), else ``diverse``;
    ``unknown`` when the capture did not measure it (no weight matrix, an older trace).
    ``dead_onset``: ``start`` when a rectifier layer has more than ``bins.dead_frac`` of its
    units dead at its first recorded step (before any update could kill them) and fed by an
    offset below zero (:func:`_dead_onset`), ``silent`` when it is dead there because its
    input is exactly zero, else ``other`` (units that die only later, or never, or a deep
    stack whose signal faded to its random biases).
    ``nonfinite_loss``: ``from_floor`` when the loss turned non-finite with every module
    output finite right after it reached the bottom
    (:func:`neuraldbg.cause_evidence.unsafe_loss_support` at 0.5 or above), else ``other``.
    ``nonfinite_source``: where a non-finite loss that came out of a calm run came from:
    ``input`` (:attr:`neuraldbg.run_facts.RunFacts.nonfinite_input_step`), ``target``
    (``nonfinite_target_step``, not right after the loss reached the bottom), ``unseen``
    (``calm_nonfinite_step`` or ``nonfinite_entry_module``), else ``other``.
    ``start_grad``: ``large`` when the global gradient norm was above
    ``bins.start_grad_ratio_high`` times the parameter norm at the first step
    (:attr:`neuraldbg.run_facts.RunFacts.start_grad_ratio`), ``small`` when below
    ``bins.start_grad_ratio_low`` times under an optimizer whose step grows with the
    gradient (SGD: the steps are then small at any rate; Adam's are not, and a healthy
    autoencoder under Adam starts at 0.0014), else ``normal`` (also when not measured, and
    under Adam and its kin when a few records far off the rest swing the first layer's
    output, :attr:`neuraldbg.run_facts.RunFacts.input_swing` above
    ``bins.input_swing_high``: the first step's gradient is then theirs, and read as the
    init's it named ``init_scale_too_large`` at 0.52-0.92 on a new user's tables with 99999
    codes; under SGD it still says why the steps were large).

    Parameters
    ----------
    trace : Trace
    facts : neuraldbg.run_facts.RunFacts
        The heuristic reasoner's run facts (the weight-row diversity).
    bins : Bins, optional

    Returns
    -------
    states, features : dict
    """
    b = bins or Bins()
    states: dict[str, str] = {}
    features: dict[str, float] = {}
    states["weight_rows"] = ("unknown" if not math.isfinite(float(facts.row_diversity))
                             else "identical" if facts.symmetric_modules else "diverse")
    features["weight_rows"] = float(facts.row_diversity)
    states["dead_onset"] = _dead_onset(trace, b.dead_frac)
    states["nonfinite_loss"] = "from_floor" if unsafe_loss_support(facts) >= 0.5 else "other"
    features["nonfinite_loss"] = float(facts.nonfinite_from_floor)
    states["nonfinite_source"] = (
        "input" if facts.nonfinite_input_step is not None
        else "target" if (facts.nonfinite_target_step is not None
                          and states["nonfinite_loss"] != "from_floor")
        else "unseen" if (facts.calm_nonfinite_step is not None
                          or facts.nonfinite_entry_module is not None) else "other")
    step = next((s for s in (facts.nonfinite_input_step, facts.nonfinite_target_step,
                             facts.calm_nonfinite_step, facts.nonfinite_entry_step)
                 if s is not None), None)
    features["nonfinite_source"] = float("nan") if step is None else float(step)
    # a few records far off the rest make the first step's gradient theirs, not the init's;
    # under SGD it also says why the steps were large (else the rate takes it), under Adam
    # and its kin, whose steps it does not size, it only misleads
    outliers = (float(facts.input_swing) > b.input_swing_high
                and not facts.step_scales_with_gradient)
    ratio = float("nan") if outliers else float(facts.start_grad_ratio)
    states["start_grad"] = ("large" if ratio > b.start_grad_ratio_high
                            else "small" if (ratio < b.start_grad_ratio_low
                                             and facts.step_scales_with_gradient)
                            else "normal")
    features["start_grad"] = ratio
    return states, features


#: A dead layer's input is switched off by an offset when its mean lies this many standard
#: deviations below zero (a bias of -1 against a spread of 0.2 reads -4.6); a deep stack
#: whose signal has faded to its random biases reads about -0.1 and is not an offset.
DEAD_DRIVE_SIGMAS = 1.0


def _dead_onset(trace: Trace, dead_frac: float) -> str:
    """When rectifier units died (see :func:`observe_cause_signs`).

    At the first recorded step, a dead layer fed by outputs whose mean lies more than
    :data:`DEAD_DRIVE_SIGMAS` standard deviations below zero is ``start`` (an offset that
    switches the units off: a negative bias); one fed by outputs exactly zero is ``silent``
    (weights that compute nothing: an all-zero initialisation). A rectifier that ends the
    network (a ReLU on the logits) is not read: its units die on negative logits.
    """
    mods = trace.modules
    if "activation_family" not in mods or not len(trace.stats):
        return "other"
    names = mods["module_name"].astype(str).tolist()
    rect = mods.loc[mods["activation_family"].astype(str) == "relu", "module_name"]
    stats = trace.stats
    # (one row per module: a merged multi-rank trace has one per rank)
    first = stats[stats["step"] == stats["step"].min()].groupby("module_name")[
        ["act_frac_dead", "act_mean", "act_std"]].mean()
    found = set()
    for name in rect.astype(str):
        if name == names[-1]:
            continue  # a rectifier on the output (its units die on negative logits, whatever
            # the biases): the rules read it (neuraldbg.cause_evidence.clipped_output_support)
        if name not in first.index or not float(first.at[name, "act_frac_dead"]) > dead_frac:
            continue
        i = names.index(name)
        feed = names[i - 1] if i > 0 else None
        if feed not in first.index:
            continue
        mean, std = float(first.at[feed, "act_mean"]), float(first.at[feed, "act_std"])
        if mean == 0.0 and std == 0.0:
            found.add("silent")
        elif mean < -DEAD_DRIVE_SIGMAS * std:
            found.add("start")
    return "start" if "start" in found else "silent" if "silent" in found else "other"


#: States of the rule-evidence nodes that are not failure types or root causes.
RULE_HEALTHY = "healthy"
RULE_NO_CAUSE = "none"
#: How strongly the rules back their top hypothesis: ``none`` (no hypothesis at all), then
#: its confidence against :data:`RULE_STRENGTH_EDGES`.
RULE_STRENGTH_STATES: tuple[str, ...] = ("none", "weak", "moderate", "strong", "certain")
#: Confidence edges between weak | moderate | strong | certain; 0.5 is the contract's
#: healthy threshold, so ``weak`` and ``moderate`` are verdicts the rules call healthy.
RULE_STRENGTH_EDGES: tuple[float, float, float] = (0.3, 0.5, 0.8)


def rule_strength(confidence: float, edges: tuple[float, float, float] = RULE_STRENGTH_EDGES
                  ) -> str:
    """The ``rule_strength`` state of a top hypothesis of confidence ``confidence``."""
    i = int(np.searchsorted(np.asarray(edges, dtype=float), float(confidence), side="right"))
    return RULE_STRENGTH_STATES[1 + i]


def rule_verdict(trace: Trace, hypotheses: list[Any] | None = None) -> dict[str, str]:
    """The heuristic reasoner's verdict on a trace, as graded evidence for the network.

    The rules are a noisy sensor of the failure and its cause. ``rule_failure`` and
    ``rule_cause`` are the top hypothesis's failure type and root cause *whatever its
    confidence* (``"healthy"`` / ``"none"`` only when the rules name no hypothesis at all),
    and ``rule_strength`` grades that confidence (:func:`rule_strength`). A verdict under
    the contract's 0.5 line is still evidence: the rules list a weak explosion on healthy
    runs rarely, and on runs whose fault shows mildly often, and the cause they name there
    is usually the true one. The network learns how far to trust each grade
    (P(rule verdict | truth)) from the zoo, starting from a prior that trusts the stronger
    grades more.

    Parameters
    ----------
    trace : Trace
    hypotheses : list of Hypothesis, optional
        The heuristic reasoner's hypotheses on ``trace`` when already computed.

    Returns
    -------
    dict
        ``{"rule_failure": ..., "rule_cause": ..., "rule_strength": ...}``.
    """
    from neuraldbg.methods import get_method

    hyps = get_method("heuristic").explain(trace) if hypotheses is None else hypotheses
    if not hyps:
        return {"rule_failure": RULE_HEALTHY, "rule_cause": RULE_NO_CAUSE,
                "rule_strength": RULE_STRENGTH_STATES[0]}
    top = max(hyps, key=lambda h: float(h.confidence))
    return {"rule_failure": top.failure_type, "rule_cause": top.root_cause,
            "rule_strength": rule_strength(float(top.confidence))}
