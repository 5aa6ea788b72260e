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
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks import metrics as M

__all__ = ["evaluate", "main"]

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
        "ece": M.expected_calibration_error(conf, correct),
        "brier": M.brier_score(conf, correct),
        "nll": M.negative_log_likelihood(conf, correct),
    }


def _proba_summary(proba: np.ndarray, truth: list[str], classes: list[str]) -> dict[str, float]:
    from causal_models.calibration import calibration_report

    index = {c: i for i, c in enumerate(classes)}
    y = np.array([index[t] for t in truth])
    rep = calibration_report(proba, y)
    return {f"proba_{k}": v for k, v in rep.items() if k != "n"}


def _record(hyps: list[Any], truth: dict[str, Any], method: str, fold: str,
            path: str) -> dict[str, Any]:
    return {"run": path, "family": truth.get("family"), "seed": truth.get("seed"),
            "method": method, "fold": fold, "true_failure": truth.get("failure_type"),
            "true_cause": truth.get("root_cause"), **M.score_run(hyps, truth)}


def evaluate(*, fit_seeds: list[int], score_seeds: list[int], cf_seeds: list[int],
             severities: str = "all", families: list[str] | None = None, workers: int = 2,
             runs_dir: str | Path = _ROOT / "results" / "zoo_cache",
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
    zoo_version : str, optional
        Reuse the runs cached under this zoo version (the hash of the zoo's and the
        capture's sources, :func:`benchmarks.fit_default.zoo_version`) instead of the
        current sources' hash: for a capture change that does not alter what is recorded.

    Returns
    -------
    dict
        ``summary`` (per method), ``per_family``, ``whatif`` summary, ``records`` and
        ``whatif_cases`` DataFrames, ``timing``.
    """
    from causal_models import ProbabilisticReasoner
    from benchmarks.fit_default import load_zoo_traces, run_zoo, zoo_run_specs
    from benchmarks.fit_default import zoo_version as current_zoo_version
    from experiments import list_families
    from experiments.run_statistics import health_report
    from neuraldbg.methods import get_method
    from neuraldbg.trace import load_trace

    if set(fit_seeds) & set(score_seeds):
        raise ValueError(f"fit seeds {fit_seeds} and score seeds {score_seeds} overlap; a "
                         "model must never be scored on a run it was fitted on.")
    fams = [f for f in list_families() if families is None or f.name in families]
    fit_specs = zoo_run_specs(fams, fit_seeds, severities=severities, counterfactuals=True)
    score_specs = zoo_run_specs(fams, score_seeds, severities="default", counterfactuals=False)
    cf_specs = [s for s in zoo_run_specs(fams, cf_seeds, severities="default",
                                         counterfactuals=True) if s["knobs"]]
    t0 = time.perf_counter()
    version = zoo_version or current_zoo_version()
    fit_paths = run_zoo(fit_specs, runs_dir, workers=workers, version=version)
    score_paths = run_zoo(score_specs, runs_dir, workers=workers, version=version)
    cf_paths = run_zoo(cf_specs, runs_dir, workers=workers, version=version)
    timing = {"runs_s": time.perf_counter() - t0}
    fit_traces = load_zoo_traces(fit_paths, manifest_only=True)
    score = [(str(p), load_trace(p)) for p in score_paths]
    rerun = {(s["family"], s["seed"], json.dumps(s["knobs"], sort_keys=True)): p
             for s, p in zip(cf_specs, cf_paths)}

    heuristic = get_method("heuristic")
    records, probas = [], {"heuristic": [], "probabilistic": []}
    t0 = time.perf_counter()
    for path, trace in score:
        records.append(_record(heuristic.explain(trace), trace.ground_truth, "heuristic", "",
                               path))
        probas["heuristic"].append(heuristic.predict_proba([trace])[0])
    timing["heuristic_s"] = time.perf_counter() - t0
    h_classes = list(heuristic.classes_)

    cases, fit_times = [], []
    p_classes: list[str] = []
    for fam in fams:
        train = [t for t in fit_traces if t.ground_truth["family"] != fam.name]
        t0 = time.perf_counter()
        model = ProbabilisticReasoner(**(model_params or {})).fit(train)
        fit_times.append(time.perf_counter() - t0)
        p_classes = list(model.classes_)
        held = [(p, t) for p, t in score if t.ground_truth["family"] == fam.name]
        for path, trace in held:
            gt = trace.ground_truth
            records.append(_record(model.explain(trace), gt, "probabilistic", fam.name, path))
            probas["probabilistic"].append(model.predict_proba(trace)[0])
            if gt["seed"] not in cf_seeds:
                continue
            for item in fam.expected_outcomes():
                knobs = dict(item["knobs"])
                rp = rerun[(fam.name, gt["seed"], json.dumps(knobs, sort_keys=True))]
                actual = not bool(health_report(load_trace(rp))["healthy"])
                cf = model.what_if(trace, **knobs)
                cases.append({"family": fam.name, "seed": gt["seed"],
                              "knobs": json.dumps(knobs, sort_keys=True),
                              "source": item.get("source", ""), "expected": item["expected"],
                              "p_failure_factual": cf.p_failure_factual,
                              "p_failure": cf.p_failure, "predicted": cf.failure_type,
                              "actual_failure": actual,
                              "agree": bool((cf.p_failure >= 0.5) == actual),
                              "agree_expected": bool((cf.p_failure >= 0.5)
                                                     == (item["expected"] != "healthy"))})
        if verbose:
            done = [r for r in records if r["method"] == "probabilistic"
                    and r["fold"] == fam.name]
            acc = np.mean([r["failure_correct"] for r in done]) if done else math.nan
            print(f"fold {fam.name:22s} fit {fit_times[-1]:5.1f}s on {len(train):3d} runs, "
                  f"held-out failure accuracy {acc:.2f}", flush=True)
    timing["fit_s_mean"] = float(np.mean(fit_times))
    rec = pd.DataFrame(records)
    truth_of = {(r["run"]): r["true_failure"] for r in records}
    summary = {}
    for method in ("heuristic", "probabilistic"):
        sub = rec[rec["method"] == method]
        runs = sub["run"].tolist()
        s = _summary(sub)
        s.update(_proba_summary(np.vstack(probas[method]), [truth_of[r] for r in runs],
                                h_classes if method == "heuristic" else p_classes))
        summary[method] = s
    per_family = (rec.groupby(["family", "method"])
                  .agg(failure_accuracy=("failure_correct", "mean"),
                       cause_ac1=("cause_rank", lambda r: float(np.mean(r == 1))
                                  if r.notna().any() else math.nan),
                       confidence=("confidence", "mean"))
                  .unstack("method"))
    cf = pd.DataFrame(cases)
    whatif = {"n_cases": int(len(cf))}
    if len(cf):
        y = cf["actual_failure"].to_numpy(dtype=float)
        p = cf["p_failure"].to_numpy(dtype=float)
        whatif.update(agreement=float(cf["agree"].mean()),
                      agreement_with_declared=float(cf["agree_expected"].mean()),
                      brier=float(np.mean((p - y) ** 2)),
                      declared_matches_rerun=float(np.mean(
                          (cf["expected"] != "healthy") == cf["actual_failure"])))
    return {"summary": summary, "per_family": per_family, "whatif": whatif, "records": rec,
            "whatif_cases": cf, "timing": timing,
            "setup": {"zoo_version": version, "fit_seeds": fit_seeds, "score_seeds": score_seeds,
                      "cf_seeds": cf_seeds, "severities": severities,
                      "families": [f.name for f in fams], "n_fit_runs": len(fit_traces),
                      "n_score_runs": len(score), "model_params": model_params or {}}}


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
