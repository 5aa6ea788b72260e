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
from dataclasses import dataclass
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
    "detection_median_latency": False, "confident_wrong": False,
}
NAMES = {"failure_accuracy": "failure accuracy", "cause_ac@1": "root-cause AC@1",
         "cause_ac@3": "root-cause AC@3", "cause_mrr": "root-cause MRR",
         "layer_accuracy": "origin-layer accuracy",
         "layer_accuracy_local": "origin-layer accuracy on layer-local faults",
         "onset_hit": "onset hit rate",
         "healthy_fpr": "healthy false-positive rate", "ece": "ECE", "brier": "Brier score",
         "nll": "NLL", "repair_rate": "repair rate",
         "detection_median_latency": "median detection latency",
         "confident_wrong": "confident-wrong rate"}


def _v(m: dict[str, Any], key: str) -> float:
    x = (m.get(key) or {}).get("value")
    return math.nan if x is None else float(x)


def _better(higher: bool, a: float, b: float) -> bool:
    return a > b if higher else a < b


def _disjoint(higher: bool, winner: dict[str, Any], loser: dict[str, Any]) -> bool:
    """The winner's interval lies wholly on its better side of the loser's."""
    if higher:
        return (winner.get("low") or -math.inf) > (loser.get("high") or math.inf)
    return (winner.get("high") or math.inf) < (loser.get("low") or -math.inf)


@dataclass(frozen=True, slots=True)
class FindingsConfig:
    """Where the written findings draw their lines.

    Attributes
    ----------
    flat_distinct : int, default=2
        A method whose top-1 confidences take at most this many distinct values is called
        flat: its ECE says little (a constant answer can be calibrated and useless).
    significance : float, default=0.05
        McNemar p-value below which a difference between two methods is called significant.
    noise_delta : float, default=0.005
        An ablation's change of a metric is called worse only beyond this (below it the two
        print the same at two decimals).
    """

    flat_distinct: int = 2
    significance: float = 0.05
    noise_delta: float = 0.005


#: The lines :func:`_findings` draws.
FINDINGS = FindingsConfig()


@dataclass(frozen=True, slots=True)
class _Pairings:
    """NeuralDBG methods against the ported peers, metric by metric.

    Attributes
    ----------
    wins, losses : list of (metric, ours, peer)
        Pairings where NeuralDBG's point estimate is better / worse.
    sep_wins, sep_losses : list of (metric, ours, peer)
        Those whose 95% intervals are disjoint.
    """

    wins: list[tuple[str, str, str]]
    losses: list[tuple[str, str, str]]
    sep_wins: list[tuple[str, str, str]]
    sep_losses: list[tuple[str, str, str]]


def _pairings(methods: dict[str, Any], ours: list[str], peers: list[str]) -> _Pairings:
    """Every (metric, ours, peer) with both values known and different, won or lost."""
    res = _Pairings([], [], [], [])
    for key, higher in HIGHER_IS_BETTER.items():
        for o in ours:
            for p in peers:
                vo, vp = _v(methods[o], key), _v(methods[p], key)
                if math.isnan(vo) or math.isnan(vp) or vo == vp:
                    continue
                if _better(higher, vo, vp):
                    res.wins.append((key, o, p))
                    if _disjoint(higher, methods[o][key], methods[p][key]):
                        res.sep_wins.append((key, o, p))
                else:
                    res.losses.append((key, o, p))
                    if _disjoint(higher, methods[p][key], methods[o][key]):
                        res.sep_losses.append((key, o, p))
    return res


def _peers_finding(methods: dict[str, Any], ours: list[str], peers: list[str]) -> str | None:
    """How NeuralDBG fares against the ported peers, and against the best on each loss."""
    pr = _pairings(methods, ours, peers)
    if not (pr.wins or pr.losses):
        return None
    text = (f"- **Against the ported peers.** Over {len(HIGHER_IS_BETTER)} metrics, "
            f"{len(ours)} NeuralDBG methods and {len(peers)} baselines, NeuralDBG scores "
            f"better in {len(pr.wins)} of {len(pr.wins) + len(pr.losses)} pairings; in "
            f"{len(pr.sep_wins)} of them the 95% intervals are disjoint.")
    if not pr.losses:
        return text
    worst: dict[tuple[str, str], str] = {}  # (metric, ours) -> the best peer above it
    for key, o, p in pr.losses:
        best = worst.get((key, o))
        if best is None or _better(HIGHER_IS_BETTER[key], _v(methods[p], key),
                                   _v(methods[best], key)):
            worst[(key, o)] = p
    text += (f" It scores worse in {len(pr.losses)} pairings; against the best peer on "
             "each such metric: " + _losses_by_metric(methods, worst))
    named = ", ".join(f"{NAMES[k]}: `{o}` vs `{p}`" for k, o, p in pr.sep_losses)
    return (text + f". Of these, {len(pr.sep_losses)} have disjoint intervals"
            + (f" ({named})" if pr.sep_losses else "")
            + "; the rest are within the noise of this sample.")


def _confident_wrong_finding(methods: dict[str, Any]) -> str | None:
    """The lowest and highest confident-wrong rates."""
    cw = {m: methods[m].get("confident_wrong") for m in methods
          if methods[m].get("confident_wrong")}
    if not cw:
        return None

    def rate(m: str, missing: float) -> float:
        return missing if cw[m]["value"] is None else cw[m]["value"]

    best = min(cw, key=lambda m: rate(m, math.inf))
    worst = max(cw, key=lambda m: rate(m, -math.inf))
    return (f"- **Confident and wrong.** The cost of trusting a tool is a confident "
            f"wrong cause: `{best}` names a specific wrong cause at confidence >= 0.5 on "
            f"{R.fmt(cw[best])} of failing runs, `{worst}` on {R.fmt(cw[worst])}. Rule "
            f"baselines answer at confidence 1, so every wrong cause they name counts.")


def _sharpness_finding(methods: dict[str, Any]) -> str | None:
    """Distinct top-1 confidence values per method; the flat ones named."""
    sharp = {m: methods[m].get("sharpness_distinct", {}).get("value") for m in methods}
    if not sharp:
        return None
    flat = [m for m, v in sharp.items() if v is not None and v <= FINDINGS.flat_distinct]
    return ("- **Sharpness beside calibration.** Distinct top-1 confidence values: "
            + ", ".join(f"`{m}` {int(v)}" for m, v in sharp.items() if v is not None)
            + (f". {', '.join(f'`{m}`' for m in flat)} give at most "
               f"{_COUNT_WORDS.get(FINDINGS.flat_distinct, FINDINGS.flat_distinct)} values, "
               "so their ECE says little: a constant answer can be calibrated and useless."
               if flat else "."))


#: Numbers the prose spells out.
_COUNT_WORDS = {1: "one", 2: "two", 3: "three"}


def _mcnemar_finding(metrics: dict[str, Any]) -> str | None:
    """The exact McNemar tests between the heuristic and the probabilistic model."""
    mc = metrics.get("mcnemar", {})
    if not mc:
        return None
    parts = []
    for name, r in mc.items():
        verdict = "significant" if r["pvalue"] < FINDINGS.significance else "not significant"
        if r["a_only"] == r["b_only"] == 0:
            verdict = "right on the same runs"
        pair, metric = name.split(": ", 1)
        parts.append(f"{NAMES.get(metric, metric)}, `{pair.split(' vs ')[1]}`: "
                     f"{r['a_only']} runs only the heuristic gets right, {r['b_only']} only "
                     f"the probabilistic model (p = {r['pvalue']:.3g}, {verdict})")
    return ("- **Heuristic vs probabilistic, run by run (McNemar, exact).** "
            + "; ".join(parts) + ".")


def _counterfactual_finding(metrics: dict[str, Any]) -> str | None:
    """``what_if``'s balanced accuracy against the re-runs, beside the baselines'."""
    cfv = metrics.get("counterfactual_validity", {})
    ours_cf = {k: v for k, v in cfv.items() if k.startswith("probabilistic")}
    base_cf = {k: v for k, v in cfv.items() if not k.startswith("probabilistic")}
    if not ours_cf:
        return None
    text = ("- **Counterfactuals.** Balanced accuracy of `what_if` against real re-runs: "
            + "; ".join(f"`{k}` {R.fmt(v['balanced_accuracy'])} (fixes "
                        f"{R.fmt(v['accuracy_fixed'])}, still-fails "
                        f"{R.fmt(v['accuracy_still_fails'])})" for k, v in ours_cf.items()))
    if base_cf:
        text += ("; the baselines score " + ", ".join(
            f"`{k}` {R.fmt(v['balanced_accuracy'])}" for k, v in base_cf.items()))
        best_base = max(_v(v, "balanced_accuracy") for v in base_cf.values())
        beat = [k for k, v in ours_cf.items() if _v(v, "balanced_accuracy") > best_base]
        text += (". " + (f"{', '.join(f'`{k}`' for k in beat)} beat the best baseline "
                         "on the point estimate" if beat else
                         "No `what_if` split beats the best baseline")
                 + " (intervals resample families)")
    return text + "."


def _findings(metrics: dict[str, Any]) -> list[str]:
    """Findings decided from the numbers: one paragraph per question, not one line per pair."""
    methods = metrics.get("methods", {})
    ours = [m for m in NEURALDBG if m in methods]
    peers = [m for m in methods if m not in NEURALDBG and not m.startswith("probabilistic")]
    found = [_peers_finding(methods, ours, peers), _confident_wrong_finding(methods),
             _sharpness_finding(methods), _mcnemar_finding(metrics),
             _counterfactual_finding(metrics), _ablation_finding(metrics)]
    out = [f for f in found if f]
    missing = metrics.get("notes", {}).get("methods_missing", {})
    for name, why in missing.items():
        out.append(f"- `{name}` could not run in this benchmark ({why}); it has no figures here.")
    return out


#: The four ablations issue 15 asks for, by the row suffix ``probabilistic[family/<name>]``
#: that ``benchmarks.suites`` gives them (those not in a run are named as missing).
ABLATION_NAMES = {"no-rule-sensor": "without the heuristic's verdict as a sensor",
                  "run-level": "without the time slices (run level only)",
                  "priors-only": "its rule priors alone, no fitting",
                  "randomised": "fitted on the randomised-knob corpus instead of the zoo's "
                                "observational runs"}


def _ablations(metrics: dict[str, Any]) -> dict[str, str]:
    """Ablation row label -> its name, for the rows this run has."""
    return {m: m[len("probabilistic[family/"):-1] for m in metrics.get("methods", {})
            if m.startswith("probabilistic[family/")}


#: What an ablation run must share with the main run for its rows to join the main tables.
SAME_RUNS_SUITE: tuple[str, ...] = ("families", "n_failure", "n_healthy", "severities",
                                    "score_seeds", "fit_seeds", "fit_corpus", "fit_params",
                                    "every", "n_resamples")
SAME_RUNS_NOTES: tuple[str, ...] = ("zoo_fingerprint", "families", "n_score_runs")


#: The committed copy of the ablation run's ``metrics.json``: a fresh clone's ``make bench``
#: joins its rows as the committed report does (``--suite ablation`` takes ~11 min more, too
#: long for the 10-minute bench). Refresh it after the ablation suite: copy
#: ``results/ablation/metrics.json`` here. Rows join only if it scored the same runs.
COMMITTED_ABLATION = Path(__file__).resolve().parent / "data" / "ablation"


def ablation_dir(results: Path) -> Path:
    """The ablation run beside ``results`` if there is one, else :data:`COMMITTED_ABLATION`."""
    local = results.parent / "ablation"
    return local if (local / "metrics.json").is_file() else COMMITTED_ABLATION


def with_ablation_rows(metrics: dict[str, Any], ablation: Path) -> dict[str, Any]:
    """``metrics`` with the ablation rows of the run in ``ablation`` added, if it fits.

    ``python -m benchmarks --suite ablation`` scores the default suite's runs with the same
    folds and seeds plus the ablation rows (kept out of ``make bench`` for its time). Its
    ``probabilistic[family/<name>]`` rows (methods and counterfactual validity) join the
    main tables when both runs scored the same runs: same zoo fingerprint, families, seeds
    and fitting settings. Otherwise ``metrics`` is returned unchanged, with the reason in
    ``metrics["ablation_source"]``.
    """
    path = ablation / "metrics.json"
    if not path.is_file() or _ablations(metrics):
        return metrics
    other = json.loads(path.read_text())
    differ = [f"suite.{k}" for k in SAME_RUNS_SUITE
              if metrics["suite"].get(k) != other["suite"].get(k)]
    differ += [f"notes.{k}" for k in SAME_RUNS_NOTES
               if metrics["notes"].get(k) != other["notes"].get(k)]
    if differ:
        return {**metrics, "ablation_source": {"path": str(path), "differs": differ}}
    rows = {k: v for k, v in other["methods"].items() if k.startswith("probabilistic[family/")}
    cfv = {k: v for k, v in other.get("counterfactual_validity", {}).items()
           if k.startswith("probabilistic[family/")}
    return {**metrics, "methods": {**metrics["methods"], **rows},
            "counterfactual_validity": {**metrics.get("counterfactual_validity", {}), **cfv},
            "ablation_source": {"path": str(path), "differs": []}}


def _ablation_threat(metrics: dict[str, Any]) -> str:
    rows = _ablations(metrics)
    source = metrics.get("ablation_source")
    if not rows and source:
        return (f"The ablation run in `{Path(source['path']).parent.name}` scored other runs "
                f"than this one ({', '.join(source['differs'])} differ), so its rows are left "
                "out and this report does not separate what each part of the probabilistic "
                "model adds; re-run `python -m benchmarks --suite ablation` at this commit.")
    if not rows:
        return ("This run has no ablation rows (`python -m benchmarks --suite ablation` adds "
                "them), so it does not separate what each part of the probabilistic model "
                "adds.")
    missing = [d for k, d in ABLATION_NAMES.items() if k not in rows.values()]
    via = (" (from `python -m benchmarks --suite ablation`, the same runs and seeds)"
           if metrics.get("ablation_source") else "")
    return ("The ablation rows score the same leave-one-family-out folds with one part of the "
            f"probabilistic model removed or, for the randomised row, fitted on other data{via} "
            "(section 4)"
            + (f"; not in this run: {'; '.join(missing)}." if missing else "."))


def _ablation_finding(metrics: dict[str, Any]) -> str | None:
    """What removing each part of the probabilistic model changes, from the ablation rows."""
    methods, rows = metrics.get("methods", {}), _ablations(metrics)
    full = methods.get("probabilistic[family]")
    if not rows or not full:
        return None
    parts = []
    for label, name in rows.items():
        m = methods[label]
        deltas = []
        for key in ("failure_accuracy", "cause_ac@1", "ece"):
            d = _v(m, key) - _v(full, key)
            if not math.isnan(d):
                worse = d < 0 if HIGHER_IS_BETTER[key] else d > 0
                deltas.append(f"{NAMES[key]} {R.fmt(m[key])} ({d:+.2f}"
                              f"{', worse' if worse and abs(d) >= FINDINGS.noise_delta else ''})")
        parts.append(f"{ABLATION_NAMES.get(name, name)} (`{label}`): " + ", ".join(deltas))
    return ("- **What each part of the probabilistic model adds (ablations, same folds as "
            "`probabilistic[family]`).** " + "; ".join(parts) + ". A part whose removal "
            "changes nothing beyond the intervals is not yet earning its place on this "
            "sample.")


def _losses_by_metric(methods: dict[str, Any], worst: dict[tuple[str, str], str]) -> str:
    """``metric: `a`, `b` 0.71 vs 0.89 `peer``` once per metric, NeuralDBG methods that share
    a value and a best peer named together."""
    groups: dict[tuple[str, str, float], list[str]] = {}
    for (key, ours), peer in worst.items():
        groups.setdefault((key, peer, round(_v(methods[ours], key), 2)), []).append(ours)
    by_metric: dict[str, list[str]] = {}
    for (key, peer, _), ours in groups.items():
        by_metric.setdefault(key, []).append(
            f"{', '.join(f'`{o}`' for o in ours)} {_fmt_pair(methods, ours[0], peer, key)} "
            f"`{peer}`")
    return "; ".join(f"{NAMES[k]}, " + " and ".join(v) for k, v in by_metric.items())


def _fmt_pair(methods: dict[str, Any], a: str, b: str, key: str) -> str:
    return f"{_v(methods[a], key):.2f} vs {_v(methods[b], key):.2f}"


def _limitations(metrics: dict[str, Any]) -> list[str]:
    s = metrics.get("suite", {})
    notes = metrics.get("notes", {})
    out = [
        f"- Small samples: {notes.get('n_score_runs')} scored runs over "
        f"{len(notes.get('families', []))} families; intervals are wide. Proportions carry "
        "exact intervals that treat runs as independent, though runs of one family are "
        "correlated; the other figures resample whole families.",
        *([f"- Left out of scoring: {', '.join(notes['unshown_score_runs'])}, whose declared "
           "fault did not show (the zoo's health judgement found a finite loss that fell and "
           "no mostly dead or saturated layer), as the fit leaves such runs out."]
          if notes.get("unshown_score_runs") else []),
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


# ------------------------------------------------------------------ knob effects (DoWhy)
#: The command that writes the knob-effect results the report's DoWhy table reads.
KNOB_EFFECTS_COMMAND = "python -m benchmarks.knob_effects"


@dataclass(frozen=True)
class RefuterTolerance:
    """When a DoWhy refuter counts as passed (absolute differences in failure probability).

    Attributes
    ----------
    placebo : float
        A permuted (placebo) treatment must have an effect within this of zero.
    stability : float
        The random-common-cause and data-subset refuters must move the estimate by at most
        this.
    """

    placebo: float = 0.05
    stability: float = 0.05


def _newcombe(p1: float, ci1: list[float], p0: float, ci0: list[float]) -> list[float]:
    """Newcombe's hybrid score interval of ``p1 - p0`` from the arms' Wilson intervals."""
    d = p1 - p0
    return [d - math.hypot(p1 - ci1[0], ci0[1] - p0), d + math.hypot(ci1[1] - p1, p0 - ci0[0])]


def _num(x: Any) -> float:
    """A number of the results file: a float, or a dict's ``estimate``/``value``."""
    if isinstance(x, dict):
        x = x.get("estimate", x.get("value"))
    return math.nan if x is None else float(x)


def _interval(x: Any) -> list[float] | None:
    """The interval of a results-file entry (``interval``, ``ci`` or ``low``/``high``)."""
    if not isinstance(x, dict):
        return None
    for key in ("interval", "ci"):
        if isinstance(x.get(key), (list, tuple)) and len(x[key]) == 2:
            return [float(v) for v in x[key]]
    if x.get("low") is not None and x.get("high") is not None:
        return [float(x["low"]), float(x["high"])]
    return None


def _pm(v: float, ci: list[float] | None = None) -> str:
    text = "-" if math.isnan(v) else f"{v:+.2f}"
    return text + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci and not math.isnan(v) else "")


def _refuters(d: dict[str, Any], tol: RefuterTolerance) -> tuple[str, int]:
    """The three refuters' new effects and how many passed."""
    est = _num(d.get("estimate"))
    checks = [("placebo", lambda v: abs(v) <= tol.placebo),
              ("random_common_cause", lambda v: abs(v - est) <= tol.stability),
              ("data_subset", lambda v: abs(v - est) <= tol.stability)]
    cells, passed = [], 0
    for key, ok in checks:
        v = _num(d.get(key))
        good = not math.isnan(v) and ok(v)
        passed += good
        cells.append(f"{_pm(v)} {'pass' if good else 'FAIL'}" if not math.isnan(v) else "-")
    return " / ".join(cells), passed


def _effect_rows(effects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per treatment: the randomised (re-run) difference with its interval, and the others."""
    rows = []
    for e in effects:
        (p1, ci1), (p0, ci0) = e["p_fail_treated"], e["p_fail_control"]
        rand = _num(e.get("randomised"))
        net = e.get("network_do", e.get("network"))
        rows.append({"e": e, "rand": rand, "rand_ci": _newcombe(p1, ci1, p0, ci0),
                     "dowhy": _num(e["dowhy"].get("estimate")),
                     "naive": _num(e["confounded"].get("naive")),
                     "adjusted": _num(e["confounded"].get("adjusted")),
                     "net": _num(net), "net_ci": _interval(net)})
    return rows


def knob_effects_section(path: Path, tol: RefuterTolerance = RefuterTolerance()) -> str:
    """The DoWhy effect table and its finding, from ``benchmarks.knob_effects``'s JSON; when
    the file is absent, the command that writes it."""
    if not path.is_file():
        return (f"*No knob-effect results: `{KNOB_EFFECTS_COMMAND}` writes "
                f"`results/knob_effects.json` (randomised re-runs of the zoo's healthy recipes, "
                f"then DoWhy and the network's do()); `make paper` then adds the table here.*")
    data = json.loads(path.read_text())
    rows = _effect_rows(data.get("effects", []))
    lines = [
        f"{data.get('runs')} runs of the zoo's healthy MLP, CNN and ResNet recipes with every "
        f"knob drawn at random and independently (overall failure rate "
        f"{_num(data.get('failure_rate')):.2f}), each judged by the zoo's judge. Because the "
        "knobs were randomised, the difference in failure rates between a treatment's arms is "
        "the effect that re-running would show (Newcombe interval from the arms' Wilson "
        "intervals). DoWhy identifies the same effect by the back-door criterion (the other "
        "knobs and the recipe as common causes) and estimates it by linear regression; its "
        f"refuters pass when a placebo treatment's effect is within {tol.placebo} of zero and "
        f"a random common cause or a random half of the data moves the estimate by at most "
        f"{tol.stability}. The confounded columns use an observational subset where treated "
        "runs were kept mostly where failure is likelier anyway. The network column is the "
        "shipped causal network's P(failure | do(treated)) - P(failure | do(control)) "
        "averaged over the corpus's runs (each run's architecture and other knobs kept, no "
        "bug in the training code: the adjustment formula with the network as the outcome "
        "model).", "",
        "| treatment | runs treated / control | P(fail) treated | P(fail) control "
        "| randomised (re-run) effect | DoWhy | refuters: placebo / random common cause / "
        "subset | observational naive | observational adjusted | network do() |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        e = r["e"]
        refute, _ = _refuters(e["dowhy"], tol)
        (p1, ci1), (p0, ci0) = e["p_fail_treated"], e["p_fail_control"]
        lines.append(
            f"| {e['treatment']} | {e['n_treated']} / {e['n_control']} | "
            f"{p1:.2f} [{ci1[0]:.2f}, {ci1[1]:.2f}] | {p0:.2f} [{ci0[0]:.2f}, {ci0[1]:.2f}] | "
            f"{_pm(r['rand'], r['rand_ci'])} | {_pm(r['dowhy'])} | {refute} | "
            f"{_pm(r['naive'])} (n={e['confounded'].get('n')}) | {_pm(r['adjusted'])} | "
            f"{_pm(r['net'], r['net_ci'])} |")
    return "\n".join(lines + ["", _knob_effects_finding(rows, tol)])


def _inside(v: float, ci: list[float]) -> bool:
    return ci[0] <= v <= ci[1]


def _knob_effects_finding(rows: list[dict[str, Any]], tol: RefuterTolerance) -> str:
    """What the effect table shows, decided from its numbers."""
    n = len(rows)
    if not n:
        return ""
    real = [r for r in rows if not _inside(0.0, r["rand_ci"])]
    agree = [r for r in rows if _inside(r["dowhy"], r["rand_ci"])]
    refuted = [r["e"]["treatment"] for r in rows if _refuters(r["e"]["dowhy"], tol)[1] < 3]
    closer = [r for r in rows if abs(r["adjusted"] - r["rand"]) < abs(r["naive"] - r["rand"])]
    sign = [r for r in real if math.copysign(1, r["net"]) == math.copysign(1, r["rand"])]
    net_in = [r for r in rows if _inside(r["net"], r["rand_ci"])]
    off = [r for r in rows if r not in net_in]
    names = lambda rs: ", ".join(f"{r['e']['treatment']} ({r['rand']:+.2f})" for r in rs)  # noqa: E731
    text = (f"**Finding.** The randomised re-runs show an effect on failure whose interval "
            f"excludes zero for {len(real)} of {n} treatments"
            + (f": {names(real)}" if real else "") + ". "
            f"DoWhy's back-door estimate on the full randomised corpus falls inside the "
            f"randomised interval for {len(agree)} of {n}, and its refuters "
            + (f"pass for every treatment but {', '.join(refuted)}" if refuted else
               "pass for every treatment")
            + f". On the confounded subset, adjustment moves the estimate closer to the "
            f"randomised effect than the naive difference for {len(closer)} of {n}. The "
            f"network's do() has the sign of {len(sign)} of the {len(real)} effects the "
            f"re-runs establish and lies inside the re-runs' interval for {len(net_in)} of {n}")
    if off:
        text += ("; it misses " + ", ".join(
            f"{r['e']['treatment']} (network {r['net']:+.2f}, re-runs {r['rand']:+.2f})"
            for r in off))
    return text + "."


def outcome_family_tables(tables: dict[str, Any]) -> str:
    """Per-family tables of the two headline metrics that come from re-runs: the repair rate
    (the top suggested fix, re-run, trains healthily) and ``what_if``'s accuracy against the
    re-runs (``p_failure >= 0.5`` agrees with the re-run's outcome), with the runs behind
    each cell, in the format of :func:`benchmarks.report.per_family_table`."""
    import pandas as pd

    from benchmarks.metrics import THRESHOLD
    from neuraldbg.records import HEALTHY

    out = []
    rec, reps = tables.get("records", pd.DataFrame()), tables.get("repairs", pd.DataFrame())
    if not reps.empty and {"family", "label", "repaired"} <= set(reps.columns):
        truth = rec.drop_duplicates("family").set_index("family")["true_failure"] \
            if not rec.empty else pd.Series(dtype=str)
        frame = reps.assign(true_failure=reps["family"].map(truth).fillna(""),
                            repaired=reps["repaired"].astype(float))
        table = R.per_family_table(frame, "repaired")
        if table:
            out += ["### Repair rate per family", "", table, ""]
    cf = tables.get("counterfactuals", pd.DataFrame())
    if not cf.empty and {"p_failure", "actual_failure", "split"} <= set(cf.columns):
        cf = cf[cf["actual_failure"].notna() & cf["p_failure"].notna()]
        cases = cf.drop_duplicates(["run", "knobs"]).assign(
            failed=lambda d: d["actual_failure"].astype(bool)).groupby("family")["failed"]
        truth = {f: f"{int(g.sum())} of {len(g)} re-runs fail" for f, g in cases}
        frame = cf.assign(
            label=[f"probabilistic[{s}]" for s in cf["split"]],
            true_failure=cf["family"].map(truth),
            whatif_correct=((cf["p_failure"].astype(float) >= THRESHOLD)
                            == cf["actual_failure"].astype(bool)).astype(float))
        table = R.per_family_table(frame, "whatif_correct")
        if table:
            out += ["### `what_if` accuracy against the re-runs per family", "",
                    "The truth column gives how many of the family's re-runs (knob changes of "
                    "its counterfactual-seed runs) still failed; the same re-runs score every "
                    "split.", "", table, ""]
    return "\n".join(out).replace("| family | truth |", "| family | truth / re-runs |")


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
            f"(seeds {s.get('repair_seeds')}). Every run trains on one thread with "
            f"deterministic algorithms, so the numbers do not depend on the worker count; "
            f"times are in `metrics.json` (`timings`), not here.")


def _abstract(metrics: dict[str, Any]) -> str:
    m = metrics.get("methods", {})
    parts = []
    for label in NEURALDBG:
        if label in m:
            parts.append(f"`{label}` reaches failure accuracy {R.fmt(m[label]['failure_accuracy'])}"
                         f", root-cause AC@1 {R.fmt(m[label]['cause_ac@1'])} and ECE "
                         f"{R.fmt(m[label]['ece'])}")
    peers = [k for k in m if k not in NEURALDBG and not k.startswith("probabilistic")]
    if peers:
        best = max(peers, key=lambda k: _v(m[k], "failure_accuracy"))
        parts.append(f"the best ported baseline (`{best}`) reaches failure accuracy "
                     f"{R.fmt(m[best]['failure_accuracy'])} and AC@1 "
                     f"{R.fmt(m[best]['cause_ac@1'])}")
    return ("On this benchmark, " + "; ".join(parts) + " (95% intervals).") if parts \
        else ""


def build(results: Path, out: Path, knob_effects: Path | None = None) -> Path:
    """Write ``out/report.md`` and ``out/figures/`` from the benchmark in ``results`` and the
    knob-effect results in ``knob_effects`` (default ``results/../knob_effects.json``; the
    report says how to make them when the file is absent)."""
    mpath = results / "metrics.json"
    if not mpath.is_file():
        raise FileNotFoundError(f"{mpath} not found: run `make bench` (python -m benchmarks "
                                f"--suite default) first, or pass --results DIR.")
    metrics = with_ablation_rows(json.loads(mpath.read_text()), ablation_dir(results))
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
        per_family=R.per_family_tables(tables.get("records", pd.DataFrame())) + "\n"
        + outcome_family_tables(tables),
        findings="\n".join(_findings(metrics)),
        limitations="\n".join(_limitations(metrics)),
        ablation_threat=_ablation_threat(metrics),
        knob_effects=knob_effects_section(knob_effects or results.parent / "knob_effects.json"),
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
    p.add_argument("--knob-effects", default=None,
                   help="knob-effect results of python -m benchmarks.knob_effects (default: "
                        "knob_effects.json beside the --results directory)")
    args = p.parse_args(argv)
    path = build(Path(args.results).resolve(), Path(args.out).resolve(),
                 Path(args.knob_effects).resolve() if args.knob_effects else None)
    print(f"wrote {path} and {Path(args.out) / 'figures'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
