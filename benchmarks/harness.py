"""The benchmark harness: zoo runs -> every method's diagnosis -> per-run records -> metrics.

Stages (each a batch of executor tasks, so they run in parallel locally or on Ray):

1. zoo runs: every family of the suite at its severities, for the score seeds and the fit
   seeds; finished traces are reused (:mod:`benchmarks.runs`);
2. diagnosis: every unfitted method (heuristic, baselines) on every scored run; the
   probabilistic model fitted once per held-out fold (leave-one-family-out and
   leave-one-architecture-out, on the fit seeds of the other folds) and scored on the fold's
   score-seed runs, including its ``what_if`` answers; in the same batch, the real re-runs of
   each scored run under the knob changes its family declares (counterfactual validity);
3. repair: each failing scored run re-run with each method's top suggested fix.

Every method goes through ``explain(trace) -> list[Hypothesis]``: NeuralDBG's own as users
get them (:func:`neuraldbg.methods.explain`), the ported baselines as their rules answer;
per-run records are
collected into pandas DataFrames, written as Parquet next to ``metrics.json``. Tasks name runs
by their path in the trace cache (``run_dir``), which every ``executor.map`` call passes as
``root``: a Ray executor ships those runs to and from its workers (no shared filesystem).
"""

from __future__ import annotations

import json
import math
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from benchmarks import metrics as M
from benchmarks.compare import canonical_order, compute_metrics
from benchmarks.executor import Executor, LocalExecutor, Task
from benchmarks.repair import (
    FIX_BY_CAUSE,
    FIX_BY_FAILURE,
    best_fix_by_what_if,
    suggest_fix,
)
from benchmarks.runs import (
    RunSpec,
    execute_run,
    is_finished,
    load,
    run_outcome,
    run_path,
    truncate_trace,
    zoo_fingerprint,
)
from benchmarks.suites import Suite
from neuraldbg.errors import MissingDependencyError
from neuraldbg.methods import DiagnosisMethod, explain, get_method
from neuraldbg.records import HEALTHY, Hypothesis
from neuraldbg.trace import Trace

if TYPE_CHECKING:
    from experiments.families import FamilySpec

__all__ = ["FIX_BY_CAUSE", "FIX_BY_FAILURE", "FITTED_METHODS", "suggest_fix",
           "runnable_methods", "score_method_on_run", "BenchmarkResult", "run_benchmark",
           "load_result", "compute_metrics", "method_label"]

#: Seed of the knob draws of the randomised ablation's corpus (``python -m
#: benchmarks.knob_effects``'s default, so the two share their runs).
RANDOMISED_SEED = 0

#: Methods fitted per held-out fold (never scored on what they were fitted on).
FITTED_METHODS: tuple[str, ...] = ("probabilistic",)

def method_label(method: str, split: str) -> str:
    """Display name: ``probabilistic[family]`` for a fitted method, else the method name."""
    return method if split == "none" else f"{method}[{split}]"


def _json(obj: Any) -> str:
    def default(v: Any) -> Any:
        if hasattr(v, "item"):
            return v.item()
        if hasattr(v, "to_dict"):
            return v.to_dict()
        if isinstance(v, (set, tuple)):
            return list(v)
        return str(v)

    return json.dumps(obj, default=default, sort_keys=True)


def _method(name: str) -> DiagnosisMethod:
    import benchmarks.baselines  # noqa: F401  (registers the baselines)

    return get_method(name)


def runnable_methods(requested: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """Methods that can run here, and why the others cannot.

    Only a method whose optional dependency is not installed
    (:class:`~neuraldbg.errors.MissingDependencyError`) is left out, with the reason; any
    other error (a broken method, an unknown name) propagates: it fails the benchmark loudly
    instead of silently dropping a column.
    """
    import benchmarks.baselines as B

    names = requested or ["heuristic", "probabilistic", *B.BASELINES]
    ok, missing = [], {}
    for name in names:
        try:
            _method(name)
        except MissingDependencyError as exc:
            missing[name] = f"{type(exc).__name__}: {exc}"
            continue
        ok.append(name)
    return ok, missing


def _latency(model: DiagnosisMethod, trace: Trace, truth: dict[str, Any],
             prefixes: dict[int, Trace] | None = None) -> float:
    """Steps from the onset until the method, fed the run so far, names the true failure.

    ``prefixes`` holds the truncated runs by last step, shared by the methods scored on one
    run (so what a method caches per trace, the baselines' pivoted tables or the
    probabilistic model's evidence, is computed once per prefix, not once per method).
    """
    onset = truth.get("onset_step")
    if onset is None or truth.get("failure_type", HEALTHY) == HEALTHY or trace.steps.empty:
        return math.nan
    prefixes = {} if prefixes is None else prefixes
    last = int(trace.steps["step"].max())
    d, offsets = 1, [0]
    while onset + d < last:
        offsets.append(d)
        d *= 2
    offsets.append(max(0, last - onset))
    for off in offsets:
        end = int(onset) + off
        if end not in prefixes:
            prefixes[end] = truncate_trace(trace, end)
        hyps = _diagnose(model, prefixes[end])
        label, _ = M.predicted_label(hyps)
        if label == truth["failure_type"]:
            return float(off)
    return math.nan


def _diagnose(model: DiagnosisMethod, trace: Trace) -> list[Hypothesis]:
    """A method's answer as its users get it.

    NeuralDBG's own methods through :func:`neuraldbg.methods.explain` (unfinished steps left
    out, thin evidence and claims a run cannot support hedged); a ported peer rule set as the
    peer's rules answer, so that the baselines stay faithful to the tools they port.
    """
    from benchmarks.baselines import BaselineMethod

    if isinstance(model, BaselineMethod):
        return list(model.explain(trace))
    return explain(trace, model)


def score_method_on_run(model: DiagnosisMethod, trace: Trace, truth: dict[str, Any], *,
                        latency: bool, prefixes: dict[int, Trace] | None = None
                        ) -> dict[str, Any]:
    """One method's answer on one run, scored.

    The fields of :func:`metrics.score_run` plus ``latency``, ``explain_s``,
    ``suggested_fix`` (JSON) and ``hypotheses`` (JSON). ``prefixes``: the run's truncated
    copies by last step, shared by the methods scored on it (see :func:`_latency`).
    """
    t0 = time.perf_counter()
    hyps = _diagnose(model, trace)
    dt = time.perf_counter() - t0
    rec = M.score_run(hyps, truth)
    rec["explain_s"] = dt
    rec["latency"] = _latency(model, trace, truth, prefixes) if latency else math.nan
    fix = suggest_fix(hyps)
    rec["fix_source"] = "table" if fix else ""
    if fix and callable(getattr(model, "what_if", None)):
        fix, p = best_fix_by_what_if(model, trace, hyps)
        rec["fix_source"] = f"what_if (P(failure) {p:.2f})"
    rec["suggested_fix"] = _json(fix) if fix else ""
    rec["hypotheses"] = _json([h.to_dict() for h in hyps[:10]])
    return rec


def _truth_fields(path: str, truth: dict[str, Any]) -> dict[str, Any]:
    return {
        "run": path, "family": truth.get("family"), "architecture": truth.get("architecture"),
        "kind": truth.get("kind"), "severity": truth.get("severity"), "seed": truth.get("seed"),
        "true_failure": truth.get("failure_type", HEALTHY),
        "true_cause": truth.get("root_cause", "none"),
        "origin_layers": _json(list(truth.get("origin_layers") or [])),
        "onset_step": truth.get("onset_step"), "onset_tolerance": truth.get("onset_tolerance"),
        "origin_scope": truth.get("origin_scope", ""),
    }


# ---------------------------------------------------------------------------- tasks
def task_diagnose(path: str, methods: list[str], latency: bool) -> list[dict[str, Any]]:
    """Every unfitted method on one scored run (an executor task)."""
    trace = load(path)
    truth = trace.ground_truth or {}
    rows = []
    prefixes: dict[int, Trace] = {}
    for name in methods:
        base = {**_truth_fields(path, truth), "method": name, "split": "none", "fold": ""}
        try:
            scored = score_method_on_run(_method(name), trace, truth, latency=latency,
                                         prefixes=prefixes)
            rows.append({**base, **scored, "error": ""})
        except Exception as exc:
            rows.append({**base, "error": f"{type(exc).__name__}: {exc}"})
    return rows


def task_folds(folds: list[dict[str, Any]], latency: bool) -> dict[str, Any]:
    """Fit, score and question the probabilistic model on some folds (an executor task).

    Per fold, the model is fitted once on its training runs, scored on the fold's held-out
    runs and asked their counterfactual cases with ``what_if``.

    Each fold is ``{split, fold, fit_params, fit_paths, score_paths, cases}`` and optionally
    ``corpus`` ("randomised": its fit runs are labelled by
    :func:`benchmarks.knob_effects.label_randomised_run`). The folds of one task share loaded
    traces, so the model's per-trace evidence is computed once, not once per fold.
    """
    from benchmarks.fit_default import prepare_fit_traces

    cache: dict[str, Trace] = {}
    prepared: dict[str, Trace | None] = {}

    def get(path: str) -> Trace:
        if path not in cache:
            cache[path] = load(path)
        return cache[path]

    def get_fit(path: str, corpus: str) -> Trace | None:
        """The trace prepared as the shipped model's fit prepares it (family labels).

        None for a run whose outcome the zoo does not declare or show; once per run. A run
        of the randomised corpus is labelled first (:func:`label_randomised_run`).
        """
        if path not in prepared:
            trace = get(path)
            if corpus == "randomised":
                from benchmarks.knob_effects import label_randomised_run

                trace = label_randomised_run(trace)
            kept = prepare_fit_traces([trace], manifest_only=True)
            prepared[path] = kept[0] if kept else None
        return prepared[path]

    return {"folds": [_one_fold(f, get, get_fit, latency) for f in folds]}


def _one_fold(f: dict[str, Any], get: Callable[[str], Trace],
              get_fit: Callable[[str, str], Trace | None], latency: bool) -> dict[str, Any]:
    from causal_models import ProbabilisticReasoner

    split, fold = f["split"], f["fold"]
    out: dict[str, Any] = {"split": split, "fold": fold, "records": [], "whatif": [],
                           "fit_s": math.nan, "n_fit": len(f["fit_paths"]), "error": "",
                           "fit_runs": _json(f["fit_paths"])}
    try:
        t0 = time.perf_counter()
        corpus = f.get("corpus", "zoo")
        train = [t for t in (get_fit(p, corpus) for p in f["fit_paths"]) if t is not None]
        model = ProbabilisticReasoner(**f.get("fit_params", {})).fit(train)
        out["fit_s"] = time.perf_counter() - t0
    except Exception as exc:
        out["error"] = f"fit failed: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
        return out
    for path in f["score_paths"]:
        trace = get(path)
        truth = trace.ground_truth or {}
        base = {**_truth_fields(path, truth), "method": "probabilistic", "split": split,
                "fold": fold}
        try:
            scored = score_method_on_run(model, trace, truth, latency=latency)
            out["records"].append({**base, **scored, "error": ""})
        except Exception as exc:
            out["records"].append({**base, "error": f"{type(exc).__name__}: {exc}"})
        for case in f["cases"].get(path, []):
            row = {"run": path, "split": split, "fold": fold, "knobs": _json(case["knobs"]),
                   "expected": case.get("expected"), "source": case.get("source", "")}
            try:
                cf = model.what_if(trace, **case["knobs"])
                row.update(p_failure=float(cf.p_failure),
                           p_failure_factual=float(cf.p_failure_factual),
                           predicted=str(cf.failure_type), error="")
            except Exception as exc:
                row.update(p_failure=math.nan, p_failure_factual=math.nan, predicted="",
                           error=f"{type(exc).__name__}: {exc}")
            out["whatif"].append(row)
    return out


def task_rerun(spec: dict[str, Any], path: str, every: int) -> dict[str, Any]:
    """Run (or reuse) one knob-changed run (an executor task)."""
    try:
        execute_run(spec, path, every)
        return {"path": path, "rerun": True, "error": ""}
    except Exception as exc:
        return {"path": path, "rerun": True, "error": f"{type(exc).__name__}: {exc}"}


def task_judge(paths: list[str]) -> list[dict[str, Any]]:
    """Judge re-runs of one family with the zoo's judge (its baseline runs made once here)."""
    out = []
    for path in paths:
        try:
            out.append({"path": path, **run_outcome(load(path)), "error": ""})
        except Exception as exc:
            out.append({"path": path, "failed": None, "outcome": "", "reasons": [],
                        "error": f"{type(exc).__name__}: {exc}"})
    return out


def _ensure_runs(specs: list[RunSpec], paths: list[Path], executor: Executor, every: int,
                 description: str, root: Path) -> None:
    todo = [(execute_run, {"spec": s.to_dict(), "path": str(p), "every": every})
            for s, p in zip(specs, paths, strict=True) if not is_finished(p)]
    executor.map(todo, description=f"{description} ({len(specs) - len(todo)} reused)",
                 root=root)


# ---------------------------------------------------------------------------- the run
@dataclass
class BenchmarkResult:
    """Everything a benchmark invocation produced (frames also written as Parquet)."""

    suite: Suite
    out: Path
    records: pd.DataFrame
    counterfactuals: pd.DataFrame
    repairs: pd.DataFrame
    folds: pd.DataFrame
    runs: pd.DataFrame
    notes: dict[str, Any]


def _select_families(suite: Suite) -> list[FamilySpec]:
    """The zoo families a suite runs: named ones, or every registered family (trimmed)."""
    from experiments import list_families

    fams = list(list_families())
    if suite.families is not None:
        known = {f.name: f for f in fams}
        missing = [n for n in suite.families if n not in known]
        if missing:
            raise KeyError(f"Unknown zoo families {missing}. Known families are: {sorted(known)}")
        return [known[n] for n in suite.families]
    failing = [f for f in fams if f.kind == "failure"]
    healthy = [f for f in fams if f.kind != "failure"]
    if suite.n_failure is not None:  # one family per failure type first, then the rest
        first, rest, seen = [], [], set()
        # single-cause families before compound ones
        for f in sorted(failing, key=lambda f: len(getattr(f, "root_causes", ()) or ()) > 1):
            (rest if f.failure_type in seen else first).append(f)
            seen.add(f.failure_type)
        failing = (first + rest)[: suite.n_failure]
    if suite.n_healthy is not None:
        healthy = healthy[: suite.n_healthy]
    return failing + healthy


def _cases(truth: dict[str, Any]) -> list[dict[str, Any]]:
    """Knob changes with a declared outcome: canonical fix, equivalent fixes, counterfactuals."""
    out, seen = [], set()
    items = [{"knobs": truth.get("canonical_fix") or {}, "expected": HEALTHY,
              "source": "canonical_fix"}]
    items += [{"knobs": k, "expected": HEALTHY, "source": "equivalent_fix"}
              for k in truth.get("equivalent_fixes") or []]
    items += [{**c, "source": "counterfactual"} for c in truth.get("counterfactuals") or []]
    for it in items:
        key = _json(it["knobs"])
        if it["knobs"] and key not in seen:
            seen.add(key)
            out.append(it)
    return out


# ------------------------------------------------------------ stage 1: the zoo runs
@dataclass(frozen=True, slots=True)
class _Context:
    """What every stage of one benchmark invocation shares.

    Attributes
    ----------
    suite : Suite
    executor : Executor
    run_dir : Path
        The trace cache (resolved).
    fingerprint : str
        The zoo's source hash the cached runs are keyed by.
    """

    suite: Suite
    executor: Executor
    run_dir: Path
    fingerprint: str

    def path(self, spec: RunSpec) -> str:
        """Where ``spec``'s run lives in the trace cache."""
        return str(run_path(self.run_dir, spec, self.fingerprint))

    def rerun_tasks(self, specs: dict[str, RunSpec]) -> list[Task]:
        """One :func:`task_rerun` per path -> spec."""
        return [(task_rerun, {"spec": s.to_dict(), "path": p, "every": self.suite.every})
                for p, s in specs.items()]


@dataclass(frozen=True, slots=True)
class _ZooRuns:
    """The suite's zoo runs after stage 1.

    Attributes
    ----------
    runs : pandas.DataFrame
        One row per run spec: its fields, ``role`` ("score" or "fit"), ``path``,
        ``finished``, ``architecture``, ``kind`` and, for the finished score runs,
        ``shown``: whether the run shows its declared outcome
        (:func:`benchmarks.fit_default.declared_outcome_shown`).
    truths : dict of str to dict
        Ground truth of every finished run, by path.
    score, fit : pandas.DataFrame
        The finished rows of ``runs`` with role "score" (those that show their declared
        outcome: a seed whose fault did not manifest has no ground truth to score against)
        / "fit".
    """

    runs: pd.DataFrame
    truths: dict[str, dict[str, Any]]
    score: pd.DataFrame
    fit: pd.DataFrame


def _zoo_specs(suite: Suite, fams: list[FamilySpec], fitted: bool
               ) -> list[tuple[RunSpec, str]]:
    """Every zoo run of the suite with its role ("score" or "fit").

    Score runs, then (for fitted methods) the fit runs at every severity and, for the zoo
    corpus, the declared knob changes; last, the randomised-knob runs of the "randomised"
    ablation (role "randomised").
    """
    specs: list[tuple[RunSpec, str]] = []
    for f in fams:
        sevs = [None] if suite.severities == "default" else list(f.severities or [None])
        fit_sevs = list(f.severities or [None]) if suite.fit_corpus == "zoo" else sevs
        for sev in sevs:
            for seed in suite.score_seeds:
                specs.append((RunSpec(f.name, sev, seed), "score"))
        if not fitted:
            continue
        for seed in suite.fit_seeds:
            for sev in fit_sevs:
                specs.append((RunSpec(f.name, sev, seed), "fit"))
            if suite.fit_corpus == "zoo":  # the declared knob changes, as fit_default does
                for item in f.expected_outcomes():
                    specs.append((RunSpec(f.name, None, seed, dict(item["knobs"])), "fit"))
    if fitted and "family" in suite.splits and suite.randomised_runs:
        from benchmarks.knob_effects import corpus_specs  # the randomised ablation's corpus

        specs += [(spec, "randomised") for spec, _ in
                  corpus_specs(suite.randomised_runs, RANDOMISED_SEED)]
    return specs


def _make_zoo_runs(ctx: _Context, fams: list[FamilySpec], fitted: bool) -> _ZooRuns:
    """Stage 1: make (or reuse) every zoo run; tabulate them with their ground truth."""
    specs = _zoo_specs(ctx.suite, fams, fitted)
    paths = [run_path(ctx.run_dir, s, ctx.fingerprint) for s, _ in specs]
    _ensure_runs([s for s, _ in specs], paths, ctx.executor, ctx.suite.every, "zoo runs",
                 ctx.run_dir)
    runs = pd.DataFrame([{**s.to_dict(), "knobs": _json(s.knobs), "role": role, "path": str(p),
                          "finished": is_finished(p)} for (s, role), p in zip(specs, paths,
                                                                            strict=True)])
    truths = {str(p): json.loads((p / "meta.json").read_text()).get("ground_truth") or {}
              for p in paths if is_finished(p)}
    runs["architecture"] = [truths.get(p, {}).get("architecture") for p in runs["path"]]
    runs["kind"] = [truths.get(p, {}).get("kind") for p in runs["path"]]
    runs["shown"] = [_shown(p) if role == "score" and done else None
                     for p, role, done in zip(runs["path"], runs["role"], runs["finished"],
                                              strict=True)]
    return _ZooRuns(runs=runs, truths=truths,
                    score=runs[(runs["role"] == "score") & runs["shown"].eq(True)],
                    fit=runs[(runs["role"] == "fit") & runs["finished"]])


def _shown(path: str) -> bool:
    """Does a finished zoo run show its declared outcome? (``declared_outcome_shown``)."""
    from benchmarks.fit_default import declared_outcome_shown

    return declared_outcome_shown(load(path))


# --------------------------------------- stage 2: diagnosis + counterfactual re-runs
@dataclass(frozen=True, slots=True)
class _CounterfactualPlan:
    """The counterfactual cases of the scored runs and the re-runs that check them.

    Attributes
    ----------
    cases : dict of str to list of dict
        Per scored run (counterfactual seeds only): its knob changes with declared outcome.
    specs : dict of str to RunSpec
        Per re-run path: the knob-changed run to make.
    """

    cases: dict[str, list[dict[str, Any]]]
    specs: dict[str, RunSpec]


def _plan_counterfactuals(ctx: _Context, zoo: _ZooRuns) -> _CounterfactualPlan:
    """The knob changes every failing scored run of a counterfactual seed is re-run under."""
    score = zoo.score
    cases: dict[str, list[dict[str, Any]]] = {}
    specs: dict[str, RunSpec] = {}
    for _, r in score[score["seed"].isin(ctx.suite.counterfactual_seeds)].iterrows():
        run_cases = _cases(zoo.truths[r["path"]]) if r["kind"] == "failure" else []
        cases[r["path"]] = run_cases
        for c in run_cases:
            spec = RunSpec(r["family"], r["severity"], int(r["seed"]), dict(c["knobs"]))
            specs[ctx.path(spec)] = spec
    return _CounterfactualPlan(cases=cases, specs=specs)


#: Held-out splits of fitted methods: split name -> the runs' column its folds group by.
SPLIT_COLUMNS: dict[str, str] = {"family": "family", "architecture": "architecture"}


def _fold_variants(suite: Suite, split: str) -> list[tuple[str, dict[str, Any]]]:
    """(label, estimator parameters) of the fits on one split.

    The model as the suite fits it and, on leave-one-family-out, each ablation (the same
    folds, other parameters).
    """
    variants = [(split, dict(suite.fit_params))]
    if split == "family":
        variants += [(f"family/{name}", {**dict(suite.fit_params), **dict(params)})
                     for name, params in suite.ablations]
    return variants


def _plan_folds(suite: Suite, fitted: list[str], zoo: _ZooRuns,
                cf: _CounterfactualPlan) -> list[dict[str, Any]]:
    """One fold per held-out value, split and variant (the input of :func:`task_folds`)."""
    score, fit = zoo.score, zoo.fit
    folds: list[dict[str, Any]] = []
    for _ in fitted:
        for split, col in SPLIT_COLUMNS.items():
            if split not in suite.splits:
                continue
            for label, params in _fold_variants(suite, split):
                for value in sorted(score[col].dropna().unique()):
                    te = score[score[col] == value]["path"].tolist()
                    folds.append({"split": label, "fold": str(value), "fit_params": params,
                                  "fit_paths": fit[fit[col] != value]["path"].tolist(),
                                  "score_paths": te,
                                  "cases": {p: cf.cases.get(p, []) for p in te}})
    return folds


def _plan_randomised_folds(suite: Suite, zoo: _ZooRuns, cf: _CounterfactualPlan
                           ) -> list[dict[str, Any]]:
    """The folds of the "randomised" ablation: fitted on the randomised-knob corpus.

    Leave-one-family-out as the other rows, except that held-out families whose fit sets are
    the same (every family but the corpus's three recipes: no randomised run comes from
    them) share one fit instead of repeating it.
    """
    if not suite.randomised_runs or "family" not in suite.splits:
        return []
    runs, score = zoo.runs, zoo.score
    corpus = runs[(runs["role"] == "randomised") & runs["finished"]]
    held_out: dict[tuple[str, ...], list[str]] = {}  # fit paths -> the families they score
    for family in sorted(score["family"].dropna().unique()):
        held_out.setdefault(tuple(corpus[corpus["family"] != family]["path"]), []).append(family)
    folds = []
    for fit_paths, families in held_out.items():
        te = score[score["family"].isin(families)]["path"].tolist()
        folds.append({"split": "family/randomised", "corpus": "randomised",
                      "fold": families[0] if len(families) == 1 else
                      f"{len(families)} families outside the corpus",
                      "fit_params": dict(suite.fit_params), "fit_paths": list(fit_paths),
                      "score_paths": te, "cases": {p: cf.cases.get(p, []) for p in te}})
    return folds


def _diagnosis_tasks(ctx: _Context, folds: list[dict[str, Any]], unfitted: list[str],
                     zoo: _ZooRuns, cf: _CounterfactualPlan) -> list[Task]:
    """Stage 2's tasks, the longest first.

    The fold tasks (spread over the workers), then the counterfactual re-runs, then one
    diagnosis task per scored run.
    """
    latency = ctx.suite.latency
    n_chunks = max(1, min(len(folds), ctx.executor.workers))
    tasks: list[Task] = [(task_folds, {"folds": folds[i::n_chunks], "latency": latency})
                         for i in range(n_chunks) if folds[i::n_chunks]]
    tasks += ctx.rerun_tasks(cf.specs)
    if unfitted:
        tasks += [(task_diagnose, {"path": p, "methods": unfitted, "latency": latency})
                  for p in zoo.score["path"]]
    return tasks


@dataclass(frozen=True, slots=True)
class _Diagnoses:
    """Stage 2's answers, gathered from its tasks.

    Attributes
    ----------
    records : pandas.DataFrame
        One row per method and scored run (with ``label``).
    whatif : list of dict
        The fitted methods' ``what_if`` answers, one per counterfactual case.
    fold_rows : list of dict
        One row per fitted fold (fit time, size, error).
    """

    records: pd.DataFrame
    whatif: list[dict[str, Any]]
    fold_rows: list[dict[str, Any]]


#: The fields of a fold's result kept in ``folds.parquet``.
FOLD_FIELDS: tuple[str, ...] = ("split", "fold", "fit_s", "n_fit", "error", "fit_runs")


def _gather_diagnoses(results: list[Any]) -> _Diagnoses:
    """Records, ``what_if`` answers and fold rows out of stage 2's task results."""
    records: list[dict[str, Any]] = []
    whatif: list[dict[str, Any]] = []
    fold_rows: list[dict[str, Any]] = []
    for r in results:
        if isinstance(r, list):
            records += r
        elif isinstance(r, dict) and "folds" in r:
            for f in r["folds"]:
                records += f["records"]
                whatif += f["whatif"]
                fold_rows.append({k: f[k] for k in FOLD_FIELDS} | {"n_score": len(f["records"])})
    rec = pd.DataFrame(records)
    if not rec.empty:
        rec["label"] = [method_label(m, s) for m, s in zip(rec["method"], rec["split"],
                                                            strict=True)]
    return _Diagnoses(records=rec, whatif=whatif, fold_rows=fold_rows)


# ------------------------------------------------- stage 3 and 4: repairs, judging
def _plan_repairs(ctx: _Context, rec: pd.DataFrame, score: pd.DataFrame
                  ) -> tuple[list[dict[str, Any]], dict[str, RunSpec]]:
    """Repair rows and the re-runs of the top suggested fixes (by path).

    One row per failing scored run of a repair seed and method.
    """
    rows: list[dict[str, Any]] = []
    specs: dict[str, RunSpec] = {}
    if rec.empty or "suggested_fix" not in rec.columns:
        return rows, specs
    cand = rec[(rec["true_failure"] != HEALTHY) & rec["seed"].isin(ctx.suite.repair_seeds)
               & (rec["error"] == "")]
    spec_of = score.set_index("path")
    for _, r in cand.iterrows():
        row = {"run": r["run"], "label": r["label"], "family": r["family"],
               "architecture": r["architecture"], "fix": r["suggested_fix"], "rerun": ""}
        if r["suggested_fix"]:
            base = spec_of.loc[r["run"]]
            spec = RunSpec(base["family"], base["severity"], int(base["seed"]),
                           json.loads(r["suggested_fix"]))
            row["rerun"] = ctx.path(spec)
            specs[row["rerun"]] = spec
        rows.append(row)
    return rows, specs


def _judge_reruns(ctx: _Context, specs: dict[str, RunSpec]) -> dict[str, dict[str, Any]]:
    """Judge every re-run with the zoo's judge, one task per family; outcome by path."""
    by_family: dict[str, list[str]] = {}
    for p, s in specs.items():
        by_family.setdefault(s.family, []).append(p)
    judged = ctx.executor.map([(task_judge, {"paths": ps}) for ps in by_family.values()],
                              description="judging re-runs", root=ctx.run_dir)
    return {o["path"]: o for group in judged for o in group}


def _counterfactual_frame(ctx: _Context, whatif: list[dict[str, Any]], score: pd.DataFrame,
                          outcome: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Each ``what_if`` answer beside the judged outcome of its real re-run."""
    rows = []
    for w in whatif:
        knobs = json.loads(w["knobs"])
        r = score[score["path"] == w["run"]].iloc[0]
        p = ctx.path(RunSpec(r["family"], r["severity"], int(r["seed"]), knobs))
        o = outcome.get(p, {})
        rows.append({**w, "family": r["family"], "architecture": r["architecture"],
                     "rerun": p, "actual_failure": o.get("failed"),
                     "actual_outcome": o.get("outcome", ""),
                     "rerun_reasons": _json(o.get("reasons", []))})
    return pd.DataFrame(rows)


def _repair_frame(rows: list[dict[str, Any]], outcome: dict[str, dict[str, Any]]
                  ) -> pd.DataFrame:
    """The repair rows with their re-run's judged outcome."""
    for row in rows:
        o = outcome.get(row["rerun"], {})
        row["rerun_failed"] = o.get("failed")
        row["rerun_outcome"] = o.get("outcome", "")
        row["repaired"] = bool(row["rerun"]) and o.get("failed") is False
        row["rerun_reasons"] = _json(o.get("reasons", []))
    return pd.DataFrame(rows)


def _write_result(result: BenchmarkResult) -> None:
    """The frames as Parquet (rows in a canonical order) and the notes as JSON."""
    for name in ("records", "counterfactuals", "repairs", "folds", "runs"):
        getattr(result, name).to_parquet(result.out / f"{name}.parquet", index=False)
    (result.out / "notes.json").write_text(_json(result.notes))


def run_benchmark(suite: Suite, out: str | Path, *, executor: Executor | None = None,
                  run_dir: str | Path | None = None, methods: list[str] | None = None
                  ) -> BenchmarkResult:
    """Run a suite end to end and write its per-run records under ``out``.

    Parameters
    ----------
    suite : Suite
    out : path
        ``results/<suite>``: Parquet tables are written here (metrics and report by
        :mod:`benchmarks.report`).
    executor : Executor, optional
        Default: local worker processes, one per core.
    run_dir : path, optional
        Trace cache (default ``<out>/../runs``), shared by suites.
    methods : list of str, optional
        Method names (default: heuristic, probabilistic and the baselines, those available).

    Returns
    -------
    BenchmarkResult
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = _Context(suite=suite, executor=executor or LocalExecutor(),
                   run_dir=(Path(run_dir) if run_dir is not None else out.parent / "runs"
                            ).resolve(), fingerprint=zoo_fingerprint())
    names, missing = runnable_methods(methods)
    for name, why in missing.items():
        warnings.warn(f"method {name!r} unavailable, left out: {why}", stacklevel=2)
    unfitted = [m for m in names if m not in FITTED_METHODS]
    fitted = [m for m in names if m in FITTED_METHODS]
    t_start = time.perf_counter()
    fams = _select_families(suite)
    zoo = _make_zoo_runs(ctx, fams, bool(fitted))
    cf = _plan_counterfactuals(ctx, zoo)
    folds = _plan_folds(suite, fitted, zoo, cf)
    if fitted:
        folds += _plan_randomised_folds(suite, zoo, cf)
    diag = _gather_diagnoses(ctx.executor.map(
        _diagnosis_tasks(ctx, folds, unfitted, zoo, cf),
        description="diagnosis + counterfactual re-runs", root=ctx.run_dir))
    rep_rows, rep_specs = _plan_repairs(ctx, diag.records, zoo.score)
    ctx.executor.map(ctx.rerun_tasks(rep_specs), description="repair re-runs",
                     root=ctx.run_dir)
    outcome = _judge_reruns(ctx, {**cf.specs, **rep_specs})
    notes = {"methods": names, "methods_missing": missing, "zoo_fingerprint": ctx.fingerprint,
             "n_runs": int(len(zoo.runs)), "n_score_runs": int(len(zoo.score)),
             "unshown_score_runs": sorted(
                 f"{r['family']}/seed {r['seed']}" for _, r in
                 zoo.runs[zoo.runs["shown"].eq(False)].iterrows()),
             "n_fit_runs": int(len(zoo.fit)), "n_counterfactual_reruns": len(cf.specs),
             "n_repair_reruns": len(rep_specs),
             "families": [f.name for f in fams], "wall_s": time.perf_counter() - t_start,
             "run_errors": int((~zoo.runs["finished"]).sum())}
    result = BenchmarkResult(  # rows in a canonical order: the same files on any worker count
        suite, out, canonical_order(diag.records, ("label", "run")),
        canonical_order(_counterfactual_frame(ctx, diag.whatif, zoo.score, outcome),
                        ("split", "run", "knobs")),
        canonical_order(_repair_frame(rep_rows, outcome), ("label", "run")),
        canonical_order(pd.DataFrame(diag.fold_rows), ("split", "fold")), zoo.runs, notes)
    _write_result(result)
    return result


def load_result(suite: Suite, out: str | Path) -> BenchmarkResult:
    """The result an earlier :func:`run_benchmark` wrote under ``out`` (no re-running).

    Raises
    ------
    FileNotFoundError
        If ``out`` holds no benchmark result.
    """
    out = Path(out)
    if not (out / "notes.json").is_file():
        raise FileNotFoundError(f"No benchmark result in {out} (notes.json missing); run "
                                f"python -m benchmarks --suite {suite.name} first.")
    frames = {n: pd.read_parquet(out / f"{n}.parquet") for n in
              ("records", "counterfactuals", "repairs", "folds", "runs")}
    return BenchmarkResult(suite, out, frames["records"], frames["counterfactuals"],
                           frames["repairs"], frames["folds"], frames["runs"],
                           json.loads((out / "notes.json").read_text()))
