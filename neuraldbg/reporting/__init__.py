"""Run reports: what happened in a run and why, as a page a person looks at.

>>> import neuraldbg as ndb
>>> ndb.write_report("runs/my-run", "report.html")          # doctest: +SKIP
>>> dbg.report("report.html")                                # doctest: +SKIP

The HTML page is self-contained (figures are inline SVG ``data:`` URIs; no script, no
external file, no network request). ``format="png"`` writes a one-page summary image.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from neuraldbg.reporting.data import ReportData, WhatIfRow, collect, standard_interventions
from neuraldbg.reporting.summary import NonFinite, RunSummary, summarize_run
from neuraldbg.reporting.words import Verdict, verdict, what_if_meaning
from neuraldbg.trace import Trace, load_trace

__all__ = ["write_report", "report_html", "collect", "ReportData", "WhatIfRow",
           "standard_interventions", "summarize_run", "RunSummary", "NonFinite", "Verdict",
           "verdict", "what_if_meaning"]

_FORMATS = ("html", "png")


def _as_trace(trace: Trace | str | os.PathLike[str]) -> Trace:
    return trace if isinstance(trace, Trace) else load_trace(trace)


def report_html(trace: Trace | str | os.PathLike[str], *,
                methods: Sequence[str] = ("heuristic", "probabilistic"),
                interventions: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The HTML report of a run as a string (see :func:`write_report`)."""
    from neuraldbg.reporting.render import render_html

    return render_html(collect(_as_trace(trace), methods=methods, interventions=interventions))


def write_report(trace: Trace | str | os.PathLike[str], path: str | os.PathLike[str], *,
                 format: Literal["html", "png"] | None = None,
                 methods: Sequence[str] = ("heuristic", "probabilistic"),
                 interventions: Sequence[Mapping[str, Any]] | None = None) -> Path:
    """Write the report of a run: one self-contained HTML page, or a one-page PNG summary.

    Parameters
    ----------
    trace : Trace or trace directory
        The run (``dbg.report(path)`` passes a NeuralDbg's trace).
    path : str or path-like
        File to write; parent directories are created.
    format : {"html", "png"}, optional
        From the file suffix when omitted (``.png`` -> png, anything else html).
    methods : sequence of str, default=("heuristic", "probabilistic")
        Diagnosis methods to run and compare; the first that runs gives the verdict. A
        method that is missing or raises is named in the report with its reason.
    interventions : sequence of dict, optional
        Knob settings of the what-if table (``[{"lr_scale": 0.1}, ...]``); the standard
        ones (:func:`standard_interventions`) when omitted, none when empty.

    Returns
    -------
    pathlib.Path
        The file written.

    Raises
    ------
    ValueError
        If ``format`` is not one of ``"html"``, ``"png"``, or the trace holds no step.
    TraceFormatError
        If ``trace`` is a directory that is not a readable trace.
    """
    path = Path(path)
    fmt = format or ("png" if path.suffix.lower() == ".png" else "html")
    if fmt not in _FORMATS:
        raise ValueError(f"Invalid report format {fmt!r}. Valid formats are: {list(_FORMATS)}.")
    data = collect(_as_trace(trace), methods=methods, interventions=interventions)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "html":
        from neuraldbg.reporting.render import render_html

        path.write_text(render_html(data), encoding="utf-8")
    else:
        import matplotlib.pyplot as plt

        from neuraldbg.reporting.render import summary_figure

        fig = summary_figure(data)
        fig.savefig(path, format="png", dpi=90, bbox_inches="tight")
        plt.close(fig)
    return path

