"""Compound families: two faults at once, so a ranking must name both causes, and a repair
must undo both."""

from __future__ import annotations

from experiments.families import register_family
from experiments.scenario import (ArchConfig, DataConfig, OnsetRule, Scenario, Manifestation,
                                  TrainConfig)

__all__: list[str] = []


@register_family(
    name="compound_dead_and_slow",
    kind="failure",
    architecture="MLP",
    data="digits",
    description="Two faults with different symptoms at once: the second hidden layer's bias "
                "is initialised to minus the severity (act2 dead from step 0) and the "
                "learning rate is 1000x too low. Fixing one leaves the other failing. "
                "Severity 0 is the baseline without either fault.",
    default_severity=10.0,
    severities=(1.0, 3.0, 10.0),
    baseline_severity=0.0,
    failure_type="dead_neurons",
    root_cause="negative_bias_init",
    root_causes=("negative_bias_init", "learning_rate_too_low"),
    secondary_failure_types=("training_plateau",),
    canonical_fix={"normalization": "batch", "lr_scale": 1000.0},
    equivalent_fixes=(),
    counterfactuals=(
        {"knobs": {"normalization": "batch"}, "expected": "training_plateau",
         "root_cause": "learning_rate_too_low"},
        {"knobs": {"lr_scale": 1000.0}, "expected": "dead_neurons",
         "root_cause": "negative_bias_init"},
    ),
)
def _compound_dead_and_slow(severity: float) -> Scenario:
    faulty = severity > 0
    return Scenario(
        arch=ArchConfig("mlp", depth=3, width=64, activation="relu",
                        bias_fill=(("fc2", -severity),) if faulty else ()),
        data=DataConfig("digits"),
        train=TrainConfig(lr=0.05 / 1000 if faulty else 0.05, momentum=0.9, steps=200),
        origin_layers=("fc2", "act2"),
        origin_scope="layer",
        onset=OnsetRule("fixed", step=0, tolerance=3),
        manifestations=(Manifestation("dead_share", module="act2", direction="greater", scale="linear",
                          margin=0.3),
                  Manifestation("loss_ratio", direction="greater", scale="log", margin=0.3)),
    )


@register_family(
    name="compound_explode_two_causes",
    kind="failure",
    architecture="MLP",
    data="teacher",
    description="One symptom from two causes at once: a 6-layer leaky-ReLU MLP with He "
                "initialisation times the severity and the learning rate times 50x the "
                "severity; gradients explode. Severity 1 is the baseline without either "
                "fault.",
    default_severity=3.0,
    severities=(1.5, 2.0, 3.0, 4.0),
    baseline_severity=1.0,
    failure_type="exploding_gradients",
    root_cause="init_scale_too_large",
    root_causes=("init_scale_too_large", "learning_rate_too_high"),
    canonical_fix={"init_scale": 1 / 3, "lr_scale": 1 / 150},
    equivalent_fixes=(),
    counterfactuals=(
        {"knobs": {"init_scale": 1 / 3}, "expected": "exploding_gradients",
         "root_cause": "learning_rate_too_high"},
        {"knobs": {"lr_scale": 1 / 150}, "expected": "exploding_gradients",
         "root_cause": "init_scale_too_large"},
    ),
)
def _compound_explode_two_causes(severity: float) -> Scenario:
    lr_mult = 1.0 if severity == 1.0 else 50.0 * severity
    return Scenario(
        arch=ArchConfig("mlp", depth=6, width=64, activation="leaky_relu", init="kaiming",
                        init_gain=severity),
        data=DataConfig("teacher"),
        train=TrainConfig(lr=0.01 * lr_mult, momentum=0.9, steps=200),
        origin_scope="global",
        onset=OnsetRule("twin", statistic="grad_norm", scale="log", margin=1.0, tolerance=5),
        manifestations=(Manifestation("max_grad_norm", direction="greater", scale="log", margin=1.0),
                  Manifestation("loss_ratio", direction="greater", scale="log", margin=0.3)),
    )
