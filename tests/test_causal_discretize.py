"""Discretization on real small training runs: bounded size, states that match the run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import neuraldbg as ndb
from causal_models.discretize import discretize, slice_node
from causal_models.evidence import observe_knobs
from causal_models.origin import locate_origin


def _train(depth: int = 3, steps: int = 40, lr: float = 0.05, act: type[nn.Module] = nn.ReLU,
           bias: float | None = None, every: int = 1, seed: int = 0,
           config: bool = True) -> ndb.Trace:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    width = 16
    for i in range(depth):
        lin = nn.Linear(8 if i == 0 else width, width)
        if bias is not None:
            with torch.no_grad():
                lin.bias.fill_(bias)
        layers += [lin, act()]
    layers.append(nn.Linear(width, 3))
    model = nn.Sequential(*layers)
    x = torch.randn(128, 8)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    with ndb.NeuralDbg(model, optimizer=opt, every=every,
                       config={"lr": lr, "optimizer": "sgd"} if config else None) as dbg:
        for _ in range(steps):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dbg.step(loss)
    return dbg.trace


def _slice_nodes(states: dict[str, str]) -> list[str]:
    return [k for k in states if "@" in k]


def test_network_size_is_bounded_for_any_depth_and_length() -> None:
    small = discretize(_train(depth=2, steps=12), n_slices=4, n_blocks=3)
    large = discretize(_train(depth=9, steps=60, every=3), n_slices=4, n_blocks=3)
    assert sorted(small.states) == sorted(large.states)
    assert len(_slice_nodes(small.states)) == 4 * (1 + 2 * 3)
    assert len(large.blocks) == 3 and sum(len(b) for b in large.blocks) == 19


def test_healthy_run_learns_and_keeps_gradients_healthy() -> None:
    disc = discretize(_train(steps=80, lr=0.1))
    assert disc.onset_step is None
    assert disc.states[slice_node("loss", 3)] in ("decreasing", "low")
    assert {disc.states[slice_node("grad", t, b)] for t in range(4) for b in range(3)} == {
        "healthy"}
    assert disc.states["update"] in ("small", "normal")
    assert observe_knobs(_train(steps=2, lr=0.1))["lr_config"] == "typical"


def test_diverging_run_is_nonfinite_after_its_onset_and_fine_before() -> None:
    trace = _train(steps=40, lr=20.0, act=nn.GELU)
    assert not np.isfinite(trace.steps["loss"]).all()
    disc = discretize(trace)
    assert disc.onset_step is not None
    first_bad = int(trace.steps["step"][~np.isfinite(trace.steps["loss"])].min())
    assert disc.onset_step <= first_bad
    assert disc.states[slice_node("loss", 3)] == "nonfinite"
    assert disc.states["update"] in ("large", "nonfinite")
    assert observe_knobs(trace)["lr_config"] == "high"
    # slices are anchored on the onset: the onset window starts there
    assert disc.slices[2][0] == disc.onset_step


def test_negative_bias_kills_relus_and_the_origin_is_a_dead_layer() -> None:
    trace = _train(depth=3, steps=20, bias=-20.0)
    disc = discretize(trace)
    assert all(disc.states[slice_node("act", t, 0)] == "dead" for t in range(4))
    layer, step, path = locate_origin(trace, disc, "dead_neurons")
    assert trace.modules.set_index("module_name").at[layer, "module_type"] == "ReLU"
    assert step == 0 and path[0].startswith("block 0")


def test_knob_observation_reads_module_table_and_config() -> None:
    trace = _train(depth=8, steps=5, act=nn.Sigmoid)
    knobs = observe_knobs(trace)
    assert knobs["activation"] == "sigmoid" and knobs["depth"] == "deep"
    assert knobs["normalization"] == "none" and knobs["clipping"] == "none"
    assert knobs["arch"] == "feedforward"


def test_ground_truth_is_never_read() -> None:
    trace = _train(steps=15)
    before = discretize(trace).states
    trace.meta["ground_truth"] = {"failure_type": "dead_neurons", "root_cause": "x"}
    assert discretize(trace).states == before


def test_invalid_sizes_and_empty_trace_raise() -> None:
    trace = _train(steps=3)
    with pytest.raises(ValueError, match="n_slices must be >= 2"):
        discretize(trace, n_slices=1)
    empty = ndb.Trace(steps=trace.steps.iloc[:0], stats=trace.stats.iloc[:0],
                      modules=trace.modules, meta={})
    with pytest.raises(ValueError, match="no steps"):
        discretize(empty)


def test_a_run_without_a_config_reads_its_rate_from_the_optimizer_and_leaves_the_rest_out(
        ) -> None:
    """Most users pass no config. The rate is still known (the capture reads it from the
    optimizer); the init and the inputs' scale are not, and the network must not read
    their "unknown" as a state: its tables learnt "unknown" from a zoo that always states
    them, where it counted 7x for a large init and 14x for large inputs."""
    import causal_models

    fine, hot = _train(steps=5, lr=0.05, config=False), _train(steps=5, lr=20.0, config=False)
    assert fine.meta["config"] == {} and fine.meta["optimizer_class"] == "SGD"
    assert observe_knobs(fine)["lr_config"] == "typical"
    assert observe_knobs(hot)["lr_config"] == "high"
    knobs = observe_knobs(fine)
    assert knobs["init_config"] == "unknown" and knobs["input_config"] == "unknown"
    model = causal_models.load_default_model()
    evidence = model.evidence(fine)
    assert evidence["lr_config"] == "typical"
    assert "init_config" not in evidence and "input_config" not in evidence
    # explain reads the same evidence (it observed "unknown" while evidence() left it out)
    for trace in (fine, hot):
        hyps = model.explain(trace)
        assert hyps and all(h.metadata["evidence"] == model.evidence(trace) for h in hyps)
