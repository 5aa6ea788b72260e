"""Compound families: two faults at once, so a ranking must name both causes."""

from __future__ import annotations

__all__: list[str] = []
