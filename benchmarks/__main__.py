"""``python -m benchmarks``: run a suite, print the comparison, write metrics and report.

Examples
--------
python -m benchmarks --suite tiny
python -m benchmarks --suite default --workers 2 --out results/
python -m benchmarks --suite full --backend ray
python -m benchmarks --suite default --report-only     # tables and figures from results/
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    from benchmarks.executor import BACKENDS
    from benchmarks.suites import SUITES

    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    p.add_argument("--suite", default="default", choices=sorted(SUITES),
                   help="which runs to make and score (default: %(default)s)")
    p.add_argument("--backend", default="local", choices=BACKENDS,
                   help="local worker processes, or Ray (optional extra) (default: %(default)s)")
    p.add_argument("--workers", type=int, default=None,
                   help="parallel workers (default: one per CPU core); the numbers do not "
                        "depend on it")
    p.add_argument("--address", default=None,
                   help="with --backend ray: address of a running Ray cluster ('auto', "
                        "'ray://head:10001'); default: start a local Ray instance")
    p.add_argument("--out", default="results", help="results root (default: %(default)s)")
    p.add_argument("--methods", default=None,
                   help="comma-separated method names (default: every available method)")
    p.add_argument("--report-only", action="store_true",
                   help="rebuild metrics, tables and figures from an earlier run's Parquet")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _cpu_seconds() -> float:
    """CPU seconds of this process and its finished worker processes (user + system)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks``."""
    args = _parser().parse_args(argv)  # the CPU code paths are pinned (benchmarks/__init__)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from rich.console import Console

    from benchmarks import harness, report
    from benchmarks.executor import make_executor
    from benchmarks.suites import get_suite

    console = Console()
    if not console.is_terminal:  # a log file or CI: wide enough for the tables
        console = Console(width=220)
    suite = get_suite(args.suite)
    out = Path(args.out) / suite.name
    t0 = time.perf_counter()
    workers = None
    if args.address is not None and args.backend != "ray":
        raise SystemExit(f"--address {args.address!r} needs --backend ray (the local backend "
                         "runs on this machine only).")
    if args.report_only:
        result = harness.load_result(suite, out)
    else:
        methods = [m.strip() for m in args.methods.split(",")] if args.methods else None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with make_executor(args.backend, args.workers, address=args.address,
                               progress=not args.no_progress) as ex:
                workers = ex.workers
                console.print(f"[bold]suite {suite.name}[/]: backend {args.backend}, "
                              f"{ex.workers} workers, results in {out}")
                result = harness.run_benchmark(suite, out, executor=ex, run_dir=Path(args.out)
                                               / "runs", methods=methods)
        for w in caught:
            console.print(f"[yellow]warning:[/] {w.message}")
    metrics = harness.compute_metrics(result)
    report.print_table(metrics, console)
    path = report.write_benchmark_report(metrics, out)
    if not args.report_only:  # the wall and CPU time of the whole command, runs to report
        result.notes.update(total_wall_s=time.perf_counter() - t0, workers=workers,
                            backend=args.backend, cpu_s=_cpu_seconds())
        (out / "notes.json").write_text(json.dumps(result.notes, default=str))
    metrics["timings"].update({k: result.notes[k] for k in ("total_wall_s", "workers",
                                                            "backend", "cpu_s")
                               if k in result.notes})
    report.write_metrics(metrics, out)
    errors = int((result.records["error"] != "").sum()) if "error" in result.records else 0
    console.print(f"metrics: {out / 'metrics.json'}; report: {path}; "
                  f"{errors} diagnosis errors; {time.perf_counter() - t0:.0f} s")
    if errors:
        bad = result.records[result.records["error"] != ""]
        console.print(json.dumps(bad.groupby("label")["error"].first().to_dict(), indent=1)[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
