"""``python -m papers.build``: regenerate ``papers/report.md`` and its figures from results/.

Every number in the report is read from ``results/<suite>/metrics.json`` and the Parquet
tables beside it; the prose around the numbers that depends on them (who wins, where
NeuralDBG loses) is decided here from the same figures, never typed in by hand.

Run from the repository root (``papers`` is not an installed package).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path
from string import Template
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # run as a script or with -m from the root
    sys.path.insert(0, str(ROOT))

from benchmarks import report as R  # noqa: E402

NEURALDBG = ("heuristic", "probabilistic[family]", "probabilistic[architecture]")
HIGHER_IS_BETTER = {
    "failure_accuracy": True, "cause_ac@1": True, "cause_ac@3": True, "cause_mrr": True,
    "layer_accuracy": True, "layer_accuracy_local": True, "onset_hit": True,
    "healthy_fpr": False, "ece": False, "brier": False, "nll": False, "repair_rate": True,
    "detection_median_latency": False,
}
NAMES = {"failure_accuracy": "failure accuracy", "cause_ac@1": "root-cause AC@1",
         "cause_ac@3": "root-cause AC@3", "cause_mrr": "root-cause MRR",
         "layer_accuracy": "origin-layer accuracy",
         "layer_accuracy_local": "origin-layer accuracy on layer-local faults",
         "onset_hit": "onset hit rate",
         "healthy_fpr": "healthy false-positive rate", "ece": "ECE", "brier": "Brier score",
         "nll": "NLL", "repair_rate": "repair rate",
         "detection_median_latency": "median detection latency"}


def _v(m: dict[str, Any], key: str) -> float:
    x = (m.get(key) or {}).get("value")
    return math.nan if x is None else float(x)


def _findings(metrics: dict[str, Any]) -> list[str]:
    """Sentences decided from the numbers: best method per metric, NeuralDBG's losses."""
    methods = metrics.get("methods", {})
    out: list[str] = []
    ours = [m for m in NEURALDBG if m in methods]
    peers = [m for m in methods if m not in NEURALDBG]
    for key, higher in HIGHER_IS_BETTER.items():
        vals = {m: _v(methods[m], key) for m in methods if not math.isnan(_v(methods[m], key))}
        if not vals:
            continue
        best = (max if higher else min)(vals, key=vals.get)
        line = (f"- **{NAMES[key]}**: best `{best}` ({R.fmt(methods[best][key])})")
        losses = []
        for o in ours:
            if o not in vals:
                continue
            for p in peers:
                if p in vals and ((vals[p] > vals[o]) if higher else (vals[p] < vals[o])):
                    sep = ((methods[p][key].get("low") or -math.inf) > (
                        methods[o][key].get("high") or math.inf)) if higher else (
                        (methods[p][key].get("high") or math.inf) < (
                            methods[o][key].get("low") or -math.inf))
                    losses.append(f"`{o}` loses to `{p}` ({_fmt_pair(methods, o, p, key)}"
                                  f"{', intervals disjoint' if sep else ', intervals overlap'})")
        if losses:
            line += "; " + "; ".join(losses)
        out.append(line + ".")
    mc = metrics.get("mcnemar", {})
    for name, r in mc.items():
        verdict = ("a significant difference" if r["pvalue"] < 0.05
                   else "no significant difference")
        if r["a_only"] == r["b_only"] == 0:
            verdict = "the two are right on exactly the same runs"
        out.append(f"- McNemar, {name}: heuristic alone right on {r['a_only']} runs, "
                   f"probabilistic alone on {r['b_only']} (p = {r['pvalue']:.3g}): {verdict} "
                   f"at the 5% level.")
    for label, v in metrics.get("counterfactual_validity", {}).items():
        acc = v["accuracy"]
        out.append(f"- Counterfactuals, `{label}`: `what_if` agreed with the real re-run in "
                   f"{R.fmt(acc)} of {acc['n']} cases (Brier {R.fmt(v['brier'])}); "
                   f"{v['base_rate_failed']:.2f} of the re-runs failed, so always predicting "
                   f"the majority outcome would score "
                   f"{max(v['base_rate_failed'], 1 - v['base_rate_failed']):.2f}.")
    missing = metrics.get("notes", {}).get("methods_missing", {})
    for name, why in missing.items():
        out.append(f"- `{name}` could not run in this benchmark ({why}); it has no figures here.")
    return out


def _fmt_pair(methods: dict[str, Any], a: str, b: str, key: str) -> str:
    return f"{_v(methods[a], key):.2f} vs {_v(methods[b], key):.2f}"


def _limitations(metrics: dict[str, Any]) -> list[str]:
    s = metrics.get("suite", {})
    notes = metrics.get("notes", {})
    out = [
        "- The heuristic reasoner's rules and thresholds were written by people who knew the "
        "zoo's failure list, and the zoo was built to exercise them: the held-out splits "
        "protect the fitted probabilistic model from its training data, not the rules from "
        "their authors. Its scores are the upper end of what to expect on unseen failures.",
        f"- Small samples: {notes.get('n_score_runs')} scored runs; intervals are wide and "
        "runs of one family are correlated (the bootstrap resamples runs, not families, so the "
        "intervals are if anything too narrow).",
        "- The zoo's faults are injected and its models small (CPU, a few hundred steps); real "
        "failures are messier, and the peers' published numbers (Keras programs) are not "
        "comparable one to one.",
        "- The baselines are ports from published rule descriptions onto NeuralDBG's "
        "statistics; where the trace lacks a peer's quantity (accuracy, pre-activations) the "
        "nearest recorded one stands in, and a fixed symptom-to-cause table, not the peers, "
        "names their causes.",
        "- Repairs and counterfactuals are judged by the zoo's judge (the family's symptom "
        "against its baseline runs, then finite loss that falls by 30% and no mostly dead or "
        "saturated layer), not by task accuracy; the fix table that turns a named cause into "
        "an intervention is ours, and a repair failure can be the table's rather than the "
        "diagnosis's.",
        f"- Detection latency is measured on prefixes at onset + 0, 1, 2, 4, ... steps, so it "
        f"is exact to within a factor of two; suite `{s.get('name')}` uses capture every "
        f"{s.get('every')} step(s).",
    ]
    return out


def _suite_description(metrics: dict[str, Any]) -> str:
    s = metrics.get("suite", {})
    n = metrics.get("notes", {})
    fams = n.get("families", [])
    sev = "their default severity" if s.get("severities") == "default" else "every severity"
    return (f"Suite `{s.get('name')}`: {len(fams)} zoo families ({', '.join(fams)}) at {sev}; "
            f"scored on seeds {s.get('score_seeds')} ({n.get('n_score_runs')} runs); the "
            f"probabilistic model is fitted on seeds {s.get('fit_seeds')} "
            f"({n.get('n_fit_runs')} runs), once per held-out fold: leave-one-family-out "
            f"(`probabilistic[family]`) and leave-one-architecture-out "
            f"(`probabilistic[architecture]`), so it is never scored on a family (or "
            f"architecture) or a seed it was fitted on"
            + (f"; the per-fold fits change {dict(s.get('fit_params'))} from the shipped "
               f"defaults to keep the suite fast" if s.get("fit_params") else "")
            + f". Unfitted methods are scored on the same "
            f"runs. {n.get('n_counterfactual_reruns')} counterfactual re-runs (seeds "
            f"{s.get('counterfactual_seeds')}) and {n.get('n_repair_reruns')} repair re-runs "
            f"(seeds {s.get('repair_seeds')}). Benchmark wall time "
            f"{(n.get('total_wall_s') or n.get('wall_s') or float('nan')):.0f} s.")


def _abstract(metrics: dict[str, Any]) -> str:
    m = metrics.get("methods", {})
    parts = []
    for label in NEURALDBG:
        if label in m:
            parts.append(f"`{label}` reaches failure accuracy {R.fmt(m[label]['failure_accuracy'])}"
                         f", root-cause AC@1 {R.fmt(m[label]['cause_ac@1'])} and ECE "
                         f"{R.fmt(m[label]['ece'])}")
    peers = [k for k in m if k not in NEURALDBG]
    if peers:
        best = max(peers, key=lambda k: _v(m[k], "failure_accuracy"))
        parts.append(f"the best ported baseline (`{best}`) reaches failure accuracy "
                     f"{R.fmt(m[best]['failure_accuracy'])} and AC@1 "
                     f"{R.fmt(m[best]['cause_ac@1'])}")
    return ("On this benchmark, " + "; ".join(parts) + " (95% bootstrap intervals).") if parts \
        else ""


def build(results: Path, out: Path) -> Path:
    """Write ``out/report.md`` and ``out/figures/`` from the benchmark in ``results``."""
    mpath = results / "metrics.json"
    if not mpath.is_file():
        raise FileNotFoundError(f"{mpath} not found: run `make bench` (python -m benchmarks "
                                f"--suite default) first, or pass --results DIR.")
    metrics = json.loads(mpath.read_text())
    fig_dir = out / "figures"
    if fig_dir.exists():
        shutil.rmtree(fig_dir)
    R.make_figures(results, fig_dir)
    tables = R.load_results(results)
    import pandas as pd

    text = Template((HERE / "report_template.md").read_text()).substitute(
        results_dir=str(results.relative_to(ROOT) if results.is_relative_to(ROOT) else results),
        n_score=metrics["notes"].get("n_score_runs"),
        n_families=len(metrics["notes"].get("families", [])),
        abstract_results=_abstract(metrics),
        suite_description=_suite_description(metrics),
        tables=R.markdown_tables(metrics),
        per_family=R.per_family_table(tables.get("records", pd.DataFrame())),
        findings="\n".join(_findings(metrics)),
        limitations="\n".join(_limitations(metrics)),
    )
    path = out / "report.md"
    path.write_text(text)
    return path


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m papers.build``."""
    p = argparse.ArgumentParser(prog="python -m papers.build", description=__doc__.split("\n")[0])
    p.add_argument("--results", default=str(ROOT / "results" / "default"),
                   help="benchmark directory to read (default: %(default)s)")
    p.add_argument("--out", default=str(HERE), help="where report.md and figures/ go")
    args = p.parse_args(argv)
    path = build(Path(args.results).resolve(), Path(args.out).resolve())
    print(f"wrote {path} and {Path(args.out) / 'figures'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
