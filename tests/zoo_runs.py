"""Failure-zoo runs shared by the tests in one pytest process (each family trained once).

A zoo run is real training (0.2-6 s on one CPU thread); tests that need the same run get
the same :class:`neuraldbg.Trace` object, so treat it as read-only.
"""

from __future__ import annotations

from functools import lru_cache

import experiments
import neuraldbg as ndb

__all__ = ["zoo_families", "zoo_trace"]


def zoo_families() -> list[str]:
    """Every registered family of the zoo (failures and healthy controls)."""
    return [spec.name for spec in experiments.list_families()]


@lru_cache(maxsize=None)
def zoo_trace(family: str, seed: int = 0) -> ndb.Trace:
    """The trace of ``family`` at ``seed``, trained on first use and kept for the session."""
    return experiments.run_scenario(family, seed=seed)
