"""The one registry type behind every extension point: components registered by name.

Diagnosis methods (:mod:`neuraldbg.methods`), the vocabulary's extensions
(:mod:`neuraldbg.records`), the scenario families of the zoo and the causal model's failure
modes and root causes each keep one :class:`Registry`. It is a plain dict behind a
decorator (STYLE.md "Extending"):

- :meth:`Registry.register` rejects a name registered twice (:class:`DuplicateNameError`);
- :meth:`Registry.get` on a miss raises :class:`UnknownNameError`, whose message lists the
  known names; it inherits both ``KeyError`` and ``ValueError``, so callers that caught
  either before keep working;
- :meth:`Registry.unregister` (and :meth:`Registry.discard`, which tolerates a miss) is the
  public way out: tests use it instead of popping a private dict;
- :meth:`Registry.names`, ``in``, ``len`` and iteration read it, in registration order.

Examples
--------
>>> from neuraldbg.registry_base import Registry
>>> detectors = Registry("detector")
>>> @detectors.register("spike")
... def spike(values):
...     return max(values) > 10
>>> detectors.names()
['spike']
>>> detectors.get("spike") is spike
True
>>> detectors.get("dip")
Traceback (most recent call last):
...
neuraldbg.registry_base.UnknownNameError: Unknown detector 'dip'. Known detectors are: ['spike'].
>>> detectors.unregister("spike") is spike
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

from neuraldbg.errors import NeuralDbgError

__all__ = ["Registry", "UnknownNameError", "DuplicateNameError"]

T = TypeVar("T")


class UnknownNameError(NeuralDbgError, KeyError, ValueError):
    """A name that no component of a :class:`Registry` has (the message lists the known ones).

    It inherits ``KeyError`` (a registry is a mapping) and ``ValueError`` (a bad argument
    value), so ``except KeyError`` and ``except ValueError`` both catch it.
    """

    def __str__(self) -> str:
        """The message itself (``KeyError`` would print its repr, quotes included)."""
        return str(self.args[0]) if self.args else ""


class DuplicateNameError(NeuralDbgError, ValueError):
    """A name registered twice in one :class:`Registry`."""


class Registry(Generic[T]):
    """Components of one kind, registered by name.

    Parameters
    ----------
    kind : str
        What a component is, singular (``"diagnosis method"``, ``"scenario family"``); the
        error messages use it.
    plural : str, optional
        The plural of ``kind`` in messages; ``kind + "s"`` when omitted.

    Examples
    --------
    >>> reg: Registry[int] = Registry("answer")
    >>> reg.add("life", 42)
    42
    >>> "life" in reg, len(reg), list(reg)
    (True, 1, ['life'])
    """

    def __init__(self, kind: str, *, plural: str | None = None) -> None:
        self.kind = kind
        self.plural = plural if plural is not None else f"{kind}s"
        self._items: dict[str, T] = {}

    def __repr__(self) -> str:
        """``Registry('diagnosis method': ['heuristic', ...])``."""
        return f"Registry({self.kind!r}: {self.names()})"

    def check_new(self, name: str) -> None:
        """Raise unless ``name`` is free: for callers that validate before they build.

        Raises
        ------
        DuplicateNameError
            If ``name`` is already registered.
        ValueError
            If ``name`` is not a non-empty string.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"A {self.kind} name must be a non-empty string, got {name!r}.")
        if name in self._items:
            raise DuplicateNameError(
                f"A {self.kind} named {name!r} is already registered ({self._items[name]!r}). "
                f"Choose another name, or unregister the old one first; registered "
                f"{self.plural} are: {self.names()}."
            )

    def add(self, name: str, item: T) -> T:
        """Register ``item`` under ``name`` and return it.

        Raises
        ------
        DuplicateNameError
            If ``name`` is already registered.
        ValueError
            If ``name`` is not a non-empty string.
        """
        self.check_new(name)
        self._items[name] = item
        return item

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, item: T) -> T: ...

    def register(self, name: str, item: T | None = None) -> T | Callable[[T], T]:
        """Register under ``name``: as a decorator (``@reg.register("x")``) or directly.

        Parameters
        ----------
        name : str
            The name callers will :meth:`get` it by.
        item : object, optional
            The component; when omitted, a decorator that registers what it decorates and
            returns it unchanged.

        Raises
        ------
        DuplicateNameError
            If ``name`` is already registered (checked at once, before decorating).
        """
        if item is not None:
            return self.add(name, item)
        self.check_new(name)

        def decorator(obj: T) -> T:
            return self.add(name, obj)

        return decorator

    def get(self, name: str) -> T:
        """The component registered under ``name``.

        Raises
        ------
        UnknownNameError
            If nothing is registered under ``name``; the message lists the known names.
        """
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise self.unknown(name) from None

    def unknown(self, name: object, known: list[str] | None = None) -> UnknownNameError:
        """The error for a miss on ``name`` (for callers that look elsewhere first).

        Parameters
        ----------
        name : object
            The name that was asked for.
        known : list of str, optional
            The names to list (sorted in the message); :meth:`names` when omitted (a caller
            that also knows names not registered yet, such as declared entry points, passes
            them all).
        """
        known = sorted(self.names() if known is None else known)
        return UnknownNameError(
            f"Unknown {self.kind} {name!r}. Known {self.plural} are: {known}."
        )

    def unregister(self, name: str) -> T:
        """Remove ``name`` and return what was registered under it.

        Raises
        ------
        UnknownNameError
            If ``name`` is not registered.
        """
        if name not in self._items:
            raise self.unknown(name)
        return self._items.pop(name)

    def discard(self, name: str) -> None:
        """Remove ``name`` if it is registered (no error when it is not)."""
        self._items.pop(name, None)

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._items)

    def items(self) -> list[tuple[str, T]]:
        """``(name, component)`` pairs, in registration order."""
        return list(self._items.items())

    def values(self) -> list[T]:
        """Registered components, in registration order."""
        return list(self._items.values())

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is registered."""
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        """The registered names, in registration order (a snapshot)."""
        return iter(self.names())

    def __len__(self) -> int:
        """How many components are registered."""
        return len(self._items)
