"""The causal graph of a diagnosis: a ``networkx.DiGraph`` and its Mermaid flowchart text.

The graph is a DAG, and an edge ``u -> v`` always means "u came first and led to v":

- ``cause -> failure`` (``causes``): a root cause produced a failure;
- ``failure -> layer`` (``originates_in``): the failure began in that layer, at its onset;
- ``layer -> layer`` (``propagates``): the failure reached the next layer later (or in the
  same step), in the order it travelled (forward for activations, backward for gradients);
- ``failure -> failure`` (``explains``): one failure accounts for another;
- ``layer -> layer`` with a mechanism (``blocks_gradient``, ``destabilises``, ``amplifies``):
  the origin of one failure set off another failure where that one began (coupled failures).

Nodes are root causes, failures (one per failure type, at its origin layer and step) and
*layer events*: a layer in the state one failure put it in (id ``layer:<failure>:<name>``).
A layer reached by two failures is two nodes, since "dead at step 31" and "exploding
gradient at step 35" are different events; drawing both on one node made cycles
(activation failures travel forward, gradient failures backward). An edge that would
close a cycle is not added (the first one wins), so the graph is acyclic by construction.
Edges carry a ``relation`` and a ``step_gap``; a second relation between the same two
nodes is merged into the first edge's label.

Mermaid node ids are generated (``n0``, ``n1``, ...), never derived from module names, so any
name is safe; labels are quoted with Mermaid's entity codes for ``"``, ``#``, ``<``, ``>``,
``|`` and ``&``.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from neuraldbg.compressor import CoupledFailure
from neuraldbg.records import Hypothesis

__all__ = ["build_causal_graph", "graph_to_mermaid", "escape_label", "layer_node"]

_MAX_PATH_NODES = 8
_MIN_CONFIDENCE = 0.1


def escape_label(text: str) -> str:
    """Escape text for a quoted Mermaid label (entity codes, ``#`` first)."""
    out = text.replace("#", "#35;")
    for ch, code in (('"', "#quot;"), ("<", "#lt;"), (">", "#gt;"), ("|", "#124;"),
                     ("&", "#amp;")):
        out = out.replace(ch, code)
    return out.replace("\n", " ")


def layer_node(failure_type: str, module_name: str) -> str:
    """Node id of the event "``module_name`` in the state ``failure_type`` put it in"."""
    return f"layer:{failure_type}:{module_name}"


def _add_edge(g: nx.DiGraph, u: str, v: str, relation: str, gap: int | None) -> None:
    if u == v or (not g.has_edge(u, v) and nx.has_path(g, v, u)):
        return  # no self-loops, no cycles: the first direction wins
    if g.has_edge(u, v):
        data = g.edges[u, v]
        if relation not in data["relations"]:
            data["relations"].append(relation)
        if gap is not None and (data["step_gap"] is None or gap < data["step_gap"]):
            data["step_gap"] = gap
        data["relation"] = "/".join(data["relations"])
        return
    g.add_edge(u, v, relation=relation, relations=[relation], step_gap=gap)


def build_causal_graph(hypotheses: Sequence[Hypothesis],
                       coupled: Sequence[CoupledFailure] = (), *,
                       min_confidence: float = _MIN_CONFIDENCE) -> nx.DiGraph:
    """Causal graph of a diagnosis.

    Parameters
    ----------
    hypotheses : sequence of Hypothesis
        Ranked hypotheses (any method; propagation is read from their metadata when present).
    coupled : sequence of CoupledFailure, optional
        Coupled failures; those between layers already in the graph become edges.
    min_confidence : float, default=0.1
        Hypotheses below this confidence are left out.

    Returns
    -------
    networkx.DiGraph
        Acyclic. Node attributes ``kind`` (``cause``, ``failure``, ``layer``), ``label``;
        for failures ``confidence``, ``origin_layer``, ``origin_step``; for layer events
        ``module_name``, ``failure_type``, ``step``. Edge attributes ``relation`` and
        ``step_gap`` (see the module docstring for what an edge means).
    """
    g = nx.DiGraph()
    best = _best_per_failure(hypotheses, min_confidence)
    _add_causes(g, hypotheses, best, min_confidence)
    for ftype, h in best.items():
        _add_layer_path(g, ftype, h)
        for other, _p in (h.metadata.get("explained_by") or {}).items():
            if other in best:
                _add_edge(g, f"failure:{other}", f"failure:{ftype}", "explains",
                          int(h.origin_step) - int(best[other].origin_step))
    _add_coupled(g, best, coupled)
    return g


def _best_per_failure(hypotheses: Sequence[Hypothesis], min_confidence: float
                      ) -> dict[str, Hypothesis]:
    """The most confident hypothesis of each failure type, those under the bar left out."""
    best: dict[str, Hypothesis] = {}
    for h in hypotheses:
        if h.confidence >= min_confidence and (h.failure_type not in best or
                                               h.confidence > best[h.failure_type].confidence):
            best[h.failure_type] = h
    return best


def _add_causes(g: nx.DiGraph, hypotheses: Sequence[Hypothesis], best: dict[str, Hypothesis],
                min_confidence: float) -> None:
    """One node per failure (at its best hypothesis) and a ``causes`` edge from each cause.

    ``unknown`` is drawn only when it carries the failure.
    """
    for h in hypotheses:
        if h.confidence < min_confidence or h.failure_type not in best:
            continue
        f = f"failure:{h.failure_type}"
        top = best[h.failure_type]
        if f not in g:
            g.add_node(f, kind="failure", label=(
                f"{h.failure_type} in {top.origin_layer or '(model)'} at step "
                f"{top.origin_step} (confidence {top.confidence:.2f})"),
                confidence=top.confidence, origin_layer=top.origin_layer,
                origin_step=top.origin_step)
        if h.root_cause != "unknown" or h is top:
            c = f"cause:{h.root_cause}"
            g.add_node(c, kind="cause", label=h.root_cause)
            _add_edge(g, c, f, "causes", None)


def _add_layer_path(g: nx.DiGraph, ftype: str, h: Hypothesis) -> None:
    """The failure's origin layer and the layers it travelled through, in order."""
    origin = layer_node(ftype, h.origin_layer)
    g.add_node(origin, kind="layer", module_name=h.origin_layer, failure_type=ftype,
               step=int(h.origin_step),
               label=f"layer {h.origin_layer or '(model)'} (step {h.origin_step})")
    _add_edge(g, f"failure:{ftype}", origin, "originates_in", 0)
    prop = h.metadata.get("propagation") or {}
    prev, prev_step = origin, h.origin_step
    path = list(zip(prop.get("path", []), prop.get("path_steps", []), strict=False))
    for name, step in path[:_MAX_PATH_NODES]:
        node = layer_node(ftype, name)
        if node not in g:
            g.add_node(node, kind="layer", module_name=name, failure_type=ftype,
                       step=int(step), label=f"layer {name} (step {int(step)})")
        _add_edge(g, prev, node, "propagates", int(step) - int(prev_step))
        prev, prev_step = node, step


def _add_coupled(g: nx.DiGraph, best: dict[str, Hypothesis],
                 coupled: Sequence[CoupledFailure]) -> None:
    """Coupled failures with a named mechanism, from one failure's origin to another's.

    Same-kind spread is already drawn as the propagation path (and would make 2-cycles); a
    mechanism edge joins two origins: the origin of one failure set off another failure
    where that one began (edges into every layer it passed were clutter).
    """
    origins = {h.origin_layer: ftype for ftype, h in best.items()}
    for pair in coupled:
        cause, effect = pair.cause.module_name, pair.effect.module_name
        if pair.relation in ("propagates", "co_occurs") or cause not in origins:
            continue
        if effect in origins and origins[effect] != origins[cause]:
            _add_edge(g, layer_node(origins[cause], cause),
                      layer_node(origins[effect], effect), pair.relation, pair.step_gap)


def graph_to_mermaid(graph: nx.DiGraph, direction: str = "TD") -> str:
    """Mermaid flowchart text of a causal graph.

    Parameters
    ----------
    graph : networkx.DiGraph
        Output of :func:`build_causal_graph`.
    direction : {"TD", "LR", "BT", "RL"}, default="TD"

    Returns
    -------
    str
        ``flowchart TD`` followed by one line per node and one per edge; edges are labelled
        ``relation`` or ``relation, +N steps``.

    Raises
    ------
    ValueError
        If ``direction`` is not one of the allowed values.
    """
    if direction not in ("TD", "LR", "BT", "RL"):
        raise ValueError(f"direction must be one of 'TD', 'LR', 'BT', 'RL', got {direction!r}.")
    ids = {node: f"n{i}" for i, node in enumerate(graph.nodes)}
    shapes = {"cause": ('(["', '"])'), "failure": ('{{"', '"}}'), "layer": ('["', '"]')}
    lines = [f"flowchart {direction}"]
    for node, data in graph.nodes(data=True):
        left, right = shapes.get(data.get("kind", "layer"), shapes["layer"])
        lines.append(f"    {ids[node]}{left}{escape_label(str(data.get('label', node)))}{right}")
    for u, v, data in graph.edges(data=True):
        gap = data.get("step_gap")
        text = data.get("relation", "")
        if gap is not None:
            text += f", +{gap} steps" if gap >= 0 else f", {gap} steps"
        lines.append(f'    {ids[u]} -->|"{escape_label(text)}"| {ids[v]}')
    for kind, style in (("cause", "fill:#fde2e2,stroke:#c0392b"),
                        ("failure", "fill:#fff3cd,stroke:#b8860b")):
        members = [ids[n] for n, d in graph.nodes(data=True) if d.get("kind") == kind]
        if members:
            lines.append(f"    classDef {kind} {style}")
            lines.append(f"    class {','.join(members)} {kind}")
    return "\n".join(lines) + "\n"
