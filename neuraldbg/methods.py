"""Diagnosis methods: a registry by name, the heuristic reasoner, and functions of a trace.

``explain(trace, method="heuristic")`` runs a registered method. Every method satisfies the
:class:`DiagnosisMethod` protocol (``explain(trace) -> list[Hypothesis]``, highest confidence
first); ``tests/test_method_conformance.py`` checks each registered one on real runs.
``"heuristic"`` is the Post-Mortem Reasoner (states -> events -> compression -> hypotheses).
Methods that live in other installed packages are found through the ``neuraldbg.methods``
entry-point group and loaded on first use: the ``causal_models`` package declares
``"probabilistic"`` there, so ``neuraldbg`` never imports it. A researcher adds a method
with :func:`register_method`::

    @register_method("my_rules")
    class MyRules:
        def explain(self, trace): ...          # -> list[Hypothesis], highest first

or, from a package of their own, with an entry point in its ``pyproject.toml``::

    [project.entry-points."neuraldbg.methods"]
    my_rules = "my_package.rules:MyRules"
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol, TypeVar, runtime_checkable

import networkx as nx
import numpy as np

from neuraldbg.causes import nonfinite_check, summed_loss_hint
from neuraldbg.compressor import Compression, CoupledFailure, compress
from neuraldbg.errors import MissingDependencyError
from neuraldbg.events import LossDynamics, extract_events, loss_dynamics
from neuraldbg.graph import build_causal_graph, graph_to_mermaid
from neuraldbg.hypotheses import (
    RankedCause,
    generate_hypotheses,
    rank_root_causes,
    resolve_overlaps,
)
from neuraldbg.knobs import validate_knobs
from neuraldbg.outside_vocabulary import (
    cause_outside_vocabulary,
    claim_unbounded_loss,
    claim_unknown,
    frozen_weights,
    loss_unbounded_below,
    modules_never_run,
    name_cause_unknown,
)
from neuraldbg.ranks import combine_ranks
from neuraldbg.records import FAILURE_TYPES, HEALTHY, Event, Hypothesis
from neuraldbg.registry_base import Registry
from neuraldbg.run_facts import SOFTMAX_OUTPUTS, RunFacts, gather_facts
from neuraldbg.states import StateTable, classify_states
from neuraldbg.sufficiency import (
    adversarial_growth,
    confident_output,
    fell_early_then_settled,
    hedge,
    hedge_failure,
    improved_past_a_stall,
    learned_the_training_data,
    plateau_unclaimable,
    signed_stall_unclaimable,
    spikes_while_settled,
    squashing_output,
    thin_evidence,
    usable_trace,
)
from neuraldbg.symptoms import Symptom, find_symptoms
from neuraldbg.thresholds import ThresholdConfig
from neuraldbg.trace import Trace, load_trace
from neuraldbg.trace_memo import memoized

__all__ = [
    "DiagnosisMethod",
    "CounterfactualAnswer",
    "CounterfactualMethod",
    "METHODS",
    "ENTRY_POINT_GROUP",
    "register_method",
    "unregister_method",
    "get_method",
    "available_methods",
    "HeuristicReasoner",
    "Diagnosis",
    "heuristic_diagnosis",
    "explain",
    "get_root_causes",
    "detect_coupled_failures",
    "causal_graph",
    "export_mermaid_causal_graph",
    "what_if",
]


@runtime_checkable
class DiagnosisMethod(Protocol):
    """What every diagnosis method is: ``explain(trace) -> list[Hypothesis]``.

    The heuristic reasoner, the probabilistic model (``causal_models.ProbabilisticMethod``)
    and the ported baselines (``benchmarks.baselines``) implement it. A registered method
    class must be constructible without arguments. The full contract, which the conformance
    test ``tests/test_method_conformance.py`` checks on real runs for every registered
    method: each hypothesis has the fields of :class:`~neuraldbg.records.Hypothesis` with
    ``failure_type`` and ``root_cause`` from the vocabulary, confidences in [0, 1] and sorted
    descending; a healthy run gives nothing at ``confidence >= 0.5``; a failing run gives
    a failure.
    """

    def explain(self, trace: Trace) -> list[Hypothesis]:
        """Ranked hypotheses for one trace, highest confidence first.

        Parameters
        ----------
        trace : Trace
            The recorded run (finished steps only; :func:`explain` prepares it).

        Returns
        -------
        list of Hypothesis
            Empty, or nothing at ``confidence >= 0.5``, when the run is judged healthy.
        """
        ...


@runtime_checkable
class CounterfactualAnswer(Protocol):
    """What ``what_if`` returns (``causal_models.Counterfactual`` is the shipped record).

    ``neuraldbg`` never imports ``causal_models``, so the answer is typed by its fields.
    """

    p_failure_factual: float
    p_failure: float
    failure_type: str
    metadata: dict[str, Any]


@runtime_checkable
class CounterfactualMethod(DiagnosisMethod, Protocol):
    """A diagnosis method that also answers counterfactuals (``what_if``)."""

    def what_if(self, trace: Trace, **knobs: Any) -> CounterfactualAnswer:
        """The run's counterfactual under changed knobs (:data:`neuraldbg.knobs.KNOBS`)."""
        ...


#: Diagnosis method classes by name (``heuristic``, the baselines, entry points once loaded).
METHODS: Registry[type[DiagnosisMethod]] = Registry("diagnosis method")
#: The entry-point group through which installed packages declare methods.
ENTRY_POINT_GROUP = "neuraldbg.methods"
T = TypeVar("T", bound=type)


def register_method(name: str) -> Callable[[T], T]:
    """Class decorator that registers a diagnosis method under ``name``.

    The class must satisfy :class:`DiagnosisMethod` (define ``explain(trace) ->
    list[Hypothesis]``) and be constructible without arguments.

    Raises
    ------
    neuraldbg.registry_base.DuplicateNameError
        If ``name`` is already registered (a ``ValueError``).
    ValueError
        If ``name`` is not a non-empty string.
    TypeError
        If the class has no ``explain`` method.
    """
    add = METHODS.register(name)

    def decorator(cls: T) -> T:
        if not callable(getattr(cls, "explain", None)):
            raise TypeError(f"{cls.__qualname__} has no explain(trace) method; a diagnosis "
                            "method must define explain(trace) -> list[Hypothesis].")
        add(cls)
        return cls

    return decorator


def unregister_method(name: str) -> type[DiagnosisMethod]:
    """Remove a registered method and return its class (tests, interactive sessions).

    Raises
    ------
    neuraldbg.registry_base.UnknownNameError
        If ``name`` is not registered (a ``KeyError`` and a ``ValueError``).
    """
    return METHODS.unregister(name)


def _declared() -> dict[str, EntryPoint]:
    """Methods that installed packages declare in the entry-point group, by name."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_methods() -> list[str]:
    """Registered method names, and those installed packages declare (loaded on first use)."""
    return sorted(set(METHODS) | set(_declared()))


def _load_declared(method: str) -> None:
    """Register the method an installed package declares under ``method``, if any.

    Raises
    ------
    neuraldbg.errors.MissingDependencyError
        If the declaring package needs a module that is not installed (an ``ImportError``;
        the message names it). Any other error of the import propagates unchanged: a
        broken method fails loudly.
    """
    declared = _declared().get(method)
    if declared is None:
        return
    try:
        cls = declared.load()
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if not missing or missing == declared.module.split(".")[0]:
            raise  # the declaring package itself is broken: fail loudly
        raise MissingDependencyError(
            f"Diagnosis method {method!r} is declared by {declared.value!r}, which needs "
            f"{missing!r}: it is not installed ({exc}). Install it to use this method."
        ) from exc
    if method not in METHODS:  # loading may have registered it already
        register_method(method)(cls)


def get_method(method: str | DiagnosisMethod) -> DiagnosisMethod:
    """A method instance from a registered name, or ``method`` itself if it has ``explain``.

    Parameters
    ----------
    method : str or DiagnosisMethod
        A name of :func:`available_methods`, or an object with ``explain(trace)``.

    Raises
    ------
    neuraldbg.registry_base.UnknownNameError
        If the name is not registered (a ``ValueError`` and a ``KeyError``); the message
        lists the available names.
    neuraldbg.errors.MissingDependencyError
        If the name is declared by an installed package that cannot be imported.
    TypeError
        If ``method`` is neither a name nor an object with ``explain``.
    """
    if not isinstance(method, str):
        if isinstance(method, DiagnosisMethod):
            return method
        raise TypeError(f"method must be a registered name or an object with explain(trace), "
                        f"got {type(method).__name__}. Registered: {available_methods()}.")
    if method not in METHODS:
        _load_declared(method)
    if method not in METHODS:
        raise METHODS.unknown(method, available_methods())
    return METHODS.get(method)()


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


def heuristic_diagnosis(trace: Trace | str | os.PathLike[str],
                        config: ThresholdConfig | None = None,
                        window: int | None = None) -> Diagnosis:
    """Run the heuristic pipeline on a trace and keep every stage's output.

    Parameters
    ----------
    trace : Trace or path
    config : ThresholdConfig, optional
        The reasoner's thresholds; the documented defaults when omitted.
    window : int, optional
        Steps within which failures in different layers are coupled; ``config.window``
        when omitted.

    Returns
    -------
    Diagnosis
        Kept with the trace object (:func:`neuraldbg.trace_memo.memoized`): asked again
        for the same trace, the same diagnosis comes back; do not modify it.

    Raises
    ------
    ValueError
        If the trace holds no step yet.
    """
    trace = _as_trace(trace)
    return memoized(trace, ("heuristic_diagnosis", config, window),
                    lambda: _diagnose(trace, config, window))


def _diagnose(trace: Trace, config: ThresholdConfig | None, window: int | None) -> Diagnosis:
    """The heuristic pipeline, stage by stage (see :func:`heuristic_diagnosis`)."""
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
    window : int, optional
        Steps within which failures in different layers are coupled;
        ``thresholds.window`` (:attr:`ThresholdConfig.window`) when omitted.

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

    def __init__(self, *, thresholds: ThresholdConfig | None = None,
                 window: int | None = None) -> None:
        self.thresholds = thresholds
        self.window = window

    @property
    def classes_(self) -> list[str]:
        """Failure types, then ``"healthy"``."""
        return [*FAILURE_TYPES, HEALTHY]

    def fit(self, traces: Iterable[Trace] | None = None, y: object = None) -> HeuristicReasoner:
        """No-op (rules are not fitted); returns ``self`` for pipeline compatibility."""
        return self

    def diagnose(self, trace: Trace | str | os.PathLike[str]) -> Diagnosis:
        """All stages' outputs for one trace."""
        return heuristic_diagnosis(trace, self.thresholds, self.window)

    def explain(self, trace: Trace | str | os.PathLike[str]) -> list[Hypothesis]:
        """Ranked hypotheses for one trace, highest confidence first."""
        return list(self.diagnose(trace).hypotheses)  # (the diagnosis is kept: copy its list)

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


def explain(trace: Trace | str | os.PathLike[str], method: str | DiagnosisMethod = "heuristic"
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
        above, and its hypotheses say why (``metadata["thin_evidence"]``). A model whose
        weights never moved gives a ``training_plateau`` with ``root_cause="unknown"`` on top
        and ``metadata["hint"]`` saying what to check (no gradient reached the optimizer
        step, or the optimizer holds other parameters), every named cause below 0.5; a
        failure claimed on a model whose BatchNorm layers do not normalise (trained in
        ``eval()`` mode) is named with ``root_cause="unknown"`` and that hint, and so is a
        too-low rate claimed under a gradient norm a clip pinned at every step, and a
        failure on weights that collapsed toward zero (a weight decay far too strong). A
        loss that fell through zero faster the further it went (no lower bound: a BCE given
        real-valued targets) is a ``loss_divergence`` with ``root_cause="unknown"`` and a
        hint, whatever the method said. A
        training plateau is kept below 0.5 (``metadata["thin_evidence"]`` says why) on a
        run too short to stall, a loss still falling, a GAN's players, and, when no cause
        explains it, a loss that fell by more than a stall allows and settled (its task's
        floor, :func:`neuraldbg.sufficiency.improved_past_a_stall`), and, unless the weights
        did not move (a rate too low), a loss that goes below zero
        (:func:`neuraldbg.sufficiency.signed_stall_unclaimable`); exploding gradients
        are, when the gradient norm only spiked in a run that learned and settled
        (:func:`neuraldbg.sufficiency.spikes_while_settled`). A run whose loss fell
        three decades to under 0.01 learned its training data: no hypothesis at 0.5 or
        above (:func:`neuraldbg.sufficiency.learned_the_training_data`).

    Raises
    ------
    ValueError
        If the trace holds no finished step, or ``method`` is not registered.
    """
    usable = usable_trace(_as_trace(trace))
    hypotheses = list(get_method(method).explain(usable))
    reason = _no_verdict(usable)
    if reason:
        return hedge(hypotheses, reason)
    unbounded = claim_unbounded_loss(hypotheses, usable)
    if unbounded is not None:
        return unbounded
    frozen = frozen_weights(usable)
    if frozen:
        return claim_unknown(hypotheses, frozen, usable)
    never_run = modules_never_run(usable)
    if never_run:  # no gradient ever reached most of the weights the optimizer holds
        what, first = never_run
        return claim_unknown(hypotheses, what, usable, failure_type="vanishing_gradients",
                             origin=(first, int(usable.steps["step"].min())),
                             root_cause="gradient_blocked")
    hint = cause_outside_vocabulary(usable, hypotheses)
    if hint:
        hypotheses = name_cause_unknown(hypotheses, hint)
    hypotheses = _with_fact_hint(usable, hypotheses)
    if _plateau_claim(hypotheses) is not None:
        why = _unclaimable_plateau(usable, lambda: hypotheses)
        if why:
            hypotheses = hedge_failure(hypotheses, "training_plateau", why)
    for failure, unclaimable in (("saturated_activations", confident_output),
                                 ("exploding_gradients", adversarial_growth),
                                 ("exploding_gradients", spikes_while_settled)):
        if any(h.failure_type == failure and h.confidence >= 0.5 for h in hypotheses):
            why = unclaimable(usable)
            if why:
                hypotheses = hedge_failure(hypotheses, failure, why)
    return hypotheses


def _no_verdict(usable: Trace) -> str | None:
    """Why the trace supports no verdict: thin evidence, or a loss at the bottom.

    Not a loss that fell through zero without a floor: that is a failure.
    """
    return thin_evidence(usable) or (None if loss_unbounded_below(usable)
                                     else learned_the_training_data(usable))


def _with_fact_hint(usable: Trace, hypotheses: list[Hypothesis]) -> list[Hypothesis]:
    """The claimed verdict with what to check or change, if it has no hint.

    A method that names no hint itself (the network) gets the one the trace's facts give:
    for ``data_problem`` or ``unknown``, the non-finite facts'
    (:func:`neuraldbg.causes.nonfinite_check`: which batch, target or module to check, at
    which step); for a rate too high, a loss summed over its batch
    (:func:`neuraldbg.causes.summed_loss_hint`).
    """
    top = max(hypotheses, key=lambda h: h.confidence, default=None)
    if (top is None or top.confidence < 0.5 or top.metadata.get("hint")
            or top.root_cause not in ("data_problem", "unknown", "learning_rate_too_high")):
        return hypotheses
    facts = heuristic_diagnosis(usable).facts
    check = (summed_loss_hint(facts) if top.root_cause == "learning_rate_too_high"
             else nonfinite_check(facts))
    if not check:
        return hypotheses
    return [dataclasses.replace(h, metadata={**h.metadata, "hint": check}) if h is top else h
            for h in hypotheses]


def _plateau_claim(hypotheses: list[Hypothesis]) -> Hypothesis | None:
    """The first training plateau claimed at 0.5 or above, if any."""
    return next((h for h in hypotheses
                 if h.failure_type == "training_plateau" and h.confidence >= 0.5), None)


#: Causes of a stall that explain a loss which fell and then settled above where it should:
#: a squashed output under the loss, targets far off scale, a rate that slows the fall.
FLOOR_CAUSES = ("loss_output_mismatch", "unscaled_targets", "learning_rate_too_low")


def _unclaimable_plateau(usable: Trace, hypotheses: Callable[[], list[Hypothesis]]
                         ) -> str | None:
    """Why a training plateau may not be claimed on this run, or ``None``.

    :func:`neuraldbg.sufficiency.plateau_unclaimable`; for a plateau of unknown cause, or
    of a loss-output mismatch in a network that does not end in a sigmoid or softmax (a module,
    a function in ``forward``, or one the loss line applies: the facts' ``output_type``)
    (a binary task at its label-noise floor was named ``loss_output_mismatch`` at 0.50 by the
    causal model), a loss that fell further than a stall allows
    (:func:`neuraldbg.sufficiency.improved_past_a_stall`); and for a plateau whose cause does
    not explain a floor (not one of :data:`FLOOR_CAUSES`, the mismatch only with a squashing
    output), a loss that fell early and then settled
    (:func:`neuraldbg.sufficiency.fell_early_then_settled`); and for a plateau of any cause
    but a rate too low, a loss that goes below zero
    (:func:`neuraldbg.sufficiency.signed_stall_unclaimable`). ``hypotheses`` gives the
    method's hypotheses, asked for only in the last three cases.
    """
    why = plateau_unclaimable(usable)
    if why:
        return why
    floor, early = improved_past_a_stall(usable), fell_early_then_settled(usable)
    signed = signed_stall_unclaimable(usable)
    if floor is None and early is None and signed is None:
        return None
    claim = _plateau_claim(hypotheses())
    if claim is None:
        return None
    if signed is not None and claim.root_cause != "learning_rate_too_low":
        return signed
    # a loss-output mismatch explains a floor only where an output squashes before the loss
    # (in the model, or in the loss line: the facts read its softmax off the gradient)
    unsupported = claim.root_cause == "loss_output_mismatch" and not (
        squashing_output(usable)
        or heuristic_diagnosis(usable).facts.output_type in SOFTMAX_OUTPUTS)
    if floor is not None and (claim.root_cause == "unknown" or unsupported):
        return floor
    explained = claim.root_cause in FLOOR_CAUSES and not unsupported
    return early if not explained else None


def get_root_causes(trace: Trace | str | os.PathLike[str],
                    method: str | DiagnosisMethod = "heuristic") -> list[RankedCause]:
    """Root causes of a run, each at the confidence of its best hypothesis, highest first."""
    return rank_root_causes(explain(trace, method))


def detect_coupled_failures(trace: Trace | str | os.PathLike[str], window: int | None = None
                            ) -> list[CoupledFailure]:
    """Failure onsets in different layers within ``window`` steps, cause before effect.

    ``window`` defaults to :attr:`neuraldbg.thresholds.ThresholdConfig.window` (5 steps).
    """
    return heuristic_diagnosis(trace, window=window).coupled


def causal_graph(trace: Trace | str | os.PathLike[str]) -> nx.DiGraph:
    """The heuristic diagnosis as a ``networkx.DiGraph`` (see :mod:`neuraldbg.graph`)."""
    return heuristic_diagnosis(trace).graph()


def export_mermaid_causal_graph(trace: Trace | str | os.PathLike[str]) -> str:
    """The causal graph as Mermaid flowchart text (deduplicated, safe node ids)."""
    return graph_to_mermaid(causal_graph(trace))


def _factual_reading(answer: Any) -> str | None:
    """The failure type a counterfactual answer reads the run as it happened as, or None.

    ``None`` when it reads it healthy (``p_failure_factual`` below 0.5).
    """
    factual = getattr(answer, "p_failure_types_factual", None) or {}
    failing = {k: float(v) for k, v in factual.items() if k != HEALTHY}
    if not failing or float(getattr(answer, "p_failure_factual", 0.0)) < 0.5:
        return None
    return max(failing, key=lambda k: failing[k])


def what_if(trace: Trace | str | os.PathLike[str],
            method: str | DiagnosisMethod = "probabilistic", **knobs: Any) -> CounterfactualAnswer:
    """What the run would have done under changed knobs, from its trace (no re-training).

    The counterfactual of a method that answers them (the ``"probabilistic"`` causal model:
    abduction, action, prediction), found through the method registry. Steps that never
    finished are left out, as :func:`neuraldbg.methods.explain` leaves them out; on a trace
    too thin for a verdict the answer's ``metadata["thin_evidence"]`` says why, and on a run
    that shows a bug no knob or cause of the model names (weights that never moved or
    collapsed, BatchNorm in ``eval()``) ``metadata["outside_vocabulary"]`` says which: the
    knobs' effects were estimated without it. When the model reads the run as a training
    plateau that :func:`explain` may not claim (too short a run, a loss still falling, a
    loss of no known cause that fell further than a stall allows, a loss that goes below
    zero), ``metadata["plateau_unclaimable"]`` says why, so the two answers do not silently
    disagree; so does ``metadata["explosion_unclaimable"]`` for an explosion it may not
    claim (a game's player starting, spikes in a run that learned and settled).

    Parameters
    ----------
    trace : Trace or path
        The run as it happened (a trace, a trace directory or a ``NeuralDbg``).
    method : str or object, default="probabilistic"
        A registered method name, or an object with ``what_if(trace, **knobs)``.
    **knobs
        ``lr_scale``, ``init_scale``, ``input_scale``, ``grad_clip``, ``activation``,
        ``normalization`` (relative to the run; :data:`neuraldbg.knobs.KNOBS`).

    Returns
    -------
    CounterfactualAnswer
        The method's answer (``causal_models.Counterfactual``): ``p_failure_factual``,
        ``p_failure``, ``failure_type`` and metadata.

    Raises
    ------
    ValueError
        For an unknown knob or value, or a method that does not answer counterfactuals.
    """
    validate_knobs(**knobs)
    engine = get_method(method)
    if not isinstance(engine, CounterfactualMethod):
        raise ValueError(f"The diagnosis method {method!r} does not answer counterfactuals "
                         "(it has no what_if); use method='probabilistic'.")
    usable = usable_trace(_as_trace(trace))
    answer = engine.what_if(usable, **knobs)
    reading = _factual_reading(answer)
    unclaimable = (_unclaimable_plateau(usable, lambda: list(engine.explain(usable)))
                   if reading == "training_plateau" else None)
    never_run = modules_never_run(usable)
    said = {"thin_evidence": _no_verdict(usable),
            "outside_vocabulary": (loss_unbounded_below(usable) or frozen_weights(usable)
                                   or (never_run[0] if never_run else None)
                                   or cause_outside_vocabulary(usable, [])),
            "plateau_unclaimable": unclaimable,
            "saturation_unclaimable": (confident_output(usable)
                                       if reading == "saturated_activations" else None),
            "explosion_unclaimable": ((adversarial_growth(usable)
                                       or spikes_while_settled(usable))
                                      if reading == "exploding_gradients" else None)}
    said = {k: v for k, v in said.items() if v}
    if said and dataclasses.is_dataclass(answer) and isinstance(
            getattr(answer, "metadata", None), dict):
        answer = dataclasses.replace(answer, metadata={**answer.metadata, **said})
    return answer
