"""Re-fit the shipped default model from failure-zoo runs.

``python -m benchmarks.fit_default`` trains the zoo's families (every severity of each
sweep, the fit seeds, and the knob changes each family declares: its fixes and
counterfactuals), fits :class:`ProbabilisticReasoner` on them and writes
``causal_models/data/default_model.json`` (JSON only). Finished runs are cached in
``--runs-dir`` and reused.

The fit seeds (100, 101 by default) are disjoint from the seeds the benchmarks score on
(0, 1, 2), so the shipped model is never scored on a run it was fitted on.

Options::

    --seeds 100 101          fit seeds
    --severities all         "all" severities of each sweep or only the "default"
    --no-counterfactuals     leave out the fixes/counterfactual knob runs
    --keep-unmanifested      also fit on runs whose declared outcome did not manifest
    --workers 2              parallel training processes
    --runs-dir DIR           trace cache (default: results/zoo_cache)
    --out PATH               where to write the model
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

import causal_models
from causal_models.network import ProbabilisticReasoner
from experiments import get_family, list_families, run_scenario
from experiments.run_statistics import health_report
from experiments.runner import zoo_fingerprint
from neuraldbg.trace import load_trace

__all__ = ["zoo_run_specs", "run_zoo", "zoo_version", "with_family_labels", "load_zoo_traces",
           "declared_outcome_shown",
           "main"]

_ROOT = Path(__file__).resolve().parent.parent


def zoo_run_specs(families: list[Any], seeds: list[int], *, severities: str = "all",
                  counterfactuals: bool = True) -> list[dict[str, Any]]:
    """Run specs ``{family, severity, seed, knobs}`` for fitting.

    Parameters
    ----------
    families : list of experiments.families.FamilySpec
    seeds : list of int
    severities : {"all", "default"}
    counterfactuals : bool
        Also the family's declared knob changes (fixes and counterfactuals) at its default
        severity.
    """
    specs = []
    for fam in families:
        sevs = list(fam.severities) if severities == "all" and fam.severities else [
            fam.default_severity]
        for seed in seeds:
            for sev in sevs:
                specs.append({"family": fam.name, "severity": float(sev), "seed": int(seed),
                              "knobs": {}})
            if counterfactuals:
                for item in fam.expected_outcomes():
                    specs.append({"family": fam.name, "severity": float(fam.default_severity),
                                  "seed": int(seed), "knobs": dict(item["knobs"])})
    return specs


def _key(spec: dict[str, Any]) -> str:
    name = f"{spec['severity']:g}_s{spec['seed']}"
    if spec["knobs"]:
        name += "_" + hashlib.sha1(json.dumps(spec["knobs"], sort_keys=True).encode()
                                   ).hexdigest()[:10]
    return f"{spec['family']}/{name}"


def zoo_version() -> str:
    """Short hash of the zoo's and the capture's sources (what a cached trace depends on):
    :func:`experiments.runner.zoo_fingerprint`."""
    return zoo_fingerprint()


def _run_one(spec: dict[str, Any], path: str) -> str:
    torch.set_num_threads(1)
    out = Path(path)
    if (out / "DONE").is_file():
        return path
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    trace = run_scenario(spec["family"], severity=spec["severity"], seed=spec["seed"],
                         **spec["knobs"])
    trace.save(tmp)
    (tmp / "DONE").write_text(json.dumps(spec, sort_keys=True))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return path


def run_zoo(specs: list[dict[str, Any]], runs_dir: str | os.PathLike[str], *,
            workers: int = 2, version: str | None = None) -> list[Path]:
    """Train (or reuse) every run of ``specs``; return their trace directories in order.

    Traces are cached under ``runs_dir/<zoo source hash>/<family>/<severity>_s<seed>[_knobs]``
    (``version`` fixes the hash, so that several calls of one evaluation share a cache even
    if the zoo's sources change meanwhile).
    """
    root = Path(runs_dir) / (version or zoo_version())
    paths = [root / _key(s) for s in specs]
    todo = [(s, str(p)) for s, p in zip(specs, paths) if not (p / "DONE").is_file()]
    for _, p in todo:
        Path(p).parent.mkdir(parents=True, exist_ok=True)
    if todo:
        if workers <= 1:
            for s, p in todo:
                _run_one(s, p)
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                list(pool.map(_run_one, [s for s, _ in todo], [p for _, p in todo]))
    return paths


def with_family_labels(trace: Any) -> Any:
    """The trace with its family's default and baseline severities added to its ground truth.

    ``training_labels`` uses them to place a non-default severity's knob level. Only the
    fitting code calls this; prediction never reads ground truth.
    """
    gt = dict(trace.ground_truth or {})
    if "family" in gt:
        spec = get_family(gt["family"])
        gt.setdefault("default_severity", spec.default_severity)
        gt.setdefault("baseline_severity", spec.baseline_severity)
    trace.meta = {**trace.meta, "ground_truth": gt}
    return trace


def load_zoo_traces(paths: list[Path], *, manifest_only: bool = False) -> list[Any]:
    """Load traces, add family labels, drop runs whose outcome the zoo does not declare.

    Parameters
    ----------
    paths : list of path
    manifest_only : bool, default=False
        Also drop runs whose declared outcome the run does not show by the zoo's own health
        judgement (``experiments.run_statistics.health_report``): a run labelled failing that
        trained healthily, or the reverse. For *fitting* only: the DeepCrime rule that a
        fault counts where it manifests, applied per run.
    """
    return prepare_fit_traces([load_trace(p) for p in paths], manifest_only=manifest_only)


def prepare_fit_traces(traces: list[Any], *, manifest_only: bool = False) -> list[Any]:
    """What :func:`load_zoo_traces` does to traces already loaded (the benchmark's folds)."""
    out = []
    for trace in traces:
        trace = with_family_labels(trace)
        label = (trace.ground_truth or {}).get("failure_type")
        if label is None:
            continue
        if manifest_only and not declared_outcome_shown(trace):
            continue
        out.append(trace)
    return out


def declared_outcome_shown(trace: Any) -> bool:
    """Does the run show the outcome its ground truth declares, by the zoo's health judgement?

    A run labelled failing that trained healthily (finite loss that fell, no mostly dead or
    saturated layer: ``experiments.run_statistics.health_report``), or a healthy control
    that did not, does not: the DeepCrime rule that a fault counts where it manifests,
    applied per run. The fit leaves such runs out of what it learns from, and the
    benchmark out of what it scores (a seed of a knife-edge family can train healthily on
    one processor's rounding and fail on another's).
    """
    label = (trace.ground_truth or {}).get("failure_type")
    return label is not None and bool(health_report(trace)["healthy"]) == (label == "healthy")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Re-fit the default model and write it as JSON."""
    parser = argparse.ArgumentParser(description="Re-fit causal_models' default model.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[100, 101])
    parser.add_argument("--severities", choices=("all", "default"), default="all")
    parser.add_argument("--no-counterfactuals", action="store_true")
    parser.add_argument("--keep-unmanifested", action="store_true",
                        help="fit also on runs whose declared outcome did not manifest")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs-dir", default=str(_ROOT / "results" / "zoo_cache"))
    parser.add_argument("--out", default=str(causal_models.DEFAULT_MODEL_PATH))
    args = parser.parse_args(argv)

    families = list_families()
    specs = zoo_run_specs(families, args.seeds, severities=args.severities,
                          counterfactuals=not args.no_counterfactuals)
    t0 = time.perf_counter()
    paths = run_zoo(specs, args.runs_dir, workers=args.workers)
    t_runs = time.perf_counter() - t0
    traces = load_zoo_traces(paths, manifest_only=not args.keep_unmanifested)
    t0 = time.perf_counter()
    model = ProbabilisticReasoner().fit(traces)
    t_fit = time.perf_counter() - t0
    out = model.save(args.out)
    t0 = time.perf_counter()
    ProbabilisticReasoner.load(out)
    t_load = time.perf_counter() - t0
    summary = {"model": str(out), "bytes": out.stat().st_size, "n_runs": len(paths),
               "n_fit_traces": len(traces), "families": len(model.fit_families_),
               "seeds": args.seeds, "severities": args.severities,
               "temperature": model.calibrator_.temperature, "runs_s": round(t_runs, 1),
               "fit_s": round(t_fit, 2), "load_s": round(t_load, 3)}
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
