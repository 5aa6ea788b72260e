"""Capture hot path: what its caches and hook switching must keep right, in real training."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import neuraldbg as ndb


def _train_and_replace_storage(replace_at: int, steps: int = 5):
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 1))  # 6,144 > sample
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    grads, updates = [], []
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(steps):
            if step == replace_at:  # what module.to() and `p.data = ...` do: new storage
                for p in model.parameters():
                    p.data = p.data.clone()
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]).norm())
            before = [p.detach().clone() for p in model.parameters()]
            opt.step()
            updates.append([(p.detach() - b).norm() for p, b in
                            zip(model.parameters(), before, strict=True)])
            dbg.step(loss)
    return dbg.trace, grads, updates


def test_update_norms_follow_parameters_whose_storage_was_replaced():
    trace, grads, updates = _train_and_replace_storage(replace_at=2)
    np.testing.assert_allclose(trace.steps["grad_norm"], [g.item() for g in grads], rtol=1e-5)
    # the second layer (96 + 1 parameters) is measured exactly: its update must be right at
    # every step, also after its storage changed (a stale cached view would read 0 there)
    head = np.array([torch.stack(u[2:]).norm().item() for u in updates])
    got = trace.stats[trace.stats["module_name"] == "2"]
    np.testing.assert_allclose(got["update_ratio"].to_numpy() * got["param_norm"].to_numpy(),
                               head, rtol=1e-4)
    # the 96 x 64 weight's update is estimated from a strided sample: same order after it
    first = np.array([torch.stack(u[:2]).norm().item() for u in updates])
    got0 = trace.stats[trace.stats["module_name"] == "0"]
    est = got0["update_ratio"].to_numpy() * got0["param_norm"].to_numpy()
    np.testing.assert_allclose(est, first, rtol=0.1)
    assert est[2] > 0.5 * first[2]


def test_root_runs_without_hooks_unless_dbg_step_waits_for_the_optimizer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 8)
    with ndb.NeuralDbg(model, optimizer=opt, every=4) as dbg:
        for step in range(8):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            if step % 2:  # dbg.step before opt.step: the root is hooked until a forward
                dbg.step(loss)
                assert len(model._forward_pre_hooks) == 1
                opt.step()
            else:
                opt.step()
                dbg.step(loss)
                assert not model._forward_pre_hooks
    assert not model._forward_pre_hooks and not model[0]._forward_hooks
    assert len(dbg.trace.steps) == 8
    assert dbg.trace.steps["recorded"].tolist() == [s % 4 == 0 for s in range(8)]


def _by_hand_run(every: int, steps: int = 6):
    """A small MLP (every output and parameter under the sample size, so nothing is sampled)
    trained under NeuralDbg, with each statistic also computed by hand from the same tensors."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(),
                          nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    x[:, 0] = 0.0  # a few exact zeros and dead units downstream
    margin = ndb.CaptureConfig().tanh_margin
    rows, grad_norms = [], []
    with ndb.NeuralDbg(model, optimizer=opt, every=every) as dbg:
        for step in range(steps):
            opt.zero_grad()
            h, outs = x, []
            for layer in model:  # the same calls model(x) makes, each output kept
                h = layer(h)
                h.retain_grad()
                outs.append(h)
            loss = nn.functional.cross_entropy(h, y)
            loss.backward()
            before = [[p.detach().clone() for p in layer.parameters()] for layer in model]
            grads = [[p.grad.clone() for p in layer.parameters()] for layer in model]
            opt.step()
            dbg.step(loss)
            grad_norms.append(torch.cat([g.flatten() for gs in grads for g in gs]).norm().item())
            if step % every:
                continue
            for i, (layer, out) in enumerate(zip(model, outs, strict=True)):
                o = out.detach()
                row = {"step": step, "module_name": str(i), "act_mean": o.mean().item(),
                       "act_std": o.std(unbiased=False).item(),
                       "act_max_abs": o.abs().max().item(),
                       "act_frac_zero": (o == 0).float().mean().item(),
                       "act_frac_dead": (o.abs().amax(0) == 0).float().mean().item(),
                       "out_grad_norm": out.grad.norm().item()}
                if isinstance(layer, nn.Tanh):
                    row["act_frac_saturated"] = (o.abs() > 1 - margin).float().mean().item()
                if before[i]:
                    after = list(layer.parameters())
                    w = torch.cat([b.flatten() for b in before[i]])
                    dw = torch.cat([(a.detach() - b).flatten()
                                    for a, b in zip(after, before[i], strict=True)])
                    row["param_grad_norm"] = torch.cat([g.flatten() for g in grads[i]]).norm().item()
                    row["param_norm"] = w.norm().item()
                    row["update_ratio"] = (dw.norm() / w.norm()).item()
                rows.append(row)
    return dbg.trace, pd.DataFrame(rows), grad_norms


@pytest.mark.parametrize("every", [1, 2])
def test_recorded_statistics_equal_the_ones_computed_by_hand(every):
    trace, expected, grad_norms = _by_hand_run(every)
    np.testing.assert_allclose(trace.steps["grad_norm"], grad_norms, rtol=1e-5)
    got = trace.stats.set_index(["step", "module_name"]).loc[
        list(zip(expected["step"], expected["module_name"], strict=True))]
    assert len(got) == len(expected) == 5 * len(range(0, 6, every))
    for col in expected.columns.drop(["step", "module_name"]):
        want = expected[col].to_numpy()
        has = ~np.isnan(want)
        np.testing.assert_allclose(got[col].to_numpy()[has], want[has], rtol=1e-5, atol=1e-7,
                                   err_msg=col)
    assert (got["calls"] == 1).all()
    assert expected["act_frac_dead"].max() > 0  # the dead-unit count was exercised


def test_weight_diversity_points_follow_the_weights_across_flushes_and_enters():
    """A flush with no step closed since the last one measures nothing new; a new enter's
    snapshot still reaches the trace, and every point equals the value of the weights then."""
    from neuraldbg.weight_diversity import row_diversity

    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    x, y = torch.randn(16, 5), torch.randint(0, 4, (16,))
    dbg = ndb.NeuralDbg(model, optimizer=opt, flush_every=5)
    by_hand = {}

    def note(step):
        by_hand[step] = [row_diversity(layer.weight) for layer in (model[0], model[2])]

    for epoch in range(2):
        with dbg:
            note(dbg.step_count)
            for _ in range(5):  # ends on a flush boundary: the exit flush follows one
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                dbg.step(loss)
            note(dbg.step_count)
        if epoch == 0:
            with dbg:  # entered and left without a step: its snapshot is kept
                pass
    div = dbg.trace.meta["weight_diversity"]
    assert div["steps"] == [0, 5, 10]
    for i, name in enumerate(("0", "2")):
        np.testing.assert_allclose(div["modules"][name], [by_hand[s][i] for s in div["steps"]],
                                   rtol=1e-6)
    # the weights moved between the points (a stale value would repeat the previous one)
    assert len(set(div["modules"]["0"])) == 3


def test_weight_diversity_skips_scheduled_flushes_but_reads_and_exit_measure_the_weights_now():
    """Scheduled flushes past the first few measure at powers of two only; a read of the
    trace mid-run and the exit measure the weights as they are then."""
    from neuraldbg.weight_diversity import row_diversity

    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    x, y = torch.randn(16, 5), torch.randint(0, 4, (16,))
    dbg = ndb.NeuralDbg(model, optimizer=opt, flush_every=5)
    with dbg:
        for step in range(50):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dbg.step(loss)
            if step == 29:  # the 6th scheduled flush has just skipped measuring
                div = dbg.trace.meta["weight_diversity"]
                assert div["steps"][-1] == 30
                np.testing.assert_allclose(div["modules"]["0"][-1],
                                           row_diversity(model[0].weight), rtol=1e-6)
    div = dbg.trace.meta["weight_diversity"]
    assert div["steps"] == [0, 5, 10, 15, 50]
    np.testing.assert_allclose(div["modules"]["2"][-1], row_diversity(model[2].weight),
                               rtol=1e-6)
