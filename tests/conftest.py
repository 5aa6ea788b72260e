"""Shared test set-up: one thread (the CI machine has 2 cores), deterministic seeds."""

from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
