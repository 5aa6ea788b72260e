"""Command line: ``neuraldbg show|explain|what-if|graph|report|export RUN``.

Argument parsing and printing only: what is said comes from :mod:`neuraldbg.reporting`.
Every error is one line on stderr (``neuraldbg: error: ...``) and exit status 2, never a
traceback; ``--json`` output stays parseable; piping into ``head`` is quiet.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from neuraldbg.knobs import KNOBS, Knob

if TYPE_CHECKING:  # the commands import the heavy modules lazily, for a fast --help
    from neuraldbg.trace import Trace

__all__ = ["main", "build_parser"]

_DESCRIPTION = """\
Explain why a PyTorch training run recorded with NeuralDBG failed.

RUN is a trace directory written by NeuralDbg(out=...) or trace.save(...).
  show     what happened: steps, loss landmarks, first non-finite value, layers
  explain  the verdict in words, then the hypotheses (--all for every one)
  what-if  P(failure) had a knob been different (no re-training)
  graph    the causal graph as Mermaid text
  report   a self-contained HTML report (or a PNG summary with --format png)
  export   the run as TensorBoard event files (needs neuraldbg[tensorboard])
"""
#: Hypotheses ``explain`` prints without ``--all``.
SHOWN = 5


class UsageError(Exception):
    """Bad command-line input, reported as one line."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (no usage dump) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _knob_value(knob: Knob) -> Callable[[str], float]:
    """The argparse type of a numeric knob: a number its record accepts."""
    def parse(text: str) -> float:
        try:
            return float(knob.validate(float(text)))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {knob.allowed()}, got {text!r}") from None
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The ``neuraldbg`` argument parser."""
    parser = _Parser(prog="neuraldbg", description=_DESCRIPTION,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_Parser)
    p_show = sub.add_parser("show", help="what happened: steps, loss landmarks, layers",
                            description="Summarise a recorded run: status, steps, first/last "
                            "and peak loss (with its step), the first non-finite value and "
                            "where it appeared, and every layer with its module type.")
    p_exp = sub.add_parser("explain", help="the verdict in words, then the hypotheses",
                           description="Say whether the run failed, then the top hypotheses "
                           "with the layer type and the evidence in words.")
    p_exp.add_argument("--method", default="heuristic",
                       help="diagnosis method: heuristic (default), probabilistic, or any "
                       "registered name")
    p_exp.add_argument("--all", action="store_true",
                       help=f"list every hypothesis (default: the top {SHOWN})")
    p_what = sub.add_parser(
        "what-if", help="P(failure) had a knob been different",
        description="What the run would have done under changed knobs, answered from the "
        "trace by the probabilistic causal model (no re-training). Knobs are relative to the "
        "run as it happened; give at least one.")
    g = p_what.add_argument_group("knobs")
    for knob in KNOBS.values():  # one record per knob (neuraldbg.knobs)
        flag = "--" + knob.name.replace("_", "-")
        if knob.kind == "choice":
            g.add_argument(flag, dest=knob.name, choices=knob.choices,
                           help=f"{knob.description}: " + ", ".join(knob.choices))
        else:
            g.add_argument(flag, dest=knob.name, type=_knob_value(knob),
                           metavar="K" if knob.kind == "multiplier" else "C",
                           help=f"{knob.description}: {knob.allowed()}")
    sub.add_parser("graph", help="the causal graph as Mermaid text",
                   description="Print the causal graph of the heuristic diagnosis as Mermaid "
                   "flowchart text (a DAG: an arrow means 'came first and led to').")
    p_rep = sub.add_parser("report", help="write a self-contained HTML report",
                           description="Write the run report: verdict, loss curve, layer x "
                           "step heatmaps, hypotheses with evidence, both methods side by "
                           "side, a what-if table and the causal graph. The HTML file works "
                           "offline; --format png writes a one-page summary image.")
    p_rep.add_argument("-o", "--output", default=None,
                       help="file to write (default: report.html, or report.png)")
    p_rep.add_argument("--format", choices=("html", "png"), default=None,
                       help="html (default) or png; taken from the -o suffix when omitted")
    p_rep.add_argument("--no-what-if", action="store_true",
                       help="leave out the what-if table (faster)")
    p_exp_tb = sub.add_parser("export", help="export the run for TensorBoard",
                              description="Write the run as TensorBoard event files: per-step "
                              "scalars, per-layer statistics, events and hypotheses as text. "
                              "Needs the optional extra: pip install 'neuraldbg[tensorboard]'.")
    p_exp_tb.add_argument("--tensorboard", required=True, metavar="DIR",
                          help="log directory to write (open it with tensorboard --logdir DIR)")
    for p in (p_show, p_exp, p_what):
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
    for p in sub.choices.values():
        p.add_argument("run", metavar="RUN", help="trace directory (NeuralDbg(out=...) or "
                       "trace.save(...))")
    return parser


def _json(obj: Any) -> None:
    def default(v: Any) -> Any:
        if isinstance(v, float):
            return None
        if hasattr(v, "item"):
            return v.item()
        return str(v)

    print(json.dumps(_finite(obj), indent=2, default=default))


def _finite(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _cmd_show(trace: Trace, args: argparse.Namespace) -> None:
    from dataclasses import asdict

    from neuraldbg.reporting import summarize_run
    from neuraldbg.reporting.words import fmt_num, status_words

    s = summarize_run(trace)
    if args.json:
        _json(asdict(s))
        return
    nf = s.first_nonfinite
    lines = [
        f"run         {args.run}",
        f"status      {status_words(s.status)}, {s.n_steps} steps ({s.n_recorded} with layer "
        "statistics" + (f", {s.n_skipped} skipped by the optimizer" if s.n_skipped else "")
        + ")",
        f"loss        first {fmt_num(s.loss_first)}, last {fmt_num(s.loss_last)} (medians of "
        "the first and last finite values)",
        ("peak loss   " + (f"{fmt_num(s.loss_peak)} at step {s.loss_peak_step}"
                        if s.loss_peak is not None else "-")),
        ("lowest loss " + (f"{fmt_num(s.loss_min)} at step {s.loss_min_step}"
                        if s.loss_min is not None else "-")),
        ("non-finite  " + (f"first {nf.value} in the {nf.where} at step {nf.step}" if nf
                           else "none (every loss, gradient and output finite"
                           + (f"; the gradients of the {s.n_skipped} skipped steps left out"
                              if s.n_skipped else "")
                           + (f"; the infinities {', '.join(s.masking_modules)} output at every "
                              "step read as a mask" if s.masking_modules else "") + ")")),
    ]
    if s.first_nonfinite_loss and s.first_nonfinite_loss != nf:
        lines.append(f"            loss non-finite from step {s.first_nonfinite_loss.step}")
    lines.append(f"layers      {s.n_modules}, in forward order:")
    width = max((len(name) for name, _ in s.layers), default=0)
    lines += [f"  {name or '(model)':<{width}}  {kind}" for name, kind in s.layers]
    if s.config:
        lines.append("config      " + json.dumps(s.config, sort_keys=True, default=str))
    print("\n".join(lines))


def _cmd_explain(trace: Trace, args: argparse.Namespace) -> None:
    import neuraldbg as ndb
    from neuraldbg.reporting import summarize_run
    from neuraldbg.reporting.summary import module_types
    from neuraldbg.reporting.words import (
        TraceEvidence,
        cause_words,
        evidence_sentence,
        failure_words,
        verdict,
    )

    hyps = ndb.explain(trace, method=args.method)
    types = module_types(trace)
    v = verdict(hyps, types)
    if args.json:
        _json({"method": args.method, "failed": v.failed, "verdict": v.sentence,
               "hypotheses": [h.to_dict() for h in hyps]})
        return
    print(v.sentence)
    shown = hyps if args.all else hyps[:SHOWN]
    if not shown:
        return
    ev = TraceEvidence(trace, summarize_run(trace))
    print(f"\nHypotheses ({args.method}), highest confidence first:")
    for i, h in enumerate(shown, 1):
        print(f"{i}. {failure_words(h.failure_type)}: {cause_words(h.root_cause)} "
              f"[{h.root_cause}] - {ev.label(h.origin_layer)}, step {h.origin_step}, "
              f"confidence {h.confidence:.2f}")
        print(f"   {evidence_sentence(ev, h)}")
    if len(hyps) > len(shown):
        print(f"\n{len(hyps) - len(shown)} more with lower confidence (--all lists them).")


def _cmd_what_if(trace: Trace, args: argparse.Namespace) -> None:
    import neuraldbg as ndb
    from neuraldbg.reporting.words import (
        CLAIM,
        knobs_words,
        what_if_caveat,
        what_if_meaning,
        what_if_method_note,
    )

    knobs = {k: getattr(args, k) for k in KNOBS if getattr(args, k) is not None}
    if not knobs:
        raise UsageError("what-if needs at least one knob, e.g. --lr-scale 0.1 (see "
                         "'neuraldbg what-if --help' for the knobs and their values)")
    cf = ndb.what_if(trace, **knobs)
    before, after = float(cf.p_failure_factual), float(cf.p_failure)
    dist = getattr(cf, "p_failure_types", None)
    meaning = what_if_meaning(before, after, str(cf.failure_type),
                              dist if isinstance(dist, dict) else None)
    caveat = what_if_caveat(getattr(cf, "metadata", None) or {})
    default_failed = any(h.confidence >= CLAIM for h in ndb.explain(trace))
    note = what_if_method_note(before, default_failed)
    if args.json:
        _json({"knobs": knobs, "p_failure_factual": before, "p_failure": after,
               "most_likely_outcome": cf.failure_type, "p_outcomes": dist or {},
               "meaning": meaning, "caveat": caveat, "note": note})
        return
    print(f"With {knobs_words(knobs)}: P(failure) {before:.2f} as it happened -> "
          f"{after:.2f}.")
    print(meaning)
    for line in (caveat, note):
        if line:
            print(line)


def _cmd_report(trace: Trace, args: argparse.Namespace) -> None:
    from neuraldbg.reporting import write_report

    fmt = args.format
    out = args.output or f"report.{fmt or 'html'}"
    path = write_report(trace, out, format=fmt, interventions=[] if args.no_what_if else None)
    print(f"wrote {path}")


def _cmd_export(trace: Trace, args: argparse.Namespace) -> None:
    from neuraldbg.tensorboard import export_tensorboard

    path = export_tensorboard(trace, args.tensorboard)
    print(f"wrote TensorBoard events to {path} (open with: tensorboard --logdir {path})")


def _run(args: argparse.Namespace) -> None:
    import neuraldbg as ndb
    from neuraldbg.sufficiency import why_no_step

    trace = ndb.load_trace(args.run)
    if args.command == "graph":
        print(ndb.export_mermaid_causal_graph(trace), end="")
        return
    if args.command in ("explain", "graph", "report") and len(trace.steps) == 0:
        raise UsageError(f"the trace in {args.run} holds no recorded step, so there is "
                         f"nothing to {args.command} ({why_no_step(trace.meta)})")
    {"show": _cmd_show, "explain": _cmd_explain, "what-if": _cmd_what_if,
     "report": _cmd_report, "export": _cmd_export}[args.command](trace, args)


def _warning_line(message: Warning | str, category: type[Warning], filename: str,
                  lineno: int, file: Any = None, line: str | None = None) -> None:
    """A warning as one line on stderr (``neuraldbg: warning: ...``), without source lines."""
    text = " ".join(str(message).split())
    print(f"neuraldbg: warning: {text}", file=sys.stderr)


def _fail(message: str) -> int:
    text = " ".join(str(message).split())  # one line, whatever the message
    print(f"neuraldbg: error: {text}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``neuraldbg`` command; returns the exit status."""
    if hasattr(signal, "SIGPIPE") and argv is None:  # the console script: die quietly on EPIPE
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        with warnings.catch_warnings():
            warnings.showwarning = _warning_line
            _run(args)
        sys.stdout.flush()
    except UsageError as exc:
        return _fail(str(exc))
    except BrokenPipeError:
        # the reader (head, less) went away: stop quietly, as a Unix tool does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (ValueError, TypeError, KeyError, OSError, ImportError) as exc:
        return _fail(str(exc) or type(exc).__name__)
    except Exception as exc:  # noqa: BLE001 - a bug still gets one line, and the way to see it
        if os.environ.get("NEURALDBG_TRACEBACK"):
            raise
        return _fail(f"internal error ({type(exc).__name__}: {exc}); rerun with "
                     "NEURALDBG_TRACEBACK=1 to see where, and report it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
