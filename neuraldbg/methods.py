"""Diagnosis methods: a registry by name, the heuristic reasoner, and functions of a trace.

``explain(trace, method="heuristic")`` runs a registered method. ``"heuristic"`` is the
Post-Mortem Reasoner (states -> events -> compression -> hypotheses). Methods that live in
other installed packages are found through the ``neuraldbg.methods`` entry-point group and
loaded on first use: the ``causal_models`` package declares ``"probabilistic"`` there, so
``neuraldbg`` never imports it. A researcher adds a method with :func:`register_method`::

    @register_method("my_rules")
    class MyRules:
        def explain(self, trace): ...          # -> list[Hypothesis], highest first

or, from a package of their own, with an entry point in its ``pyproject.toml``::

    [project.entry-points."neuraldbg.methods"]
    my_rules = "my_package.rules:MyRules"
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar

import networkx as nx
import numpy as np

from neuraldbg.causes import RunFacts, gather_facts
from neuraldbg.compressor import Compression, CoupledFailure, compress
from neuraldbg.events import LossDynamics, extract_events, loss_dynamics
from neuraldbg.graph import build_causal_graph, to_mermaid
from neuraldbg.hypotheses import RootCause, generate_hypotheses, rank_root_causes, resolve_overlaps
from neuraldbg.ranks import combine_ranks
from neuraldbg.records import FAILURE_TYPES, HEALTHY, Event, Hypothesis
from neuraldbg.states import StateTable, ThresholdConfig, classify_states
from neuraldbg.sufficiency import hedge, thin_evidence, usable_trace
from neuraldbg.symptoms import Symptom, find_symptoms
from neuraldbg.trace import Trace, load_trace

__all__ = [
    "register_method",
    "get_method",
    "available_methods",
    "HeuristicReasoner",
    "Diagnosis",
    "diagnose",
    "explain",
    "get_root_causes",
    "detect_coupled_failures",
    "causal_graph",
    "export_mermaid_causal_graph",
]

_METHODS: dict[str, type] = {}
#: The entry-point group through which installed packages declare methods.
ENTRY_POINT_GROUP = "neuraldbg.methods"
T = TypeVar("T", bound=type)


def register_method(name: str) -> Callable[[T], T]:
    """Class decorator that registers a diagnosis method under ``name``.

    The class must define ``explain(trace) -> list[Hypothesis]`` and be constructible
    without arguments.

    Raises
    ------
    ValueError
        If ``name`` is already registered, or is not a non-empty string.
    TypeError
        If the class has no ``explain`` method.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"A method name must be a non-empty string, got {name!r}.")

    def decorator(cls: T) -> T:
        if name in _METHODS:
            raise ValueError(
                f"A diagnosis method named {name!r} is already registered "
                f"({_METHODS[name].__qualname__}). Choose another name; registered: "
                f"{sorted(_METHODS)}."
            )
        if not callable(getattr(cls, "explain", None)):
            raise TypeError(f"{cls.__qualname__} has no explain(trace) method; a diagnosis "
                            "method must define explain(trace) -> list[Hypothesis].")
        _METHODS[name] = cls
        return cls

    return decorator


def _declared() -> dict[str, EntryPoint]:
    """Methods that installed packages declare in the entry-point group, by name."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_methods() -> list[str]:
    """Registered method names, and those installed packages declare (loaded on first use)."""
    return sorted(set(_METHODS) | set(_declared()))


def get_method(method: str | Any) -> Any:
    """A method instance from a registered name, or ``method`` itself if it has ``explain``.

    Raises
    ------
    ValueError
        If the name is not registered; the message lists the registered names.
    """
    if not isinstance(method, str):
        if callable(getattr(method, "explain", None)):
            return method
        raise TypeError(f"method must be a registered name or an object with explain(trace), "
                        f"got {type(method).__name__}. Registered: {available_methods()}.")
    if method not in _METHODS:
        declared = _declared().get(method)
        if declared is not None:
            try:
                cls = declared.load()
            except ImportError as exc:
                raise ValueError(f"Method {method!r} is declared by {declared.value!r}, which "
                                 f"could not be imported ({exc}).") from exc
            if method not in _METHODS:  # loading may have registered it already
                register_method(method)(cls)
    if method not in _METHODS:
        raise ValueError(f"Unknown diagnosis method {method!r}. Registered methods are: "
                         f"{available_methods()}.")
    return _METHODS[method]()


def _as_trace(trace: Trace | str | os.PathLike[str]) -> Trace:
    """A trace to diagnose: loaded if a path, its ranks combined if a distributed run's."""
    if isinstance(trace, Trace):
        return combine_ranks(trace)
    if isinstance(trace, (str, os.PathLike)):
        return combine_ranks(load_trace(trace))
    inner = getattr(trace, "trace", None)  # a NeuralDbg
    if isinstance(inner, Trace):
        return combine_ranks(inner)
    raise TypeError(f"Expected a Trace, a trace directory or a NeuralDbg, got "
                    f"{type(trace).__name__}.")


@dataclass(frozen=True)
class Diagnosis:
    """Everything the heuristic reasoner computed for one trace, stage by stage."""

    states: StateTable
    dynamics: LossDynamics
    events: list[Event]
    compression: Compression
    facts: RunFacts
    symptoms: list[Symptom]
    hypotheses: list[Hypothesis]

    @property
    def coupled(self) -> list[CoupledFailure]:
        """Coupled failures, cause before effect."""
        return self.compression.coupled

    def graph(self) -> nx.DiGraph:
        """The causal graph (:func:`neuraldbg.graph.build_causal_graph`)."""
        return build_causal_graph(self.hypotheses, self.compression.coupled)


def diagnose(trace: Trace | str | os.PathLike[str], config: ThresholdConfig | None = None,
             window: int = 5) -> Diagnosis:
    """Run the heuristic pipeline on a trace and keep every stage's output.

    Parameters
    ----------
    trace : Trace or path
    config : ThresholdConfig, optional
    window : int, default=5
        Steps within which failures in different layers are coupled.

    Returns
    -------
    Diagnosis

    Raises
    ------
    ValueError
        If the trace holds no step yet.
    """
    trace = _as_trace(trace)
    if len(trace.steps) == 0 or len(trace.stats) == 0:
        raise ValueError(
            "The trace holds no recorded step yet, so there is nothing to explain. Call "
            "dbg.step(loss) after at least one training step (forward, backward, "
            "optimizer.step()) before explaining."
        )
    states = classify_states(trace, config)
    dyn = loss_dynamics(trace, states.config)
    events = extract_events(trace, states, dyn)
    comp = compress(events, states, window)
    facts = gather_facts(trace, states, dyn)
    symptoms = find_symptoms(trace, states, dyn, comp, facts)
    resolve_overlaps(symptoms, dyn, facts, states)
    hyps = generate_hypotheses(symptoms, comp, facts, states)
    return Diagnosis(states, dyn, events, comp, facts, symptoms, hyps)


@register_method("heuristic")
class HeuristicReasoner:
    """The rule-based Post-Mortem Reasoner, with a scikit-learn-like interface.

    Parameters
    ----------
    thresholds : ThresholdConfig, optional
        Every threshold of the reasoner; the documented defaults when omitted.
    window : int, default=5
        Steps within which failures in different layers are coupled.

    Attributes
    ----------
    classes_ : list of str
        The failure types of the contract followed by ``"healthy"``: the columns of
        :meth:`predict_proba`. Rules need no fitting, so it exists from construction.

    Examples
    --------
    >>> reasoner = HeuristicReasoner()
    >>> reasoner.classes_[-1]
    'healthy'
    """

    def __init__(self, *, thresholds: ThresholdConfig | None = None, window: int = 5) -> None:
        self.thresholds = thresholds
        self.window = window

    @property
    def classes_(self) -> list[str]:
        """Failure types, then ``"healthy"``."""
        return [*FAILURE_TYPES, HEALTHY]

    def fit(self, traces: Iterable[Trace] | None = None, y: Any = None) -> HeuristicReasoner:
        """No-op (rules are not fitted); returns ``self`` for pipeline compatibility."""
        return self

    def diagnose(self, trace: Trace | str | os.PathLike[str]) -> Diagnosis:
        """All stages' outputs for one trace."""
        return diagnose(trace, self.thresholds, self.window)

    def explain(self, trace: Trace | str | os.PathLike[str]) -> list[Hypothesis]:
        """Ranked hypotheses for one trace, highest confidence first."""
        return self.diagnose(trace).hypotheses

    def predict_proba(self, traces: Iterable[Trace | str | os.PathLike[str]] | Trace
                      ) -> np.ndarray:
        """Probability of each class of :attr:`classes_` for each trace.

        A failure type's score is the highest confidence of its hypotheses; ``healthy``
        scores ``1 - max(failure scores)``; each row is then normalised to sum to 1.

        Returns
        -------
        ndarray of shape (n_traces, n_classes)
        """
        if isinstance(traces, (Trace, str, os.PathLike)):
            traces = [traces]
        rows = []
        for trace in traces:
            score = dict.fromkeys(FAILURE_TYPES, 0.0)
            for h in self.explain(trace):
                if h.failure_type in score:
                    score[h.failure_type] = max(score[h.failure_type], h.confidence)
            vec = np.array([*score.values(), 1.0 - max(score.values())], dtype=float)
            rows.append(vec / vec.sum())
        return np.vstack(rows) if rows else np.zeros((0, len(self.classes_)))

    def predict(self, traces: Iterable[Trace | str | os.PathLike[str]] | Trace) -> np.ndarray:
        """Most probable class for each trace."""
        proba = self.predict_proba(traces)
        return np.asarray(self.classes_, dtype=object)[proba.argmax(axis=1)]


def explain(trace: Trace | str | os.PathLike[str], method: str | Any = "heuristic"
            ) -> list[Hypothesis]:
    """Explain a run: ranked hypotheses, highest confidence first.

    Parameters
    ----------
    trace : Trace or path
        A trace or a trace directory.
    method : str or object, default="heuristic"
        A registered method name (``"heuristic"``, ``"probabilistic"``, ...) or an object
        with ``explain(trace)``.

    Returns
    -------
    list of Hypothesis
        Empty, or no hypothesis with ``confidence >= 0.5``, means the run is judged healthy.
        Steps that never finished are left out; a trace of fewer than
        :data:`neuraldbg.sufficiency.MIN_STEPS` finished steps gives no hypothesis at 0.5 or
        above, and its hypotheses say why (``metadata["thin_evidence"]``).

    Raises
    ------
    ValueError
        If the trace holds no finished step, or ``method`` is not registered.
    """
    usable = usable_trace(_as_trace(trace))
    hypotheses = list(get_method(method).explain(usable))
    reason = thin_evidence(usable)
    return hedge(hypotheses, reason) if reason else hypotheses


def get_root_causes(trace: Trace | str | os.PathLike[str], method: str | Any = "heuristic"
                    ) -> list[RootCause]:
    """Root causes of a run, each at the confidence of its best hypothesis, highest first."""
    return rank_root_causes(explain(trace, method))


def detect_coupled_failures(trace: Trace | str | os.PathLike[str], window: int = 5
                            ) -> list[CoupledFailure]:
    """Failure onsets in different layers within ``window`` steps, cause before effect."""
    return diagnose(trace, window=window).coupled


def causal_graph(trace: Trace | str | os.PathLike[str]) -> nx.DiGraph:
    """The heuristic diagnosis as a ``networkx.DiGraph`` (see :mod:`neuraldbg.graph`)."""
    return diagnose(trace).graph()


def export_mermaid_causal_graph(trace: Trace | str | os.PathLike[str]) -> str:
    """The causal graph as Mermaid flowchart text (deduplicated, safe node ids)."""
    return to_mermaid(causal_graph(trace))
