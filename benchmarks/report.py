"""Report of a benchmark: terminal table (rich), ``metrics.json``, ``report.md``, figures.

Everything here reads what the harness wrote (``results/<suite>/*.parquet`` and the metrics
dict); nothing is recomputed from traces except the health heatmaps, which draw one scored
run per failure family through NeuralDBG's State Classifier. Figures use matplotlib's Agg
backend (no display needed).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.markup import escape  # noqa: E402
from rich.table import Table  # noqa: E402

from benchmarks import metrics as M  # noqa: E402
from neuraldbg.records import HEALTHY  # noqa: E402

__all__ = ["MAIN_COLUMNS", "fmt", "write_metrics", "print_table", "markdown_tables",
           "per_family_table", "per_family_tables",
           "plot_reliability", "plot_ac_at_k", "plot_zoo_heatmaps", "write_benchmark_report",
           "load_results"]

#: (metric key, column title) of the main comparison table.
MAIN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("failure_accuracy", "failure acc"),
    ("cause_ac@1", "cause AC@1"),
    ("cause_ac@3", "AC@3"),
    ("cause_avg@5", "Avg@5"),
    ("cause_mrr", "MRR"),
    ("layer_accuracy", "layer acc"),
    ("layer_accuracy_local", "layer acc (local faults)"),
    ("onset_hit", "onset hit"),
    ("onset_median_error", "onset med err"),
    ("detection_median_latency", "latency (steps)"),
    ("healthy_fpr", "healthy FPR"),
)
CALIBRATION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("confident_wrong", "confident-wrong"), ("ece", "ECE (15 bins)"), ("brier", "Brier"),
    ("nll", "NLL"), ("sharpness_std", "sharpness (std)"),
    ("sharpness_distinct", "distinct conf."), ("repair_rate", "repair rate"),
    ("detection_rate", "detected"),
)
#: Per-family tables of the report: (per-run column, title, failing runs only).
PER_FAMILY: tuple[tuple[str, str, bool], ...] = (
    ("failure_correct", "Failure accuracy", False),
    ("cause_hit", "Root cause at rank 1 (AC@1)", True),
    ("layer_correct", "Origin-layer accuracy", True),
    ("onset_hit", "Onset within tolerance", True),
    ("confident_wrong", "Confident-wrong rate (lower is better)", True),
)


def fmt(m: dict[str, float] | None, digits: int = 2) -> str:
    """``value [low, high]`` (or ``value`` alone, or ``-``; a count without decimals)."""
    if not m or m.get("value") is None or (isinstance(m["value"], float)
                                             and math.isnan(m["value"])):
        return "-"
    if m.get("interval") == "none":
        return f"{m['value']:.0f}"
    def num(x: float) -> str:
        return f"{round(x, digits) + 0.0:.{digits}f}"  # round, then + 0.0: never "-0.00"

    v = num(m["value"])
    lo, hi = m.get("low"), m.get("high")
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return v
    return f"{v} [{num(lo)}, {num(hi)}]"


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "item"):
        return _clean(obj.item())
    return obj


def write_metrics(metrics: dict[str, Any], out: Path) -> Path:
    """``metrics.json`` (NaN written as null)."""
    path = Path(out) / "metrics.json"
    path.write_text(json.dumps(_clean(metrics), indent=2, sort_keys=True))
    return path


def print_table(metrics: dict[str, Any], console: Console | None = None) -> None:
    """The main comparison as a rich table in the terminal."""
    console = console or Console()
    for title, cols in (("Diagnosis (95% intervals: exact for proportions, family bootstrap "
                         "otherwise)", MAIN_COLUMNS),
                        ("Calibration, repair, cost", CALIBRATION_COLUMNS)):
        t = Table(title=title, show_lines=False)
        t.add_column("method", style="bold")
        for _, name in cols:
            t.add_column(name, justify="right")
        for label, m in metrics.get("methods", {}).items():
            t.add_row(escape(label), *[fmt(m.get(k)) for k, _ in cols])
        console.print(t)
    cfv = metrics.get("counterfactual_validity", {})
    if cfv:
        t = Table(title="Counterfactual validity: what_if vs real re-run")
        for c in ("method", "balanced acc", "on fixes", "on still-fails", "accuracy", "Brier",
                  "n"):
            t.add_column(c, justify="right")
        for label, v in cfv.items():
            t.add_row(escape(label), fmt(v["balanced_accuracy"]), fmt(v["accuracy_fixed"]),
                      fmt(v["accuracy_still_fails"]), fmt(v["accuracy"]), fmt(v["brier"]),
                      str(v["accuracy"]["n"]))
        console.print(t)
    for name, r in metrics.get("mcnemar", {}).items():
        console.print(escape(f"McNemar {name}: heuristic only right {r['a_only']}, "
                             f"probabilistic only right {r['b_only']}, p = {r['pvalue']:.3g} "
                             f"(n = {r['n']})"))


def markdown_tables(metrics: dict[str, Any]) -> str:
    """The tables of the report as Markdown."""
    lines: list[str] = []
    for title, cols in (("Diagnosis", MAIN_COLUMNS), ("Calibration, repair, cost",
                                                      CALIBRATION_COLUMNS)):
        lines += [f"### {title}", "", "| method | " + " | ".join(n for _, n in cols) + " |",
                  "|---|" + "---|" * len(cols)]
        for label, m in metrics.get("methods", {}).items():
            lines.append(f"| {label} | " + " | ".join(fmt(m.get(k)) for k, _ in cols) + " |")
        lines.append("")
    n = {label: (m["failure_accuracy"]["n"], m["cause_ac@1"]["n"], m["healthy_fpr"]["n"])
         for label, m in metrics.get("methods", {}).items()}
    if n:
        lines += ["Runs scored per method (all / failing / healthy): " + "; ".join(
            f"{k} {a}/{b}/{c}" for k, (a, b, c) in n.items()) + ".", ""]
    cfv = metrics.get("counterfactual_validity", {})
    if cfv:
        lines += ["### Counterfactual validity (`what_if` vs really re-running the seed)", "",
                  "Balanced accuracy is the mean of the accuracy on the changes whose re-run "
                  "trained healthily (\"on fixes\") and on those whose re-run still failed; "
                  "`fix table` and `nothing fixes it` are the counterfactual baselines, "
                  "scored on the same cases.", "",
                  "| method | balanced accuracy | on fixes | on still-fails | accuracy | Brier "
                  "| cases |", "|---|---|---|---|---|---|---|"]
        for label, v in cfv.items():
            lines.append(f"| {label} | {fmt(v['balanced_accuracy'])} | "
                         f"{fmt(v['accuracy_fixed'])} | {fmt(v['accuracy_still_fails'])} | "
                         f"{fmt(v['accuracy'])} | {fmt(v['brier'])} | {v['accuracy']['n']} |")
        lines.append("")
    mc = metrics.get("mcnemar", {})
    if mc:
        lines += ["### McNemar's test (exact), heuristic vs probabilistic, paired per run", "",
                  "| comparison | both right | heuristic only | probabilistic only | neither | "
                  "p-value |", "|---|---|---|---|---|---|"]
        for name, r in mc.items():
            lines.append(f"| {name} | {r['both']} | {r['a_only']} | {r['b_only']} | "
                         f"{r['neither']} | {r['pvalue']:.3g} |")
        lines.append("")
    return "\n".join(lines)


def per_family_table(records: pd.DataFrame, column: str = "failure_correct",
                     failing_only: bool = False) -> str:
    """Share of runs where ``column`` holds, per family (rows) and method (columns), as
    Markdown with the runs behind each cell (``0.50 (2)``). ``column="cause_hit"`` is the
    true cause at rank 1."""
    if records.empty:
        return ""
    ok = records[records["error"] == ""] if "error" in records.columns else records
    if failing_only:
        ok = ok[ok["true_failure"] != HEALTHY]
    if column == "cause_hit":
        ok = ok.assign(cause_hit=ok["cause_rank"].astype(float) == 1.0)
    if column not in ok.columns:
        return ""
    ok = ok[ok[column].notna()].assign(**{column: ok[column].astype(float)})
    if ok.empty:
        return ""
    mean = ok.pivot_table(index="family", columns="label", values=column, aggfunc="mean")
    count = ok.pivot_table(index="family", columns="label", values=column, aggfunc="count")
    truth = ok.groupby("family")["true_failure"].first()
    lines = ["| family | truth | " + " | ".join(mean.columns) + " |",
             "|---|---|" + "---|" * len(mean.columns)]
    for fam, row in mean.iterrows():
        lines.append(f"| {fam} | {truth[fam]} | " + " | ".join(
            "-" if pd.isna(v) else f"{v:.2f} ({int(count.at[fam, c])})"
            for c, v in row.items()) + " |")
    return "\n".join(lines)


def per_family_tables(records: pd.DataFrame) -> str:
    """Every table of :data:`PER_FAMILY`, each under its title."""
    out = []
    for column, title, failing in PER_FAMILY:
        table = per_family_table(records, column, failing)
        if table:
            out += [f"### {title} per family", "", table, ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------- figures
def plot_reliability(records: pd.DataFrame, path: Path, n_bins: int = 15) -> Path:
    """Reliability diagram of the top-1 confidence, one panel per method."""
    ok = records[records["error"] == ""]
    labels = sorted(ok["label"].unique())
    cols = min(3, max(1, len(labels)))
    rows = math.ceil(len(labels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.6 * rows), squeeze=False)
    for ax, label in zip(axes.flat, labels, strict=False):
        g = ok[ok["label"] == label]
        t = M.reliability_table(g["confidence"].astype(float), g["failure_correct"].astype(bool),
                                n_bins)
        t = t[t["count"] > 0]
        ax.bar(t["lower"], t["accuracy"], width=1 / n_bins, align="edge", alpha=0.7,
               edgecolor="k", label="accuracy")
        for _, b in t.iterrows():  # runs per bin, so an empty-looking bar reads as 1 run
            ax.text(b["lower"] + 0.5 / n_bins, min(b["accuracy"], 0.9) + 0.03,
                    str(int(b["count"])), ha="center", fontsize=6)
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        ax.scatter(t["mean_confidence"], t["accuracy"], s=8 + 4 * t["count"], c="C3", zorder=3,
                   label="mean confidence (size: runs)")
        ece = M.top1_expected_calibration_error(g["confidence"].astype(float),
                                           g["failure_correct"].astype(bool), n_bins)
        sharp = M.sharpness(g["confidence"].astype(float))
        ax.set_title(f"{label}\nECE {ece:.3f}, n={len(g)}; {sharp['distinct']} distinct "
                     f"conf., std {sharp['std']:.2f}", fontsize=8)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("top-1 confidence")
        ax.set_ylabel("accuracy")
    for ax in list(axes.flat)[len(labels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_ac_at_k(records: pd.DataFrame, path: Path, k_max: int = 5) -> Path:
    """AC@k of the true root cause for k = 1..k_max, one line per method."""
    ok = records[(records["error"] == "") & (records["true_failure"] != HEALTHY)]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ks = np.arange(1, k_max + 1)
    markers = "osD^vxP*"
    for i, label in enumerate(sorted(ok["label"].unique())):
        r = ok[ok["label"] == label]["cause_rank"].astype(float).to_numpy()
        # markers of decreasing size, so that methods with identical curves stay visible
        ax.plot(ks, [M.ac_at_k(r, k) for k in ks], marker=markers[i % len(markers)],
                ms=11 - 1.2 * i, mfc="none" if i % 2 else None, label=label,
                ls="-" if not label.startswith(("autotrainer", "deepdiag", "anomaly")) else "--",
                color=f"C{i}")
    ax.set_xticks(ks)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("k")
    ax.set_ylabel("AC@k (true root cause in top k)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_zoo_heatmaps(examples: list[tuple[str, str]], path: Path) -> Path | None:
    """Layer x step health heatmap of one run per failure family (``(title, trace dir)``).

    Drawn by :func:`neuraldbg.reporting.figures.plot_health_heatmaps`; the true origin
    layers and onset step of each zoo run are marked (triangles, dashed line).
    """
    from neuraldbg.reporting.figures import HeatmapPanel
    from neuraldbg.reporting.figures import plot_health_heatmaps as draw
    from neuraldbg.trace import load_trace

    panels = []
    for title, tdir in examples:
        gt = load_trace(tdir).ground_truth or {}
        label = f"{title}: {gt['failure_type']}" if gt.get("failure_type") else title
        panels.append(HeatmapPanel(label, str(tdir), tuple(gt.get("origin_layers") or ()),
                                   gt.get("onset_step")))
    out = draw(panels, str(path))
    return Path(out) if out else None


def load_results(out: Path) -> dict[str, pd.DataFrame]:
    """The Parquet tables a benchmark wrote under ``out``."""
    return {name: pd.read_parquet(Path(out) / f"{name}.parquet")
            for name in ("records", "counterfactuals", "repairs", "folds", "runs")
            if (Path(out) / f"{name}.parquet").exists()}


def make_figures(out: Path, fig_dir: Path | None = None) -> dict[str, Path]:
    """All figures of a benchmark directory; returns name -> file."""
    out = Path(out)
    fig_dir = Path(fig_dir or out / "figures")
    fig_dir.mkdir(parents=True, exist_ok=True)
    t = load_results(out)
    rec = t.get("records", pd.DataFrame())
    figs: dict[str, Path] = {}
    if rec.empty:
        return figs
    figs["reliability"] = plot_reliability(rec, fig_dir / "reliability.png")
    figs["ac_at_k"] = plot_ac_at_k(rec, fig_dir / "ac_at_k.png")
    fail = rec[(rec["true_failure"] != HEALTHY)].drop_duplicates("family").sort_values("family")
    p = plot_zoo_heatmaps([(r["family"], r["run"]) for _, r in fail.iterrows()],
                             fig_dir / "health_heatmaps.png")
    if p is not None:
        figs["health_heatmaps"] = p
    return figs


def _unshown(notes: dict[str, Any]) -> str:
    """The scored seeds left out because their declared outcome did not show, in words."""
    unshown = notes.get("unshown_score_runs") or []
    if not unshown:
        return ""
    return (f" ({len(unshown)} more left out, as their declared outcome did not show by the "
            f"zoo's health judgement: {', '.join(unshown)})")


def write_benchmark_report(metrics: dict[str, Any], out: Path) -> Path:
    """``report.md`` of one benchmark directory (tables and figures)."""
    out = Path(out)
    figs = make_figures(out)
    t = load_results(out)
    notes = metrics.get("notes", {})
    s = metrics.get("suite", {})
    lines = [f"# NeuralDBG benchmark: suite `{s.get('name')}`", "",
             f"{notes.get('n_score_runs')} scored runs{_unshown(notes)} and "
             f"{notes.get('n_fit_runs')} fitting "
             f"runs over {len(notes.get('families', []))} zoo families (score seeds "
             f"{s.get('score_seeds')}, fit seeds {s.get('fit_seeds')}), "
             f"{notes.get('n_counterfactual_reruns')} counterfactual re-runs, "
             f"{notes.get('n_repair_reruns')} repair re-runs. Intervals (95%): exact "
             f"Clopper-Pearson for proportions, a percentile bootstrap over families "
             f"({s.get('n_resamples')} resamples) otherwise. Times are in metrics.json "
             f"(`timings`), not here, so this file is the same on every machine.", ""]
    if notes.get("methods_missing"):
        lines += ["Methods not available in this run: " + ", ".join(
            f"`{k}` ({v})" for k, v in notes["methods_missing"].items()), ""]
    lines += [markdown_tables(metrics), per_family_tables(t.get("records", pd.DataFrame())), ""]
    for name, title in (("reliability", "Reliability of the top-1 confidence"),
                        ("ac_at_k", "Root cause in the top k"),
                        ("health_heatmaps", "Layer x step health (State Classifier), one run "
                                            "per failure family; dashed: true onset")):
        if name in figs:
            lines += [f"### {title}", "", f"![{title}](figures/{figs[name].name})", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
