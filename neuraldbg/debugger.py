"""``NeuralDbg``: the user-facing object.

Capture (from :mod:`neuraldbg.capture`) plus the diagnosis entry points, which read the
recorded trace and never touch the hooks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import networkx as nx

from neuraldbg.capture import Recorder
from neuraldbg.compressor import CoupledFailure
from neuraldbg.hypotheses import RankedCause
from neuraldbg.methods import (
    CounterfactualAnswer,
    DiagnosisMethod,
    causal_graph,
    detect_coupled_failures,
    explain,
    export_mermaid_causal_graph,
    get_root_causes,
    what_if,
)
from neuraldbg.records import Hypothesis

# ``what_if`` lives in :mod:`neuraldbg.methods` with the other functions of a trace; it is
# re-exported here, where it was first defined.
__all__ = ["NeuralDbg", "what_if"]


class NeuralDbg(Recorder):
    """Record a training run and explain its failure.

    See :class:`neuraldbg.capture.Recorder` for the capture parameters.

    Examples
    --------
    >>> import torch, neuraldbg as ndb
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> with ndb.NeuralDbg(model, optimizer=opt) as dbg:
    ...     for _ in range(3):
    ...         opt.zero_grad()
    ...         loss = model(torch.randn(16, 4)).pow(2).mean()
    ...         loss.backward()
    ...         opt.step()
    ...         dbg.step(loss)
    >>> len(dbg.trace.steps)
    3
    """

    def explain_failure(self, method: str | DiagnosisMethod = "heuristic") -> list[Hypothesis]:
        """Explain the recorded run: hypotheses, highest confidence first.

        Works during and after the ``with`` block. An empty list, or no hypothesis with
        ``confidence >= 0.5``, means the run is judged healthy.

        Parameters
        ----------
        method : str or object, default="heuristic"
            A registered method name (``"heuristic"``, ``"probabilistic"``) or an object with
            ``explain(trace)``; see :func:`neuraldbg.methods.explain`.
        """
        return explain(self.trace, method)

    def get_root_causes(self, method: str | DiagnosisMethod = "heuristic") -> list[RankedCause]:
        """Root causes of the recorded run, highest confidence first.

        See :func:`neuraldbg.methods.get_root_causes`.
        """
        return get_root_causes(self.trace, method)

    def detect_coupled_failures(self, window: int | None = None) -> list[CoupledFailure]:
        """Failure onsets in different layers within ``window`` steps, cause before effect.

        See :func:`neuraldbg.methods.detect_coupled_failures`; ``window`` defaults to
        :attr:`neuraldbg.thresholds.ThresholdConfig.window`.
        """
        return detect_coupled_failures(self.trace, window)

    def causal_graph(self) -> nx.DiGraph:
        """The heuristic diagnosis as a ``networkx.DiGraph``."""
        return causal_graph(self.trace)

    def export_mermaid_causal_graph(self) -> str:
        """The causal graph of the heuristic diagnosis as Mermaid flowchart text."""
        return export_mermaid_causal_graph(self.trace)

    def report(self, path: str | os.PathLike[str], **kwargs: Any) -> Path:
        """Write the run report: a self-contained HTML page (or a PNG summary for ``.png``).

        See :func:`neuraldbg.reporting.write_report` for the options; works during and after
        the ``with`` block.
        """
        from neuraldbg.reporting import write_report

        return write_report(self.trace, path, **kwargs)

    def what_if(self, **knobs: Any) -> CounterfactualAnswer:
        """Counterfactual for the recorded run, e.g. ``dbg.what_if(lr_scale=0.1)``.

        See :func:`neuraldbg.methods.what_if`; works during and after the ``with`` block.
        """
        return what_if(self.trace, **knobs)
