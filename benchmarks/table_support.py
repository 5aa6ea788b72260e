"""The data share of every table of the causal model, and its sensitivity to the priors.

``python -m benchmarks.table_support`` prints, for the shipped default model, each
conditional table's parent configurations, the share the fitting data reached, the data's
weight there against the rules' pseudo-counts (:func:`causal_models.support.table_support`),
and a summary per role.

``--prior-sensitivity`` also fits leave-one-family-out on the zoo's fitting runs (the seeds
of :mod:`benchmarks.fit_default`, cached in ``results/zoo_cache``) at the default prior
strength and at a near-zero one, and reports the held-out log-likelihood of the true
(failure type, root cause) of each held-out run: how much the rules' priors help on a family
the data never showed. Results go to ``results/table_support.json``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

import causal_models
from benchmarks.fit_default import load_zoo_traces, run_zoo, zoo_run_specs
from causal_models.network import ProbabilisticReasoner
from causal_models.structure import NO_CAUSE
from experiments import list_families
from neuraldbg.records import HEALTHY

__all__ = ["support_summary", "prior_sensitivity", "main"]

_ROOT = Path(__file__).resolve().parent.parent
#: Pseudo-counts per column standing for "no prior" (zero would leave unseen columns empty).
_NO_PRIOR = 0.01
#: Light pseudo-counts per column: the rules' shape, outweighed by a few runs of data.
_LIGHT = 2.0
#: Floor of a held-out probability in the log-likelihood (an unseen outcome is not -inf).
_FLOOR = 1e-6


def support_summary(support: pd.DataFrame) -> pd.DataFrame:
    """Per role: tables, columns, share reached, share of reached columns data-dominated."""
    return support.groupby("role").agg(
        tables=("node", "count"), columns=("columns", "sum"), reached=("reached", "sum"),
        median_share_reached=("share_reached", "median"),
        median_data_outweighs_prior=("share_data_outweighs_prior", "median")).assign(
        share_reached=lambda d: d["reached"] / d["columns"]).reset_index()


def _held_out_loglik(model: ProbabilisticReasoner, traces: list[Any]) -> list[float]:
    out = []
    classes, causes = list(model.classes_), list(model.root_causes_)
    for trace in traces:
        gt = trace.ground_truth
        ft = gt.get("failure_type") or HEALTHY
        rc = NO_CAUSE if ft == HEALTHY else (gt.get("root_cause") or "unknown")
        joint = model.joint_posterior(trace)
        p = float(joint.loc[ft, rc]) if ft in classes and rc in causes else 0.0
        out.append(math.log(max(p, _FLOOR)))
    return out


def prior_sensitivity(traces: list[Any], strengths: dict[str, float]) -> dict[str, Any]:
    """Leave-one-family-out held-out log-likelihood per prior strength."""
    families = sorted({t.ground_truth["family"] for t in traces})
    result: dict[str, Any] = {}
    for label, strength in strengths.items():
        scores: list[float] = []
        for family in families:
            train = [t for t in traces if t.ground_truth["family"] != family]
            test = [t for t in traces if t.ground_truth["family"] == family]
            model = ProbabilisticReasoner(prior_strength=strength, calibration="none")
            scores += _held_out_loglik(model.fit(train), test)
        result[label] = {"prior_strength": strength, "runs": len(scores),
                         "mean_loglik": float(np.mean(scores)),
                         "share_above_floor": float(np.mean(np.array(scores) > math.log(
                             _FLOOR)))}
    return result


def _print(console: Console, frame: pd.DataFrame, title: str) -> None:
    table = Table(title=title)
    for col in frame.columns:
        table.add_column(str(col))
    for row in frame.itertuples(index=False):
        table.add_row(*(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row))
    console.print(table)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prior-sensitivity", action="store_true")
    parser.add_argument("--runs-dir", default=str(_ROOT / "results" / "zoo_cache"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(_ROOT / "results" / "table_support.json"))
    args = parser.parse_args(argv)
    console = Console()
    model = causal_models.load_default_model()
    support = model.support_
    summary = support_summary(support)
    _print(console, support, "Data share per table (shipped default model)")
    _print(console, summary, "Per role")
    out: dict[str, Any] = {"tables": support.to_dict(orient="records"),
                           "by_role": summary.to_dict(orient="records")}
    if args.prior_sensitivity:
        specs = zoo_run_specs(list_families(), [100, 101])
        traces = load_zoo_traces(run_zoo(specs, args.runs_dir, workers=args.workers),
                                 manifest_only=True)
        default = ProbabilisticReasoner().prior_strength
        out["prior_sensitivity"] = prior_sensitivity(
            traces, {"rule priors (default)": default, "light rule priors": _LIGHT,
                     "no prior": _NO_PRIOR})
        console.print_json(json.dumps(out["prior_sensitivity"]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
