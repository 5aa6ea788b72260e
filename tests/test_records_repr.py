"""Hypotheses and coupled failures of a real run read in one short line in Python."""

from __future__ import annotations

from zoo_runs import zoo_trace

import neuraldbg as ndb


def test_repr_and_str_are_one_short_line():
    trace = zoo_trace("lr_too_high")
    hyps = ndb.explain(trace)
    coupled = ndb.detect_coupled_failures(trace)
    assert hyps and coupled
    assert len(str(hyps[0].to_dict())) > 2000  # the metadata really is kilobytes
    for h in hyps:
        for text in (repr(h), str(h)):
            assert "\n" not in text and len(text) < 250, text
        assert h.failure_type in repr(h) and repr(h.origin_layer) in repr(h)
        assert f"{h.confidence:.3f}" in repr(h) and "metadata: {" in repr(h)
    top = hyps[0]
    assert str(top) == (f"{top.failure_type} caused by {top.root_cause}, from layer "
                        f"{top.origin_layer!r} at step {top.origin_step} "
                        f"(confidence {top.confidence:.2f})")
    for pair in coupled:
        for text in (repr(pair), str(pair), repr(pair.cause)):
            assert "\n" not in text and len(text) < 250, text
        assert pair.relation in repr(pair) and f"+{pair.step_gap} steps" in repr(pair)
    assert len(repr(hyps)) < 250 * len(hyps)
