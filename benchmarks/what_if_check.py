"""``what_if`` of a fitted model against really re-running the seed, and its consistency.

``python -m benchmarks.what_if_check --seed 10`` runs every zoo family at one seed, and for
each failing family its canonical fix, equivalent fixes and declared counterfactuals (for a
healthy family, its declared counterfactuals), each re-run with the knob changed and judged
by the zoo (:func:`benchmarks.runs.run_outcome`). It prints the accuracy of ``p_failure >=
0.5`` against the re-runs, split into the changes that fix the run and those that do not
(balanced accuracy: their mean), the largest ``|p_failure - p_failure_factual|`` over
no-op interventions (target 0), and the median ``what_if`` time.

The model is the shipped default model (or ``--model PATH``): it was fitted on other seeds of
the same families, so this is a quick check of the counterfactual machinery, not the
held-out figure (``python -m benchmarks.causal_eval`` gives that, leave-one-family-out).
Runs are cached under ``--run-dir`` as the benchmark caches them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

import causal_models
from benchmarks.runs import RunSpec, execute_run, load, run_outcome, run_path, zoo_fingerprint
from causal_models.network import ProbabilisticReasoner
from experiments import list_families
from neuraldbg.sufficiency import usable_trace

__all__ = ["check", "main"]


def _trace(spec: RunSpec, run_dir: Path, fingerprint: str) -> Any:
    path = run_path(run_dir, spec, fingerprint)
    execute_run(spec.to_dict(), str(path))
    return load(path)


def check(model: ProbabilisticReasoner, seed: int, run_dir: Path) -> dict[str, Any]:
    """Every declared knob change of every family at ``seed``: predicted vs re-run."""
    fingerprint = zoo_fingerprint()
    cases: list[dict[str, Any]] = []
    no_op = 0.0
    for family in list_families():
        trace = usable_trace(_trace(RunSpec(family.name, None, seed), run_dir, fingerprint))
        norms = trace.steps["grad_norm"].to_numpy(dtype=float)
        norms = norms[np.isfinite(norms)]
        no_ops: list[dict[str, Any]] = [{}, {"lr_scale": 1.0}, {"init_scale": 1.0}]
        if norms.size and not (trace.meta.get("config") or {}).get("grad_clip"):
            no_ops.append({"grad_clip": float(norms.max()) * 10.0})
        for knobs in no_ops:
            cf = model.what_if(trace, **knobs)
            no_op = max(no_op, abs(cf.p_failure - cf.p_failure_factual))
        changes = [c["knobs"] for c in family.counterfactuals]
        if family.kind == "failure":
            changes = [family.canonical_fix, *family.equivalent_fixes, *changes]
        for knobs in changes:
            rerun = _trace(RunSpec(family.name, None, seed, dict(knobs)), run_dir, fingerprint)
            failed = bool(run_outcome(rerun)["failed"])
            start = time.perf_counter()
            cf = model.what_if(trace, **knobs)
            seconds = time.perf_counter() - start
            cases.append({"family": family.name, "knobs": dict(knobs), "rerun_failed": failed,
                          "p_failure": cf.p_failure, "p_failure_factual": cf.p_failure_factual,
                          "seconds": seconds})
    fixes = [c for c in cases if not c["rerun_failed"]]
    still = [c for c in cases if c["rerun_failed"]]
    fix_acc = float(np.mean([c["p_failure"] < 0.5 for c in fixes])) if fixes else float("nan")
    still_acc = float(np.mean([c["p_failure"] >= 0.5 for c in still])) if still \
        else float("nan")
    right = sum((c["p_failure"] >= 0.5) == c["rerun_failed"] for c in cases)
    return {"seed": seed, "cases": len(cases), "accuracy": right / max(len(cases), 1),
            "fixes": [sum(c["p_failure"] < 0.5 for c in fixes), len(fixes), fix_acc],
            "still_fails": [sum(c["p_failure"] >= 0.5 for c in still), len(still), still_acc],
            "balanced_accuracy": (fix_acc + still_acc) / 2, "no_op_max_abs_diff": no_op,
            "median_what_if_seconds": float(np.median([c["seconds"] for c in cases])),
            "per_case": cases}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command-line entry point; prints the summary and writes ``--out`` (JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument("--model", default=None,
                        help="a model JSON (default: the shipped default model)")
    parser.add_argument("--run-dir", default="results/runs")
    parser.add_argument("--out", default="results/what_if_check.json")
    args = parser.parse_args(argv)
    model = (ProbabilisticReasoner.load(args.model) if args.model
             else causal_models.load_default_model())
    result = check(model, args.seed, Path(args.run_dir))
    summary = {k: v for k, v in result.items() if k != "per_case"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(summary, indent=2))
    return result


if __name__ == "__main__":
    main()
