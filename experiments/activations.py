"""Activation families: a deep sigmoid stack whose gradients vanish."""

from __future__ import annotations

from experiments.families import register_family
from experiments.scenario import (ArchConfig, DataConfig, OnsetRule, Scenario, Manifestation,
                                  TrainConfig)

__all__: list[str] = []


@register_family(
    name="deep_sigmoid",
    kind="failure",
    architecture="MLP",
    data="digits",
    description="An MLP of sigmoid layers (He initialisation), as many as the severity: "
                "each sigmoid scales the backward signal by at most 1/4, so the first layers "
                "receive almost no gradient and the loss stalls.",
    default_severity=8.0,
    severities=(3.0, 4.0, 6.0, 8.0, 10.0),
    baseline_severity=2.0,
    failure_type="vanishing_gradients",
    root_cause="saturating_activation",
    canonical_fix={"activation": "relu"},
    equivalent_fixes=({"activation": "leaky_relu"}, {"normalization": "batch"}),
    counterfactuals=(
        {"knobs": {"lr_scale": 10.0}, "expected": "vanishing_gradients"},
        {"knobs": {"grad_clip": 1.0}, "expected": "vanishing_gradients"},
    ),
)
def _deep_sigmoid(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("mlp", depth=int(severity), width=64, activation="sigmoid",
                        init="kaiming"),
        data=DataConfig("digits"),
        train=TrainConfig(lr=0.05, momentum=0.9, steps=200),
        origin_layers=("fc1", "act1", "fc2", "act2"),
        origin_scope="layer",
        onset=OnsetRule("fixed", step=0, tolerance=5),
        manifestations=(Manifestation("out_grad_norm", module="fc1", direction="less", scale="log",
                          margin=1.0),
                  Manifestation("loss_ratio", direction="greater", scale="log", margin=0.3)),
    )
