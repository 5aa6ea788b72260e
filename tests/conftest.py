"""Shared test set-up: one thread (the CI machine has 2 cores), deterministic seeds."""

from __future__ import annotations

import os

from experiments.cpu_paths import pin_cpu_paths

pin_cpu_paths()  # the zoo's code paths, before numpy and torch compute (experiments.cpu_paths)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
