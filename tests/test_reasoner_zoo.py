"""Cross-check on a few failure-zoo scenarios (ground truth from the trace, never hard-coded).

The core end-to-end tests build their own models (tests/test_reasoner_e2e.py); these only
add scenarios the zoo defines, at a seed the reasoner's thresholds were not chosen on.
"""

from __future__ import annotations

import pytest

import experiments
import neuraldbg as ndb

FAST = ["init_too_large", "resnet_no_norm", "lr_spike", "unnormalized_inputs"]


@pytest.mark.parametrize("family", FAST)
def test_zoo_scenario_diagnosed_as_labelled(family):
    assert family in {f.name for f in experiments.list_families()}, f"zoo lost {family!r}"
    trace = experiments.run_scenario(family, seed=5)
    truth = trace.ground_truth
    hyps = ndb.explain(trace)
    assert hyps and hyps[0].confidence >= 0.5
    top = hyps[0]
    assert top.failure_type == truth["failure_type"]
    assert top.root_cause == truth["root_cause"]
    assert top.origin_layer in truth["origin_layers"]
    assert abs(top.origin_step - truth["onset_step"]) <= truth["onset_tolerance"]
