"""Healthy controls: one per architecture, and one with benign loss noise. They measure
false positives: a reasoner must call them healthy."""

from __future__ import annotations

from experiments.families import register_family
from experiments.scenario import ArchConfig, DataConfig, Scenario, TrainConfig

__all__: list[str] = []


def _healthy(name: str, architecture: str, data: str, description: str,
             counterfactuals: tuple[dict, ...] = ()):  # noqa: ANN202 - decorator factory
    return register_family(name=name, kind="healthy", architecture=architecture, data=data,
                           description=description, default_severity=1.0, severities=(1.0,),
                           counterfactuals=counterfactuals)


@_healthy("healthy_mlp", "MLP", "digits", "A 3-layer ReLU MLP, SGD with momentum.",
          counterfactuals=(
              {"knobs": {"lr_scale": 100.0}, "expected": "loss_divergence",
               "root_cause": "learning_rate_too_high"},
              {"knobs": {"init_scale": 0.1}, "expected": "training_plateau",
               "root_cause": "init_scale_too_small"},
              {"knobs": {"activation": "sigmoid"}, "expected": "training_plateau",
               "root_cause": "saturating_activation"},
          ))
def _healthy_mlp(severity: float) -> Scenario:
    return Scenario(ArchConfig("mlp", depth=3, width=64, activation="relu"),
                    DataConfig("digits"), TrainConfig(lr=0.05, momentum=0.9, steps=200))


@_healthy("healthy_cnn", "CNN", "digits_image", "A 2-conv ReLU CNN without normalization.")
def _healthy_cnn(severity: float) -> Scenario:
    return Scenario(ArchConfig("cnn", depth=2, width=16, activation="relu"),
                    DataConfig("digits_image"), TrainConfig(lr=0.05, momentum=0.9, steps=200))


@_healthy("healthy_cnn_bn", "CNN+BN", "digits_image", "A 2-conv ReLU CNN with BatchNorm.")
def _healthy_cnn_bn(severity: float) -> Scenario:
    return Scenario(ArchConfig("cnn", depth=2, width=16, activation="relu", normalization="batch"),
                    DataConfig("digits_image"), TrainConfig(lr=0.05, momentum=0.9, steps=200))


@_healthy("healthy_resnet", "residual", "teacher",
          "A 4-block residual MLP with BatchNorm in each block, He initialisation.")
def _healthy_resnet(severity: float) -> Scenario:
    return Scenario(ArchConfig("resnet", depth=4, width=64, activation="relu", init="kaiming",
                               normalization="batch"),
                    DataConfig("teacher"), TrainConfig(lr=0.01, momentum=0.9, steps=200))


@_healthy("healthy_gru", "GRU", "sequence", "A GRU on length-16 sequences, Adam.")
def _healthy_gru(severity: float) -> Scenario:
    return Scenario(ArchConfig("rnn", width=32, activation="tanh", cell="gru"),
                    DataConfig("sequence", n_features=8, n_classes=4, seq_len=16),
                    TrainConfig(optimizer="adam", lr=1e-2, steps=150, batch_size=32))


@_healthy("healthy_lstm", "LSTM", "sequence", "An LSTM on length-16 sequences, Adam.")
def _healthy_lstm(severity: float) -> Scenario:
    return Scenario(ArchConfig("rnn", width=32, activation="tanh", cell="lstm"),
                    DataConfig("sequence", n_features=8, n_classes=4, seq_len=16),
                    TrainConfig(optimizer="adam", lr=1e-2, steps=150, batch_size=32))


@_healthy("healthy_transformer", "Transformer", "sequence",
          "A one-block pre-norm Transformer on length-12 sequences, Adam.")
def _healthy_transformer(severity: float) -> Scenario:
    return Scenario(ArchConfig("transformer", depth=1, width=16, activation="gelu",
                               normalization="layer", heads=2),
                    DataConfig("sequence", n_features=8, n_classes=4, seq_len=12),
                    TrainConfig(optimizer="adam", lr=3e-3, steps=150, batch_size=32))


@_healthy("healthy_noisy", "MLP", "digits",
          "A ReLU MLP with 10% label noise, batches of 16 and a batch of shuffled labels every "
          "25 steps: a noisy loss with benign spikes that training recovers from.")
def _healthy_noisy(severity: float) -> Scenario:
    return Scenario(ArchConfig("mlp", depth=3, width=64, activation="relu"),
                    DataConfig("digits", label_noise=0.1),
                    TrainConfig(lr=0.05, momentum=0.9, steps=200, batch_size=16,
                                noisy_batch_every=25))
