"""Causal graph and Mermaid export: safe ids, escaped labels, labelled and unique edges."""

from __future__ import annotations

import re

import pytest

from neuraldbg.graph import build_causal_graph, escape_label, to_mermaid
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
    text = to_mermaid(graph)
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
    assert graph.edges["layer:b", "layer:c"]["step_gap"] == 2
    assert graph.has_edge("cause:learning_rate_too_high", "failure:dead_neurons")


def test_graph_merges_relations_and_never_adds_a_two_cycle():
    hyps = [_hyp("dead_neurons", "negative_bias_init", "a", 0, 0.9, path=["b"], path_steps=[1]),
            _hyp("exploding_gradients", "unknown", "b", 2, 0.8, path=["a"], path_steps=[3])]
    graph = build_causal_graph(hyps)
    assert graph.has_edge("layer:a", "layer:b") and not graph.has_edge("layer:b", "layer:a")


def test_mermaid_direction_is_validated():
    with pytest.raises(ValueError, match="direction"):
        to_mermaid(build_causal_graph([]), direction="XY")
    assert to_mermaid(build_causal_graph([])) == "flowchart TD\n"
