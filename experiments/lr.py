"""Learning-rate families: too high, too low, a spike at a chosen step, and dying ReLUs
caused by a high learning rate (the same symptom as a negative bias, another cause)."""

from __future__ import annotations

from experiments.families import register_family
from experiments.scenario import (ArchConfig, DataConfig, OnsetRule, Scenario, Manifestation,
                                  TrainConfig)

__all__: list[str] = []


@register_family(
    name="lr_too_high",
    kind="failure",
    architecture="CNN",
    data="digits_image",
    description="SGD (momentum 0.9) on a leaky-ReLU CNN with the learning rate multiplied by "
                "the severity: gradient norms grow by orders of magnitude, then the loss "
                "turns non-finite.",
    default_severity=10.0,
    severities=(2.0, 3.0, 5.0, 10.0, 30.0),
    baseline_severity=1.0,
    failure_type="exploding_gradients",
    root_cause="learning_rate_too_high",
    canonical_fix={"lr_scale": 0.1},
    equivalent_fixes=({"lr_scale": 0.2},),
    counterfactuals=(
        {"knobs": {"lr_scale": 0.5}, "expected": "exploding_gradients"},
        # the same cause with tanh units shows as saturation, not as exploding gradients
        {"knobs": {"activation": "tanh"}, "expected": "saturated_activations"},
    ),
)
def _lr_too_high(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("cnn", depth=2, width=16, activation="leaky_relu"),
        data=DataConfig("digits_image"),
        train=TrainConfig(lr=0.05 * severity, momentum=0.9, steps=200),
        origin_scope="global",
        onset=OnsetRule("twin", statistic="grad_norm", scale="log", margin=1.0, tolerance=5),
        manifestations=(Manifestation("max_grad_norm", direction="greater", scale="log", margin=1.0),
                  Manifestation("loss_ratio", direction="greater", scale="log", margin=0.3)),
    )


@register_family(
    name="lr_too_low",
    kind="failure",
    architecture="Transformer",
    data="sequence",
    description="Adam on a small pre-norm Transformer with the learning rate divided by the "
                "severity: gradients stay healthy but the loss does not move (plateau).",
    default_severity=100.0,
    severities=(3.0, 10.0, 30.0, 100.0, 1000.0),
    baseline_severity=1.0,
    failure_type="training_plateau",
    root_cause="learning_rate_too_low",
    canonical_fix={"lr_scale": 100.0},
    equivalent_fixes=(),
    counterfactuals=(
        {"knobs": {"lr_scale": 3.0}, "expected": "training_plateau"},
        {"knobs": {"grad_clip": 1.0}, "expected": "training_plateau"},
    ),
)
def _lr_too_low(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("transformer", depth=1, width=16, activation="gelu",
                        normalization="layer", heads=2),
        data=DataConfig("sequence", n_features=8, n_classes=4, seq_len=12),
        train=TrainConfig(optimizer="adam", lr=3e-3 / severity, steps=150, batch_size=32),
        origin_scope="global",
        # The fault acts from step 0; the loss separates from the healthy run's between
        # steps ~20 and ~60 (measured across seeds), hence the wide tolerance.
        onset=OnsetRule("fixed", step=0, tolerance=60),
        manifestations=(Manifestation("loss_ratio", direction="greater", scale="log", margin=0.15),),
    )


_SPIKE_STEP = 100


@register_family(
    name="lr_spike",
    kind="failure",
    architecture="MLP",
    data="digits",
    description=f"A leaky-ReLU MLP trains healthily until a schedule bug multiplies the "
                f"learning rate by the severity for 3 steps from step {_SPIKE_STEP}: the loss "
                "blows up at once (delayed onset, no gradient lead).",
    default_severity=30.0,
    severities=(3.0, 10.0, 30.0, 100.0),
    baseline_severity=1.0,
    failure_type="loss_divergence",
    root_cause="learning_rate_too_high",
    canonical_fix={"lr_scale": 0.1},
    # clipping bounds the spike's updates: the loss jumps but the run recovers
    equivalent_fixes=({"lr_scale": 0.2}, {"lr_scale": 0.5}, {"grad_clip": 1.0},
                      {"grad_clip": 0.3}),
    counterfactuals=(
        {"knobs": {"lr_scale": 2.0}, "expected": "loss_divergence"},
        {"knobs": {"init_scale": 2.0}, "expected": "loss_divergence"},
    ),
)
def _lr_spike(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("mlp", depth=3, width=64, activation="leaky_relu"),
        data=DataConfig("digits"),
        train=TrainConfig(lr=0.05, momentum=0.9, steps=200,
                          lr_spike=(_SPIKE_STEP, severity, 3)),
        origin_scope="global",
        onset=OnsetRule("fixed", step=_SPIKE_STEP, tolerance=3),
        manifestations=(Manifestation("max_loss_jump", direction="greater", scale="log", margin=0.5),),
    )


@register_family(
    name="dead_relu_high_lr",
    kind="failure",
    architecture="MLP",
    data="digits",
    description="A ReLU MLP under Adam with the learning rate multiplied by the severity "
                "(from 1e-3): large early updates push most of the second hidden layer's "
                "pre-activations below zero for every sample and those units die. The same "
                "symptom as a negative bias, a different cause.",
    default_severity=100.0,
    severities=(10.0, 30.0, 100.0, 300.0),
    baseline_severity=1.0,
    failure_type="dead_neurons",
    root_cause="learning_rate_too_high",
    canonical_fix={"lr_scale": 0.01},
    equivalent_fixes=({"lr_scale": 0.1}, {"normalization": "batch"}),
    counterfactuals=(
        {"knobs": {"grad_clip": 1.0}, "expected": "dead_neurons"},
    ),
)
def _dead_relu_high_lr(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("mlp", depth=3, width=64, activation="relu"),
        data=DataConfig("digits"),
        train=TrainConfig(optimizer="adam", lr=1e-3 * severity, steps=200),
        origin_layers=("fc2", "act2"),
        origin_scope="layer",
        onset=OnsetRule("twin", statistic="act_frac_dead", module="act2", scale="linear",
                        margin=0.3, tolerance=5),
        manifestations=(Manifestation("dead_share", module="act2", direction="greater", scale="linear",
                          margin=0.3),),
    )
