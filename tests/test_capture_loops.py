"""Steps are optimizer steps: the loops people write, each on a healthy model.

Every loop trains a small tanh MLP on y = sin(x_0) through real hooks. The gradient norm each
optimizer received is computed by hand right before it steps and compared with the trace;
both diagnosis methods must judge the run healthy (no hypothesis at confidence >= 0.5).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import neuraldbg as ndb
from neuraldbg.reporting.summary import summarize_run

STEPS = 80


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 1))


def data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(128, 16, generator=g)
    return x, x[:, :1].sin()


def grad_norm(params) -> float:
    grads = [p.grad.flatten() for p in params if p.grad is not None]
    return torch.cat(grads).norm().item()


def assert_healthy(trace: ndb.Trace, methods: tuple[str, ...] = ("heuristic", "probabilistic")
                   ) -> None:
    for method in methods:
        hyps = ndb.explain(trace, method=method)
        assert all(h.confidence < 0.5 for h in hyps), (method, hyps[:2])


def assert_norms(trace: ndb.Trace, expected: list[float]) -> None:
    assert trace.steps["step"].tolist() == list(range(len(expected)))
    assert trace.steps["complete"].all() and np.isfinite(trace.steps["loss"]).all()
    np.testing.assert_allclose(trace.steps["grad_norm"], expected, rtol=1e-3)


def train_plain(model: nn.Module, steps: int, *, every: int = 1,
                probe: torch.Tensor | None = None) -> ndb.Trace:
    """The plain loop on ``data()`` with SGD; ``probe``: a saliency probe before each step
    (a forward and a backward on those inputs, then ``zero_grad``)."""
    x, y = data()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with ndb.NeuralDbg(model, optimizer=opt, every=every) as dbg:
        for _ in range(steps):
            if probe is not None:
                xq = probe.clone().requires_grad_()
                model(xq).sum().backward()
                assert xq.grad is not None
                opt.zero_grad()
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            dbg.step(loss)
    return dbg.trace


def test_validation_forward_between_steps_and_after_the_last():
    model, (x, y) = mlp(), data()
    xv, yv = data(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    expected, val_first = [], []
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(STEPS):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            expected.append(grad_norm(model.parameters()))
            opt.step()
            dbg.step(loss)
            if step % 10 == 0 or step == STEPS - 1:
                val = ((model(xv) - yv) ** 2).mean()  # gradients enabled, no backward
                val_first.append(val.item())
    trace = dbg.trace
    assert_norms(trace, expected)
    assert (trace.stat("calls")["0"] == 1).all()  # the validation forwards are not counted
    assert trace.meta["n_steps"] == STEPS
    assert_healthy(trace)


def test_dbg_step_before_optimizer_step():
    model, (x, y) = mlp(), data()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    expected, updates = [], []
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(STEPS):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            dbg.step(loss)  # before opt.step(): the step closes once the optimizer stepped
            expected.append(grad_norm(model.parameters()))
            before = [p.detach().clone() for p in model.parameters()]
            opt.step()
            updates.append(torch.cat([(p.detach() - b).flatten() for p, b in
                                      zip(model.parameters(), before, strict=True)]).norm().item())
    trace = dbg.trace
    assert_norms(trace, expected)
    np.testing.assert_allclose(trace.steps["update_norm"], updates, rtol=1e-3)
    assert_healthy(trace)


@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.Adam])
def test_optimizer_step_with_a_closure(opt_cls):
    model, (x, y) = mlp(), data()
    opt = opt_cls(model.parameters(), lr=0.05 if opt_cls is torch.optim.SGD else 3e-3)
    expected = []

    def closure():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        expected.append(grad_norm(model.parameters()))
        return loss

    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(STEPS):
            loss = opt.step(closure)  # forward and backward inside the step, as Lightning does
            dbg.step(loss)
    trace = dbg.trace
    assert_norms(trace, expected)
    assert np.isfinite(trace.stat("param_grad_norm")["0"]).all()
    assert_healthy(trace)


def test_lbfgs_step_is_measured_at_its_first_evaluation_and_across_the_whole_step():
    """LBFGS evaluates the closure several times per step, moving the weights in between:
    the step's gradient is the first evaluation's and its update spans the whole step."""
    torch.manual_seed(0)
    model, (x, y) = mlp(), data()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    first, updates = [], []

    def closure():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        if len(first) == len(updates):  # the step's first evaluation
            first.append(grad_norm(model.parameters()))
        return loss

    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(6):
            before = [p.detach().clone() for p in model.parameters()]
            loss = opt.step(closure)
            updates.append(torch.cat([(p.detach() - b).flatten() for p, b in
                                      zip(model.parameters(), before, strict=True)]).norm())
            dbg.step(loss)
    trace = dbg.trace
    np.testing.assert_allclose(trace.steps["grad_norm"], first, rtol=1e-4)
    np.testing.assert_allclose(trace.steps["update_norm"], [u.item() for u in updates],
                               rtol=1e-4)


def test_sparse_embedding_gradients_are_measured_not_fatal():
    """nn.Embedding(sparse=True) gives sparse gradients, which no norm kernel takes: the
    capture measures their values and the training loop runs on."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(500, 16, sparse=True), nn.Flatten(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = torch.randint(0, 500, (32, 4))
    target = torch.randn(32, 1)
    expected = []
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(5):
            opt.zero_grad()
            loss = ((model(tokens) - target) ** 2).mean()
            loss.backward()
            expected.append(torch.cat([p.grad.to_dense().flatten()
                                       for p in model.parameters()]).norm().item())
            opt.step()
            dbg.step(loss)
    np.testing.assert_allclose(dbg.trace.steps["grad_norm"], expected, rtol=1e-5)


def test_grad_scaler_on_cpu_records_unscaled_statistics():
    torch.manual_seed(0)
    plain_model = mlp()
    scaled_model = mlp()
    scaled_model.load_state_dict(plain_model.state_dict())
    x, y = data()
    traces, norms = [], []
    for model, use_scaler in ((plain_model, False), (scaled_model, True)):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16) if use_scaler else None
        expected = []
        with ndb.NeuralDbg(model, optimizer=opt, scaler=scaler) as dbg:
            for _ in range(STEPS):
                opt.zero_grad()
                loss = ((model(x) - y) ** 2).mean()
                if scaler is None:
                    loss.backward()
                    expected.append(grad_norm(model.parameters()))
                    opt.step()
                else:
                    scaler.scale(loss).backward()
                    scaler.unscale_(opt)
                    expected.append(grad_norm(model.parameters()))
                    scaler.step(opt)
                    scaler.update()
                dbg.step(loss)
        traces.append(dbg.trace)
        norms.append(expected)
    plain, scaled = traces
    assert_norms(scaled, norms[1])
    np.testing.assert_allclose(norms[1], norms[0], rtol=1e-3)  # the same run, unscaled
    for column in ("out_grad_norm", "param_grad_norm"):
        np.testing.assert_allclose(scaled.stat(column).to_numpy(), plain.stat(column).to_numpy(),
                                   rtol=1e-3, err_msg=column)
    assert scaled.meta["grad_scaler"] is True
    assert_healthy(scaled)


def test_float16_steps_a_grad_scaler_skips_are_marked_and_raise_no_alarm():
    """Float16 autocast from a scale of 2^24: the scaled gradients overflow at first and the
    scaler skips those optimizer steps while it lowers the scale (as on a GPU). Those steps
    are rows with ``stepped`` False (and no gradient norm); their overflowed gradients are
    no evidence of a failure: both methods judge the run healthy and ``show`` finds nothing
    non-finite."""
    torch.manual_seed(0)
    model, (x, y) = mlp(), data()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24, growth_interval=10)
    expected, skipped = [], []
    with ndb.NeuralDbg(model, optimizer=opt, scaler=scaler) as dbg:
        for _ in range(STEPS):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                out = model(x)
            loss = ((out.float() - y) ** 2).mean()
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            expected.append(grad_norm(model.parameters()))
            scale = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            skipped.append(scaler.get_scale() < scale)
            dbg.step(loss)
    steps = dbg.trace.steps
    skipped_arr = np.asarray(skipped)
    assert 3 <= skipped_arr.sum() < STEPS // 2  # the scaler did skip steps, and trained
    np.testing.assert_array_equal(steps["stepped"].to_numpy(), ~skipped_arr)
    assert steps.loc[skipped_arr, "grad_norm"].isna().all()
    np.testing.assert_allclose(steps.loc[~skipped_arr, "grad_norm"],
                               np.asarray(expected)[~skipped_arr], rtol=1e-3)
    assert_healthy(dbg.trace)
    summary = summarize_run(dbg.trace)
    assert summary.first_nonfinite is None
    assert summary.n_skipped == skipped_arr.sum()


def test_a_probe_backward_whose_gradients_are_cleared_is_not_part_of_the_next_step():
    """A saliency probe between steps (a forward and a backward on other inputs, then
    ``zero_grad``) trained nothing: the next step's statistics are those of its own forward
    and backward, as in the same run without the probe."""
    torch.manual_seed(0)
    plain_model = mlp()
    probed_model = mlp()
    probed_model.load_state_dict(plain_model.state_dict())
    xp, _ = data(1)
    traces = [train_plain(plain_model, 20), train_plain(probed_model, 20, probe=xp * 3)]
    plain, probed = traces
    assert (probed.stats["calls"] == 1).all()
    for column in ("act_mean", "act_std", "act_max_abs", "out_grad_norm", "param_grad_norm"):
        np.testing.assert_allclose(probed.stat(column).to_numpy(), plain.stat(column).to_numpy(),
                                   rtol=1e-5, err_msg=column)
    assert_healthy(probed)


def test_gradient_accumulation():
    model, (x, y) = mlp(), data()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    expected = []
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(STEPS):
            opt.zero_grad()
            total = 0.0
            for xb, yb in zip(x.chunk(4), y.chunk(4), strict=True):
                loss = ((model(xb) - yb) ** 2).mean() / 4
                loss.backward()
                total += loss.detach()
            expected.append(grad_norm(model.parameters()))
            opt.step()
            dbg.step(total)  # once per optimizer step
    trace = dbg.trace
    assert_norms(trace, expected)
    assert (trace.stat("calls")["0"] == 4).all()
    assert_healthy(trace)


def test_two_optimizers_each_measured_when_it_steps():
    model, (x, y) = mlp(), data()
    body = [p for m in model[:-1] for p in m.parameters()]
    head = list(model[-1].parameters())
    opt_body = torch.optim.SGD(body, lr=0.05)
    opt_head = torch.optim.Adam(head, lr=3e-3)
    expected, head_moves = [], []
    with ndb.NeuralDbg(model, optimizer=[opt_body, opt_head]) as dbg:
        for _ in range(STEPS):
            opt_body.zero_grad()
            opt_head.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            expected.append(grad_norm(model.parameters()))
            w = model[-1].weight.detach().clone()
            opt_body.step()
            opt_head.step()
            head_moves.append(((model[-1].weight.detach() - w).norm() / w.norm()).item())
            dbg.step(loss)
    trace = dbg.trace
    assert_norms(trace, expected)
    ratio = trace.stat("update_ratio")["4"].to_numpy()
    assert (ratio > 0).all()
    # the head's weight and bias together: close to the weight's own ratio
    np.testing.assert_allclose(ratio, head_moves, rtol=0.5)
    assert trace.meta["optimizer_class"] == ["SGD", "Adam"]
    assert_healthy(trace)


def test_one_of_two_optimizers_given_warns_and_names_the_parameters():
    model = mlp()
    opt_body = torch.optim.SGD([p for m in model[:-1] for p in m.parameters()], lr=0.05)
    with pytest.warns(ndb.NeuralDbgWarning, match=r"optimizer=\[opt_a, opt_b\]") as rec:
        ndb.NeuralDbg(model, optimizer=opt_body)
    assert "4.weight" in str(rec[0].message)


def _gan_trace() -> tuple[ndb.Trace, list[float]]:
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    disc = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1))
    gan = nn.ModuleDict({"gen": gen, "disc": disc})
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-3, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-3, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(0)
    real = torch.randn(256, 2, generator=g) * 0.5 + 4.0
    expected = []
    with ndb.NeuralDbg(gan, optimizer=[opt_d, opt_g]) as dbg:
        for _ in range(STEPS):
            z = torch.randn(256, 4, generator=g)
            opt_d.zero_grad()
            d_loss = (bce(disc(real), torch.ones(256, 1))
                      + bce(disc(gen(z).detach()), torch.zeros(256, 1)))
            d_loss.backward()
            d_norm = grad_norm(disc.parameters())
            opt_d.step()
            opt_g.zero_grad()
            g_loss = bce(disc(gen(z)), torch.ones(256, 1))
            g_loss.backward()
            g_norm = grad_norm(gen.parameters())
            opt_g.step()
            expected.append(float(np.hypot(d_norm, g_norm)))
            # the discriminator's loss, which falls while it learns to tell the samples apart
            # (a GAN near equilibrium reads as a plateau to both reasoners, whatever is recorded)
            dbg.step(d_loss)
    return dbg.trace, expected


def test_gan_loop_with_two_optimizers():
    trace, expected = _gan_trace()
    assert_norms(trace, expected)
    s = trace.stats.set_index(["step", "module_name"])
    # the detached generator forward of the discriminator step is not counted
    assert (s.xs("gen.0", level="module_name")["calls"] == 1).all()
    linear = s.index.get_level_values("module_name").str.endswith(("0", "2"))
    assert np.isfinite(s.loc[linear, "param_grad_norm"]).all()
    assert_healthy(trace, ("heuristic",))


def test_gan_loop_is_healthy_for_the_probabilistic_model():
    """Its model reads the discriminator's flat loss as a plateau (progress 'none'); with two
    optimizers stepping (the GAN's players) no method may claim a plateau from the loss."""
    trace, _ = _gan_trace()
    assert trace.meta["optimizer_class"] == ["Adam", "Adam"]
    assert_healthy(trace, ("probabilistic",))
    hyps = ndb.explain(trace, method="probabilistic")
    assert all("GAN" in h.metadata["thin_evidence"] for h in hyps
               if h.failure_type == "training_plateau")


def test_exception_inside_the_block_leaves_only_whole_steps(tmp_path):
    model, (x, y) = mlp(), data()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    expected = []
    dbg = ndb.NeuralDbg(model, optimizer=opt, out=tmp_path / "run", flush_every=16)
    with pytest.raises(KeyboardInterrupt):
        with dbg:
            for step in range(STEPS + 10):
                opt.zero_grad()
                loss = ((model(x) - y) ** 2).mean()
                if step == STEPS:
                    raise KeyboardInterrupt  # the user stops the run mid-forward
                loss.backward()
                expected.append(grad_norm(model.parameters()))
                opt.step()
                dbg.step(loss)
    trace = ndb.load_trace(tmp_path / "run")
    assert_norms(trace, expected)
    assert trace.meta["status"] == "failed" and trace.meta["n_steps"] == STEPS
    assert_healthy(trace)


def test_the_warning_for_parameters_no_optimizer_holds_points_at_the_users_line():
    """A head left out of the optimizer: the warning names the line that built the
    recorder (it said ``sys:1`` from a script's top level, the frame above the caller)."""
    model = mlp()
    opt = torch.optim.SGD(model[0].parameters(), lr=0.05)
    with pytest.warns(ndb.NeuralDbgWarning, match="in none of the optimizers") as caught:
        ndb.NeuralDbg(model, optimizer=opt)
    assert caught[0].filename == __file__


def test_a_compiled_model_runs_the_hooks_eagerly_and_records_what_eager_does():
    """``torch.compile(model)`` given to the recorder: Dynamo must not trace the hooks (it
    warned about their caches and recompiled past its limit, 20x slower than eager); the
    statistics equal the eager run's. The ``aot_eager`` backend exercises Dynamo without a
    C++ compiler."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager_model = mlp()
    compiled_source = mlp()
    compiled_source.load_state_dict(eager_model.state_dict())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traces = [train_plain(eager_model, 24, every=4),
                  train_plain(torch.compile(compiled_source, backend="aot_eager"), 24, every=4)]
    dynamo = [str(w.message)[:120] for w in caught if "dynamo" in str(w.filename).lower()
              or "recompile" in str(w.message).lower()]
    assert not dynamo, dynamo
    eager, compiled = traces
    assert compiled.module_names == [f"_orig_mod.{n}" for n in eager.module_names]
    for column in ("act_std", "act_mean", "out_grad_norm", "param_grad_norm"):
        np.testing.assert_allclose(compiled.stat(column).to_numpy(),
                                   eager.stat(column).to_numpy(), rtol=1e-4, err_msg=column)
