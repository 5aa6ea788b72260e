"""Fixed, pre-generated datasets of the zoo: scikit-learn's bundled digits and synthetic data.

Nothing is downloaded: ``load_digits`` ships inside scikit-learn. A dataset depends only on
its :class:`~experiments.scenario.DataConfig` (its own ``data_seed``), so every seed of a
family trains on the same samples and only the initialisation and batch order change.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from experiments.scenario import DataConfig

__all__ = ["Dataset", "load_dataset", "DATASETS"]

#: Dataset names :func:`load_dataset` knows.
DATASETS: tuple[str, ...] = ("digits", "digits_image", "teacher", "sequence")

#: Time steps at the start (``head``) or end (``tail``) of a sequence that decide its label.
_SEQUENCE_MEMORY = 8


@dataclass(frozen=True, slots=True)
class Dataset:
    """Inputs and labels of one scenario (never mutated; batches are copies).

    Attributes
    ----------
    x : torch.Tensor
        Inputs, float32: ``(n, d)``, ``(n, 1, 8, 8)`` or ``(n, seq_len, d)``.
    y : torch.Tensor
        Class labels, int64, ``(n,)``; regression targets, float32, ``(n, 1)``.
    n_classes : int
        Number of classes (1 for a regression target: the model's outputs).
    description : str
        A line for the run config (what a user would write down about the data).
    """

    x: torch.Tensor
    y: torch.Tensor
    n_classes: int
    description: str


def _standardize(x: np.ndarray) -> np.ndarray:
    axes = tuple(range(x.ndim - 1))
    mean = x.mean(axis=axes, keepdims=True)
    std = x.std(axis=axes, keepdims=True)
    return (x - mean) / np.where(std > 0, std, 1.0)


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return x.astype(np.float64), y.astype(np.int64)


def _teacher(cfg: DataConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal((cfg.n_samples, cfg.n_features))
    w1 = rng.standard_normal((cfg.n_features, 64)) / np.sqrt(cfg.n_features)
    w2 = rng.standard_normal((64, cfg.n_classes)) / 8.0
    scores = np.tanh(2.0 * x @ w1) @ w2
    if cfg.target == "regression":  # the teacher's first score, standardised, then scaled
        s = scores[:, :1]
        s = (s - s.mean()) / s.std()
        return x, (s * cfg.target_scale + cfg.target_offset).astype(np.float32)
    y = np.argmax(scores, axis=1)
    return x, y.astype(np.int64)


def _sequence(cfg: DataConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal((cfg.n_samples, cfg.seq_len, cfg.n_features))
    w = rng.standard_normal((cfg.n_features, cfg.n_classes))
    k = min(_SEQUENCE_MEMORY, cfg.seq_len)
    window = {"head": x[:, :k], "tail": x[:, -k:], "all": x}[cfg.label_window]
    y = np.argmax(window.mean(axis=1) @ w, axis=1)
    return x, y.astype(np.int64)


@lru_cache(maxsize=32)
def load_dataset(cfg: DataConfig) -> Dataset:
    """Generate (or load) the dataset of ``cfg``; cached per process.

    Parameters
    ----------
    cfg : DataConfig

    Returns
    -------
    Dataset

    Raises
    ------
    ValueError
        If ``cfg.name`` is not one of :data:`DATASETS`.
    """
    rng = np.random.default_rng(cfg.data_seed)
    if cfg.target == "regression" and cfg.name != "teacher":
        raise ValueError(f"Regression targets come from the teacher dataset only, got "
                         f"name={cfg.name!r}. Use DataConfig('teacher', target='regression').")
    if cfg.name in ("digits", "digits_image"):
        x, y = _digits()
        n_classes = 10
    elif cfg.name == "teacher":
        x, y = _teacher(cfg, rng)
        n_classes = cfg.n_classes
    elif cfg.name == "sequence":
        x, y = _sequence(cfg, rng)
        n_classes = cfg.n_classes
    else:
        raise ValueError(f"Unknown dataset {cfg.name!r}. Known datasets are: {list(DATASETS)}")
    if cfg.standardize:
        x = _standardize(x)
    x = x * cfg.raw_scale + cfg.offset
    if cfg.label_noise > 0 and cfg.target == "class":
        flip = rng.random(len(y)) < cfg.label_noise
        y = np.where(flip, rng.integers(0, n_classes, len(y)), y)
    if cfg.name == "digits_image":
        x = x.reshape(-1, 1, 8, 8)
    desc = cfg.name
    if cfg.name == "sequence":
        desc += f" (len {cfg.seq_len})"
    if cfg.target == "regression":
        desc += " (regression)"
    return Dataset(
        x=torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),
        y=torch.from_numpy(np.ascontiguousarray(
            y, dtype=np.float32 if cfg.target == "regression" else np.int64)),
        n_classes=1 if cfg.target == "regression" else int(n_classes),
        description=desc,
    )
