"""Command line: ``neuraldbg show|explain|graph|what-if TRACE_DIR``. Argument parsing only."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

import neuraldbg as ndb

__all__ = ["main"]

_KNOBS = {"lr_scale": float, "init_scale": float, "input_scale": float, "grad_clip": float,
          "activation": str, "normalization": str}


def _show(trace: ndb.Trace, console: Console) -> None:
    steps = trace.steps
    loss = steps["loss"]
    finite = loss[loss.map(lambda v: math.isfinite(v))]
    table = Table(title=f"trace: {trace.meta.get('model_class', '?')}", show_header=False)
    table.add_row("status", str(trace.meta.get("status")))
    table.add_row("steps", str(len(steps)))
    table.add_row("recorded steps", str(int(steps["recorded"].sum()) if len(steps) else 0))
    table.add_row("modules", str(len(trace.modules)))
    if len(finite):
        table.add_row("loss first / last finite", f"{finite.iloc[0]:.4g} / {finite.iloc[-1]:.4g}")
    bad = steps.loc[~loss.map(lambda v: math.isfinite(v)), "step"]
    table.add_row("first non-finite loss", str(int(bad.iloc[0])) if len(bad) else "none")
    table.add_row("config", json.dumps(trace.meta.get("config", {}), sort_keys=True))
    console.print(table)


def _explain(trace: ndb.Trace, method: str, as_json: bool, console: Console) -> None:
    hyps = ndb.explain(trace, method=method)
    if as_json:
        print(json.dumps([h.to_dict() for h in hyps], indent=2, default=str))
        return
    if not hyps or max(h.confidence for h in hyps) < 0.5:
        console.print("[green]No failure found with confidence >= 0.5: the run looks healthy.")
    table = Table(title=f"hypotheses ({method})")
    for col in ("#", "failure", "root cause", "origin layer", "step", "confidence"):
        table.add_column(col)
    for i, h in enumerate(hyps, 1):
        table.add_row(str(i), h.failure_type, h.root_cause, h.origin_layer or "-",
                      str(h.origin_step), f"{h.confidence:.2f}")
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``neuraldbg`` command."""
    parser = argparse.ArgumentParser(prog="neuraldbg", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_show = sub.add_parser("show", help="summarise a recorded trace")
    p_explain = sub.add_parser("explain", help="explain the failure of a recorded run")
    p_explain.add_argument("--method", default="heuristic",
                           help="registered method: heuristic, probabilistic, ...")
    p_explain.add_argument("--json", action="store_true", help="print hypotheses as JSON")
    p_graph = sub.add_parser("graph", help="print the causal graph as Mermaid text")
    p_what = sub.add_parser("what-if", help="counterfactual: P(failure) under a changed knob")
    for knob, typ in _KNOBS.items():
        p_what.add_argument(f"--{knob.replace('_', '-')}", dest=knob, type=typ)
    for p in (p_show, p_explain, p_graph, p_what):
        p.add_argument("trace", help="trace directory (NeuralDbg(out=...) or trace.save)")
    args = parser.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 120)
    try:
        trace = ndb.load_trace(args.trace)
        if args.command == "show":
            _show(trace, console)
        elif args.command == "explain":
            _explain(trace, args.method, args.json, console)
        elif args.command == "graph":
            print(ndb.export_mermaid_causal_graph(trace))
        else:
            knobs = {k: getattr(args, k) for k in _KNOBS if getattr(args, k) is not None}
            if not knobs:
                parser.error("what-if needs at least one knob, e.g. --lr-scale 0.1")
            cf = ndb.what_if(trace, **knobs)
            console.print(f"P(failure) as it happened: {cf.p_failure_factual:.3f}\n"
                          f"P(failure) under {knobs}: {cf.p_failure:.3f}\n"
                          f"most likely outcome: {cf.failure_type}")
    except ndb.NeuralDbgError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
