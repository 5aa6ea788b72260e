"""Leave-one-family-out evaluation of the probabilistic causal model beside the heuristic.

For every zoo family F (failure and healthy alike) the probabilistic model is fitted on the
*other* families' fit-seed runs (all severities, plus their declared knob changes) and scored
on F's score-seed runs, which it has never seen: neither the family nor the seeds (fit seeds
100+, score seeds 10+; seeds 0-4 are left out because the heuristic's thresholds were chosen
on them). The heuristic reasoner needs no fitting and is scored on the same runs.

Reported per method: failure accuracy, root-cause AC@1 (failing runs), healthy false-positive
rate, and calibration of the verdict confidence (benchmarks.metrics conventions: ECE with 15
bins, Brier, NLL), plus the multi-class ECE/Brier/NLL of ``predict_proba``. Counterfactual
validity: for each scored run of a counterfactual seed and each knob change its family
declares, the model's ``what_if`` (fitted without that family) against really re-running the
same seed with the knob changed (the zoo's health judgement of the re-run).

Usage::

    python -m benchmarks.causal_eval [--fit-seeds 100 101] [--score-seeds 10 11]
        [--cf-seeds 10] [--severities all] [--families a b ...] [--workers 2]
        [--runs-dir results/zoo_cache] [--out results/causal_eval] [--zoo-version HASH]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from benchmarks import metrics as M
from neuraldbg.records import Hypothesis
from neuraldbg.trace import Trace

if TYPE_CHECKING:
    from causal_models import ProbabilisticReasoner
    from experiments.families import FamilySpec

__all__ = ["EvalConfig", "CONFIG", "evaluate", "main"]

_ROOT = Path(__file__).resolve().parent.parent


def _summary(records: pd.DataFrame) -> dict[str, float]:
    """Headline figures of one method's per-run records."""
    failing = records[records["true_failure"] != "healthy"]
    healthy = records[records["true_failure"] == "healthy"]
    ranks = failing["cause_rank"].to_numpy(dtype=float)
    conf = records["confidence"].to_numpy(dtype=float)
    correct = records["failure_correct"].to_numpy(dtype=bool)
    return {
        "n_runs": int(len(records)),
        "failure_accuracy": float(np.mean(correct)) if len(records) else math.nan,
        "cause_ac1": M.ac_at_k(ranks, 1) if len(failing) else math.nan,
        "cause_ac3": M.ac_at_k(ranks, 3) if len(failing) else math.nan,
        "healthy_fpr": float(np.mean(healthy["flagged"])) if len(healthy) else math.nan,
        "ece": M.top1_expected_calibration_error(conf, correct),
        "brier": M.top1_brier_score(conf, correct),
        "nll": M.top1_negative_log_likelihood(conf, correct),
    }


def _proba_summary(proba: np.ndarray, truth: list[str], classes: list[str]) -> dict[str, float]:
    from causal_models.calibration import calibration_report

    index = {c: i for i, c in enumerate(classes)}
    y = np.array([index[t] for t in truth])
    rep = calibration_report(proba, y)
    return {f"proba_{k}": v for k, v in rep.items() if k != "n"}


def _record(hyps: list[Hypothesis], truth: dict[str, Any], method: str, fold: str,
            path: str) -> dict[str, Any]:
    return {"run": path, "family": truth.get("family"), "seed": truth.get("seed"),
            "method": method, "fold": fold, "true_failure": truth.get("failure_type"),
            "true_cause": truth.get("root_cause"), **M.score_run(hyps, truth)}


@dataclass(frozen=True, slots=True)
class EvalConfig:
    """Fixed choices of the evaluation.

    Attributes
    ----------
    failure_threshold : float, default=0.5
        A ``what_if`` answer predicts failure when its P(failure) is at least this (the
        decision rule of EVALUATION.md's counterfactual validity).
    """

    failure_threshold: float = 0.5


#: The configuration :func:`evaluate` uses.
CONFIG = EvalConfig()


@dataclass(frozen=True, slots=True)
class _Runs:
    """The evaluation's zoo runs, made or reused.

    Attributes
    ----------
    fit_traces : list of Trace
        Fitting runs (family labels added, runs whose outcome did not manifest dropped).
    score : list of (str, Trace)
        Scored runs with their paths.
    rerun : dict
        Path of each counterfactual re-run by (family, seed, knobs as JSON).
    version : str
        The zoo version the runs are cached under.
    runs_s : float
        Seconds spent making or finding them.
    """

    fit_traces: list[Trace]
    score: list[tuple[str, Trace]]
    rerun: dict[tuple[str, int, str], Path]
    version: str
    runs_s: float


def _knob_key(knobs: dict[str, Any]) -> str:
    return json.dumps(knobs, sort_keys=True)


def _make_runs(fams: list[FamilySpec], fit_seeds: list[int], score_seeds: list[int],
               cf_seeds: list[int], severities: Literal["all", "default"], workers: int,
               runs_dir: str | Path, zoo_version: str | None) -> _Runs:
    """Make (or reuse) the fitting, scored and counterfactual runs, and load them."""
    from benchmarks.fit_default import load_zoo_traces, run_zoo, zoo_run_specs
    from benchmarks.fit_default import zoo_version as current_zoo_version
    from neuraldbg.trace import load_trace

    fit_specs = zoo_run_specs(fams, fit_seeds, severities=severities, counterfactuals=True)
    score_specs = zoo_run_specs(fams, score_seeds, severities="default", counterfactuals=False)
    cf_specs = [s for s in zoo_run_specs(fams, cf_seeds, severities="default",
                                         counterfactuals=True) if s["knobs"]]
    t0 = time.perf_counter()
    version = zoo_version or current_zoo_version()
    fit_paths = run_zoo(fit_specs, runs_dir, workers=workers, version=version)
    score_paths = run_zoo(score_specs, runs_dir, workers=workers, version=version)
    cf_paths = run_zoo(cf_specs, runs_dir, workers=workers, version=version)
    runs_s = time.perf_counter() - t0
    return _Runs(fit_traces=load_zoo_traces(fit_paths, manifest_only=True),
                 score=[(str(p), load_trace(p)) for p in score_paths],
                 rerun={(s["family"], s["seed"], _knob_key(s["knobs"])): p
                        for s, p in zip(cf_specs, cf_paths, strict=True)},
                 version=version, runs_s=runs_s)


def _score_heuristic(score: list[tuple[str, Trace]]
                     ) -> tuple[list[dict[str, Any]], list[np.ndarray], list[str]]:
    """The heuristic's records and ``predict_proba`` rows on every scored run."""
    from neuraldbg.methods import get_method

    heuristic = get_method("heuristic")
    records, probas = [], []
    for path, trace in score:
        records.append(_record(heuristic.explain(trace), trace.ground_truth, "heuristic", "",
                               path))
        probas.append(heuristic.predict_proba([trace])[0])
    return records, probas, list(heuristic.classes_)


def _whatif_cases(model: ProbabilisticReasoner, fam: FamilySpec, trace: Trace,
                  rerun: dict[tuple[str, int, str], Path]) -> list[dict[str, Any]]:
    """``what_if`` under each knob change ``fam`` declares, beside the judged re-run."""
    from experiments.run_statistics import health_report
    from neuraldbg.trace import load_trace

    gt = trace.ground_truth
    cases = []
    for item in fam.expected_outcomes():
        knobs = dict(item["knobs"])
        rp = rerun[(fam.name, gt["seed"], _knob_key(knobs))]
        actual = not bool(health_report(load_trace(rp))["healthy"])
        cf = model.what_if(trace, **knobs)
        predicted = cf.p_failure >= CONFIG.failure_threshold
        cases.append({"family": fam.name, "seed": gt["seed"], "knobs": _knob_key(knobs),
                      "source": item.get("source", ""), "expected": item["expected"],
                      "p_failure_factual": cf.p_failure_factual,
                      "p_failure": cf.p_failure, "predicted": cf.failure_type,
                      "actual_failure": actual, "agree": bool(predicted == actual),
                      "agree_expected": bool(predicted == (item["expected"] != "healthy"))})
    return cases


@dataclass(frozen=True, slots=True)
class _Fold:
    """One leave-one-family-out fold's results.

    Attributes
    ----------
    records, probas, cases : list
        Per held-out run: its record and ``predict_proba`` row; its ``what_if`` cases.
    classes : list of str
        The fitted model's ``classes_``.
    fit_s : float
        Fit seconds.
    n_fit : int
        Fitting runs.
    """

    records: list[dict[str, Any]]
    probas: list[np.ndarray]
    cases: list[dict[str, Any]]
    classes: list[str]
    fit_s: float
    n_fit: int


def _run_fold(fam: FamilySpec, runs: _Runs, cf_seeds: list[int],
              model_params: dict[str, Any]) -> _Fold:
    """Fit without ``fam``, score its runs and answer their counterfactual cases."""
    from causal_models import ProbabilisticReasoner

    train = [t for t in runs.fit_traces if t.ground_truth["family"] != fam.name]
    t0 = time.perf_counter()
    model = ProbabilisticReasoner(**model_params).fit(train)
    fit_s = time.perf_counter() - t0
    records, probas, cases = [], [], []
    for path, trace in runs.score:
        gt = trace.ground_truth
        if gt["family"] != fam.name:
            continue
        records.append(_record(model.explain(trace), gt, "probabilistic", fam.name, path))
        probas.append(model.predict_proba(trace)[0])
        if gt["seed"] in cf_seeds:
            cases += _whatif_cases(model, fam, trace, runs.rerun)
    return _Fold(records, probas, cases, list(model.classes_), fit_s, len(train))


def _method_summaries(rec: pd.DataFrame, probas: dict[str, list[np.ndarray]],
                      classes: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """:func:`_summary` and :func:`_proba_summary` of each method."""
    truth_of = dict(zip(rec["run"], rec["true_failure"], strict=True))
    summary = {}
    for method in ("heuristic", "probabilistic"):
        sub = rec[rec["method"] == method]
        s = _summary(sub)
        s.update(_proba_summary(np.vstack(probas[method]),
                                [truth_of[r] for r in sub["run"]], classes[method]))
        summary[method] = s
    return summary


def _per_family(rec: pd.DataFrame) -> pd.DataFrame:
    """Failure accuracy, cause AC@1 and mean confidence per family and method."""
    return (rec.groupby(["family", "method"])
            .agg(failure_accuracy=("failure_correct", "mean"),
                 cause_ac1=("cause_rank", lambda r: float(np.mean(r == 1))
                            if r.notna().any() else math.nan),
                 confidence=("confidence", "mean"))
            .unstack("method"))


def _whatif_summary(cf: pd.DataFrame) -> dict[str, float]:
    """Agreement of ``what_if`` with the re-runs and with the declared outcomes; Brier."""
    out: dict[str, float] = {"n_cases": int(len(cf))}
    if len(cf):
        y = cf["actual_failure"].to_numpy(dtype=float)
        p = cf["p_failure"].to_numpy(dtype=float)
        out.update(agreement=float(cf["agree"].mean()),
                   agreement_with_declared=float(cf["agree_expected"].mean()),
                   brier=float(np.mean((p - y) ** 2)),
                   declared_matches_rerun=float(np.mean(
                       (cf["expected"] != "healthy") == cf["actual_failure"])))
    return out


def evaluate(*, fit_seeds: list[int], score_seeds: list[int], cf_seeds: list[int],
             severities: Literal["all", "default"] = "all", families: list[str] | None = None,
             workers: int = 2, runs_dir: str | Path = _ROOT / "results" / "zoo_cache",
             model_params: dict[str, Any] | None = None, verbose: bool = True,
             zoo_version: str | None = None) -> dict[str, Any]:
    """Run the leave-one-family-out evaluation; return summary and per-run tables.

    Parameters
    ----------
    fit_seeds, score_seeds, cf_seeds : list of int
        Seeds to fit on, to score on (disjoint), and whose score runs are re-run under each
        declared knob change (a subset of ``score_seeds``).
    severities : {"all", "default"}
        Fitting runs at every severity of each sweep or only the default.
    families : list of str, optional
        Families to include (default: all registered).
    workers : int
        Parallel training processes for the zoo runs.
    runs_dir : path
        Trace cache.
    model_params : dict, optional
        Hyperparameters of :class:`causal_models.ProbabilisticReasoner`.
    verbose : bool, default=True
        Print one line per fold.
    zoo_version : str, optional
        Reuse the runs cached under this zoo version (the hash of the zoo's and the
        capture's sources, :func:`benchmarks.fit_default.zoo_version`) instead of the
        current sources' hash: for a capture change that does not alter what is recorded.

    Returns
    -------
    dict
        ``summary`` (per method), ``per_family``, ``whatif`` summary, ``records`` and
        ``whatif_cases`` DataFrames, ``timing``, ``setup``.

    Raises
    ------
    ValueError
        If fit and score seeds overlap.
    """
    from experiments import list_families

    if set(fit_seeds) & set(score_seeds):
        raise ValueError(f"fit seeds {fit_seeds} and score seeds {score_seeds} overlap; a "
                         "model must never be scored on a run it was fitted on.")
    fams = [f for f in list_families() if families is None or f.name in families]
    runs = _make_runs(fams, fit_seeds, score_seeds, cf_seeds, severities, workers, runs_dir,
                      zoo_version)
    t0 = time.perf_counter()
    records, h_probas, h_classes = _score_heuristic(runs.score)
    timing = {"runs_s": runs.runs_s, "heuristic_s": time.perf_counter() - t0}
    probas: dict[str, list[np.ndarray]] = {"heuristic": h_probas, "probabilistic": []}
    classes = {"heuristic": h_classes, "probabilistic": []}
    cases, fit_times = [], []
    for fam in fams:
        fold = _run_fold(fam, runs, cf_seeds, model_params or {})
        records += fold.records
        probas["probabilistic"] += fold.probas
        cases += fold.cases
        classes["probabilistic"] = fold.classes
        fit_times.append(fold.fit_s)
        if verbose:
            acc = (np.mean([r["failure_correct"] for r in fold.records]) if fold.records
                   else math.nan)
            print(f"fold {fam.name:22s} fit {fold.fit_s:5.1f}s on {fold.n_fit:3d} runs, "
                  f"held-out failure accuracy {acc:.2f}", flush=True)
    timing["fit_s_mean"] = float(np.mean(fit_times))
    rec, cf = pd.DataFrame(records), pd.DataFrame(cases)
    return {"summary": _method_summaries(rec, probas, classes), "per_family": _per_family(rec),
            "whatif": _whatif_summary(cf), "records": rec, "whatif_cases": cf,
            "timing": timing,
            "setup": {"zoo_version": runs.version, "fit_seeds": fit_seeds,
                      "score_seeds": score_seeds, "cf_seeds": cf_seeds,
                      "severities": severities, "families": [f.name for f in fams],
                      "n_fit_runs": len(runs.fit_traces), "n_score_runs": len(runs.score),
                      "model_params": model_params or {}}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line: run the evaluation, print and write the results."""
    import torch

    torch.set_num_threads(1)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit-seeds", type=int, nargs="+", default=[100, 101])
    parser.add_argument("--score-seeds", type=int, nargs="+", default=[10, 11])
    parser.add_argument("--cf-seeds", type=int, nargs="+", default=[10])
    parser.add_argument("--severities", choices=("all", "default"), default="all")
    parser.add_argument("--families", nargs="+", default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs-dir", default=str(_ROOT / "results" / "zoo_cache"))
    parser.add_argument("--out", default=str(_ROOT / "results" / "causal_eval"))
    parser.add_argument("--zoo-version", default=None,
                        help="reuse runs cached under this zoo version (default: current hash)")
    args = parser.parse_args(argv)
    res = evaluate(fit_seeds=args.fit_seeds, score_seeds=args.score_seeds,
                   cf_seeds=args.cf_seeds, severities=args.severities,
                   families=args.families, workers=args.workers, runs_dir=args.runs_dir,
                   zoo_version=args.zoo_version)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res["records"].to_parquet(out / "records.parquet", index=False)
    res["whatif_cases"].to_parquet(out / "whatif.parquet", index=False)
    res["per_family"].to_csv(out / "per_family.csv")
    blob = {k: res[k] for k in ("summary", "whatif", "timing", "setup")}
    (out / "summary.json").write_text(json.dumps(blob, indent=2, default=float))
    pd.set_option("display.width", 160)
    print(pd.DataFrame(res["summary"]).round(3).to_string())
    print(res["per_family"].round(2).to_string())
    print(json.dumps(res["whatif"], indent=2))
    if len(res["whatif_cases"]):
        print(res["whatif_cases"][["family", "knobs", "expected", "actual_failure", "p_failure",
                                   "agree"]].round(3).to_string())
    return res


if __name__ == "__main__":
    main()
