"""Transparency: what the fitted network learned, as a graph, Mermaid text and tables.

- :func:`to_networkx`: the structure as a ``networkx.DiGraph`` (node attributes: ``role``
  and ``states``);
- :func:`network_to_mermaid`: Mermaid ``graph`` text, slices drawn as subgraphs;
- :func:`cpd_frame`: one conditional table as a DataFrame (rows: parent configurations,
  columns: the node's states);
- :func:`cpd_frames`: every table.
"""

from __future__ import annotations

import re

import networkx as nx
import pandas as pd

from causal_models.fitted import FittedModel, check_is_fitted

__all__ = ["to_networkx", "network_to_mermaid", "cpd_frame", "cpd_frames"]


def to_networkx(reasoner: FittedModel) -> nx.DiGraph:
    """The fitted network's structure as a DiGraph with ``role`` and ``states`` attributes."""
    check_is_fitted(reasoner)
    s = reasoner.structure_
    graph = nx.DiGraph()
    for node, states in s.states.items():
        graph.add_node(node, role=s.roles[node], states=list(states))
    graph.add_edges_from(s.edges)
    return graph


def _mermaid_id(node: str) -> str:
    return "n_" + re.sub(r"[^0-9A-Za-z_]", "_", node)


def network_to_mermaid(reasoner: FittedModel, *, include_slices: bool = True) -> str:
    """Mermaid ``graph TD`` text of the network (slices grouped in subgraphs).

    Parameters
    ----------
    reasoner : FittedModel
        Fitted.
    include_slices : bool, default=True
        Draw the time-slice nodes (False keeps the causal core: knobs, faults, causes).
    """
    graph = to_networkx(reasoner)
    lines = ["graph TD"]
    slices: dict[str, list[str]] = {}
    for node, data in graph.nodes(data=True):
        if data["role"] == "slice":
            if not include_slices:
                continue
            slices.setdefault(node.split("@")[1], []).append(node)
            continue
        shape = ("([{}])" if data["role"] in ("knob", "latent_knob", "context", "trait")
                 else "{{{{{}}}}}" if data["role"] in ("root_cause", "failure_type") else "[{}]")
        lines.append(f"    {_mermaid_id(node)}" + shape.format(f'"{node}"'))
    for t, nodes in sorted(slices.items()):
        lines.append(f"    subgraph slice_{t}[\"slice {t}\"]")
        lines += [f"        {_mermaid_id(n)}[\"{n}\"]" for n in nodes]
        lines.append("    end")
    for u, v in graph.edges:
        if not include_slices and (graph.nodes[u]["role"] == "slice"
                                   or graph.nodes[v]["role"] == "slice"):
            continue
        lines.append(f"    {_mermaid_id(u)} --> {_mermaid_id(v)}")
    return "\n".join(lines) + "\n"


def cpd_frame(reasoner: FittedModel, node: str) -> pd.DataFrame:
    """The fitted conditional table of ``node``: rows parent configurations, columns states.

    Raises
    ------
    KeyError
        If ``node`` is not in the network (the message lists the nodes).
    """
    check_is_fitted(reasoner)
    s = reasoner.structure_
    if node not in s.states:
        raise KeyError(f"Unknown node {node!r}. Nodes: {sorted(s.states)}")
    cpd = reasoner.network_.get_cpds(node)
    parents = list(cpd.variables[1:])
    values = cpd.get_values()
    if len(parents) == 1:
        index = pd.Index(cpd.state_names[parents[0]], name=parents[0])
    elif parents:
        index = pd.MultiIndex.from_product([cpd.state_names[p] for p in parents], names=parents)
    else:
        index = pd.Index(["(prior)"], name="parents")
    return pd.DataFrame(values.T, index=index, columns=pd.Index(cpd.state_names[node],
                                                                  name=node))


def cpd_frames(reasoner: FittedModel) -> dict[str, pd.DataFrame]:
    """Every conditional table, by node."""
    return {node: cpd_frame(reasoner, node) for node in reasoner.structure_.states}
