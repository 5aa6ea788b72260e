"""The heuristic on the zoo's user-bug families, with the split its rules were written on.

The rules for the script bugs (:mod:`neuraldbg.causes`: gradients never reset, a probability
layer before a logits loss, unscaled targets, symmetric init, labels unrelated to the inputs,
a detached tensor, BatchNorm left in ``eval()``) were written looking at the traces of the
:data:`TUNING` families only (zoo seeds 0-2). The :data:`HELD_OUT` families were not looked at
while writing them: their confident-wrong rate shows how the rules generalise to a bug class
or an architecture they were not written on. Every family is scored at seeds the rules never
saw (default 10 and 11, as the benchmark's score seeds).

::

    python -m benchmarks.bug_families                 # held-out and tuning families, controls
    python -m benchmarks.bug_families --existing      # the other zoo families (no regression)
    python -m benchmarks.bug_families --seeds 10 11 12 --json out.json
    python -m benchmarks.bug_families --from-results results/default   # every method, no runs

``--from-results`` reads what ``make bench`` wrote (``records.parquet``: every method, the
probabilistic model per held-out split; ``counterfactuals.parquet``: ``what_if`` against the
re-runs) and sums the harness's own per-run verdicts over each group of families, for every
method (failure accuracy over all the group's runs, as the report counts it; cause AC@1 and
confident-wrong over its failing runs), plus the two halves of ``what_if`` (fixes,
still-fails), without running anything.

Metrics as EVALUATION.md defines them: failure accuracy (top hypothesis's failure type),
cause AC@1 (top hypothesis's root cause), confident-wrong rate (failing runs whose top
hypothesis has confidence >= 0.5 and names a specific cause that is wrong; an honest
``unknown`` is not counted) and healthy FPR (controls with any hypothesis >= 0.5).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["TUNING", "HELD_OUT", "CONTROLS", "score_families", "from_results", "main"]

#: Families whose traces the rules were written on.
TUNING: tuple[str, ...] = (
    "zero_grad_per_epoch_cnn_adam",
    "softmax_before_ce_mlp",
    "unscaled_targets_mlp",
    "constant_init_mlp",
    "shuffled_labels_mlp",
    "adam_sgd_lr_lstm",
    "left_in_eval_cnn_bn",
    "detached_features_gru",
)
#: Families held out of the rules' writing entirely.
HELD_OUT: tuple[str, ...] = (
    "zero_grad_per_epoch_mlp",
    "softmax_before_ce_cnn",
    "constant_init_cnn",
    "constant_init_transformer",
    "shuffled_labels_gru",
)
#: Healthy look-alikes of the bugs.
CONTROLS: tuple[str, ...] = (
    "healthy_adam_high_lr",
    "healthy_regression_standardized",
    "healthy_constant_plus_noise_init",
)


def _record(family: str, seed: int) -> dict[str, Any]:
    import experiments
    import neuraldbg as ndb

    trace = experiments.run_scenario(family, seed=seed)
    truth = trace.ground_truth or {}
    hyps = ndb.explain(trace)
    top = hyps[0] if hyps else None
    conf = top.confidence if top else 0.0
    return {"family": family, "seed": seed, "kind": truth.get("kind"),
            "true_failure": truth.get("failure_type"), "true_cause": truth.get("root_cause"),
            "failure": top.failure_type if top and conf >= 0.5 else "healthy",
            "cause": top.root_cause if top and conf >= 0.5 else "none",
            "confidence": conf,
            "resolution": (top.metadata.get("cause_resolution") if top else None)}


def _rate(hits: int, n: int) -> str:
    return f"{hits}/{n} = {hits / n:.2f}" if n else "n/a"


def summarise(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Failure accuracy, cause AC@1, confident-wrong rate and healthy FPR of ``records``."""
    fail = [r for r in records if r["kind"] == "failure"]
    healthy = [r for r in records if r["kind"] == "healthy"]
    wrong = [r for r in fail if r["confidence"] >= 0.5 and r["cause"] not in
             ("unknown", r["true_cause"])]
    return {
        "n_failing": len(fail), "n_healthy": len(healthy),
        "failure_accuracy": _rate(sum(r["failure"] == r["true_failure"] for r in fail),
                                  len(fail)),
        "cause_ac1": _rate(sum(r["cause"] == r["true_cause"] for r in fail), len(fail)),
        "confident_wrong": _rate(len(wrong), len(fail)),
        "healthy_fpr": _rate(sum(r["failure"] != "healthy" for r in healthy), len(healthy)),
    }


def score_families(families: Sequence[str], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """One record per (family, seed): truth and the heuristic's top hypothesis."""
    import torch

    torch.set_num_threads(1)
    return [_record(f, s) for f in families for s in seeds]


def _existing() -> list[str]:
    import experiments

    ours = set(TUNING) | set(HELD_OUT) | set(CONTROLS)
    return [f.name for f in experiments.list_families() if f.name not in ours]


def from_results(results: str) -> dict[str, Any]:
    """The groups' figures for every method from a benchmark run's tables (see the module).

    Returns ``{group: {method: summary}}`` and, under ``"what_if"``, ``{group: {split:
    {"fixes": "k/n", "still_fails": "k/n"}}}``; groups are the new families (held out and
    tuning), the held-out ones, the controls and the zoo's other families.
    """
    from pathlib import Path

    import pandas as pd

    root = Path(results)
    rec = pd.read_parquet(root / "records.parquet")
    rec = rec[rec["error"].fillna("") == ""]
    new = set(HELD_OUT) | set(TUNING)
    groups = {"new": new | set(CONTROLS), "held_out": set(HELD_OUT) | set(CONTROLS),
              "existing": set(rec["family"]) - new - set(CONTROLS)}
    out: dict[str, Any] = {}
    for name, fams in groups.items():
        sub = rec[rec["family"].isin(fams)]
        out[name] = {}
        for label, g in sub.groupby("label"):
            # the harness's own per-run columns, so the figures are the report's
            failing = g[g["true_failure"] != "healthy"]
            healthy = g[g["true_failure"] == "healthy"]
            out[name][str(label)] = {
                "n_failing": len(failing), "n_healthy": len(healthy),
                "failure_accuracy": _rate(int(g["failure_correct"].sum()), len(g)),
                "failure_accuracy_failing": _rate(int(failing["failure_correct"].sum()),
                                                  len(failing)),
                "cause_ac1": _rate(int((failing["cause_rank"] == 1.0).sum()), len(failing)),
                "confident_wrong": _rate(int(failing["confident_wrong"].fillna(False)
                                             .astype(bool).sum()), len(failing)),
                "healthy_fpr": _rate(int(healthy["flagged"].sum()), len(healthy))}
    cf = pd.read_parquet(root / "counterfactuals.parquet")
    cf = cf[cf["error"].fillna("") == ""]
    out["what_if"] = {}
    for name, fams in groups.items():
        sub = cf[cf["family"].isin(fams)]
        out["what_if"][name] = {}
        for split, g in sub.groupby("split"):
            fixed = ~g["actual_failure"].astype(bool)
            said_fixed = g["predicted"] == "healthy"
            out["what_if"][name][str(split)] = {
                "fixes": _rate(int((said_fixed & fixed).sum()), int(fixed.sum())),
                "still_fails": _rate(int((~said_fixed & ~fixed).sum()), int((~fixed).sum()))}
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks.bug_families``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bug_families",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[10, 11])
    parser.add_argument("--existing", action="store_true",
                        help="score the zoo's other families instead (regression check)")
    parser.add_argument("--json", default=None, help="write every record to this file")
    parser.add_argument("--from-results", default=None, metavar="DIR",
                        help="read a benchmark run's tables (results/default) instead of "
                             "running the families; every method is summarised")
    args = parser.parse_args(argv)
    if args.from_results:
        summary = from_results(args.from_results)
        for name, by_method in summary.items():
            print(f"== {name}")
            for method, figures in by_method.items():
                print(f"  {method}: " + ", ".join(f"{k}: {v}" for k, v in figures.items()))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(summary, fh, indent=2)
        return 0
    groups = ({"existing": _existing()} if args.existing else
              {"held_out": list(HELD_OUT), "tuning": list(TUNING), "controls": list(CONTROLS)})
    out: dict[str, Any] = {"seeds": args.seeds}
    for name, fams in groups.items():
        start = time.perf_counter()
        recs = score_families(fams, args.seeds)
        summary = summarise(recs)
        out[name] = {"families": fams, "summary": summary, "records": recs,
                     "seconds": time.perf_counter() - start}
        print(f"== {name} ({len(fams)} families x seeds {args.seeds}, "
              f"{out[name]['seconds']:.0f} s)")
        for r in recs:
            ok = r["cause"] == r["true_cause"] and r["failure"] == r["true_failure"]
            print(f"  {r['family']:<36} s{r['seed']:<3} truth {r['true_failure']}/"
                  f"{r['true_cause']}  got {r['failure']}/{r['cause']} "
                  f"({r['confidence']:.2f}, {r['resolution']}) {'' if ok else '  <-'}")
        print("  " + ", ".join(f"{k}: {v}" for k, v in summary.items()))
    if len(groups) > 1:
        allfail = out["held_out"]["records"] + out["tuning"]["records"]
        out["all_new"] = summarise(allfail + out["controls"]["records"])
        print("== all new families: " + ", ".join(f"{k}: {v}"
                                                  for k, v in out["all_new"].items()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
