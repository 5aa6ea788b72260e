"""Time and size of the run report on a large synthetic trace (no training).

The trace is :func:`benchmarks.reasoner_speed.synthetic_trace` (``steps x modules``, a dead
layer, an explosion and a NaN tail). Reported: wall seconds of the whole
``neuraldbg.write_report`` (both methods, the standard what-if table, every figure), the
same split into gathering (the diagnosis methods and the counterfactuals, through the public
API) and drawing (figures and HTML), the size of the HTML file, and the same for the report
without the what-if table. A measurement printed here, never asserted in a test; the target
is < 10 s and < 5 MB for 10,000 steps x 100 modules.

Usage::

    python -m benchmarks.report_speed [--steps 10000] [--modules 100] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _time_report(trace: Any, path: Path, interventions: list | None) -> dict[str, float]:
    from neuraldbg.reporting import collect
    from neuraldbg.reporting.render import render_html

    t0 = time.perf_counter()
    data = collect(trace, interventions=interventions)
    t1 = time.perf_counter()
    path.write_text(render_html(data), encoding="utf-8")
    t2 = time.perf_counter()
    return {"total_s": round(t2 - t0, 2), "gather_s": round(t1 - t0, 2),
            "draw_s": round(t2 - t1, 2), "html_mb": round(path.stat().st_size / 2**20, 3),
            "what_if_rows": len(data.what_if), "methods": sorted(data.hypotheses),
            "methods_unavailable": data.failures}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the measurement and print it as JSON."""
    import torch

    from benchmarks.reasoner_speed import synthetic_trace

    parser = argparse.ArgumentParser(prog="python -m benchmarks.report_speed",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--modules", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None,
                        help="keep the reports in this directory (default: a temporary one)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    trace = synthetic_trace(args.steps, args.modules)
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="report-speed-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    # warm-up on a small trace: imports, the probabilistic model's first load
    _time_report(synthetic_trace(200, 10), out_dir / "warmup.html", [])
    full = _time_report(trace, out_dir / "report.html", None)
    bare = _time_report(trace, out_dir / "report_no_what_if.html", [])
    result = {"steps": args.steps, "modules": args.modules, "full": full,
              "without_what_if": bare, "targets": {"seconds": 10, "megabytes": 5},
              "meets_targets": full["total_s"] < 10 and full["html_mb"] < 5,
              "reports": str(out_dir)}
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
