"""Causal graph and Mermaid export: safe ids, escaped labels, labelled and unique edges."""

from __future__ import annotations

import re

import networkx as nx
import pytest
from zoo_runs import zoo_families, zoo_trace

import neuraldbg as ndb
from neuraldbg.graph import build_causal_graph, escape_label, graph_to_mermaid, layer_node
from neuraldbg.methods import causal_graph
from neuraldbg.records import Hypothesis

_WEIRD = 'enc.layers.0["attn"]|<x> #1 & "q"'


def _hyp(failure, cause, layer, step, conf, path=(), path_steps=(), explained_by=None):
    meta = {"propagation": {"path": list(path), "path_steps": list(path_steps)},
            "explained_by": explained_by or {}}
    return Hypothesis(failure, cause, layer, step, conf, meta)


def test_escape_label_leaves_no_mermaid_metacharacters():
    out = escape_label(_WEIRD)
    assert not set('"<>|&') & set(out.replace("#quot;", "").replace("#lt;", "")
                                  .replace("#gt;", "").replace("#124;", "")
                                  .replace("#amp;", ""))
    assert "#35;1" in out and "#quot;attn#quot;" in out


def test_mermaid_is_valid_flowchart_with_safe_ids_and_no_duplicate_edges():
    hyps = [
        _hyp("dead_neurons", "negative_bias_init", _WEIRD, 3, 0.9, path=["b", "c"],
             path_steps=[4, 6]),
        _hyp("dead_neurons", "learning_rate_too_high", _WEIRD, 3, 0.7),  # same failure again
        _hyp("vanishing_gradients", "unknown", "b", 4, 0.3, explained_by={"dead_neurons": 0.9}),
        _hyp("training_plateau", "unknown", "a", 0, 0.05),  # below the graph's cut
    ]
    graph = build_causal_graph(hyps)
    text = graph_to_mermaid(graph)
    lines = text.strip().splitlines()
    assert lines[0] == "flowchart TD"
    ids = re.compile(r"n\d+")
    edges = []
    for line in lines[1:]:
        if "-->" in line:
            m = re.fullmatch(r'    (n\d+) -->\|"([^"|]+)"\| (n\d+)', line)
            assert m, line
            edges.append((m.group(1), m.group(3)))
            assert re.fullmatch(r"[a-z_/]+(, [+-]?\d+ steps)?", m.group(2)), m.group(2)
        elif line.startswith("    class"):
            continue
        else:
            m = re.fullmatch(r'    (n\d+)(\["[^"]*"\]|\(\["[^"]*"\]\)|\{\{"[^"]*"\}\})', line)
            assert m and ids.fullmatch(m.group(1)), line
    assert len(edges) == len(set(edges)) == graph.number_of_edges()
    assert "training_plateau" not in text
    assert graph.edges["failure:dead_neurons", "failure:vanishing_gradients"]["relation"] == (
        "explains")
    assert graph.edges[layer_node("dead_neurons", "b"),
                       layer_node("dead_neurons", "c")]["step_gap"] == 2
    assert graph.has_edge("cause:learning_rate_too_high", "failure:dead_neurons")


def test_two_failures_travelling_opposite_ways_stay_acyclic():
    # dead units travel forward a -> b, the gradient explosion backward b -> a: on shared
    # layer nodes this was a cycle; as layer events both chains are kept and the graph is a DAG
    hyps = [_hyp("dead_neurons", "negative_bias_init", "a", 0, 0.9, path=["b"], path_steps=[1],
                 explained_by={"exploding_gradients": 0.8}),
            _hyp("exploding_gradients", "unknown", "b", 2, 0.8, path=["a"], path_steps=[3],
                 explained_by={"dead_neurons": 0.9})]
    graph = build_causal_graph(hyps)
    assert nx.is_directed_acyclic_graph(graph)
    assert graph.has_edge(layer_node("dead_neurons", "a"), layer_node("dead_neurons", "b"))
    assert graph.has_edge(layer_node("exploding_gradients", "b"),
                          layer_node("exploding_gradients", "a"))
    # the two failures explain each other in the metadata: only the first direction is drawn
    assert graph.has_edge("failure:exploding_gradients", "failure:dead_neurons")
    assert not graph.has_edge("failure:dead_neurons", "failure:exploding_gradients")


def test_mermaid_direction_is_validated():
    with pytest.raises(ValueError, match="direction"):
        graph_to_mermaid(build_causal_graph([]), direction="XY")
    assert graph_to_mermaid(build_causal_graph([])) == "flowchart TD\n"


@pytest.mark.parametrize("family", zoo_families())
def test_causal_graph_of_every_zoo_run_is_a_dag(family):
    trace = zoo_trace(family)
    graph = causal_graph(trace)
    assert nx.is_directed_acyclic_graph(graph), list(nx.simple_cycles(graph))[:3]
    hyps = [h for h in ndb.explain(trace) if h.confidence >= 0.1]
    # every failure the diagnosis names is in the graph, with the layer where it began
    for h in hyps:
        assert f"failure:{h.failure_type}" in graph
    for node, data in graph.nodes(data=True):
        if data["kind"] == "failure":
            assert graph.has_edge(node, layer_node(node.split(":", 1)[1], data["origin_layer"]))
    # the Mermaid text draws exactly these edges
    text = ndb.export_mermaid_causal_graph(trace)
    assert sum("-->" in line for line in text.splitlines()) == graph.number_of_edges()
