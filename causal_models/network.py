"""The probabilistic reasoner: a time-sliced Bayesian network fitted on failure-zoo traces.

:class:`ProbabilisticReasoner` follows scikit-learn's estimator conventions: keyword-only
hyperparameters stored unchanged in ``__init__``; ``fit(traces)`` discretizes the traces
(:mod:`causal_models.discretize`), builds the structure and Dirichlet priors from the
registered rules (:mod:`causal_models.structure`), estimates every conditional table with
pgmpy's ``BayesianEstimator`` and fits a calibrator on out-of-family predictions
(:mod:`causal_models.calibration`); ``predict_proba`` gives the posterior over failure types
(``classes_``), ``explain`` the contract's ranked hypotheses. Causal queries live in
:mod:`causal_models.interventions` and are exposed here as ``intervene`` and ``what_if``.

The network is a plain unrolled pgmpy ``DiscreteBayesianNetwork``; inference is exact
variable elimination (pgmpy's ``DBNInference`` is avoided on purpose: its open bugs give
wrong answers and huge allocations).
"""

from __future__ import annotations

import json
import os
import warnings
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from causal_models.calibration import Calibrator, fit_calibrator
from causal_models.discretize import Bins, Discretized, discretize
from causal_models.evidence import RULE_NO_CAUSE, observe_knobs, observe_stack, rule_verdict
from causal_models.labels import training_labels
from causal_models.origin import locate_origin
from causal_models.placement import fit_placement
from causal_models.structure import NO_CAUSE, build_structure, root_cause_states
from causal_models.support import table_support
from neuraldbg.errors import NotFittedError
from neuraldbg.knobs import KNOBS
from neuraldbg.methods import diagnose
from neuraldbg.records import HEALTHY, Hypothesis
from neuraldbg.trace import Trace

__all__ = ["ProbabilisticReasoner", "name_undetermined_cause"]

# Discretized evidence per live trace object and discretization settings: leave-one-family-out
# evaluation fits many models on the same traces. Entries go when the trace is collected.
_EVIDENCE_CACHE: dict[tuple[int, tuple[Any, ...]], Discretized] = {}


def _forget(key_id: int) -> None:
    for key in [k for k in _EVIDENCE_CACHE if k[0] == key_id]:
        del _EVIDENCE_CACHE[key]


def _pgmpy(*, estimators: bool = True) -> Any:
    """Import pgmpy quietly (it warns about its own deprecations on import).

    ``estimators=False`` skips ``pgmpy.estimators`` (which imports scikit-learn): loading a
    fitted model and answering queries need only the model, factors and inference.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgmpy.inference as inf
        import pgmpy.models as models
        from pgmpy.factors.discrete import TabularCPD

        est: Any = None
        if estimators:
            import pgmpy.estimators

            est = pgmpy.estimators
    return models, est, inf, TabularCPD


def _is_plain(ground_truth: dict[str, Any]) -> bool:
    """A run of the scenario as defined: no knob changed, default severity (when known)."""
    knobs = ground_truth.get("knobs") or {}
    changed = any(v is not None and (KNOBS[k].kind != "multiplier" or v != 1.0)
                  for k, v in knobs.items() if k in KNOBS)
    default = ground_truth.get("default_severity")
    off_default = default is not None and ground_truth.get("severity") != default
    return not changed and not off_default


def name_undetermined_cause(hyps: list[Hypothesis]) -> list[Hypothesis]:
    """Name a failure whose cause the evidence does not single out ``unknown``.

    A failure the evidence shows, with no cause the evidence singles out, is named with
    ``root_cause="unknown"`` at the failure type's posterior; the candidate causes
    stay listed at their joint posterior (each below 0.5 then).
    """
    top = hyps[0]
    p_ft = float(top.metadata["p_failure_type"])
    if p_ft < 0.5 or top.confidence >= 0.5 or top.root_cause == "unknown":
        return hyps
    candidates = {h.root_cause: round(h.confidence, 4) for h in hyps
                  if h.failure_type == top.failure_type}
    unknown = Hypothesis(
        failure_type=top.failure_type, root_cause="unknown",
        origin_layer=top.origin_layer, origin_step=top.origin_step, confidence=p_ft,
        metadata={**top.metadata, "p_root_cause_given_failure": None, "p_joint": None,
                  "cause_undetermined": candidates,
                  "reason": (f"the evidence shows {top.failure_type} (posterior "
                             f"{p_ft:.2f}) but does not single out its cause: the most "
                             f"probable, {top.root_cause}, has {top.confidence:.2f}")})
    return [unknown, *hyps]


class ProbabilisticReasoner:
    """Posterior over failure types and root causes from a time-sliced Bayesian network.

    Parameters
    ----------
    n_slices : int, default=2
        Time slices the network is unrolled over (2: before the located onset and from it on;
        halves of the run without one).
    n_blocks : int, default=2
        Layer blocks per slice (2: input side and output side). Measured leave-one-family-out
        on the zoo, 2 x 2 generalises better than 3 x 2 and 4 x 3: more slice nodes make the
        posterior overconfident on families it has not seen.
    prior_strength : float, default=20.0
        Pseudo-observations per parent configuration from the rule priors. Strong priors keep
        the tables of families the zoo shows in one way only from ruling out the other ways
        a held-out family may show the same failure.
    persistence : float, default=4.0
        Prior odds of a slice state persisting to the next slice.
    coupling : float, default=2.0
        Prior odds of a block taking its upstream neighbour's state.
    balance : {"family", "none"}, default="family"
        Weight fitting runs so that every zoo family counts the same.
    calibration : {"temperature", "isotonic", "none"}, default="temperature"
        Recalibration of the failure-type posterior, fitted on out-of-family predictions of
        a grouped cross-validation inside ``fit``.
    calibration_cv : int or None, default=8
        Folds (grouped by family) of that cross-validation; None: one per family (the
        held-out predictions then come from models that miss one family, as in use). Eight
        folds keep every held-out prediction out-of-family at a fraction of the cost: one
        fold per family made the benchmark's leave-one-family-out fits quadratic in the
        number of families (38 families: 37 inner fits per fold fit).
    min_confidence : float, default=0.02
        ``explain`` lists the most probable failure type and the others with at least this
        posterior.
    rule_evidence : bool, default=True
        Observe the heuristic reasoner's graded verdict as evidence (``rule_strength``,
        ``rule_failure``, ``rule_cause``), so the fitted tables learn how far to trust the
        rules at each grade.
    rule_trust : float, default=0.9
        Prior probability that the rules name the truth (before fitting).
    bins : Bins, optional
        Discretization thresholds.
    slices : bool, default=True
        False: one time slice over the whole run instead of ``n_slices`` (run level only:
        the benchmark's ablation without the time slices).

    Attributes
    ----------
    network_ : pgmpy.models.DiscreteBayesianNetwork
        The fitted network.
    structure_ : Structure
        Its nodes, parents and priors.
    classes_ : numpy.ndarray
        Failure types, ``"healthy"`` included, in ``predict_proba`` column order.
    root_causes_ : numpy.ndarray
        Root-cause states (``"none"`` for healthy) in ``predict_root_cause_proba`` order.
    calibrator_ : Calibrator
        The fitted recalibration of the failure-type posterior.
    n_fit_traces_ : int
    fit_families_ : list of str
        Zoo families seen in fitting.
    support_ : pandas.DataFrame
        How far the fitting data reached each table (:func:`causal_models.support.
        table_support`): columns reached, data weight against the prior's pseudo-counts.

    Examples
    --------
    >>> reasoner = ProbabilisticReasoner().fit(traces)            # doctest: +SKIP
    >>> reasoner.predict_proba([trace]).round(2)                  # doctest: +SKIP
    >>> reasoner.explain(trace)[0].root_cause                     # doctest: +SKIP
    'learning_rate_too_high'
    """

    #: Seconds :func:`causal_models.load_default_model` took to read the model (set there).
    load_seconds_: float

    def __init__(self, *, n_slices: int = 2, n_blocks: int = 2, prior_strength: float = 20.0,
                 persistence: float = 4.0, coupling: float = 2.0,
                 balance: Literal["family", "none"] = "family",
                 calibration: Literal["temperature", "isotonic", "none"] = "temperature",
                 calibration_cv: int | None = 8, min_confidence: float = 0.02,
                 rule_evidence: bool = True, rule_trust: float = 0.9,
                 bins: Bins | None = None, slices: bool = True) -> None:
        self.n_slices = n_slices
        self.n_blocks = n_blocks
        self.prior_strength = prior_strength
        self.persistence = persistence
        self.coupling = coupling
        self.balance = balance
        self.calibration = calibration
        self.calibration_cv = calibration_cv
        self.min_confidence = min_confidence
        self.rule_evidence = rule_evidence
        self.rule_trust = rule_trust
        self.bins = bins
        self.slices = slices

    # ----------------------------------------------------------------- params
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Hyperparameters, scikit-learn style."""
        return {k: getattr(self, k) for k in (
            "n_slices", "n_blocks", "prior_strength", "persistence", "coupling", "balance",
            "calibration", "calibration_cv", "min_confidence", "rule_evidence", "rule_trust",
            "bins", "slices")}

    def set_params(self, **params: Any) -> ProbabilisticReasoner:
        """Set hyperparameters; unknown names raise ValueError listing the valid ones."""
        valid = self.get_params()
        for key, value in params.items():
            if key not in valid:
                raise ValueError(f"Invalid parameter {key!r} for estimator "
                                 f"ProbabilisticReasoner. Valid parameters are: {sorted(valid)}.")
            setattr(self, key, value)
        return self

    def _check_params(self) -> None:
        for name in ("n_slices", "n_blocks", "calibration_cv"):
            value = getattr(self, name)
            if name == "calibration_cv" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if self.n_slices < 2:
            raise ValueError(f"n_slices must be >= 2, got {self.n_slices}.")
        if self.balance not in ("family", "none"):
            raise ValueError(f"balance must be 'family' or 'none', got {self.balance!r}.")
        if self.calibration not in ("temperature", "isotonic", "none"):
            raise ValueError("calibration must be one of ['temperature', 'isotonic', 'none'], "
                             f"got {self.calibration!r}.")

    @property
    def n_time_slices(self) -> int:
        """Slices the network is unrolled over: ``n_slices``, or 1 with ``slices=False``."""
        return self.n_slices if self.slices else 1

    # -------------------------------------------------------------------- fit
    def _discretize(self, trace: Trace) -> Discretized:
        settings = (len(trace.steps), len(trace.stats), self.n_time_slices, self.n_blocks,
                    repr(self.bins), self.rule_evidence, self._cause_states())
        key = (id(trace), settings)
        cached = _EVIDENCE_CACHE.get(key)
        if cached is not None:
            return cached
        disc = self._discretize_uncached(trace)
        if not any(k[0] == id(trace) for k in _EVIDENCE_CACHE):
            weakref.finalize(trace, _forget, id(trace))
        _EVIDENCE_CACHE[key] = disc
        return disc

    def _discretize_uncached(self, trace: Trace) -> Discretized:
        disc = discretize(trace, n_slices=self.n_slices, n_blocks=self.n_blocks, bins=self.bins,
                          slices=self.slices)
        disc.states.update(observe_knobs(trace, self.bins))
        diagnosis = diagnose(trace)  # the heuristic reasoner: its verdict and run facts
        for hyp in diagnosis.hypotheses:  # module-resolution onsets, read as a sensor
            disc.events.setdefault(hyp.failure_type, (hyp.origin_layer, hyp.origin_step))
        stack, stack_features = observe_stack(trace, diagnosis.facts, self.bins)
        disc.states.update(stack)
        disc.features.update(stack_features)
        if self.rule_evidence:
            verdict = rule_verdict(trace, diagnosis.hypotheses)
            causes = set(self._cause_states())
            if verdict["rule_cause"] not in causes:
                verdict["rule_cause"] = "unknown" if verdict["rule_cause"] != RULE_NO_CAUSE \
                    else RULE_NO_CAUSE
            disc.states.update(verdict)
        return disc

    def _cause_states(self) -> tuple[str, ...]:
        if hasattr(self, "structure_"):
            return self.structure_.states["root_cause"]
        return root_cause_states()

    def fit(self, traces: Iterable[Trace], y: None = None) -> ProbabilisticReasoner:
        """Fit the conditional tables on failure-zoo traces.

        Parameters
        ----------
        traces : iterable of Trace
            Runs with ``meta["ground_truth"]`` (failure-zoo runs). Ground truth is read here
            only, to label the latent nodes; prediction never reads it.
        y : None
            Ignored (the labels are in the traces).

        Returns
        -------
        self

        Raises
        ------
        ValueError
            If no trace is given or a trace has no ground truth.
        """
        self._check_params()
        traces = list(traces)
        if not traces:
            raise ValueError("fit needs at least one trace with ground truth; got none.")
        rows, families, plain, placed = [], [], [], []
        for i, trace in enumerate(traces):
            gt = trace.ground_truth
            if not gt:
                raise ValueError(
                    f"Trace {i} has no meta['ground_truth']; fit on failure-zoo runs "
                    "(experiments.run_scenario) or add the ground truth to the trace meta.")
            disc = self._discretize(trace)
            rows.append({**disc.states, **training_labels(gt)})
            placed.append({**rows[-1], **{f"feature:{k}": v for k, v in disc.features.items()}})
            families.append(str(gt.get("family", f"run{i}")))
            plain.append(_is_plain(gt))
        self.structure_ = build_structure(n_slices=self.n_time_slices, n_blocks=self.n_blocks,
                                          prior_strength=self.prior_strength,
                                          persistence=self.persistence, coupling=self.coupling,
                                          rule_evidence=self.rule_evidence,
                                          rule_trust=self.rule_trust)
        data = pd.DataFrame(rows)
        weights = self._weights(families)
        self.network_ = self._estimate(data, weights)
        self.support_ = table_support(self.structure_, data, weights)
        self.classes_ = np.array(self.structure_.states["failure_type"], dtype=object)
        self.root_causes_ = np.array(self.structure_.states["root_cause"], dtype=object)
        self.n_fit_traces_ = len(traces)
        self.fit_families_ = sorted(set(families))
        self._inference = None
        self.calibrator_ = self._fit_calibrator(data, weights, families, np.array(plain))
        self.placement_ = fit_placement(placed)
        return self

    def _weights(self, families: Sequence[str]) -> np.ndarray:
        if self.balance == "none":
            return np.ones(len(families))
        counts = pd.Series(families).value_counts()
        w = np.array([1.0 / counts[f] for f in families])
        return w * len(families) / w.sum()

    def _estimate(self, data: pd.DataFrame, weights: np.ndarray) -> Any:
        models, est, _, _ = _pgmpy()
        s = self.structure_
        model = models.DiscreteBayesianNetwork()
        model.add_nodes_from(s.states)
        model.add_edges_from(s.edges)
        frame = data.reindex(columns=list(s.states)).copy()
        for node, states in s.states.items():
            bad = ~frame[node].isin(states)
            if bad.any():
                raise ValueError(f"Node {node!r} got states {sorted(set(frame[node][bad]))} "
                                 f"outside its states {list(states)}.")
        frame["_weight"] = weights
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            estimator = est.BayesianEstimator(model, frame, state_names=dict(s.states))
            cpds = [estimator.estimate_cpd(node, prior_type="dirichlet",
                                           pseudo_counts=s.prior[node], weighted=True)
                    for node in s.states]
        model.add_cpds(*cpds)
        return model

    def _fit_calibrator(self, data: pd.DataFrame, weights: np.ndarray,
                        families: list[str], plain: np.ndarray) -> Calibrator:
        """Fit the calibrator on out-of-family predictions of a grouped cross-validation.

        Every run is fitted on, but only the *plain* held-out runs (the scenario as defined, no
        knob changed, default severity) are predicted and calibrated on: those are what a
        reasoner meets in use (and what the benchmark scores), while mild severities and knob
        sweeps exist to teach the tables; calibrated on every held-out run, the confidence of
        a healthy verdict on plain runs came out 0.87 where all of them were right. Falls back
        to all held-out runs when fewer than 10 are plain. With a few dozen plain runs the
        calibrator bounds its confidences by the rule of succession (:func:`fit_calibrator`).
        """
        groups = sorted(set(families))
        if self.calibration == "none" or len(groups) < 2:
            return fit_calibrator("none", np.ones((1, len(self.classes_))), np.zeros(1, int))
        k = len(groups) if self.calibration_cv is None else min(self.calibration_cv, len(groups))
        fam = np.array(families)
        fold_of = {g: i % k for i, g in enumerate(groups)}
        target = plain if plain.sum() >= 10 else np.ones(len(data), dtype=bool)
        probs = np.zeros((len(data), len(self.classes_)))
        full = self.network_
        for fold in range(k):
            test = np.array([fold_of[f] == fold for f in fam])
            if test.all() or not test.any():
                continue
            sub = self._estimate(data[~test].reset_index(drop=True), weights[~test])
            scored = test & target
            evidence = data[scored][self.structure_.observed_nodes()].to_dict("records")
            if evidence:
                probs[scored] = self._joint_batch(sub, evidence).sum(axis=2)
        self.network_ = full
        index = {c: i for i, c in enumerate(self.classes_)}
        y = np.array([index[v] for v in data["failure_type"]])
        keep = target & (probs.sum(axis=1) > 0)
        probs, y = probs[keep], y[keep]
        return fit_calibrator(self.calibration, probs, y, healthy=index[HEALTHY])

    # -------------------------------------------------------------- inference
    def _check_fitted(self) -> None:
        if not hasattr(self, "network_"):
            raise NotFittedError("This ProbabilisticReasoner is not fitted yet. Call "
                                 "fit(traces) or use causal_models.load_default_model().")

    def _infer(self, network: Any) -> Any:
        _, _, inf, _ = _pgmpy(estimators=False)
        return inf.VariableElimination(network)

    def _joint_batch(self, network: Any, evidence: list[dict[str, str]]) -> np.ndarray:
        """P(failure_type, root_cause | evidence) for each evidence dict: (n, n_ft, n_rc)."""
        engine = self._infer(network)
        out = np.zeros((len(evidence), len(self.classes_), len(self.root_causes_)))
        for i, ev in enumerate(evidence):
            out[i] = self._joint(engine, ev)
        return out

    def _joint(self, engine: Any, evidence: dict[str, str]) -> np.ndarray:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            factor = engine.query(["failure_type", "root_cause"], evidence=evidence,
                                  show_progress=False, joint=True)
        factor = factor.copy()
        factor.normalize()
        order = [factor.variables.index(v) for v in ("failure_type", "root_cause")]
        values = np.transpose(factor.values, order)
        ft_pos = [factor.state_names["failure_type"].index(c) for c in self.classes_]
        rc_pos = [factor.state_names["root_cause"].index(c) for c in self.root_causes_]
        return values[np.ix_(ft_pos, rc_pos)]

    def _engine(self) -> Any:
        if getattr(self, "_inference", None) is None:
            self._inference = self._infer(self.network_)
        return self._inference

    def evidence(self, trace: Trace) -> dict[str, str]:
        """The observed node states of ``trace`` (its discretization, no ground truth)."""
        self._check_fitted()
        states = self._discretize(trace).states
        return {n: states[n] for n in self.structure_.observed_nodes() if n in states}

    def joint_posterior(self, trace: Trace) -> pd.DataFrame:
        """Calibrated P(failure_type, root_cause | trace) as a DataFrame (rows failure types).

        The failure-type marginal is recalibrated; P(root_cause | failure_type) is the
        network's.
        """
        self._check_fitted()
        joint = self._joint(self._engine(), self.evidence(trace))
        return pd.DataFrame(self._calibrate_joint(joint[None])[0], index=self.classes_,
                            columns=self.root_causes_)

    def raw_proba(self, trace: Trace) -> np.ndarray:
        """The network's posterior over failure types before recalibration.

        ``calibrator_.transform(raw_proba(trace))`` is ``predict_proba(trace)[0]``.

        Returns
        -------
        numpy.ndarray
            Shape ``(n_classes,)``, in ``classes_`` order.
        """
        self._check_fitted()
        return self._joint(self._engine(), self.evidence(trace)).sum(axis=1)

    def _calibrate_joint(self, joint: np.ndarray) -> np.ndarray:
        marginal = joint.sum(axis=2)
        calibrated = self.calibrator_.transform(marginal)
        with np.errstate(invalid="ignore", divide="ignore"):
            conditional = np.where(marginal[..., None] > 0, joint / marginal[..., None], 0.0)
        joint = np.clip(conditional * calibrated[..., None], 0.0, None)
        return joint / joint.sum(axis=(-2, -1), keepdims=True)

    def _joint_traces(self, traces: Iterable[Trace] | Trace) -> np.ndarray:
        self._check_fitted()
        if isinstance(traces, Trace):
            traces = [traces]
        engine = self._engine()
        joint = np.stack([self._joint(engine, self.evidence(t)) for t in traces])
        return self._calibrate_joint(joint)

    def predict_proba(self, traces: Iterable[Trace] | Trace) -> np.ndarray:
        """Calibrated posterior over failure types, shape ``(n_traces, n_classes)``.

        Parameters
        ----------
        traces : Trace or iterable of Trace

        Returns
        -------
        numpy.ndarray
            Columns in ``classes_`` order (``"healthy"`` included); rows sum to 1.
        """
        return self._joint_traces(traces).sum(axis=2)

    def predict(self, traces: Iterable[Trace] | Trace) -> np.ndarray:
        """Most probable failure type (or ``"healthy"``) per trace."""
        return self.classes_[np.argmax(self.predict_proba(traces), axis=1)]

    def predict_root_cause_proba(self, traces: Iterable[Trace] | Trace) -> np.ndarray:
        """Posterior over root causes, shape ``(n_traces, n_root_causes)``, ``root_causes_``."""
        return self._joint_traces(traces).sum(axis=1)

    def explain(self, trace: Trace) -> list[Hypothesis]:
        """Ranked hypotheses with posterior confidences (the contract's ``Hypothesis`` list).

        One hypothesis per (failure type, root cause) pair worth naming, highest confidence
        first. On a run judged failing, ``confidence`` is the calibrated joint posterior of
        the failure type and the cause (a hypothesis claims both): the most probable failure
        type is always listed, the others with posterior >= ``min_confidence``; under each,
        the causes with conditional probability >= 0.05 (at most three). When the failure is
        probable (>= 0.5) but no cause reaches 0.5 with it, the evidence shows a failure it
        cannot attribute: the first hypothesis names it with ``root_cause="unknown"`` at the
        failure type's posterior, its metadata lists the candidate causes, and each specific
        cause stays below 0.5. On a run judged healthy, the three causes with the highest
        joint posterior with *any* failure (summed over failure types) are listed, each under
        its most probable failure type, all with ``confidence`` = P(the run fails), so the
        healthy verdict reads the calibrated posterior of "healthy". The root cause's
        conditional probability and the joint are in ``metadata``.

        Parameters
        ----------
        trace : Trace

        Returns
        -------
        list of Hypothesis
            Empty or all below 0.5 when the run is judged healthy.
        """
        self._check_fitted()
        disc = self._discretize(trace)
        evidence = {n: disc.states[n] for n in self.structure_.observed_nodes()}
        joint = self._calibrate_joint(self._joint(self._engine(), evidence)[None])[0]
        marginal = joint.sum(axis=1)
        healthy = list(self.classes_).index(HEALTHY)
        p_healthy = float(marginal[healthy])
        hyps: list[Hypothesis] = []
        pairs_healthy = int(np.argmax(marginal)) == healthy
        if pairs_healthy:
            # judged healthy: name the causes by their joint posterior with any failure
            # (summed over failure types), each under its most probable failure type
            failing = np.delete(np.arange(len(self.classes_)), healthy)
            by_cause = joint[failing].sum(axis=0)
            pairs = [(int(failing[np.argmax(joint[failing, j])]), j)
                     for j in np.argsort(-by_cause, kind="stable")
                     if self.root_causes_[j] != NO_CAUSE][:3]
        else:
            pairs = []
            for i in np.argsort(-marginal, kind="stable"):
                if i == healthy or (pairs and marginal[i] < self.min_confidence):
                    continue  # the most probable failure type is always listed
                cond = joint[i] / max(float(marginal[i]), 1e-300)
                ranked = [j for j in np.argsort(-cond, kind="stable")
                          if self.root_causes_[j] != NO_CAUSE][:3]
                pairs += [(int(i), j) for r, j in enumerate(ranked)
                          if not r or cond[j] >= 0.05]
        origins: dict[str, Any] = {}
        for i, j in pairs:
            ft = str(self.classes_[i])
            p_ft = min(1.0, max(0.0, float(marginal[i])))
            cond = joint[i] / max(float(marginal[i]), 1e-300)
            # judged healthy, every hypothesis carries P(the run fails at all); judged
            # failing, a hypothesis claims its failure type *and* its cause: the joint
            conf = (min(1.0, max(0.0, 1.0 - p_healthy)) if pairs_healthy
                    else min(1.0, max(0.0, float(joint[i, j]))))
            if ft not in origins:
                origins[ft] = locate_origin(trace, disc, ft)
                if ft in disc.events:
                    # two blocks and two slices cannot place an onset at module and step
                    # resolution: the first event of the same failure the rules' extractor
                    # found is read as a sensor of it (the propagation path stays the
                    # network's blocks)
                    layer, step = disc.events[ft]
                    origins[ft] = (layer, int(step), origins[ft][2])
            layer, step, path = origins[ft]
            hyps.append(Hypothesis(
                failure_type=ft, root_cause=str(self.root_causes_[j]), origin_layer=layer,
                origin_step=step, confidence=conf,
                metadata={"method": "probabilistic", "p_failure_type": p_ft,
                          "p_root_cause_given_failure": float(cond[j]),
                          "p_joint": float(joint[i, j]), "p_healthy": p_healthy,
                          "propagation_path": path, "onset_step": disc.onset_step,
                          "slices": [list(s) for s in disc.slices],
                          "evidence": {k: v for k, v in evidence.items()}}))
        if not pairs_healthy and hyps:
            hyps = name_undetermined_cause(hyps)
        return sorted(hyps, key=lambda h: -h.confidence)

    # ---------------------------------------------------------- causal queries
    def intervene(self, do: dict[str, str], evidence: dict[str, str] | None = None
                  ) -> pd.Series:
        """P(failure_type | do(knob nodes = levels), evidence) through pgmpy's CausalInference.

        See :func:`causal_models.interventions.intervene`.
        """
        from causal_models.interventions import intervene

        return intervene(self, do=do, evidence=evidence)

    def what_if(self, trace: Trace, **knobs: Any) -> Any:
        """Counterfactual for one run: abduction, action, prediction.

        See :func:`causal_models.interventions.what_if`.
        """
        from causal_models.interventions import what_if

        return what_if(self, trace, **knobs)

    # ------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form (see :mod:`causal_models.persistence`)."""
        from causal_models.persistence import model_to_dict

        return model_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbabilisticReasoner:
        """Inverse of :meth:`to_dict` (no pickle: tables are plain lists)."""
        from causal_models.persistence import model_from_dict

        return model_from_dict(cls, data)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the fitted model as JSON."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), separators=(",", ":")))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ProbabilisticReasoner:
        """Read a model written by :meth:`save` (JSON only)."""
        return cls.from_dict(json.loads(Path(path).read_text()))
