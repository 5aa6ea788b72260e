"""Initialisation families: weights too large, too small, and a large negative bias that
kills one ReLU layer."""

from __future__ import annotations

from experiments.families import register_family
from experiments.scenario import (ArchConfig, DataConfig, OnsetRule, Scenario, Manifestation,
                                  TrainConfig)

__all__: list[str] = []


@register_family(
    name="init_too_large",
    kind="failure",
    architecture="MLP",
    data="teacher",
    description="A 6-layer ReLU MLP with He initialisation multiplied by the severity: "
                "activations and gradients grow with depth from step 0 and the loss turns "
                "non-finite within a few steps.",
    default_severity=3.0,
    severities=(1.5, 2.0, 3.0, 5.0),
    baseline_severity=1.0,
    failure_type="exploding_gradients",
    root_cause="init_scale_too_large",
    canonical_fix={"init_scale": 1 / 3},
    equivalent_fixes=({"normalization": "batch"},),
    counterfactuals=(
        {"knobs": {"lr_scale": 0.1}, "expected": "exploding_gradients"},
    ),
)
def _init_too_large(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("mlp", depth=6, width=64, activation="relu", init="kaiming",
                        init_gain=severity),
        data=DataConfig("teacher"),
        train=TrainConfig(lr=0.01, momentum=0.9, steps=200),
        origin_scope="global",
        onset=OnsetRule("fixed", step=0, tolerance=3),
        manifestations=(Manifestation("max_grad_norm", direction="greater", scale="log", margin=1.0),
                  Manifestation("max_act", direction="greater", scale="log", margin=1.0)),
    )


@register_family(
    name="init_too_small",
    kind="failure",
    architecture="MLP",
    data="teacher",
    description="A 6-layer tanh MLP with Xavier initialisation multiplied by the severity: "
                "the signal shrinks layer by layer, gradients at the first layers vanish and "
                "the loss stalls.",
    default_severity=0.1,
    severities=(0.5, 0.3, 0.2, 0.1, 0.03),
    baseline_severity=1.0,
    failure_type="vanishing_gradients",
    root_cause="init_scale_too_small",
    canonical_fix={"init_scale": 10.0},
    equivalent_fixes=(),
    counterfactuals=(
        {"knobs": {"lr_scale": 10.0}, "expected": "vanishing_gradients"},
        {"knobs": {"activation": "relu"}, "expected": "vanishing_gradients"},
    ),
)
def _init_too_small(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("mlp", depth=6, width=64, activation="tanh", init="xavier",
                        init_gain=severity),
        data=DataConfig("teacher"),
        train=TrainConfig(lr=0.05, momentum=0.9, steps=200),
        origin_layers=("fc1", "act1", "fc2", "act2"),
        origin_scope="layer",
        onset=OnsetRule("fixed", step=0, tolerance=5),
        manifestations=(Manifestation("out_grad_norm", module="fc1", direction="less", scale="log",
                          margin=1.0),
                  Manifestation("loss_ratio", direction="greater", scale="log", margin=0.3)),
    )


@register_family(
    name="dead_relu_bias",
    kind="failure",
    architecture="MLP",
    data="digits",
    description="A ReLU MLP whose second hidden layer's bias is initialised to minus the "
                "severity: every unit of act2 is dead from step 0 and the loss stalls.",
    default_severity=10.0,
    severities=(0.1, 0.25, 0.5, 1.0, 3.0, 10.0),
    baseline_severity=0.0,
    failure_type="dead_neurons",
    root_cause="negative_bias_init",
    canonical_fix={"normalization": "batch"},
    equivalent_fixes=(),
    counterfactuals=(
        {"knobs": {"lr_scale": 10.0}, "expected": "dead_neurons"},
        # leaky units are never exactly zero, but with this bias they carry no signal
        {"knobs": {"activation": "leaky_relu"}, "expected": "training_plateau"},
    ),
)
def _dead_relu_bias(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("mlp", depth=3, width=64, activation="relu",
                        bias_fill=(("fc2", -severity),)),
        data=DataConfig("digits"),
        train=TrainConfig(lr=0.05, momentum=0.9, steps=200),
        origin_layers=("fc2", "act2"),
        origin_scope="layer",
        onset=OnsetRule("fixed", step=0, tolerance=3),
        manifestations=(Manifestation("dead_share", module="act2", direction="greater", scale="linear",
                          margin=0.3),),
    )
