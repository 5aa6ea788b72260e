"""Results derived from a trace, kept while the trace object lives.

One explain reads the same trace several times: the probabilistic method observes it through
the heuristic reasoner's diagnosis (its verdict and run facts), and ``explain`` asks that
diagnosis again for the non-finite check; on 10,000 steps x 100 modules each diagnosis costs
about half a second. :func:`memoized` keeps one result per trace object and key, and drops
them when the trace is garbage-collected (``weakref.finalize``).

A result is valid for the trace as it is when it is computed: it is kept with the trace's
tables, their lengths and its metadata as text, so a trace whose tables were replaced or grew,
or whose metadata changed (a config set after the run), is read afresh. Table cells edited in
place are not detected; a trace is a record of a run and the library never edits one.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from neuraldbg.trace import Trace

__all__ = ["memoized"]

T = TypeVar("T")

#: id(trace) -> {key: (the tables it was computed on, their lengths and the meta, result)}
_MEMO: dict[int, dict[Hashable, tuple[tuple[Any, ...], tuple[Any, ...], Any]]] = {}


def _forget(trace_id: int) -> None:
    _MEMO.pop(trace_id, None)


def memoized(trace: Trace, key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()`` once per trace object, tables and ``key``; the kept result after that.

    Parameters
    ----------
    trace : Trace
        The trace the result is derived from.
    key : hashable
        What is computed, with every setting it depends on.
    compute : callable
        Computes the result; called again only when the trace's tables were replaced or
        changed length, or its metadata changed, since.

    Returns
    -------
    The result; the caller must not modify it.
    """
    slot = _MEMO.get(id(trace))
    if slot is None:
        slot = _MEMO[id(trace)] = {}
        weakref.finalize(trace, _forget, id(trace))
    tables = (trace.steps, trace.stats, trace.modules)
    sizes = (*(len(t) for t in tables), repr(trace.meta))  # (meta is small and often edited)
    kept = slot.get(key)
    # identity, not id(): the entry holds its tables, so a new table never passes for one
    if (kept is None or kept[1] != sizes
            or any(a is not b for a, b in zip(kept[0], tables, strict=True))):
        kept = slot[key] = (tables, sizes, compute())
    return kept[2]
