"""Figures of a run with matplotlib (Agg, no display).

The loss curve, layer x step heatmaps, the causal graph as a DAG, and the health heatmaps
the benchmark report draws per family.

Long runs are binned along the step axis (at most ``MAX_COLUMNS`` columns, the worst value
of each bin kept), so a 10,000-step run draws as fast and as small as a 1,000-step one.
"""

from __future__ import annotations

import base64
import io
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import networkx as nx  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from neuraldbg.states import (  # noqa: E402
    ACTIVATION_STATES,
    GRADIENT_STATES,
    StateTable,
    classify_states,
)
from neuraldbg.trace import load_trace  # noqa: E402

__all__ = ["STATE_NAMES", "HEALTH_COLORS", "MAX_COLUMNS", "HeatmapPanel", "health_matrix",
           "bin_steps", "plot_loss", "plot_heatmap", "plot_health", "plot_causal_graph",
           "graph_layout", "graph_figure_size",
           "plot_health_heatmaps", "to_data_uri"]

#: Health codes of :func:`health_matrix`, in code order.
STATE_NAMES: tuple[str, ...] = ("ok", "vanishing", "exploding", "saturated", "dead",
                                "anomalous", "non-finite")
HEALTH_COLORS = ListedColormap(["#d9ead3", "#6fa8dc", "#e06666", "#f6b26b", "#444444",
                                "#b4a7d6", "#990000"])
#: Most step columns a heatmap draws; longer runs are binned.
MAX_COLUMNS = 600
_SVG_SALT = "neuraldbg"  # fixed ids in the SVG output, so a report is reproducible


#: Severity rank of each code + 1 (unobserved -1, ok 0, vanishing 1, exploding 2,
#: saturated 3, dead 4, anomalous 5): the worse state of a cell is the one drawn.
_SEVERITY = np.array([-1, 0, 3, 4, 2, 5, 1])


def _lookup(states: tuple, unobserved: float) -> np.ndarray:
    """Code table for a state array: index ``i`` -> health code.

    The last slot (-1) is for an unobserved cell.
    """
    codes = {"healthy": 0, "normal": 0, "vanishing": 1, "exploding": 2, "saturated": 3,
             "dead": 4, "anomalous": 5}
    return np.array([codes.get(str(getattr(st, "value", st)), 0) for st in states] +
                    [unobserved], dtype=float)


def health_matrix(states: StateTable) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(modules x steps) health codes (index into :data:`STATE_NAMES`), NaN where unobserved.

    A cell shows the worse of the gradient and activation states (dead, then exploding,
    vanishing, saturated, anomalous); a non-finite output or gradient overrides both.
    """
    grad = _lookup(GRADIENT_STATES, -1.0)[states.grad_state]
    act = _lookup(ACTIVATION_STATES, -1.0)[states.act_state]
    rank = _SEVERITY[(grad + 1).astype(int)]  # unobserved (-1) ranks lowest
    codes = np.where(rank >= _SEVERITY[(act + 1).astype(int)], grad, act)
    nf = states.measures.get("nonfinite")
    if nf is not None:
        codes[np.asarray(nf, dtype=bool)] = 6
    codes[codes < 0] = np.nan
    return codes.T, list(states.module_names), np.asarray(states.steps)


def bin_steps(values: np.ndarray, steps: np.ndarray, max_columns: int = MAX_COLUMNS
              ) -> tuple[np.ndarray, np.ndarray]:
    """Columns binned to at most ``max_columns``, each bin's largest value (NaN ignored).

    Returns the binned ``(rows, bins)`` array and the first step of each bin.
    """
    n = values.shape[1]
    if n <= max_columns:
        return values, steps
    edges = np.linspace(0, n, max_columns + 1).astype(int)
    out = np.full((values.shape[0], max_columns), np.nan)
    filled = np.where(np.isnan(values), -np.inf, values)
    red = np.maximum.reduceat(filled, edges[:-1], axis=1)
    out[:] = np.where(np.isneginf(red), np.nan, red)
    return out, steps[edges[:-1]]


def _mark(ax: Axes, names: Sequence[str], steps: np.ndarray, origin_layers: Sequence[str],
          onset: int | None) -> None:
    for lay in origin_layers:
        if lay in names and len(origin_layers) < len(names):
            ax.plot(steps[0], names.index(lay), marker=">", color="k", ms=7, clip_on=False,
                    transform=ax.transData)
    if onset is not None:
        ax.axvline(onset, color="k", ls="--", lw=1.0)


def _yticks(ax: Axes, names: Sequence[str], fontsize: float = 6) -> None:
    stride = max(1, math.ceil(len(names) / 24))
    ax.set_yticks(range(0, len(names), stride))
    ax.set_yticklabels(list(names)[::stride], fontsize=fontsize)


def _extent(steps: np.ndarray, n_rows: int) -> tuple[float, float, float, float]:
    step = (steps[1] - steps[0]) if len(steps) > 1 else 1
    return (float(steps[0]) - 0.5, float(steps[-1]) + step - 0.5, n_rows - 0.5, -0.5)


def plot_health(ax: Axes, codes: np.ndarray, names: Sequence[str], steps: np.ndarray, *,
                origin_layers: Sequence[str] = (), onset: int | None = None,
                legend: bool = True) -> None:
    """Layer x step health map (colours of :data:`HEALTH_COLORS`); origin and onset marked."""
    binned, bsteps = bin_steps(codes, steps)
    ax.imshow(binned, aspect="auto", interpolation="nearest", cmap=HEALTH_COLORS, vmin=-0.5,
              vmax=6.5, extent=_extent(bsteps, len(names)))
    _mark(ax, names, bsteps, origin_layers, onset)
    _yticks(ax, names)
    ax.set_xlabel("step", fontsize=8)
    if legend:
        handles = [plt.Rectangle((0, 0), 1, 1, color=HEALTH_COLORS(i))
                   for i in range(len(STATE_NAMES))]
        # 0.45 inch under the axes, whatever their height (below the "step" label)
        axes_in = ax.get_position().height * cast(Figure, ax.figure).get_figheight()
        ax.legend(handles, STATE_NAMES, loc="upper center",
                  bbox_to_anchor=(0.5, -0.45 / max(axes_in, 0.1)), ncol=len(STATE_NAMES),
                  fontsize=7, frameon=False)


def plot_heatmap(ax: Axes, values: np.ndarray, names: Sequence[str], steps: np.ndarray, *,
                 label: str, origin_layers: Sequence[str] = (), onset: int | None = None,
                 cmap: str = "magma") -> None:
    """Layer x step map of a positive statistic on a log10 colour scale, with a colour bar.

    ``values`` is (modules x steps); zeros and non-finite cells are blank.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        logv = np.where(np.isfinite(values) & (values > 0), np.log10(values), np.nan)
    binned, bsteps = bin_steps(logv, steps)
    finite = binned[np.isfinite(binned)]
    lo, hi = (np.percentile(finite, [1, 99.5]) if len(finite) else (0.0, 1.0))
    im = ax.imshow(binned, aspect="auto", interpolation="nearest", cmap=cmap, vmin=lo,
                   vmax=max(hi, lo + 1e-6), extent=_extent(bsteps, len(names)))
    cbar = ax.figure.colorbar(im, ax=ax, pad=0.01, fraction=0.04)
    cbar.set_label(f"log10 {label}", fontsize=7)
    cbar.ax.tick_params(labelsize=6)
    _mark(ax, names, bsteps, origin_layers, onset)
    _yticks(ax, names)
    ax.set_xlabel("step", fontsize=8)


def plot_loss(ax: Axes, steps: np.ndarray, loss: np.ndarray, *, onset: int | None = None,
              nonfinite_step: int | None = None, peak: tuple[int, float] | None = None) -> None:
    """Loss per step (log scale when it spans more than two decades).

    The onset (dashed), the first non-finite loss (red) and non-finite steps (red ticks) are
    marked.
    """
    finite = np.isfinite(loss)
    n = len(loss)
    if n > 4 * MAX_COLUMNS:  # min/max envelope per bin keeps spikes visible
        edges = np.linspace(0, n, 2 * MAX_COLUMNS + 1).astype(int)
        lv = np.where(finite, loss, np.nan)
        lo = np.array([np.nanmin(lv[a:b]) if finite[a:b].any() else np.nan
                       for a, b in zip(edges[:-1], edges[1:], strict=True)])
        hi = np.array([np.nanmax(lv[a:b]) if finite[a:b].any() else np.nan
                       for a, b in zip(edges[:-1], edges[1:], strict=True)])
        x = steps[edges[:-1]]
        ax.fill_between(x, lo, hi, color="C0", alpha=0.5, lw=0)
        ax.plot(x, hi, color="C0", lw=0.8, label="loss (per-bin min-max)")
    else:
        ax.plot(steps[finite], loss[finite], color="C0", lw=1.2, label="loss")
    pos = loss[finite & (loss > 0)]
    if len(pos) and pos.max() / max(pos.min(), 1e-300) > 100 and (loss[finite] > 0).all():
        ax.set_yscale("log")
    bad = steps[~finite]
    if len(bad):
        ax.plot(bad, np.full(len(bad), 1.0), "|", color="#990000", ms=8,
                transform=ax.get_xaxis_transform(), label="non-finite loss")
    if nonfinite_step is not None:
        ax.axvline(nonfinite_step, color="#990000", lw=1.2,
                   label=f"first non-finite loss (step {nonfinite_step})")
    if onset is not None:
        ax.axvline(onset, color="k", ls="--", lw=1.0, label=f"onset (step {onset})")
    if peak is not None:
        ax.plot([peak[0]], [peak[1]], "v", color="C3", ms=7, label=f"peak {peak[1]:.3g}")
    ax.set_xlabel("step", fontsize=8)
    ax.set_ylabel("loss", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")


_KIND_COLORS = {"cause": "#fde2e2", "failure": "#fff3cd", "layer": "#e8eef7"}
_KIND_EDGES = {"cause": "#c0392b", "failure": "#b8860b", "layer": "#5b7db1"}


def graph_layout(graph: nx.DiGraph) -> dict[str, tuple[float, float]]:
    """Top-to-bottom positions of a DAG: one row per topological generation.

    Nodes of a row are ordered by the mean position of their parents (fewer crossings).
    """
    pos: dict[str, tuple[float, float]] = {}
    for row, nodes in enumerate(nx.topological_generations(graph)):
        def parent_x(n: str) -> float:
            xs = [pos[p][0] for p in graph.predecessors(n) if p in pos]
            return float(np.mean(xs)) if xs else 0.0

        ordered = sorted(nodes, key=lambda n: (parent_x(n), str(n)))
        for i, node in enumerate(ordered):
            pos[node] = (i - (len(ordered) - 1) / 2, -float(row))
    return pos


def graph_figure_size(graph: nx.DiGraph) -> tuple[float, float]:
    """Figure size (inches) that gives every node of :func:`graph_layout` room."""
    if graph.number_of_nodes() == 0:
        return (8.0, 1.5)
    gens = [len(g) for g in nx.topological_generations(graph)]
    return (max(6.0, 2.4 * max(gens)), max(2.0, 0.95 * len(gens)))


def _node_text(node: str, data: dict, types: dict[str, str]) -> str:
    kind = data.get("kind", "layer")
    if kind == "layer":
        name = data.get("module_name", "")
        typ = types.get(name)
        return f"{name or '(model)'}{f' ({typ})' if typ else ''}\nstep {data.get('step')}"
    if kind == "failure":
        return (str(data.get("failure_type", node.split(":", 1)[-1])).replace("_", " ") +
                f"\nconfidence {data.get('confidence', 0):.2f}")
    return "\n".join(textwrap.wrap(str(data.get("label", node)).replace("_", " "), 24))


def plot_causal_graph(ax: Axes, graph: nx.DiGraph, types: dict[str, str] | None = None
                      ) -> None:
    """The causal graph (a DAG) drawn top to bottom.

    Causes, failures, then layers in the order the failure reached them. Relations other
    than ``propagates`` label their edge.
    """
    ax.axis("off")
    if graph.number_of_nodes() == 0:
        ax.text(0.5, 0.5, "no failure, so no causal graph", ha="center", va="center",
                fontsize=10, color="#555")
        return
    types = types or {}
    pos = graph_layout(graph)
    for node, data in graph.nodes(data=True):
        kind = data.get("kind", "layer")
        x, y = pos[node]
        ax.text(x, y, _node_text(node, data, types), ha="center", va="center",
                              fontsize=7, zorder=3, bbox={
                                  "boxstyle": "round,pad=0.4", "fc": _KIND_COLORS.get(kind),
                                  "ec": _KIND_EDGES.get(kind), "lw": 0.9})
    for u, v, data in graph.edges(data=True):
        ax.annotate("", xy=pos[v], xytext=pos[u], zorder=2, arrowprops={
            "arrowstyle": "-|>", "color": "#555", "lw": 0.9, "shrinkA": 13, "shrinkB": 13,
            "mutation_scale": 11, "connectionstyle": "arc3,rad=0.06"})
        rel = data.get("relation", "")
        if rel and rel != "propagates":
            mx, my = (pos[u][0] + pos[v][0]) / 2, (pos[u][1] + pos[v][1]) / 2
            ax.text(mx, my, rel.replace("_", " "), fontsize=5.5, color="#444", ha="center",
                    va="center", zorder=4, bbox={"fc": "white", "ec": "none", "pad": 0.5,
                                                 "alpha": 0.8})
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    ax.set_xlim(min(xs) - 0.6, max(xs) + 0.6)
    ax.set_ylim(min(ys) - 0.5, max(ys) + 0.5)


@dataclass(frozen=True, slots=True)
class HeatmapPanel:
    """One panel of :func:`plot_health_heatmaps`.

    Attributes
    ----------
    title : str
    trace : str
        Trace directory.
    origin_layers : tuple of str
        Layers to mark (a triangle on the left edge); empty for none.
    onset_step : int or None
        Step to mark (a dashed line); None for none.
    """

    title: str
    trace: str
    origin_layers: tuple[str, ...] = ()
    onset_step: int | None = None


def plot_health_heatmaps(panels: Sequence[HeatmapPanel], path: str) -> str | None:
    """Layer x step health heatmaps of several runs in one PNG (the benchmark's figure).

    Titles and marks are the caller's: nothing here reads a ground truth.
    """
    if not panels:
        return None
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 2.9 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        try:
            codes, names, steps = health_matrix(classify_states(load_trace(panel.trace)))
        except Exception as exc:  # noqa: BLE001 - one unreadable run must not hide the others
            ax.text(0.5, 0.5, f"no states: {exc}", ha="center", fontsize=7, wrap=True)
            ax.set_title(panel.title, fontsize=8)
            continue
        plot_health(ax, codes, names, steps, origin_layers=panel.origin_layers,
                    onset=panel.onset_step, legend=False)
        ax.set_title(panel.title, fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles = [plt.Rectangle((0, 0), 1, 1, color=HEALTH_COLORS(i))
               for i in range(len(STATE_NAMES))]
    fig.legend(handles, STATE_NAMES, loc="lower center", ncol=len(STATE_NAMES), fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def to_data_uri(fig: Figure, fmt: str = "svg") -> str:
    """The figure as a ``data:`` URI (SVG or PNG), then closed: no file, no network."""
    buf = io.BytesIO()
    with plt.rc_context({"svg.hashsalt": _SVG_SALT, "svg.fonttype": "none"}):
        fig.savefig(buf, format=fmt, metadata=(
            {"Date": None} if fmt == "svg" else None), dpi=110 if fmt == "png" else None)
    plt.close(fig)
    mime = "image/svg+xml" if fmt == "svg" else "image/png"
    return f"data:{mime};base64," + base64.b64encode(buf.getvalue()).decode("ascii")
