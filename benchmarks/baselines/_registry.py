"""Where the baselines register: NeuralDBG's method registry (``neuraldbg.methods``).

Until that registry exists in the installed NeuralDBG, a registry of the same shape lives
here, so the baselines and the harness work either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["register_method", "get_method", "list_methods"]

try:  # the shared registry: heuristic, probabilistic and ours side by side
    from neuraldbg.methods import get_method, register_method  # type: ignore[attr-defined]

    try:
        from neuraldbg.methods import list_methods  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - depends on the installed neuraldbg
        from neuraldbg.methods import _REGISTRY as _SHARED  # type: ignore[attr-defined]

        def list_methods() -> list[str]:
            """Registered method names, sorted."""
            return sorted(_SHARED)
except ImportError:
    _METHODS: dict[str, type] = {}

    def register_method(name: str) -> Callable[[type], type]:
        """Class decorator: register a diagnosis method under ``name`` (duplicates rejected)."""

        def deco(cls: type) -> type:
            if name in _METHODS:
                raise ValueError(f"A method named {name!r} is already registered "
                                 f"({_METHODS[name].__name__}); choose another name.")
            _METHODS[name] = cls
            return cls

        return deco

    def get_method(name_or_instance: Any) -> Any:
        """An instance of the method registered as ``name``, or the instance given."""
        if not isinstance(name_or_instance, str):
            return name_or_instance
        if name_or_instance not in _METHODS:
            raise KeyError(f"Unknown method {name_or_instance!r}. Known methods are: "
                           f"{sorted(_METHODS)}")
        return _METHODS[name_or_instance]()

    def list_methods() -> list[str]:
        """Registered method names, sorted."""
        return sorted(_METHODS)
