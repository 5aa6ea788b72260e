"""Command line of the failure zoo (argument parsing and printing only).

::

    python -m experiments list
    python -m experiments run FAMILY [--severity S] [--seed N] --out DIR [--lr-scale K ...]
    python -m experiments suite --out DIR [--seeds 3] [--workers 2] [--severity default|all]
    python -m experiments manifest [FAMILY ...] [--seeds 3] [--counterfactuals] [--json FILE]
    python -m experiments sweep FAMILY [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

__all__ = ["main"]


def _knob_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lr-scale", type=float, default=None)
    parser.add_argument("--init-scale", type=float, default=None)
    parser.add_argument("--input-scale", type=float, default=None)
    parser.add_argument("--grad-clip", type=float, default=None)
    parser.add_argument("--activation", default=None)
    parser.add_argument("--normalization", default=None)


def _knobs(args: argparse.Namespace) -> dict[str, Any]:
    names = ("lr_scale", "init_scale", "input_scale", "grad_clip", "activation", "normalization")
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_fmt(v)}" for k, v in value.items())
    return str(value)


def _cmd_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from experiments import list_families

    table = Table(title="NeuralDBG failure zoo", show_lines=False)
    for col in ("family", "kind", "architecture", "data", "failure_type", "root_cause",
                "severity (default; sweep)", "counterfactual knobs", "canonical fix"):
        table.add_column(col)
    specs = list_families()
    for spec in specs:
        sevs = ", ".join(_fmt(s) for s in spec.severities)
        table.add_row(spec.name, spec.kind, spec.architecture, spec.data, spec.failure_type,
                      " + ".join(spec.root_causes) or spec.root_cause,
                      f"{_fmt(spec.default_severity)}; {sevs}",
                      ", ".join(spec.counterfactual_knobs),
                      _fmt(spec.canonical_fix) or f"(code) {spec.code_fix}")
    console = Console(width=200)
    console.print(table)
    n_fail = sum(s.kind == "failure" for s in specs)
    console.print(f"{n_fail} failure families, {len(specs) - n_fail} healthy controls. Knobs on "
                  "every family: lr_scale, init_scale, input_scale, grad_clip, activation, "
                  "normalization.")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    import torch

    from experiments import run_scenario

    torch.set_num_threads(1)
    start, cpu = time.perf_counter(), time.process_time()
    trace = run_scenario(args.family, severity=args.severity, seed=args.seed, out=args.out,
                         every=args.every, **_knobs(args))
    gt = trace.ground_truth or {}
    print(f"{args.family}: {trace.n_steps} steps in {time.perf_counter() - start:.2f}s "
          f"({time.process_time() - cpu:.2f}s CPU) -> {args.out}")
    print(f"  ground truth: failure_type={gt.get('failure_type')} root_cause="
          f"{gt.get('root_cause')} origin_layers={gt.get('origin_layers')} "
          f"onset_step={gt.get('onset_step')}")
    return 0


def _cmd_suite(args: argparse.Namespace) -> int:
    from experiments.suite import run_suite

    families = args.families.split(",") if args.families else None
    severity: str | float = args.severity
    if severity not in ("default", "all"):
        severity = float(severity)
    start = time.perf_counter()
    dirs = run_suite(args.out, seeds=args.seeds, workers=args.workers, families=families,
                     severity=severity, baselines=not args.no_baselines, every=args.every,
                     progress=not args.no_progress, manifest=not args.no_manifest)
    summary = json.loads((__import__("pathlib").Path(args.out) / "summary.json").read_text())
    print(f"{len(dirs)} traces in {args.out} ({summary['runs_made']} made, "
          f"{summary['runs_resumed']} resumed) in {time.perf_counter() - start:.1f}s")
    for res in summary.get("manifestation", []):
        status = "kept" if res.get("kept") else "NOT KEPT"
        print(f"  {res['family']:<30} severity {_fmt(res['severity']):<8} {status}")
    if summary["errors"]:
        print(f"{len(summary['errors'])} run(s) failed: {summary['errors'][:3]}")
        return 1
    return 0


def _print_check(res: dict[str, Any]) -> str:
    if res["kind"] == "healthy":
        return "healthy" if res["healthy"] else "UNHEALTHY " + str(
            [h["reasons"] for h in res["health"]])
    t = res["tests"][0]
    status = "manifest" if res["manifest"] else "NOT manifest"
    effect = "non-finite" if t["effect"] >= 1e5 else _fmt(t["effect"])
    return (f"{status}: {t['statistic']} p={t['p_mannwhitney']:.3f} effect={effect} "
            f"(margin {_fmt(t['margin'])}); baseline healthy={res['baseline']['healthy']}; "
            f"onsets {res['onset_steps']} (empirical {res['empirical_onsets']})")


def _cmd_manifest(args: argparse.Namespace) -> int:
    import torch

    from experiments import list_families
    from experiments.manifest import check_counterfactuals, check_family

    torch.set_num_threads(1)
    names = args.families or [s.name for s in list_families()]
    seeds = list(range(args.seeds))
    out: list[dict[str, Any]] = []
    ok = True
    for name in names:
        start = time.perf_counter()
        res = check_family(name, seeds=seeds)
        res["seconds"] = time.perf_counter() - start
        good = res["healthy"] if res["kind"] == "healthy" else res["manifest"]
        ok &= bool(good)
        print(f"{name:<30} {_print_check(res)} [{res['seconds']:.1f}s]", flush=True)
        if args.counterfactuals:
            res["counterfactual_checks"] = check_counterfactuals(name, seeds=seeds)
            for cf in res["counterfactual_checks"]:
                ok &= cf["agrees"]
                mark = "ok" if cf["agrees"] else "MISMATCH"
                print(f"    {_fmt(cf['knobs']):<40} expected {cf['expected']:<22} got "
                      f"{cf['outcomes']} {mark}", flush=True)
        out.append(res)
    if args.json:
        from experiments.suite import _clean

        with open(args.json, "w") as fh:
            json.dump(_clean(out), fh, indent=2, default=str)
    return 0 if ok else 1


def _cmd_sweep(args: argparse.Namespace) -> int:
    import torch

    from experiments.manifest import sweep_family

    torch.set_num_threads(1)
    results = sweep_family(args.family, seeds=list(range(args.seeds)))
    first = None
    for res in results:
        print(f"severity {_fmt(res['severity']):<8} {_print_check(res)}", flush=True)
        if res["manifest"] and first is None:
            first = res["severity"]
    print(f"{args.family}: the failure first manifests at severity "
          f"{_fmt(first) if first is not None else 'none of the swept severities'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m experiments``."""
    parser = argparse.ArgumentParser(prog="python -m experiments",
                                     description="NeuralDBG failure zoo")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="show the families with architectures and knobs")

    p = sub.add_parser("run", help="train one scenario and save its trace")
    p.add_argument("family")
    p.add_argument("--severity", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--every", type=int, default=1)
    _knob_args(p)

    p = sub.add_parser("suite", help="run every family in parallel workers (resumable)")
    p.add_argument("--out", required=True)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--families", default=None, help="comma-separated names (default: all)")
    p.add_argument("--severity", default="default", help="default, all, or a number")
    p.add_argument("--every", type=int, default=1)
    p.add_argument("--no-baselines", action="store_true")
    p.add_argument("--no-manifest", action="store_true")
    p.add_argument("--no-progress", action="store_true")

    p = sub.add_parser("manifest", help="manifestation check over families")
    p.add_argument("families", nargs="*")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--counterfactuals", action="store_true",
                   help="also re-run every declared fix and counterfactual")
    p.add_argument("--json", default=None, help="write the evidence to this file")

    p = sub.add_parser("sweep", help="manifestation check at every severity of a family")
    p.add_argument("family")
    p.add_argument("--seeds", type=int, default=3)

    args = parser.parse_args(argv)
    handler = {"list": _cmd_list, "run": _cmd_run, "suite": _cmd_suite,
               "manifest": _cmd_manifest, "sweep": _cmd_sweep}[args.command]
    try:
        return handler(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
