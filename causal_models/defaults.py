"""The default failure modes and root causes: the rules the network's priors come from.

Registered through :mod:`causal_models.registry`'s public decorators, exactly as a
researcher's extension is. The package's ``__init__`` imports this module before anything
else, so the defaults are registered whenever any part of ``causal_models`` is imported.

Each failure mode's *signature* says what it does to the discrete states of
:mod:`causal_models.discretize`; each root cause's *rule* is the prior probability of its
fault given the fault's parents (knobs, context, latent traits).
"""

from __future__ import annotations

from causal_models.registry import register_code_bug, register_failure_mode, register_root_cause
from neuraldbg.records import FAILURE_TYPES, HEALTHY

__all__: list[str] = []

#: P(fault) one level off "ok": the level straddles the tolerance edge (a level is one decade
#: of the knob, half a decade for the init scale), so a run there fails about half the time;
#: two levels off, it fails.
BOUNDARY = 0.5

# Signatures: what each failure mode does to the discrete states (causal_models.discretize).
register_failure_mode(HEALTHY, description="trains normally", signature={
    "loss": {"decreasing": 1.0, "low": 1.0, "flat": 0.3},
    "loss.early": {"decreasing": 1.0, "flat": 0.7, "low": 0.3},
    "grad": {"healthy": 1.0}, "act": {"normal": 1.0},
    "progress": {"learned": 1.0, "partial": 0.3}, "spikes": {"calm": 1.0, "spiky": 0.3},
    "grad_ratio": {"balanced": 1.0}})
register_failure_mode("vanishing_gradients", description="gradients die out toward the input",
                      signature={
    "loss": {"flat": 1.0, "decreasing": 0.2}, "grad.input": {"vanishing": 1.0, "healthy": 0.2},
    "grad.output": {"healthy": 1.0}, "act": {"normal": 1.0, "saturated": 0.5},
    "progress": {"none": 1.0, "partial": 0.5}, "spikes": {"calm": 1.0},
    "grad_ratio": {"vanishing": 1.0, "dead": 0.2}})
register_failure_mode("exploding_gradients", description="gradients grow by orders of magnitude",
                      signature={
    "loss.early": {"flat": 1.0, "decreasing": 0.5, "rising": 0.3},
    # the heuristic's impact term: a blow-up or a stall counts in full (sporadic bursts in a
    # recurrence keep the loss from settling), a run that still learns at 0.4
    "loss.late": {"rising": 1.0, "nonfinite": 1.0, "flat": 1.0, "decreasing": 0.4,
                  "low": 0.4},
    "grad.early": {"healthy": 1.0, "exploding": 0.5},
    # sporadic bursts leave a slice's mean log-gradient healthy
    "grad.late": {"exploding": 1.0, "nonfinite": 0.4, "healthy": 0.4},
    "act.late": {"anomalous": 1.0, "normal": 0.5},
    "progress": {"nonfinite": 1.0, "worse": 0.7, "none": 1.0, "partial": 0.4, "learned": 0.4},
    "spikes": {"extreme": 1.0, "nonfinite": 1.0, "spiky": 1.0},
    "grad_ratio": {"balanced": 1.0, "growing": 1.0}})
register_failure_mode("dead_neurons", description="rectifier units output zero for every input",
                      signature={
    # the heuristic's impact term: dead units that stall the loss count in full, dead units
    # the surviving ones learn around at 0.4
    "loss": {"flat": 1.0, "decreasing": 0.4, "low": 0.4}, "act": {"dead": 1.0, "normal": 0.3},
    "grad.input": {"vanishing": 1.0, "healthy": 0.5},
    "progress": {"none": 1.0, "partial": 0.4, "learned": 0.4, "worse": 0.3},
    "spikes": {"calm": 1.0, "spiky": 0.5},
    "grad_ratio": {"dead": 1.0, "vanishing": 0.5, "balanced": 0.5}})
register_failure_mode("saturated_activations", description="sigmoid/tanh units stuck in the tails",
                      signature={
    "loss": {"flat": 1.0}, "act": {"saturated": 1.0, "normal": 0.3},
    "grad.input": {"vanishing": 1.0, "healthy": 0.5},
    "progress": {"none": 1.0, "partial": 0.8}, "grad_ratio": {"balanced": 1.0, "vanishing": 0.5}})
register_failure_mode("loss_divergence", description="loss blows up or turns non-finite",
                      signature={
    "loss.early": {"flat": 1.0, "decreasing": 0.7, "rising": 0.5},
    "loss.late": {"nonfinite": 1.0, "rising": 0.8},
    "grad.early": {"healthy": 1.0}, "grad.late": {"nonfinite": 1.0, "healthy": 0.3},
    "act.late": {"anomalous": 1.0, "normal": 0.5},
    "progress": {"nonfinite": 1.0, "worse": 0.8}, "spikes": {"nonfinite": 1.0, "extreme": 0.8},
    "grad_ratio": {"balanced": 1.0, "growing": 0.5}})
register_failure_mode("training_plateau", description="loss does not move with healthy gradients",
                      signature={
    "loss": {"flat": 1.0, "decreasing": 0.1}, "grad": {"healthy": 1.0}, "act": {"normal": 1.0},
    # a stall *with healthy gradients* (the contract): gradient spikes contradict it
    "progress": {"none": 1.0, "partial": 0.3},
    "spikes": {"calm": 1.0, "spiky": 0.005, "extreme": 0.005, "nonfinite": 0.005},
    "grad_ratio": {"balanced": 1.0}})


@register_root_cause("learning_rate_too_high",
                     parents=("lr_level", "clipping", "normalization", "lr_schedule", "arch",
                              "optimizer"),
                     knob="lr_scale",
                     failure_types={"loss_divergence": 1.0, "exploding_gradients": 0.8,
                                    "dead_neurons": 0.2, "training_plateau": 0.1},
                     description="steps too large for the loss surface")
def _lr_high(lr_level: str, clipping: str, normalization: str, lr_schedule: str,
             arch: str, optimizer: str) -> float:
    p = {"high": BOUNDARY, "very_high": 0.97}.get(lr_level, 0.01)
    if clipping != "none":
        # clipping bounds the few huge steps of a rate spike; a rate that is too high at
        # every step still moves too far, less so when every update is capped
        p *= 0.05 if lr_schedule == "spike" else (0.5 if clipping == "tight" else 0.8)
    if normalization == "none" or arch == "attention":
        # attention's query and key weights feed a softmax, not a normalization, and their
        # logits grow with every large step
        return p
    # a normalization after a layer makes it blind to its weights' scale, so a large step
    # grows those weights and shrinks the next steps. Under SGD the step grows with the
    # gradient, and two decades up the first steps overshoot before that (the randomised
    # corpus, SGD with momentum and batch norm: 10 of 10 runs failed at 31-100x their rate,
    # 3 of 30 at 10-31x against 9 of 20 without it); Adam bounds every step by the rate (the
    # zoo's ReLU MLP at 100x under Adam trains with batch norm)
    return p * (0.9 if lr_level == "very_high" and optimizer == "sgd" else 0.3)


@register_root_cause("learning_rate_too_low", parents=("lr_level",), knob="lr_scale",
                     failure_types={"training_plateau": 1.0, "vanishing_gradients": 0.1},
                     description="steps too small to make progress")
def _lr_low(lr_level: str) -> float:
    return {"low": BOUNDARY, "very_low": 0.97}.get(lr_level, 0.01)


@register_root_cause("init_scale_too_large", parents=("init_level", "normalization"),
                     knob="init_scale",
                     failure_types={"exploding_gradients": 1.0, "loss_divergence": 0.6,
                                    "saturated_activations": 0.3},
                     description="weights so large that signals grow layer by layer")
def _init_large(init_level: str, normalization: str) -> float:
    base = {"large": BOUNDARY, "very_large": 0.97}.get(init_level, 0.01)
    return base if normalization == "none" else base * 0.15  # normalization rescales


@register_root_cause("init_scale_too_small", parents=("init_level", "normalization"),
                     knob="init_scale",
                     failure_types={"vanishing_gradients": 1.0, "training_plateau": 0.4},
                     description="weights so small that signals shrink layer by layer")
def _init_small(init_level: str, normalization: str) -> float:
    base = {"small": BOUNDARY, "very_small": 0.97}.get(init_level, 0.01)
    return base if normalization == "none" else base * 0.15


@register_root_cause("saturating_activation",
                     parents=("activation", "depth", "normalization", "sigmoid_decay"),
                     knob="activation",
                     failure_types={"vanishing_gradients": 1.0, "saturated_activations": 0.8,
                                    "training_plateau": 0.2},
                     description="sigmoid/tanh derivatives shrink the gradient at every layer")
def _saturating(activation: str, depth: str, normalization: str, sigmoid_decay: str) -> float:
    if activation == "sigmoid":
        # a sigmoid passes at most a quarter of the signal per layer, times the weights'
        # gain: what stalls the stack is the decay over its depth, not its depth alone
        p = {"mild": 0.1, "strong": 0.7, "severe": 0.9}[sigmoid_decay]
    elif activation == "tanh":
        p = 0.7 if depth == "deep" else 0.15
    else:
        return 0.01
    return p if normalization == "none" else p * 0.3


@register_root_cause("negative_bias_init", parents=("bias_init", "activation", "normalization"),
                     traits={"bias_init": ("ok", "negative")}, knob="activation",
                     failure_types={"dead_neurons": 1.0, "vanishing_gradients": 0.3},
                     description="large negative biases switch rectifier units off for good")
def _negative_bias(bias_init: str, activation: str, normalization: str) -> float:
    if bias_init != "negative":
        return 0.01
    # a leaky slope of 0.01 barely moves a bias of -10; GELU's tail is flat too
    p = {"relu": 0.95, "leaky_relu": 0.85, "gelu": 0.5}.get(activation, 0.3)
    return p if normalization == "none" else p * 0.1  # normalization re-centres the units


@register_root_cause("unnormalized_inputs",
                     parents=("input_level", "normalization", "activation", "clipping",
                              "lr_level", "optimizer"),
                     knob="input_scale",
                     failure_types={"exploding_gradients": 1.0, "loss_divergence": 0.8,
                                    "saturated_activations": 0.6, "dead_neurons": 0.3},
                     description="raw inputs on a scale the first layer cannot absorb")
def _unnormalized(input_level: str, normalization: str, activation: str,
                  clipping: str, lr_level: str, optimizer: str) -> float:
    base = {"large": BOUNDARY, "very_large": 0.97}.get(input_level, 0.01)
    if activation not in ("sigmoid", "tanh"):
        # a saturating unit saturates on the first raw batch; through a rectifier the raw
        # scale blows the outputs up over training, which capped steps hold off, and so do
        # steps a decade smaller (as for missing clipping) where the step grows with the
        # gradient the raw scale inflates: under SGD (digits x1000, ReLU MLP: 0.10 at 1e-2,
        # 0.84 at 1e-3). Adam steps by the rate whatever the gradient's scale: raw inputs
        # that fail it fail a tenth of its rate too (a 1-D CNN on inputs x1000 + 20000, and
        # digits + 1000: 0.10 at 1e-3 and at 1e-4)
        if clipping != "none":
            base *= 0.2 if clipping == "tight" else 0.5
        if lr_level in ("low", "very_low") and optimizer == "sgd":
            base *= 0.2
    return base if normalization == "none" else base * 0.15


@register_root_cause("missing_normalization", parents=("normalization", "depth", "clipping"),
                     knob="normalization",
                     # a stack that attenuates through depth decays, one that amplifies (a
                     # residual stream) blows up: the heuristic names it for both alike
                     failure_types={"vanishing_gradients": 1.0, "exploding_gradients": 1.0,
                                    "training_plateau": 0.4},
                     # a residual stream without normalization grows block by block
                     signs={"fwd_gain": {"growing": 1.0, "stable": 0.5}},
                     description="a deep stack without normalization layers")
def _missing_norm(normalization: str, depth: str, clipping: str) -> float:
    if normalization != "none":
        return 0.01
    p = 0.3 if depth == "deep" else 0.03
    # clipping caps the residual blow-up, the more the more steps it caps
    return p * {"tight": 0.2, "peaks": 0.5}.get(clipping, 1.0)


@register_root_cause("missing_gradient_clipping",
                     parents=("clipping", "arch", "lr_level", "init_level"), knob="grad_clip",
                     # bursts the optimizer recovers from keep the loss from settling: a
                     # stall with gradient spikes (the exploding signature's impact term)
                     failure_types={"exploding_gradients": 1.0, "loss_divergence": 0.7,
                                    "training_plateau": 0.3},
                     description="rare huge gradients (long recurrences) reach the update")
def _missing_clip(clipping: str, arch: str, lr_level: str, init_level: str) -> float:
    if clipping != "none":
        return 0.01
    p = 0.4 if arch == "recurrent" else 0.05
    if lr_level in ("low", "very_low"):  # smaller steps, smaller blow-ups
        p *= 0.2
    if init_level in ("small", "very_small"):  # a contracting recurrence does not explode
        p *= 0.2
    return p


@register_root_cause("unknown", failure_types={ft: 1.0 for ft in FAILURE_TYPES},
                     priority=0.1, description="a failure none of the registered causes explains")
def _unknown() -> float:
    return 0.03



# Code bugs: causes no knob drives (no fault node). What each mechanism ends in, as
# CONTRACT.md's vocabulary describes it; the data outweigh it wherever a family shows the bug.
# gradients summed over steps grow like a running sum until the updates blow up; as a rate
# too high does, the outsized updates kill rectifier units (an accumulation loop clearing the
# gradients every 8 steps killed the ReLU before a CNN's head, and the network, which had no
# way to name the bug with dead units, said negative_bias_init on 12 such runs of a probe)
register_code_bug("missing_zero_grad", failure_types={
    "exploding_gradients": 1.0, "loss_divergence": 0.5, "training_plateau": 0.3,
    "dead_neurons": 0.5})
# probabilities fed to a loss that expects logits: a flat, saturated loss surface; a loss
# written on probabilities reaches log(0) once they round to 0 or 1 (NaN, outputs finite)
register_code_bug("loss_output_mismatch", failure_types={
    "training_plateau": 1.0, "saturated_activations": 0.3, "vanishing_gradients": 0.3,
    "loss_divergence": 0.3})
# targets far off the output scale: the loss stalls high, or its huge gradients blow up
register_code_bug("unscaled_targets", failure_types={
    "training_plateau": 1.0, "loss_divergence": 0.5, "exploding_gradients": 0.3})
# identical units receive identical updates: the gradient signal collapses and learning stalls
register_code_bug("symmetric_init", failure_types={
    "vanishing_gradients": 1.0, "training_plateau": 0.8})
# labels unrelated to inputs: a stall with healthy gradients; a batch that carries NaN or
# Inf: the loss turns non-finite at once
register_code_bug("data_problem", failure_types={"training_plateau": 1.0,
                                                 "loss_divergence": 0.3})
# layers cut off from the gradient do not learn: a stall, gradients vanishing before the cut
register_code_bug("gradient_blocked", failure_types={
    "training_plateau": 1.0, "vanishing_gradients": 0.5})
