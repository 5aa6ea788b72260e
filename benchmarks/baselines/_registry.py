"""Where the baselines register: NeuralDBG's method registry (``neuraldbg.methods``).

The heuristic reasoner, the probabilistic model and the ported baselines share it, so the
harness compares every method through ``get_method(name).explain(trace)``.
"""

from __future__ import annotations

from neuraldbg.methods import available_methods, get_method, register_method

__all__ = ["register_method", "get_method", "list_methods"]


def list_methods() -> list[str]:
    """Registered method names, sorted (those importable on demand included)."""
    return available_methods()
