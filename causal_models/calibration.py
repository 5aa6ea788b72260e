"""Calibration: measure and repair the posterior's confidence.

Measures (on held-out runs): expected calibration error of the top-1 confidence with 15
equal-width bins, the multi-class Brier score and the negative log-likelihood of the true
class.

Recalibration, fitted on out-of-family predictions (a grouped cross-validation inside
``ProbabilisticReasoner.fit``, as scikit-learn's ``CalibratedClassifierCV`` fits on held-out
folds):

- ``temperature``: ``p_k ∝ p_k ** (1 / T)`` with ``T >= 1`` (Guo et al., 2017), mixed with
  the uniform distribution, ``(1 - eps) * p_T + eps / K``: ``T`` and ``eps`` minimise the
  Brier score of the held-out predictions (scipy). The mixture is what a model that is right
  about the families it knows and sometimes confidently wrong about a new one needs: ``T``
  alone can only flatten every prediction to pay for the few confident misses (and the NLL,
  unbounded for them, drives it to do so), ``eps`` caps the confidence at what held-out
  accuracy supports;
- ``isotonic``: one-vs-rest ``sklearn.isotonic.IsotonicRegression`` per class, renormalised
  (Zadrozny & Elkan, 2002);
- ``none``: identity.

References
----------
Guo, Pleiss, Sun, Weinberger. On Calibration of Modern Neural Networks. ICML 2017.
Zadrozny, Elkan. Transforming classifier scores into accurate multiclass probability
estimates. KDD 2002.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

__all__ = [
    "Calibrator",
    "fit_calibrator",
    "expected_calibration_error",
    "brier_score",
    "negative_log_likelihood",
    "calibration_report",
]

_EPS = 1e-12


def _check(probs: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    probs = np.asarray(probs, dtype=float)
    y = np.asarray(y, dtype=int)
    if probs.ndim != 2 or len(probs) != len(y):
        raise ValueError(f"probs must be (n, n_classes) with one label per row; got shape "
                         f"{probs.shape} and {len(y)} labels.")
    return probs, y


def expected_calibration_error(probs: np.ndarray, y: np.ndarray, n_bins: int = 15) -> float:
    """ECE of the top-1 confidence: sum over equal-width bins of share x |accuracy - conf|.

    Parameters
    ----------
    probs : array of shape (n, n_classes)
    y : array of shape (n,)
        True class indices.
    n_bins : int, default=15

    Returns
    -------
    float
    """
    probs, y = _check(probs, y)
    conf = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == y).astype(float)
    idx = np.clip(np.ceil(conf * n_bins).astype(int) - 1, 0, n_bins - 1)
    gap = np.bincount(idx, weights=correct - conf, minlength=n_bins)
    return float(np.abs(gap).sum() / max(len(y), 1))


def brier_score(probs: np.ndarray, y: np.ndarray) -> float:
    """Multi-class Brier score: mean over runs of the squared error summed over classes."""
    probs, y = _check(probs, y)
    onehot = np.eye(probs.shape[1])[y]
    return float(np.mean(np.sum((probs - onehot) ** 2, axis=1)))


def negative_log_likelihood(probs: np.ndarray, y: np.ndarray) -> float:
    """Mean negative log-probability of the true class (clipped at 1e-12)."""
    probs, y = _check(probs, y)
    return float(-np.mean(np.log(np.clip(probs[np.arange(len(y)), y], _EPS, 1.0))))


def calibration_report(probs: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Accuracy, ECE (15 bins), Brier and NLL in one dict."""
    probs, y = _check(probs, y)
    return {"accuracy": float(np.mean(probs.argmax(axis=1) == y)),
            "ece": expected_calibration_error(probs, y),
            "brier": brier_score(probs, y), "nll": negative_log_likelihood(probs, y),
            "n": int(len(y))}


def _temper(probs: np.ndarray, temperature: float) -> np.ndarray:
    logp = np.log(np.clip(probs, _EPS, 1.0)) / temperature
    logp -= logp.max(axis=1, keepdims=True)
    out = np.exp(logp)
    return out / out.sum(axis=1, keepdims=True)


@dataclass(frozen=True, slots=True)
class Calibrator:
    """A fitted recalibration map of class probabilities.

    Attributes
    ----------
    method : {"temperature", "isotonic", "none"}
    temperature : float
        For ``temperature``: the fitted T (1 = identity).
    epsilon : float
        For ``temperature``: weight of the uniform distribution mixed in (0 = none).
    isotonic : list of (list of float, list of float)
        For ``isotonic``: per class, the fitted thresholds (x, y).
    n_fit : int
        Held-out predictions the map was fitted on.
    """

    method: Literal["temperature", "isotonic", "none"] = "none"
    temperature: float = 1.0
    epsilon: float = 0.0
    isotonic: list[tuple[list[float], list[float]]] = field(default_factory=list)
    n_fit: int = 0

    def transform(self, probs: np.ndarray) -> np.ndarray:
        """Recalibrated probabilities; rows still sum to 1."""
        probs = np.asarray(probs, dtype=float)
        if self.method == "temperature":
            k = probs.shape[-1]
            return (1.0 - self.epsilon) * _temper(probs, self.temperature) + self.epsilon / k
        if self.method == "isotonic" and self.isotonic:
            cols = [np.interp(probs[..., k], np.asarray(x), np.asarray(yv))
                    for k, (x, yv) in enumerate(self.isotonic)]
            out = np.stack(cols, axis=-1) + 1e-6
            return out / out.sum(axis=-1, keepdims=True)
        return probs

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form."""
        return {"method": self.method, "temperature": self.temperature, "epsilon": self.epsilon,
                "isotonic": [[list(x), list(y)] for x, y in self.isotonic], "n_fit": self.n_fit}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibrator:
        """Inverse of :meth:`to_dict`."""
        return cls(method=data["method"], temperature=float(data["temperature"]),
                   epsilon=float(data.get("epsilon", 0.0)),
                   isotonic=[(list(x), list(y)) for x, y in data.get("isotonic", [])],
                   n_fit=int(data.get("n_fit", 0)))


def fit_calibrator(method: Literal["temperature", "isotonic", "none"], probs: np.ndarray,
                   y: np.ndarray) -> Calibrator:
    """Fit a recalibration map on held-out predictions.

    Parameters
    ----------
    method : {"temperature", "isotonic", "none"}
    probs : array of shape (n, n_classes)
        Held-out (out-of-family) probabilities.
    y : array of shape (n,)
        True class indices.

    Returns
    -------
    Calibrator

    Raises
    ------
    ValueError
        For an unknown method.
    """
    if method not in ("temperature", "isotonic", "none"):
        raise ValueError(f"Unknown calibration method {method!r}. Valid methods are: "
                         "['temperature', 'isotonic', 'none'].")
    probs, y = _check(probs, y)
    if method == "none" or len(y) < 2:
        return Calibrator("none", n_fit=int(len(y)))
    if method == "temperature":
        from scipy.optimize import minimize

        k = probs.shape[1]

        def loss(theta: np.ndarray) -> float:
            t, eps = float(np.exp(theta[0])), float(theta[1])
            mixed = (1.0 - eps) * _temper(probs, t) + eps / k
            return brier_score(mixed, y)

        best = None
        for start in ((0.0, 0.01), (np.log(3.0), 0.1), (np.log(10.0), 0.05)):
            res = minimize(loss, np.array(start), method="L-BFGS-B",
                           bounds=[(0.0, np.log(50.0)), (0.0, 0.5)])
            if best is None or res.fun < best.fun:
                best = res
        return Calibrator("temperature", temperature=float(np.exp(best.x[0])),
                          epsilon=float(best.x[1]), n_fit=int(len(y)))
    from sklearn.isotonic import IsotonicRegression

    tables = []
    for k in range(probs.shape[1]):
        reg = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
        reg.fit(probs[:, k], (y == k).astype(float))
        tables.append((reg.X_thresholds_.tolist(), reg.y_thresholds_.tolist()))
    return Calibrator("isotonic", isotonic=tables, n_fit=int(len(y)))
