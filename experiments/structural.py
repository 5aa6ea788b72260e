"""Structural families: a deep residual network without normalization, a recurrent network
on long sequences without gradient clipping."""

from __future__ import annotations

from experiments.families import register_family
from experiments.scenario import (ArchConfig, DataConfig, OnsetRule, Scenario, Manifestation,
                                  TrainConfig)

__all__: list[str] = []


@register_family(
    name="resnet_no_norm",
    kind="failure",
    architecture="residual",
    data="teacher",
    description="A residual MLP with He-initialised blocks and no normalization, as many "
                "blocks as the severity: each block adds a branch as large as its input, so "
                "the residual stream (and the gradient) grows geometrically with depth and "
                "the loss turns non-finite within a few steps.",
    default_severity=8.0,
    severities=(3.0, 4.0, 6.0, 8.0, 12.0),
    baseline_severity=2.0,
    failure_type="exploding_gradients",
    root_cause="missing_normalization",
    canonical_fix={"normalization": "batch"},
    # clipping keeps the huge residual stream from wrecking the weights: the run trains
    equivalent_fixes=({"normalization": "layer"}, {"grad_clip": 1.0}),
    counterfactuals=(
        {"knobs": {"lr_scale": 0.3}, "expected": "exploding_gradients"},
        {"knobs": {"init_scale": 1.5}, "expected": "exploding_gradients"},
        {"knobs": {"activation": "tanh"}, "expected": "saturated_activations"},
    ),
)
def _resnet_no_norm(severity: float) -> Scenario:
    depth = int(severity)
    return Scenario(
        arch=ArchConfig("resnet", depth=depth, width=64, activation="relu", init="kaiming"),
        data=DataConfig("teacher"),
        train=TrainConfig(lr=0.01, momentum=0.9, steps=200),
        origin_layers=("stem", *(f"blocks.{i}.{m}" for i in range(depth)
                                 for m in ("fc1", "act", "fc2"))),
        origin_scope="global",
        onset=OnsetRule("fixed", step=0, tolerance=3),
        manifestations=(Manifestation("max_act", direction="greater", scale="log", margin=1.0),
                  Manifestation("max_grad_norm", direction="greater", scale="log", margin=1.0)),
    )


@register_family(
    name="rnn_no_clip",
    kind="failure",
    architecture="RNN",
    data="sequence",
    description="A tanh Elman RNN with recurrent weights at 2.5x PyTorch's scale, trained "
                "by SGD (lr 0.05, momentum 0.9) on sequences as long as the severity, without "
                "gradient clipping: backpropagation through time produces gradient bursts "
                "that throw the weights off and the loss does not settle (length 10 trains "
                "fine). The baseline is the same run with clipping at 0.5.",
    default_severity=50.0,
    severities=(10.0, 25.0, 50.0, 100.0),
    baseline_severity=None,
    baseline_knobs={"grad_clip": 0.5},
    failure_type="exploding_gradients",
    root_cause="missing_gradient_clipping",
    canonical_fix={"grad_clip": 0.5},
    equivalent_fixes=({"grad_clip": 1.0}, {"lr_scale": 0.2}, {"init_scale": 0.5}),
    counterfactuals=(
        {"knobs": {"lr_scale": 2.0}, "expected": "exploding_gradients"},
        {"knobs": {"lr_scale": 0.5}, "expected": "exploding_gradients"},
        # the knob replaces the head's activation; the recurrent cell keeps its tanh
        {"knobs": {"activation": "relu"}, "expected": "exploding_gradients"},
    ),
)
def _rnn_no_clip(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("rnn", width=32, activation="tanh", cell="rnn", recurrent_gain=2.5),
        data=DataConfig("sequence", n_features=8, n_classes=2, seq_len=int(severity),
                        label_window="tail"),
        train=TrainConfig(lr=0.05, momentum=0.9, steps=150, batch_size=32),
        origin_layers=("rnn",),
        origin_scope="layer",
        # Gradient bursts come and go; the onset is the first burst 5x above the clipped twin.
        onset=OnsetRule("twin", statistic="grad_norm", scale="log", margin=0.7, tolerance=10),
        manifestations=(Manifestation("loss_ratio", direction="greater", scale="log", margin=0.2),
                  Manifestation("max_grad_norm", direction="greater", scale="log", margin=1.0)),
    )
