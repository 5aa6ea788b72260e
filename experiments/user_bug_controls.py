"""Healthy look-alikes of the user bugs (:mod:`experiments.user_bugs`): runs that share a
bug's surface (a high Adam rate, a target in the thousands, a near-constant init) and train
fine. They measure false alarms: a reasoner must call them healthy."""

from __future__ import annotations

from experiments.families import register_family
from experiments.scenario import ArchConfig, DataConfig, Scenario, TrainConfig

__all__: list[str] = []


def _control(name: str, architecture: str, data: str, description: str):  # noqa: ANN202
    return register_family(name=name, kind="healthy", architecture=architecture, data=data,
                           description=description, default_severity=1.0, severities=(1.0,))


@_control("healthy_adam_high_lr", "MLP", "digits",
          "A ReLU MLP under Adam at 1e-2, high for Adam but fine on this problem (the "
          "look-alike of an SGD-sized Adam rate).")
def _healthy_adam_high_lr(severity: float) -> Scenario:
    return Scenario(ArchConfig("mlp", depth=2, width=32, activation="relu"),
                    DataConfig("digits"),
                    TrainConfig(optimizer="adam", lr=1e-2, steps=100))


@_control("healthy_regression_standardized", "MLP", "teacher",
          "A regression MLP (Adam, MSE) on a target that was in the thousands and that the "
          "user standardised (the look-alike of a target left in raw units).")
def _healthy_regression(severity: float) -> Scenario:
    return Scenario(ArchConfig("mlp", depth=2, width=32, activation="relu"),
                    DataConfig("teacher", target="regression"),
                    TrainConfig(optimizer="adam", lr=1e-2, steps=100, loss="mse"))


@_control("healthy_constant_plus_noise_init", "MLP", "digits",
          "A ReLU MLP whose parameters the user filled with 0.01 and then perturbed with "
          "Gaussian noise of std 0.1: the noise breaks the symmetry and it trains (the "
          "look-alike of a constant init).")
def _healthy_constant_noise(severity: float) -> Scenario:
    return Scenario(ArchConfig("mlp", depth=2, width=32, activation="relu", init="constant",
                               init_fill=0.01, init_noise=0.1),
                    DataConfig("digits"),
                    TrainConfig(lr=0.05, momentum=0.9, steps=100))
