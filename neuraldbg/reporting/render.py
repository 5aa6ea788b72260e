"""A :class:`~neuraldbg.reporting.data.ReportData` as a self-contained HTML page or PNG.

The PNG is a one-page summary.

The HTML has no script, no external stylesheet, font or image: every figure is a matplotlib
SVG in a ``data:`` URI, so the file opens offline and makes no network request.
"""

from __future__ import annotations

import html
import textwrap
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from neuraldbg.records import Hypothesis
from neuraldbg.reporting.data import ReportData
from neuraldbg.reporting.figures import (
    graph_figure_size,
    health_matrix,
    plot_causal_graph,
    plot_health,
    plot_heatmap,
    plot_loss,
    to_data_uri,
)
from neuraldbg.reporting.words import (
    Verdict,
    cause_words,
    disagreement,
    evidence_sentence,
    failure_words,
    fmt_num,
    status_words,
    verdict,
)

__all__ = ["render_html", "summary_figure", "MAX_HYPOTHESES"]

#: Hypotheses listed per method (the rest are counted, not shown).
MAX_HYPOTHESES = 8
_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
margin:0 auto;max-width:1100px;padding:24px;color:#222;line-height:1.45}
h1{font-size:1.5em;margin-bottom:0}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
.sub{color:#666;margin-top:4px}
.verdict{font-size:1.2em;padding:14px 18px;border-radius:6px;margin:18px 0}
.failed{background:#fdecea;border-left:6px solid #c0392b}
.healthy{background:#e8f5e9;border-left:6px solid #2e7d32}
table{border-collapse:collapse;margin:8px 0;font-size:.92em}
td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f5f5f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:10px 0}figure img{max-width:100%;display:block}
figcaption{color:#555;font-size:.9em}
.note{color:#555;font-size:.92em}.warn{color:#8a4b00}
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _top_onset(data: ReportData) -> tuple[str, int] | None:
    hyps = data.hypotheses.get(data.primary) or []
    top = hyps[0] if hyps else None
    if top is None or top.confidence < 0.5:
        return None
    return top.origin_layer, int(top.origin_step)


def _figure(fig: Figure, alt: str, caption: str, fid: str) -> str:
    return (f'<figure id="{fid}"><img class="fig" alt="{_e(alt)}" src="{to_data_uri(fig)}">'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


def _loss_fig(data: ReportData, width: float = 10, height: float = 3.2) -> Figure:
    s = data.summary
    steps = data.trace.steps["step"].to_numpy()
    loss = data.trace.steps["loss"].to_numpy(dtype=float)
    mark = _top_onset(data)
    fig, ax = plt.subplots(figsize=(width, height))
    fig.subplots_adjust(left=0.07, right=0.98, top=0.95, bottom=0.15)
    peak = ((s.loss_peak_step, s.loss_peak)
            if s.loss_peak is not None and s.loss_peak_step is not None else None)
    plot_loss(ax, steps, loss, onset=mark[1] if mark else None,
              nonfinite_step=s.first_nonfinite_loss.step if s.first_nonfinite_loss else None,
              peak=peak)
    return fig


def _loss_caption(data: ReportData) -> str:
    marks = ["triangle: peak"]
    if _top_onset(data):
        marks.insert(0, "dashed: onset of the top hypothesis")
    if data.summary.first_nonfinite_loss:
        marks.insert(1, "red: first non-finite loss")
    return "Loss per step; " + "; ".join(marks) + "."


def _heatmaps(data: ReportData) -> list[tuple[str, str, Figure]]:
    ev = data.evidence
    mark = _top_onset(data)
    origin = (mark[0],) if mark else ()
    onset = mark[1] if mark else None
    figs = []
    rows = max(3.0, min(9.0, 0.16 * len(ev.names) + 1.2))
    if data.diagnosis is not None:
        codes, names, steps = health_matrix(data.diagnosis.states)
        fig, ax = plt.subplots(figsize=(10, rows))
        fig.subplots_adjust(left=0.12, right=0.9, top=1 - 0.3 / rows, bottom=0.8 / rows)
        plot_health(ax, codes, names, steps, origin_layers=origin, onset=onset)
        ax.set_title("activation and gradient health per layer (State Classifier)", fontsize=9)
        figs.append(("health", "Health of every layer at every recorded step", fig))
    for stat, title, cmap in (("out_grad_norm", "gradient norm (w.r.t. the layer output)",
                               "magma"),
                              ("update_ratio", "update ratio ||dW|| / ||W||", "viridis")):
        vals = ev.tables[stat].T
        if not np.isfinite(vals).any():
            continue
        fig, ax = plt.subplots(figsize=(10, rows))
        fig.subplots_adjust(left=0.12, right=0.98, top=1 - 0.3 / rows, bottom=0.5 / rows)
        plot_heatmap(ax, vals, ev.names, ev.steps, label=stat, origin_layers=origin,
                     onset=onset, cmap=cmap)
        ax.set_title(title, fontsize=9)
        figs.append((stat, f"{title} per layer and step, log scale", fig))
    return figs


def _hyp_rows(data: ReportData, hyps: list[Hypothesis]) -> str:
    rows = []
    for i, h in enumerate(hyps[:MAX_HYPOTHESES], 1):
        rows.append(
            f"<tr><td class=num>{i}</td><td>{_e(failure_words(h.failure_type))}</td>"
            f"<td>{_e(cause_words(h.root_cause))}</td>"
            f"<td>{_e(data.evidence.label(h.origin_layer))}</td>"
            f"<td class=num>{h.origin_step}</td><td class=num>{h.confidence:.2f}</td>"
            f"<td>{_e(evidence_sentence(data.evidence, h))}</td></tr>")
    more = (f"<p class=note>{len(hyps) - MAX_HYPOTHESES} more hypotheses with lower confidence "
            "are not listed (<code>neuraldbg explain --all</code> shows them).</p>"
            if len(hyps) > MAX_HYPOTHESES else "")
    return ("<table><tr><th>#</th><th>failure</th><th>cause</th><th>origin layer</th>"
            "<th>step</th><th>confidence</th><th>evidence</th></tr>" + "".join(rows) +
            "</table>" + more)


def _methods_section(data: ReportData) -> str:
    parts = ["<h2>The methods side by side</h2>"]
    verdicts: dict[str, Verdict] = {m: verdict(h, data.evidence.types)
                                    for m, h in data.hypotheses.items()}
    cells = ["<table><tr><th>method</th><th>verdict</th><th>failure</th><th>cause</th>"
             "<th>origin layer</th><th>step</th><th>confidence</th></tr>"]
    for m, v in verdicts.items():
        t = v.top
        cells.append(
            f"<tr><td>{_e(m)}</td><td>{'failed' if v.failed else 'healthy'}</td>"
            + (f"<td>{_e(failure_words(t.failure_type))}</td><td>{_e(t.root_cause)}</td>"
               f"<td>{_e(data.evidence.label(t.origin_layer))}</td>"
               f"<td class=num>{t.origin_step}</td><td class=num>{t.confidence:.2f}</td>"
               if t is not None else "<td colspan=5>no hypothesis</td>") + "</tr>")
    for m, reason in data.failures.items():
        cells.append(f"<tr><td>{_e(m)}</td><td colspan=6 class=warn>unavailable: "
                     f"{_e(reason)}</td></tr>")
    cells.append("</table>")
    parts.append("".join(cells))
    if len(data.hypotheses) >= 2:
        why = disagreement(data.evidence, data.hypotheses)
        if why:
            parts.append("<p><b>Where they disagree, and why.</b></p>" +
                         "".join(f"<p id=disagreement>{_e(w)}</p>" for w in why))
        elif not any(v.failed for v in verdicts.values()):
            parts.append("<p>Both methods judge the run healthy.</p>")
        else:
            parts.append("<p>The methods agree on the verdict, the failure, its cause and "
                         "where it began.</p>")
        for m, hyps in data.hypotheses.items():
            if m != data.primary and hyps:
                parts.append(f"<p><b>Hypotheses of the {_e(m)} method</b></p>" +
                             _hyp_rows(data, hyps))
    return "".join(parts)


def _what_if_section(data: ReportData) -> str:
    parts = ["<h2>What if: standard interventions</h2>",
             "<p class=note>Answered from the recorded trace by the probabilistic causal "
             "model (abduction, action, prediction); nothing is re-trained.</p>"]
    if data.what_if_error:
        parts.append(f"<p class=warn id=whatif-unavailable>The what-if table could not be "
                     f"computed: {_e(data.what_if_error)}</p>")
        return "".join(parts)
    if not data.what_if:
        parts.append("<p class=note>No intervention was asked for.</p>")
        return "".join(parts)
    rows = ["<table id=whatif><tr><th>intervention</th><th>P(failure) as it happened</th>"
            "<th>P(failure) under it</th><th>most likely outcome</th><th>what it means</th>"
            "</tr>"]
    for r in data.what_if:
        rows.append(
            f"<tr><td>{_e(r.label)}<br><code>{_e(_knob_args(r.knobs))}</code></td>"
            f"<td class=num>{fmt_num(r.p_before) if r.p_before is not None else '-'}</td>"
            f"<td class=num>{fmt_num(r.p_after) if r.p_after is not None else '-'}</td>"
            f"<td>{_e(r.outcome.replace('_', ' ') or '-')}</td><td>{_e(r.meaning)}</td></tr>")
    rows.append("</table>")
    parts.append("".join(rows))
    return "".join(parts)


def _knob_args(knobs: dict[str, Any]) -> str:
    return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in knobs.items())


def _summary_table(data: ReportData) -> str:
    s = data.summary
    nf = s.first_nonfinite
    rows = [
        ("status", status_words(s.status)),
        ("steps", f"{s.n_steps} ({s.n_recorded} with layer statistics"
         + (f", {s.n_skipped} skipped by the optimizer" if s.n_skipped else "") + ")"),
        ("loss first / last (medians)", f"{fmt_num(s.loss_first)} / {fmt_num(s.loss_last)}"),
        ("peak loss", f"{fmt_num(s.loss_peak)} at step {s.loss_peak_step}"
         if s.loss_peak is not None else "-"),
        ("lowest loss", f"{fmt_num(s.loss_min)} at step {s.loss_min_step}"
         if s.loss_min is not None else "-"),
        ("first non-finite value", f"{nf.value} in the {nf.where} at step {nf.step}"
         if nf else "none"),
        ("layers", f"{s.n_modules}: " + ", ".join(f"{n} ({t})" for n, t in s.layers[:12]) +
         (f", ... ({s.n_modules - 12} more)" if s.n_modules > 12 else "")),
    ]
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>"
                               for k, v in rows) + "</table>"


def render_html(data: ReportData, title: str = "NeuralDBG run report") -> str:
    """The report page (one self-contained HTML document)."""
    primary = data.hypotheses.get(data.primary, [])
    v = verdict(primary, data.evidence.types)
    how = (f"{data.primary} method" if data.primary in data.hypotheses else
           "no method could run")
    meta = data.trace.meta
    sub = " · ".join(str(x) for x in (meta.get("model_class"), meta.get("optimizer_class"),
                                       f"{data.summary.n_steps} steps",
                                       f"{data.summary.n_modules} modules") if x)
    body = [f"<h1>{_e(title)}</h1><p class=sub>{_e(sub)}</p>",
            f"<p id=verdict class='verdict {'failed' if v.failed else 'healthy'}'>"
            f"{_e(v.sentence)} <span class=note>({_e(how)})</span></p>"]
    if data.failures.get(data.primary):
        body.append(f"<p class=warn>{_e(data.primary)} method unavailable: "
                    f"{_e(data.failures[data.primary])}</p>")
    for m, hyps in data.hypotheses.items():
        if m != data.primary:
            other = verdict(hyps, data.evidence.types)
            same = other.failed == v.failed and (not v.failed or (
                other.top is not None and v.top is not None
                and other.top.failure_type == v.top.failure_type))
            word = "agrees on the verdict" if same else "disagrees"
            body.append(f"<p class=note>The {_e(m)} method {word}: {_e(other.sentence)} "
                        "(see <i>The methods side by side</i>)</p>")
    gt = data.trace.ground_truth
    if isinstance(gt, dict) and gt.get("failure_type"):
        facts = [str(gt["failure_type"])] + [
            f"{label} {gt[key]}" for key, label in (("root_cause", "caused by"),
                                                    ("onset_step", "from step"))
            if gt.get(key) not in (None, "", "none")]
        body.append(f"<p class=note>Ground truth (failure-zoo run): {_e(', '.join(facts))}."
                    "</p>")
    body += ["<h2>The run</h2>", _summary_table(data),
             _figure(_loss_fig(data), "loss curve", _loss_caption(data), "fig-loss"),
             "<h2>Layers over time</h2><p class=note>Rows are layers in forward order, "
             "columns steps (long runs binned, worst value kept). Triangle: origin layer of "
             "the top hypothesis; dashed line: its onset step.</p>"]
    for fid, caption, fig in _heatmaps(data):
        body.append(_figure(fig, caption, caption, f"fig-{fid}"))
    body.append(f"<h2>Hypotheses ({_e(data.primary)} method)</h2>")
    body.append(_hyp_rows(data, primary) if primary else
                "<p>No hypothesis: nothing in the run looks like a failure.</p>")
    body.append(_methods_section(data))
    body.append(_what_if_section(data))
    body.append("<h2>Causal graph</h2>")
    if data.graph.number_of_nodes():
        fig, ax = plt.subplots(figsize=graph_figure_size(data.graph))
        fig.subplots_adjust(left=0.01, right=0.99, top=0.99, bottom=0.01)
        plot_causal_graph(ax, data.graph, data.evidence.types)
        body.append("<p class=note>An arrow means &ldquo;came first and led to&rdquo;: a "
                    "cause to the failure it produced, a failure to the layer where it began, "
                    "and on through the layers it reached, in order. It is a DAG.</p>")
        body.append(_figure(fig, "causal graph", "Causal graph of the heuristic diagnosis "
                            "(causes red, failures yellow, layers blue).", "fig-graph"))
    else:
        body.append("<p id=no-graph>No failure reached confidence 0.1, so there is no causal "
                    "graph to draw.</p>")
    versions = meta.get("versions", {})
    body.append(f"<p class=note>Generated by NeuralDBG {_e(versions.get('neuraldbg', ''))} "
                "from the recorded trace; no tensor was kept, only per-layer statistics.</p>")
    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            "<meta name=viewport content='width=device-width,initial-scale=1'>"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


def summary_figure(data: ReportData) -> Figure:
    """One-page summary: verdict, loss, health map, top hypotheses and what-ifs."""
    primary = data.hypotheses.get(data.primary, [])
    v = verdict(primary, data.evidence.types)
    fig = plt.figure(figsize=(11, 14))
    grid = fig.add_gridspec(5, 1, height_ratios=[0.7, 2.2, 3.2, 2.0, 1.8], hspace=0.45)
    head = fig.add_subplot(grid[0])
    head.axis("off")
    head.text(0, 1, "NeuralDBG run report", fontsize=15, weight="bold", va="top")
    head.text(0, 0.45, "\n".join(textwrap.wrap(v.sentence, 120)), fontsize=10, va="top",
              color="#c0392b" if v.failed else "#2e7d32")
    plot_loss(fig.add_subplot(grid[1]), data.trace.steps["step"].to_numpy(),
              data.trace.steps["loss"].to_numpy(dtype=float),
              onset=(_top_onset(data) or (None, None))[1],
              nonfinite_step=(data.summary.first_nonfinite_loss.step
                              if data.summary.first_nonfinite_loss else None))
    ax = fig.add_subplot(grid[2])
    mark = _top_onset(data)
    if data.diagnosis is not None:
        codes, names, steps = health_matrix(data.diagnosis.states)
        plot_health(ax, codes, names, steps, origin_layers=(mark[0],) if mark else (),
                    onset=mark[1] if mark else None)
        ax.set_title("layer health", fontsize=9)
    else:
        ax.axis("off")
    text = fig.add_subplot(grid[3])
    text.axis("off")
    lines = [f"{i}. {h} - " + evidence_sentence(data.evidence, h)
             for i, h in enumerate(primary[:3], 1)] or ["No hypothesis."]
    text.text(0, 1, "Top hypotheses\n" + "\n".join(
        "\n".join(textwrap.wrap(line, 140)) for line in lines), fontsize=8, va="top")
    wi = fig.add_subplot(grid[4])
    wi.axis("off")
    rows = ([f"{r.label}: " + r.meaning for r in data.what_if] if data.what_if else
            [f"What-if unavailable: {data.what_if_error}" if data.what_if_error else
             "No what-if asked."])
    wi.text(0, 1, "What if\n" + "\n".join("\n".join(textwrap.wrap(r, 140)) for r in rows),
            fontsize=8, va="top")
    return fig
