"""Exceptions and warnings shared by every NeuralDBG package.

Each exception also inherits the builtin it refines, as scikit-learn's ``NotFittedError``
inherits ``ValueError``, so ``except ValueError`` keeps working for callers that do not
know our names.
"""

from __future__ import annotations

__all__ = [
    "NeuralDbgError",
    "TraceFormatError",
    "SchemaVersionError",
    "CaptureError",
    "TraceLockedError",
    "NotFittedError",
    "MissingDependencyError",
    "NeuralDbgWarning",
]


class NeuralDbgError(Exception):
    """Base class of every error NeuralDBG raises on purpose."""


class TraceFormatError(NeuralDbgError, ValueError):
    """A trace directory is missing, truncated, foreign or otherwise unreadable."""


class SchemaVersionError(TraceFormatError):
    """A trace was written by a newer NeuralDBG whose schema this version cannot read."""


class CaptureError(NeuralDbgError, RuntimeError):
    """The capture was used in a way that cannot produce a trace (wrong order of calls)."""


class TraceLockedError(NeuralDbgError, FileExistsError):
    """Another process is writing to the trace directory (its lock file exists)."""


class NotFittedError(NeuralDbgError, ValueError):
    """An estimator was used before ``fit``."""


class MissingDependencyError(NeuralDbgError, ImportError):
    """An optional feature was used without its extra installed (the message names it)."""


class NeuralDbgWarning(UserWarning):
    """A surprise the run recovers from (a skipped output, an overwritten trace, ...)."""
