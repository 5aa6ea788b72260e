"""Numerical families: a hand-written softmax cross-entropy that overflows."""

from __future__ import annotations

from experiments.families import register_family
from experiments.scenario import (ArchConfig, DataConfig, OnsetRule, Scenario, Manifestation,
                                  TrainConfig)

__all__: list[str] = []


@register_family(
    name="softmax_overflow",
    kind="failure",
    architecture="MLP",
    data="digits",
    description="A leaky-ReLU MLP trained with a hand-written softmax cross-entropy "
                "(log(sum(exp(z))) without the max shift) on raw digit intensities times "
                "the severity: the logits grow until exp overflows float32 and the loss is "
                "non-finite at a step the run records (no gradient lead). Severity 0 is the "
                "standardised baseline.",
    default_severity=8.0,
    severities=(2.0, 4.0, 8.0, 16.0),
    baseline_severity=0.0,
    failure_type="loss_divergence",
    root_cause="unnormalized_inputs",
    canonical_fix={"input_scale": 1 / 128},
    equivalent_fixes=({"lr_scale": 0.1}, {"grad_clip": 1.0}, {"normalization": "batch"}),
    counterfactuals=(
        {"knobs": {"lr_scale": 2.0}, "expected": "loss_divergence"},
        {"knobs": {"init_scale": 2.0}, "expected": "loss_divergence"},
        {"knobs": {"activation": "tanh"}, "expected": "saturated_activations"},
    ),
)
def _softmax_overflow(severity: float) -> Scenario:
    raw = severity > 0
    return Scenario(
        arch=ArchConfig("mlp", depth=2, width=64, activation="leaky_relu"),
        data=DataConfig("digits", standardize=not raw, raw_scale=severity if raw else 1.0),
        train=TrainConfig(lr=0.01, momentum=0.9, steps=200, loss="naive_cross_entropy"),
        origin_layers=("out",),
        origin_scope="layer",
        onset=OnsetRule("nonfinite", tolerance=2),
        manifestations=(Manifestation("nonfinite_step", direction="less", scale="linear", margin=20.0),),
    )
