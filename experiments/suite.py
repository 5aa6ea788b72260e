"""Run many zoo scenarios in parallel worker processes, resumably, then check manifestation.

Layout of a suite directory::

    <out>/<family>/sev<severity>/seed<k>/            a run of the family (trace directory)
    <out>/<family>/baseline-sev<severity>/seed<k>/   its healthy baseline (failure families)
    <out>/summary.json                               per-family manifestation and timings

A run whose ``meta.json`` says ``status: complete`` is never recomputed, so an interrupted
suite resumes where it stopped. After the runs, the manifestation check of
:mod:`experiments.manifest` is computed from the stored traces and written into each run's
``meta.json`` (``ground_truth["manifestation"]``): a failure run is *kept* only where its
family manifests against the baseline across the seeds.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SuiteRun", "plan_suite", "run_suite", "is_complete"]


@dataclass(frozen=True, slots=True)
class SuiteRun:
    """One run of a suite.

    Attributes
    ----------
    family : str
    severity : float
    seed : int
    knobs : dict
        Knobs of the run (a baseline's ``baseline_knobs``).
    role : {"run", "baseline"}
        A run of the family (failure or healthy control) or a healthy baseline run.
    path : str
        Trace directory relative to the suite directory.
    """

    family: str
    severity: float
    seed: int
    knobs: dict[str, Any] = field(default_factory=dict)
    role: str = "run"
    path: str = ""


def _sev(value: float) -> str:
    return f"{value:g}"


def plan_suite(families: Iterable[str] | None = None, seeds: int | Sequence[int] = 3, *,
               severity: str | float = "default", baselines: bool = True) -> list[SuiteRun]:
    """The runs of a suite: each family at its default severity (or all its severities) for
    every seed, plus the baseline runs the manifestation check needs.

    Parameters
    ----------
    families : iterable of str, optional
        Family names; all registered families when None.
    seeds : int or sequence of int, default=3
        ``n`` means seeds ``0..n-1``.
    severity : "default", "all" or float, default="default"
    baselines : bool, default=True
        Include the healthy baseline runs of failure families.
    """
    from experiments.families import get_family, list_families

    specs = list_families() if families is None else [get_family(f) for f in families]
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    runs: list[SuiteRun] = []
    for spec in specs:
        if severity == "default":
            sevs = [spec.default_severity]
        elif severity == "all":
            sevs = list(spec.severities)
        else:
            sevs = [float(severity)]
        base_done: set[tuple[float, str]] = set()
        for sev in sevs:
            for seed in seed_list:
                runs.append(SuiteRun(spec.name, sev, seed, {}, "run",
                                     f"{spec.name}/sev{_sev(sev)}/seed{seed}"))
            if baselines and spec.kind == "failure":
                base_sev, base_knobs = spec.baseline_of(sev)
                key = (base_sev, json.dumps(base_knobs, sort_keys=True))
                if key in base_done:
                    continue
                base_done.add(key)
                tag = "-".join(f"{k}{v}" for k, v in sorted(base_knobs.items()))
                name = f"baseline-sev{_sev(base_sev)}" + (f"-{tag}" if tag else "")
                for seed in seed_list:
                    runs.append(SuiteRun(spec.name, base_sev, seed, dict(base_knobs), "baseline",
                                         f"{spec.name}/{name}/seed{seed}"))
    return runs


def is_complete(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` holds a finished trace (``meta.json`` with ``status: complete``)."""
    meta = Path(path) / "meta.json"
    if not meta.is_file():
        return False
    try:
        return json.loads(meta.read_text()).get("status") == "complete"
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return False


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"


def _run_one(run: dict[str, Any], root: str, every: int) -> dict[str, Any]:
    """Worker: make one run and save it; returns timing and status (never raises)."""
    import experiments

    target = Path(root) / run["path"]
    start, cpu = time.perf_counter(), time.process_time()
    try:
        experiments.run_scenario(run["family"], severity=run["severity"], seed=run["seed"],
                                 out=target, every=every, **run["knobs"])
        error = None
    except Exception as exc:  # reported in the summary; the suite goes on
        error = f"{type(exc).__name__}: {exc}"
    return {"path": run["path"], "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu, "error": error}


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default))
    os.replace(tmp, path)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{value!r} is not JSON-serialisable")


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


def _record_manifestation(root: Path, runs: list[SuiteRun]) -> list[dict[str, Any]]:
    """Check manifestation per (family, severity) from the stored traces and write it into
    each run's meta.json."""
    import neuraldbg as ndb
    from experiments.manifest import check_family
    from experiments.families import get_family

    groups: dict[tuple[str, float], dict[str, list[SuiteRun]]] = {}
    for run in runs:
        if run.role == "run":
            key = (run.family, run.severity)
            groups.setdefault(key, {"run": [], "baseline": []})["run"].append(run)
    for run in runs:
        if run.role != "baseline":
            continue
        for (fam, sev), group in groups.items():
            spec = get_family(fam)
            if fam == run.family and spec.baseline_of(sev) == (run.severity, run.knobs):
                group["baseline"].append(run)
    results = []
    for (fam, sev), group in sorted(groups.items()):
        spec = get_family(fam)
        done = [r for r in group["run"] if is_complete(root / r.path)]
        base = [r for r in group["baseline"] if is_complete(root / r.path)]
        if not done or (spec.kind == "failure" and not base):
            results.append({"family": fam, "severity": sev, "checked": False,
                            "reason": "missing runs"})
            continue
        evidence = check_family(
            fam, sev, seeds=[r.seed for r in done],
            fault_traces=[ndb.load_trace(root / r.path) for r in done],
            baseline_traces=[ndb.load_trace(root / r.path) for r in base] or None,
        )
        evidence = _clean(evidence)
        kept = evidence["manifest"] if spec.kind == "failure" else evidence["healthy"]
        for r in done:
            meta_path = root / r.path / "meta.json"
            meta = json.loads(meta_path.read_text())
            if meta.get("ground_truth") is not None:
                meta["ground_truth"]["manifestation"] = {**evidence, "kept": bool(kept)}
                _write_json_atomic(meta_path, meta)
        results.append({**evidence, "kept": bool(kept)})
    return results


def run_suite(out: str | os.PathLike[str], *, seeds: int | Sequence[int] = 3, workers: int = 2,
              families: Iterable[str] | None = None, severity: str | float = "default",
              baselines: bool = True, every: int = 1, progress: bool = True,
              manifest: bool = True) -> list[Path]:
    """Run a suite of scenarios in worker processes; resumable.

    Parameters
    ----------
    out : str or path-like
        Suite directory (created if missing).
    seeds : int or sequence of int, default=3
    workers : int, default=2
        Worker processes (each single-threaded).
    families : iterable of str, optional
        All registered families when None.
    severity : "default", "all" or float, default="default"
    baselines : bool, default=True
        Also run the baselines the manifestation check needs.
    every : int, default=1
        Per-module recording interval of every run.
    progress : bool, default=True
        Show a rich progress bar.
    manifest : bool, default=True
        Check manifestation afterwards and record it in each run's ``meta.json``.

    Returns
    -------
    list of pathlib.Path
        Trace directories of the family runs (baselines not included), finished or resumed.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}.")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    runs = plan_suite(families, seeds, severity=severity, baselines=baselines)
    todo = [r for r in runs if not is_complete(root / r.path)]
    timings: list[dict[str, Any]] = []
    start = time.perf_counter()
    if todo:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                                 initializer=_init_worker) as pool:
            futures = [pool.submit(_run_one, asdict(r), str(root), every) for r in todo]
            if progress:
                from rich.progress import (BarColumn, MofNCompleteColumn, Progress,
                                           TextColumn, TimeElapsedColumn)

                with Progress(TextColumn("[bold]zoo suite"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), TextColumn("{task.description}")) as bar:
                    task = bar.add_task("", total=len(futures))
                    for fut in as_completed(futures):
                        res = fut.result()
                        timings.append(res)
                        bar.update(task, advance=1, description=res["path"])
            else:
                for fut in as_completed(futures):
                    timings.append(fut.result())
    wall = time.perf_counter() - start
    summary: dict[str, Any] = {
        "runs_planned": len(runs),
        "runs_made": len(todo),
        "runs_resumed": len(runs) - len(todo),
        "workers": workers,
        "wall_seconds": wall,
        "cpu_seconds_total": sum(t["cpu_seconds"] for t in timings),
        "run_seconds": sorted(timings, key=lambda t: t["path"]),
        "errors": [t for t in timings if t["error"]],
    }
    if manifest:
        summary["manifestation"] = _record_manifestation(root, runs)
    _write_json_atomic(root / "summary.json", _clean(summary))
    return [root / r.path for r in runs if r.role == "run" and is_complete(root / r.path)]
