"""Zoo runs for the benchmark: run specs, a cache of finished traces, and run outcomes.

A run is ``(family, severity, seed, knobs)``. Its trace lives under
``<run_dir>/<zoo fingerprint>/<family>/<severity>_s<seed>[_<knob hash>]``: the fingerprint
hashes the source of the zoo and the capture code, so an edited scenario never reuses a
stale trace, while unchanged code reuses every finished run across suites and invocations.
A run is written to a temporary directory and renamed when complete, so a killed benchmark
leaves no half-finished trace that would be mistaken for a finished one.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.runner import zoo_fingerprint
from neuraldbg.trace import Trace, load_trace

__all__ = ["RunSpec", "zoo_fingerprint", "run_path", "is_finished", "execute_run",
           "run_outcome", "truncate_trace", "finished_runs", "pack_run", "unpack_run"]


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One zoo run.

    Attributes
    ----------
    family : str
        Zoo family name.
    severity : float or None
        Severity (None: the family's default).
    seed : int
    knobs : dict
        Knob changes relative to the scenario (empty: the scenario as it is).
    """

    family: str
    severity: float | None
    seed: int
    knobs: dict[str, Any] = field(default_factory=dict)

    def key(self) -> str:
        """Relative directory name, stable across processes and machines."""
        sev = "default" if _is_default(self.severity) else f"{float(self.severity):g}"
        name = f"{sev}_s{self.seed}"
        if self.knobs:
            blob = json.dumps(self.knobs, sort_keys=True)
            name += "_" + hashlib.sha1(blob.encode()).hexdigest()[:10]
        return f"{self.family}/{name}"

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (task arguments)."""
        return {"family": self.family,
                "severity": None if _is_default(self.severity) else float(self.severity),
                "seed": int(self.seed), "knobs": dict(self.knobs)}


def _is_default(severity: Any) -> bool:
    """None, or the NaN a pandas column turns None into."""
    return severity is None or (isinstance(severity, float) and math.isnan(severity))


def run_path(run_dir: Path, spec: RunSpec, fingerprint: str) -> Path:
    """Where the trace of ``spec`` lives."""
    return Path(run_dir) / fingerprint / spec.key()


def is_finished(path: Path) -> bool:
    """True when ``path`` holds a complete trace written by :func:`execute_run`."""
    return (Path(path) / "meta.json").is_file() and (Path(path) / "DONE").is_file()


def execute_run(spec: dict[str, Any], path: str, every: int = 1) -> str:
    """Train one zoo run and save its trace to ``path`` (a task for the executor).

    Reuses the trace when it is already finished. Returns ``path``.
    """
    from experiments import run_scenario

    out = Path(path)
    if is_finished(out):
        return str(out)
    tmp = out.with_name(f".{out.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    trace = run_scenario(spec["family"], severity=spec["severity"], seed=spec["seed"],
                         every=every, **spec["knobs"])
    trace.save(tmp)
    (tmp / "DONE").write_text(json.dumps(spec, sort_keys=True))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return str(out)


def finished_runs(root: str | Path) -> list[Path]:
    """Every finished trace directory under ``root`` (sorted), as :func:`execute_run` leaves
    them; half-written ``.tmp`` directories are not finished and not listed."""
    return sorted(p.parent for p in Path(root).rglob("DONE") if is_finished(p.parent))


def pack_run(path: str | Path) -> dict[str, bytes]:
    """The files of a finished trace directory as bytes, keyed by their relative POSIX path.

    The trace travels as its own Parquet and JSON files (never a pickled object), so a Ray
    worker on another host can rebuild the directory byte for byte with :func:`unpack_run`.

    Raises
    ------
    FileNotFoundError
        If ``path`` is not a finished trace (no ``meta.json`` and ``DONE``).
    """
    path = Path(path)
    if not is_finished(path):
        raise FileNotFoundError(f"{path} is not a finished trace (meta.json and DONE missing); "
                                "only a complete run can be shipped to another host.")
    return {f.relative_to(path).as_posix(): f.read_bytes() for f in sorted(path.rglob("*"))
            if f.is_file() and f.name != ".lock"}


def unpack_run(files: dict[str, bytes], path: str | Path) -> Path:
    """Write a trace packed by :func:`pack_run` to ``path`` (kept when already finished).

    Written to a temporary sibling and renamed when complete, as :func:`execute_run` does,
    so an interrupted copy is never taken for a finished run.

    Raises
    ------
    ValueError
        If ``files`` holds no ``DONE`` marker or a name that leaves the directory.
    """
    out = Path(path)
    if is_finished(out):
        return out
    if "DONE" not in files or "meta.json" not in files:
        raise ValueError(f"The files for {out} are not a finished trace (no DONE or meta.json); "
                         "pack it with benchmarks.runs.pack_run after execute_run.")
    bad = [n for n in files if ".." in Path(n).parts or Path(n).is_absolute()]
    if bad:
        raise ValueError(f"File names {bad} of a packed trace leave its directory.")
    tmp = out.with_name(f".{out.name}.unpack.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    for name, data in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(data)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def run_outcome(trace: Trace) -> dict[str, Any]:
    """Did the run train healthily? The zoo's judge (``experiments.manifest.judge_outcome``).

    A re-run still fails when its family's primary symptom lies beyond the family's baseline
    runs, or when it fails the zoo's generic health check (finite loss that falls, no mostly
    dead or saturated layer).

    Returns
    -------
    dict
        ``failed`` (bool), ``outcome`` ("healthy" or a failure type) and ``reasons``.
    """
    from experiments.manifest import judge_outcome

    res = judge_outcome(trace)
    reasons = {k: v for k, v in res.items() if k != "baseline_values"}
    return {"failed": res["outcome"] != "healthy", "outcome": res["outcome"],
            "reasons": [json.dumps(reasons, default=str, sort_keys=True)]}


def truncate_trace(trace: Trace, last_step: int) -> Trace:
    """The trace as it stood after ``last_step`` (what an online detector had seen)."""
    steps = trace.steps[trace.steps["step"] <= last_step].reset_index(drop=True)
    stats = trace.stats[trace.stats["step"] <= last_step].reset_index(drop=True)
    return Trace(steps=steps, stats=stats, modules=trace.modules, meta=trace.meta)


def load(path: str | Path) -> Trace:
    """``load_trace`` (a name the tasks import)."""
    return load_trace(path)
