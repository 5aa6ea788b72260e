"""Data families: unnormalised inputs that saturate the first tanh layer."""

from __future__ import annotations

from experiments.families import register_family
from experiments.scenario import (ArchConfig, DataConfig, OnsetRule, Scenario, Manifestation,
                                  TrainConfig)

__all__: list[str] = []


@register_family(
    name="unnormalized_inputs",
    kind="failure",
    architecture="MLP",
    data="digits",
    description="A tanh MLP fed raw digit intensities (0..16) times the severity instead of "
                "standardised features: the first tanh layer is saturated from step 0. "
                "Severity 0 is the standardised baseline.",
    default_severity=4.0,
    severities=(0.25, 1.0, 4.0, 16.0),
    baseline_severity=0.0,
    failure_type="saturated_activations",
    root_cause="unnormalized_inputs",
    canonical_fix={"input_scale": 1 / 64},
    equivalent_fixes=({"normalization": "batch"},),
    counterfactuals=(
        {"knobs": {"lr_scale": 0.1}, "expected": "saturated_activations"},
        {"knobs": {"init_scale": 0.1}, "expected": "saturated_activations"},
    ),
)
def _unnormalized_inputs(severity: float) -> Scenario:
    raw = severity > 0
    return Scenario(
        arch=ArchConfig("mlp", depth=2, width=64, activation="tanh"),
        data=DataConfig("digits", standardize=not raw, raw_scale=severity if raw else 1.0),
        train=TrainConfig(lr=0.05, momentum=0.9, steps=200),
        origin_layers=("fc1", "act1"),
        origin_scope="layer",
        onset=OnsetRule("fixed", step=0, tolerance=3),
        manifestations=(Manifestation("saturated_share", module="act1", direction="greater",
                          scale="linear", margin=0.3),),
    )
