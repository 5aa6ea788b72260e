"""``NeuralDbg``: the user-facing object. Capture (from :mod:`neuraldbg.capture`) plus the
diagnosis entry points, which read the recorded trace and never touch the hooks."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from neuraldbg.capture import Recorder
from neuraldbg.knobs import validate_knobs
from neuraldbg.methods import get_method
from neuraldbg.ranks import combine_ranks
from neuraldbg.records import Hypothesis
from neuraldbg.sufficiency import thin_evidence, usable_trace
from neuraldbg.trace import Trace

__all__ = ["NeuralDbg", "what_if"]


def what_if(trace: Trace, method: str | Any = "probabilistic", **knobs: Any) -> Any:
    """What the run would have done under changed knobs, from its trace (no re-training).

    The counterfactual of a method that answers them (the ``"probabilistic"`` causal model:
    abduction, action, prediction), found through the method registry. Steps that never
    finished are left out, as :func:`neuraldbg.methods.explain` leaves them out; on a trace
    too thin for a verdict the answer's ``metadata["thin_evidence"]`` says why.

    Parameters
    ----------
    trace : Trace
        The run as it happened.
    method : str or object, default="probabilistic"
        A registered method name, or an object with ``what_if(trace, **knobs)``.
    **knobs
        ``lr_scale``, ``init_scale``, ``input_scale``, ``grad_clip``, ``activation``,
        ``normalization`` (relative to the run; :data:`neuraldbg.knobs.KNOBS`).

    Returns
    -------
    Counterfactual
        ``p_failure_factual``, ``p_failure``, ``failure_type`` and metadata.

    Raises
    ------
    ValueError
        For an unknown knob or value, or a method that does not answer counterfactuals.
    """
    validate_knobs(**knobs)
    engine = get_method(method)
    if not callable(getattr(engine, "what_if", None)):
        raise ValueError(f"The diagnosis method {method!r} does not answer counterfactuals "
                         "(it has no what_if); use method='probabilistic'.")
    usable = usable_trace(combine_ranks(trace))
    answer = engine.what_if(usable, **knobs)
    reason = thin_evidence(usable)
    if reason and dataclasses.is_dataclass(answer) and isinstance(
            getattr(answer, "metadata", None), dict):
        answer = dataclasses.replace(answer, metadata={**answer.metadata,
                                                       "thin_evidence": reason})
    return answer


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

    def explain_failure(self, method: str | Any = "heuristic") -> list[Hypothesis]:
        """Explain the recorded run: hypotheses, highest confidence first.

        Works during and after the ``with`` block. An empty list, or no hypothesis with
        ``confidence >= 0.5``, means the run is judged healthy.

        Parameters
        ----------
        method : str or object, default="heuristic"
            A registered method name (``"heuristic"``, ``"probabilistic"``) or an object with
            ``explain(trace)``; see :func:`neuraldbg.methods.explain`.
        """
        from neuraldbg.methods import explain

        return explain(self.trace, method)

    def get_root_causes(self, method: str | Any = "heuristic") -> list[Any]:
        """Root causes of the recorded run, highest confidence first
        (:func:`neuraldbg.methods.get_root_causes`)."""
        from neuraldbg.methods import get_root_causes

        return get_root_causes(self.trace, method)

    def detect_coupled_failures(self, window: int = 5) -> list[Any]:
        """Failure onsets in different layers within ``window`` steps, cause before effect
        (:func:`neuraldbg.methods.detect_coupled_failures`)."""
        from neuraldbg.methods import detect_coupled_failures

        return detect_coupled_failures(self.trace, window)

    def causal_graph(self) -> Any:
        """The heuristic diagnosis as a ``networkx.DiGraph``."""
        from neuraldbg.methods import causal_graph

        return causal_graph(self.trace)

    def export_mermaid_causal_graph(self) -> str:
        """The causal graph of the heuristic diagnosis as Mermaid flowchart text."""
        from neuraldbg.methods import export_mermaid_causal_graph

        return export_mermaid_causal_graph(self.trace)

    def report(self, path: str | os.PathLike[str], **kwargs: Any) -> Path:
        """Write the run report: a self-contained HTML page (or a PNG summary for ``.png``).

        See :func:`neuraldbg.reporting.write_report` for the options; works during and after
        the ``with`` block.
        """
        from neuraldbg.reporting import write_report

        return write_report(self.trace, path, **kwargs)

    def what_if(self, **knobs: Any) -> Any:
        """Counterfactual for the recorded run, e.g. ``dbg.what_if(lr_scale=0.1)``.

        See :func:`neuraldbg.debugger.what_if`; works during and after the ``with`` block.
        """
        return what_if(self.trace, **knobs)
