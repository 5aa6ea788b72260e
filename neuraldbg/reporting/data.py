"""Everything a run report shows, gathered once through NeuralDBG's public API.

The diagnosis methods are called by name through :func:`neuraldbg.explain` and the
counterfactuals through :func:`neuraldbg.what_if`; a method that is missing or raises is
recorded with its one-line reason (the report says so) instead of stopping the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from neuraldbg.methods import Diagnosis, explain, heuristic_diagnosis, what_if
from neuraldbg.records import Hypothesis
from neuraldbg.reporting.summary import RunSummary, summarize_run
from neuraldbg.reporting.words import (
    TraceEvidence,
    knobs_words,
    what_if_caveat,
    what_if_meaning,
)
from neuraldbg.trace import Trace

__all__ = ["WhatIfRow", "ReportData", "standard_interventions", "collect"]


@dataclass(frozen=True, slots=True)
class WhatIfRow:
    """One counterfactual of the what-if table.

    Attributes
    ----------
    knobs : dict
        The intervention (contract knob names).
    label : str
        The intervention in words.
    p_before, p_after : float or None
        P(failure) as it happened and under the intervention (None when it failed).
    outcome : str
        Most likely outcome under the intervention, or ``""``.
    meaning : str
        One sentence that reads both numbers and the outcome together, or the error.
    """

    knobs: dict[str, Any]
    label: str
    p_before: float | None
    p_after: float | None
    outcome: str
    meaning: str


@dataclass(frozen=True)
class ReportData:
    """What :func:`collect` gathered for one trace.

    Attributes
    ----------
    trace : Trace
    summary : RunSummary
    evidence : TraceEvidence
    diagnosis : Diagnosis or None
        The heuristic reasoner's stages (states for the heatmaps, the causal graph).
    hypotheses : dict of str to list of Hypothesis
        Per method that ran.
    failures : dict of str to str
        Per method that could not run: the one-line reason.
    primary : str
        The method whose verdict leads the report.
    what_if : list of WhatIfRow
    what_if_error : str
        Why no counterfactual could be computed ("" when some were).
    graph : networkx.DiGraph
    """

    trace: Trace
    summary: RunSummary
    evidence: TraceEvidence
    diagnosis: Diagnosis | None
    hypotheses: dict[str, list[Hypothesis]]
    failures: dict[str, str]
    primary: str
    what_if: list[WhatIfRow] = field(default_factory=list)
    what_if_error: str = ""
    graph: nx.DiGraph = field(default_factory=nx.DiGraph)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else 'no message'}"


def standard_interventions(trace: Trace) -> list[dict[str, Any]]:
    """The interventions of the what-if table: one per knob, in the usual fixing direction.

    ``grad_clip`` is set at the run's median recorded gradient norm (a clip that bites on
    every spike); ``activation`` is ``leaky_relu`` for a run with ReLU-like layers (no dead
    units) and ``relu`` for any other (no saturation).
    """
    rows: list[dict[str, Any]] = [{"lr_scale": 0.1}, {"lr_scale": 10.0}, {"init_scale": 0.5}]
    g = trace.steps["grad_norm"].to_numpy(dtype=float) if "grad_norm" in trace.steps else []
    g = np.asarray(g)[np.isfinite(g) & (np.asarray(g) > 0)] if len(g) else np.zeros(0)
    if len(g):
        rows.append({"grad_clip": float(f"{float(np.median(g)):.3g}")})
    fams = set(trace.modules.get("activation_family", []))
    rows.append({"activation": "leaky_relu" if "relu" in fams else "relu"})
    rows.append({"normalization": "batch"})
    return rows


def _what_if_rows(trace: Trace, interventions: Sequence[Mapping[str, Any]]
                  ) -> tuple[list[WhatIfRow], str]:
    rows: list[WhatIfRow] = []
    errors: list[str] = []
    for knobs in interventions:
        knobs = dict(knobs)
        try:
            cf = what_if(trace, **knobs)
            before, after = float(cf.p_failure_factual), float(cf.p_failure)
            outcome = str(cf.failure_type)
            dist = getattr(cf, "p_failure_types", None)
            meaning = what_if_meaning(before, after, outcome,
                                      dist if isinstance(dist, Mapping) else None)
            caveat = what_if_caveat(getattr(cf, "metadata", None) or {})
            rows.append(WhatIfRow(knobs, knobs_words(knobs), before, after, outcome,
                                  f"{meaning} {caveat}" if caveat else meaning))
        except Exception as exc:  # noqa: BLE001 - another package's method: report, go on
            errors.append(_reason(exc))
            rows.append(WhatIfRow(knobs, knobs_words(knobs), None, None, "",
                                  f"not computed ({_reason(exc)})"))
    if errors and len(errors) == len(rows):
        return [], errors[0]
    return rows, ""


def collect(trace: Trace, *, methods: Sequence[str] = ("heuristic", "probabilistic"),
            interventions: Sequence[Mapping[str, Any]] | None = None) -> ReportData:
    """Run the diagnosis methods and the what-if table on one trace.

    Parameters
    ----------
    trace : Trace
    methods : sequence of str, default=("heuristic", "probabilistic")
        Registered method names; the first one that runs leads the report.
    interventions : sequence of dict, optional
        The what-if table; :func:`standard_interventions` when None, none when empty.

    Returns
    -------
    ReportData

    Raises
    ------
    ValueError
        If the trace holds no recorded step (there is nothing to report).
    """
    if len(trace.steps) == 0 or len(trace.stats) == 0:
        raise ValueError("The trace holds no recorded step, so there is nothing to report. "
                         "Record at least one training step with dbg.step(loss) first.")
    summary = summarize_run(trace)
    evidence = TraceEvidence(trace, summary)
    hyps: dict[str, list[Hypothesis]] = {}
    failures: dict[str, str] = {}
    diag: Diagnosis | None = None
    for name in methods:
        try:
            if name == "heuristic":
                diag = heuristic_diagnosis(trace)
                hyps[name] = list(diag.hypotheses)
            else:
                hyps[name] = list(explain(trace, name))
        except Exception as exc:  # noqa: BLE001 - a method that fails is reported, not fatal
            failures[name] = _reason(exc)
    primary = next((m for m in methods if m in hyps), methods[0] if methods else "heuristic")
    if interventions is None:
        interventions = standard_interventions(trace)
    rows, wi_error = _what_if_rows(trace, interventions) if interventions else ([], "")
    graph = diag.graph() if diag is not None else nx.DiGraph()
    return ReportData(trace, summary, evidence, diag, hyps, failures, primary, rows, wi_error,
                      graph)
