"""Bugs in the training script, written the way users write them, against their healthy twin.

Each failing run has a twin that differs only by the bug; the heuristic must name the bug
(not a learning-rate story) on the failing run and raise nothing on the twin.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import neuraldbg as ndb
from neuraldbg.events import loss_dynamics
from neuraldbg.methods import heuristic_diagnosis
from neuraldbg.outside_vocabulary import batchnorm_off_factor, narrow_layer
from neuraldbg.reporting import summarize_run, verdict
from neuraldbg.sufficiency import output_module

_X, _Y = load_digits(return_X_y=True)
X = torch.tensor(_X, dtype=torch.float32) / 16.0
Y = torch.tensor(_Y)


def _mlp(out: int = 10) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, out))


def _train(model: nn.Module, opt: torch.optim.Optimizer, loss_fn, targets: torch.Tensor, *,
           zero_grad: bool = True, zero_grad_every: int = 1, steps: int = 150,
           inputs: torch.Tensor = X,
           backward: bool = True, zero_grad_after_backward: bool = False,
           clip: float | None = None, step: bool = True,
           batches: Iterator[torch.Tensor] | None = None, every: int = 1,
           batch: int = 64, generator: torch.Generator | None = None,
           after_step: Callable[[int, torch.Tensor], None] | None = None) -> ndb.Trace:
    """The usual loop; each keyword turns one line of it into a bug users write.

    Minibatches of ``batch`` drawn at random (with ``generator``, by default one seeded
    with 0), or the indices ``batches`` yields; module statistics every ``every`` steps;
    ``after_step(step, loss)`` runs at the end of each step (a scheduler, a rate set by
    hand); ``zero_grad_every=k`` clears the gradients at every k-th step only."""
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    with ndb.NeuralDbg(model, optimizer=opt, every=every) as dbg:
        for i in range(steps):
            idx = next(batches) if batches is not None else torch.randint(
                0, len(inputs), (batch,), generator=g)
            if zero_grad and i % zero_grad_every == 0:
                opt.zero_grad()
            loss = loss_fn(model(inputs[idx]), targets[idx])
            if backward:
                loss.backward()
            if zero_grad_after_backward:
                opt.zero_grad()  # meant to be the first line of the loop
            if clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            if step:
                opt.step()
            dbg.step(loss)
            if after_step is not None:
                after_step(i, loss)
    return dbg.trace


def _top(trace: ndb.Trace) -> ndb.Hypothesis | None:
    hyps = ndb.explain(trace)
    return hyps[0] if hyps and hyps[0].confidence >= 0.5 else None


def _assert_healthy(trace: ndb.Trace) -> None:
    assert _top(trace) is None, _top(trace)


def test_gradients_never_reset_are_named_not_the_learning_rate() -> None:
    model = _mlp()
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                   F.cross_entropy, Y, zero_grad=False)
    top = _top(trace)
    assert top is not None and top.root_cause == "missing_zero_grad", top
    assert top.metadata["cause_evidence"]["grad_growth_exponent"] > 0.8
    model = _mlp()
    _assert_healthy(_train(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                           F.cross_entropy, Y))


@pytest.mark.xfail(strict=True, reason="a forgotten zero_grad is a code bug without a fault "
                   "node, which no knob moves; as a latent trait whose fault hangs on the "
                   "clipping this passes, but the trait's posterior stays at its prior in "
                   "every other run and the zoo's held-out fixes fell 25 -> 23 of 28 "
                   "(docs/design-notes.md, session 27)")
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_clip_caps_gradients_never_reset_and_what_if_says_so(optimizer: str) -> None:
    """Without ``zero_grad`` the summed gradient grows with every step; a gradient-norm clip
    caps the step it feeds, and the same script with ``clip_grad_norm_(params, 1.0)``
    trains, under SGD and under Adam. A forgotten ``zero_grad`` is a code bug without a
    fault node, which no knob can move: ``what_if(grad_clip=1.0)`` says 0.997 (a helper's
    user probe)."""
    def opt(model: nn.Module) -> torch.optim.Optimizer:
        return (torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9) if optimizer == "sgd"
                else torch.optim.Adam(model.parameters(), lr=3e-3))

    model = _mlp()
    trace = _train(model, opt(model), F.cross_entropy, Y, zero_grad=False)
    top = ndb.explain(trace, method="probabilistic")[0]
    assert top.root_cause == "missing_zero_grad" and top.confidence >= 0.5, top
    model = _mlp()
    clipped = _train(model, opt(model), F.cross_entropy, Y, zero_grad=False, clip=1.0)
    loss = clipped.steps["loss"].to_numpy()
    assert np.mean(loss[-10:]) < 0.5 * loss[0]  # the premise: the clipped script learns
    assert ndb.what_if(trace, grad_clip=1.0).p_failure < 0.5
    assert ndb.what_if(trace, grad_clip=1e9).p_failure >= 0.5  # a clip that never bites


@pytest.mark.parametrize("method", ["heuristic", "probabilistic"])
def test_gradients_reset_only_every_8_steps_are_named_not_the_learning_rate(method: str
                                                                           ) -> None:
    """An accumulation loop gone wrong: the optimizer steps at every batch, zero_grad runs
    at every 8th. The gradient norm climbs for 8 steps and falls at each reset; both methods
    said learning_rate_too_high at 0.66-1.00 (a user-style probe, 3 of 3 seeds), and a
    lower rate only slows the blow-up. The twin that clears every step is healthy."""
    def run(every: int) -> ndb.Trace:
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return _train(model, opt, F.cross_entropy, Y, zero_grad_every=every, steps=160)

    hyps = ndb.explain(run(8), method=method)
    assert hyps and hyps[0].confidence >= 0.5, hyps[:2]
    assert hyps[0].root_cause == "missing_zero_grad", hyps[:2]
    assert not [h for h in ndb.explain(run(1), method=method) if h.confidence >= 0.5]


@pytest.mark.parametrize("method", ["heuristic", "probabilistic"])
def test_gradients_summed_under_adam_grow_into_exploding_not_a_plateau(method: str) -> None:
    """Adam normalises its step, so gradients that are never reset grow 230x over 150
    steps while the loss still creeps down (2.31 -> 1.9). The network's gradient states
    measured the growth from the first slice's mean, which already held most of it, and
    read "healthy" in every slice: it said a plateau (0.45 here; 0.88-0.90 on the zoo's two
    runs of the CNN twin). From each block's early level the late slice reads
    ``exploding``, and both methods name the failure and the bug; the twin that clears the
    gradients every step stays healthy in every slice."""
    from causal_models.discretize import discretize

    def run(zero_grad: bool) -> ndb.Trace:
        model = _mlp()
        return _train(model, torch.optim.Adam(model.parameters(), lr=3e-3), F.cross_entropy,
                      Y, zero_grad=zero_grad, steps=150)

    bug, twin = run(False), run(True)
    late = {k: v for k, v in discretize(bug, n_slices=2, n_blocks=2).states.items()
            if k.startswith("grad[") and k.endswith("@1")}
    assert set(late.values()) == {"exploding"}, late
    assert {v for k, v in discretize(twin, n_slices=2, n_blocks=2).states.items()
            if k.startswith("grad[")} == {"healthy"}
    top = ndb.explain(bug, method=method)[0]
    assert top.confidence >= 0.5, top
    assert (top.failure_type, top.root_cause) == ("exploding_gradients", "missing_zero_grad")
    assert not [h for h in ndb.explain(twin, method=method) if h.confidence >= 0.5]


def test_a_softmax_before_cross_entropy_is_named_not_a_low_rate() -> None:
    model = nn.Sequential(_mlp(), nn.Softmax(dim=1))
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, Y)
    top = _top(trace)
    assert top is not None and top.root_cause == "loss_output_mismatch", top
    model = _mlp()
    _assert_healthy(_train(model, torch.optim.SGD(model.parameters(), lr=0.1),
                           F.cross_entropy, Y))


class _SoftmaxInForward(nn.Module):
    """The MLP with ``F.softmax`` in its ``forward``: no module shows the probabilities."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(self.body(x), dim=1)


def _nll_of_probabilities(probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.nll_loss(torch.log(probs + 1e-9), target)


@pytest.mark.parametrize("method", ["heuristic", "probabilistic"])
def test_a_softmax_in_forward_before_cross_entropy_is_named_and_nll_on_its_log_is_healthy(
        method: str) -> None:
    model = _SoftmaxInForward()
    bug = _train(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, Y)
    out = bug.meta["model_output"]
    assert out["width"] == 10 and out["min"] >= 0 and out["row_sum_error"] < 1e-4, out
    top = ndb.explain(bug, method=method)[0]
    assert top.confidence >= 0.5, top
    assert (top.failure_type, top.root_cause) == ("training_plateau", "loss_output_mismatch")
    # the same probabilities read rightly (the log of them under nll_loss) train
    model = _SoftmaxInForward()
    twin = _train(model, torch.optim.SGD(model.parameters(), lr=0.1), _nll_of_probabilities, Y)
    assert not [h for h in ndb.explain(twin, method=method) if h.confidence >= 0.5]


@pytest.mark.parametrize("scale, bug", [(5000.0, True), (1.0, False)])
def test_regression_targets_far_off_the_output_scale(scale: float, bug: bool) -> None:
    """A price in dollars (~1e5) against the same target standardised."""
    price = X.sum(1, keepdim=True)
    target = (price * scale + 20.0 * scale) if bug else (price - price.mean()) / price.std()
    model = _mlp(out=1)
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=1e-3), F.mse_loss, target)
    top = _top(trace)
    if bug:
        assert top is not None and top.root_cause == "unscaled_targets", top
    else:
        assert all(h.root_cause != "unscaled_targets" for h in ndb.explain(trace))


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(8 * 16, 32), nn.ReLU(), nn.Linear(32, 10))


def _bar_images(seed: int, n: int = 1024, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Four classes of noisy images: a horizontal, a vertical or one of two diagonal bars."""
    g = torch.Generator().manual_seed(3000 + seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.3 * torch.randn(n, 1, size, size, generator=g)
    bars = torch.zeros(4, size, size)
    bars[0, size // 2 - 1:size // 2 + 1, :] = 1.0
    bars[1, :, size // 2 - 1:size // 2 + 1] = 1.0
    bars[2] = torch.eye(size) + torch.eye(size).roll(1, dims=1).triu(1)
    bars[3] = bars[2].flip(1)
    return x + bars[y].unsqueeze(1), y


@pytest.mark.parametrize("seed", [0, 2])
def test_a_relu_on_the_logits_is_a_loss_output_mismatch_not_a_negative_bias(seed: int
                                                                             ) -> None:
    """A CNN head written Linear(32, 4) + ReLU before CrossEntropyLoss, the default init
    and a sound rate: the logits' units die (seed 0: all four by step 22, the loss pinned at
    ln 4; seed 2: three of four negative from the first batch). The network named
    negative_bias_init at 0.71/0.79 (a user-style probe), though no bias is set anywhere.
    The rules now read a dead rectifier that ends the network as the loss/output mismatch,
    and the network's 'dead from the start' evidence leaves the output out. The same CNN
    without the final ReLU trains."""
    def run(relu: bool) -> ndb.Trace:
        x, y = _bar_images(seed)
        torch.manual_seed(seed)
        head = [nn.Linear(32, 4), *([nn.ReLU()] if relu else [])]  # (built first)
        model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(64, 32),
                              nn.ReLU(), *head)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        with ndb.NeuralDbg(model, optimizer=opt) as dbg:
            for epoch in range(8):
                order = torch.randperm(len(x), generator=torch.Generator().manual_seed(
                    seed * 7919 + epoch))
                for i in range(0, len(x) - 31, 32):
                    opt.zero_grad()
                    loss = F.cross_entropy(model(x[order[i:i + 32]]), y[order[i:i + 32]])
                    loss.backward()
                    opt.step()
                    dbg.step(loss)
        return dbg.trace

    trace = run(relu=True)
    top = _top(trace)
    assert top is not None and top.root_cause == "loss_output_mismatch", top
    claims = [h for h in ndb.explain(trace, method="probabilistic") if h.confidence >= 0.5]
    assert claims and claims[0].root_cause in ("loss_output_mismatch", "unknown"), claims[:2]
    assert not [h for h in claims if h.root_cause == "negative_bias_init"]
    _assert_healthy(run(relu=False))


@pytest.mark.parametrize("every", [1, 16])
def test_a_model_left_in_eval_after_its_first_validation_is_named_unknown_with_the_step(
        every: int) -> None:
    """model.eval() for a validation pass at the end of each epoch, model.train() never
    called again: from the second epoch (step 32) the BatchNorm layers run on stale running
    statistics and the run blows up or dies. The rules read BatchNorm only at the first
    step, where it normalised, and both methods named a cause outside the bug with
    confidence (learning_rate_too_high 0.59-0.78, unnormalized_inputs 0.74-1.00; a user-style
    probe, at every=16 on all seeds). A train-mode BatchNorm puts out the mean square its
    affine parameters set, at every step: from step 32 its outputs are off that scale, and
    the answer is unknown with the step and the check. The twin that calls model.train()
    again is healthy."""
    def run(bug: bool) -> ndb.Trace:
        x, y = _bar_images(0, n=1280)
        x = x * 3 + 5
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                              nn.MaxPool2d(2), nn.Conv2d(16, 16, 3, padding=1),
                              nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                              nn.Flatten(), nn.Dropout(0.3), nn.Linear(64, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
        with ndb.NeuralDbg(model, optimizer=opt, every=every) as dbg:
            model.train()
            for epoch in range(6):
                if not bug:
                    model.train()
                order = torch.randperm(1024, generator=torch.Generator().manual_seed(epoch))
                for i in range(0, 1024, 32):
                    opt.zero_grad()
                    loss = F.cross_entropy(model(x[order[i:i + 32]]), y[order[i:i + 32]])
                    loss.backward()
                    opt.step()
                    dbg.step(loss)
                model.eval()
                with torch.no_grad():
                    model(x[1024:])  # the validation pass
        return dbg.trace

    trace = run(bug=True)
    for method in ("heuristic", "probabilistic"):
        claims = [h for h in ndb.explain(trace, method=method) if h.confidence >= 0.5]
        assert claims and all(h.root_cause == "unknown" for h in claims), (method, claims[:2])
    hint = ndb.explain(trace)[0].metadata["hint"]
    assert "from step 32" in hint and "model.train()" in hint, hint
    _assert_healthy(run(bug=False))


def test_adam_cnn_without_zero_grad_is_named_not_the_learning_rate() -> None:
    model = _cnn()
    images = X.view(-1, 1, 8, 8)
    g = torch.Generator().manual_seed(1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(100):
            idx = torch.randint(0, len(X), (64,), generator=g)
            loss = F.cross_entropy(model(images[idx]), Y[idx])  # no opt.zero_grad() anywhere
            loss.backward()
            opt.step()
            dbg.step(loss)
    # Adam still lowers the loss on a summed gradient (ratio ~0.7 here), so the failure is
    # mild: what matters is that the story told is the bug's, and no other cause is claimed.
    hyps = ndb.explain(dbg.trace)
    assert hyps and hyps[0].root_cause == "missing_zero_grad", hyps[:2]
    assert hyps[0].failure_type == "exploding_gradients"
    assert not [h for h in hyps if h.confidence >= 0.5 and h.root_cause != "missing_zero_grad"]


def test_weights_filled_with_a_constant_are_named_and_noise_that_breaks_them_is_healthy() -> None:
    model = nn.Sequential(_mlp(), nn.Identity())
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.01)
    top = _top(_train(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                      F.cross_entropy, Y))
    assert top is not None and top.root_cause == "symmetric_init", top
    model = _mlp()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.01).add_(0.1 * torch.randn_like(p))
    _assert_healthy(_train(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                           F.cross_entropy, Y))


def test_labels_shuffled_apart_from_their_inputs_are_a_data_problem() -> None:
    shuffled = Y[torch.randperm(len(Y), generator=torch.Generator().manual_seed(3))]
    model = _mlp()
    hyps = ndb.explain(_train(model, torch.optim.SGD(model.parameters(), lr=0.05,
                                                      momentum=0.9), F.cross_entropy, shuffled))
    top = hyps[0]
    assert top.failure_type == "training_plateau" and top.confidence >= 0.5, top
    # No learning-rate story: the stall is named a data problem, or left an honest unknown
    # when the evidence for it is thin (0.39 support here, against 0.44 for "no known cause").
    assert top.root_cause in ("data_problem", "unknown"), top
    support = top.metadata["cause_support"]
    assert max(support, key=support.get) == "data_problem", support
    assert not [h for h in hyps if h.confidence >= 0.5 and h.root_cause not in
                ("data_problem", "unknown")]


def test_a_stall_recorded_every_16_steps_is_not_read_as_a_rate_too_low() -> None:
    """Shuffled labels under Adam: the weights move as at every step, but the run's total
    movement summed the updates of the recorded steps only, 1 in 16 at every=16, and read
    a rate too low (0.92 heuristic, 0.70 network) where every=1 says "unknown"."""
    shuffled = Y[torch.randperm(len(Y), generator=torch.Generator().manual_seed(100))]
    dense, sparse = [_train(model, torch.optim.Adam(model.parameters(), lr=1e-3),
                            F.cross_entropy, shuffled, steps=300, every=every, batch=32)
                     for every, model in ((1, _mlp()), (16, _mlp()))]
    total = [loss_dynamics(t).total_update for t in (dense, sparse)]
    assert abs(total[1] / total[0] - 1) < 0.25, total
    for method in ("heuristic", "probabilistic"):
        tops = [ndb.explain(t, method=method)[0] for t in (dense, sparse)]
        assert tops[1].root_cause == tops[0].root_cause != "learning_rate_too_low", \
            (method, tops)


def _wide_mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, 10))


@pytest.mark.parametrize("seed", [0, 2])
def test_labels_with_no_signal_under_adam_are_not_read_as_a_rate_too_high(seed: int) -> None:
    # Adam at 1e-2 steps each weight by about the rate, whatever the gradient says: the
    # run's median update ratio (0.018) reads the same on labels with no signal, which
    # stall and leave most of the second layer's units dead, as on the true labels, which
    # train at that rate. A new user's MLP got learning_rate_too_high at 0.57-0.83 / 0.95
    # on 7 of 7 such runs, and what_if(lr_scale=0.1) promised a fix no re-run keeps. A
    # rate too high under Adam shows in its first step or in a loss that overshoots its
    # start; neither happens here.
    std = (X - X.mean(0)) / (X.std(0) + 1e-6)
    g = torch.Generator().manual_seed(seed)
    shuffled = Y[torch.randperm(len(Y), generator=g)]

    def run(labels: torch.Tensor) -> ndb.Trace:
        model = _wide_mlp(seed)
        return _train(model, torch.optim.Adam(model.parameters(), lr=1e-2), F.cross_entropy,
                      labels, inputs=std, steps=120, batch=32,
                      generator=torch.Generator().manual_seed(seed))

    stalled = run(shuffled)
    assert stalled.steps["loss"].iloc[-12:].median() > 2.0  # nothing learned
    for method in ("heuristic", "probabilistic"):
        claimed = [h for h in ndb.explain(stalled, method=method) if h.confidence >= 0.5]
        assert claimed, method  # it is a failure ...
        assert all(h.root_cause in ("data_problem", "unknown") for h in claimed), \
            (method, claimed)  # ... of no cause a knob fixes
    assert ndb.what_if(stalled, lr_scale=0.1).p_failure >= 0.5
    _assert_healthy(run(Y))  # the same rate trains on the true labels


def test_rmsprop_s_uncorrected_first_step_reads_at_its_rate() -> None:
    # RMSprop's running average of squared gradients starts at zero with no bias
    # correction: its first step is 10x the rate's steady one (at PyTorch's alpha 0.99), so
    # a new user's RMSprop at 1e-2 moved the weights by 1.2-1.3 of their norm, the mark of a
    # rate too high under Adam, on runs whose clean twins train. Read at the rate, the first
    # step is Adam's.
    std = (X - X.mean(0)) / (X.std(0) + 1e-6)
    first = {}
    for name, make in (("adam", torch.optim.Adam), ("rmsprop", torch.optim.RMSprop)):
        model = _wide_mlp(0)
        trace = _train(model, make(model.parameters(), lr=1e-3), F.cross_entropy, Y,
                       inputs=std, steps=30)
        first[name] = heuristic_diagnosis(trace).facts.start_update_ratio
    assert 0.5 < first["rmsprop"] / first["adam"] < 2.0, first


@pytest.mark.parametrize("seed", [1, 2])
def test_rmsprop_s_early_overshoot_on_labels_with_no_signal_is_not_the_rate(seed: int) -> None:
    # RMSprop's uncorrected first steps (10x the rate's steady step) overshoot the loss at
    # any rate it trains at: a tanh MLP at 1e-2 on digits overshoots 1.5-3.2x and trains
    # to 0.95. On shuffled labels the same loop overshoots as much, stalls at chance with
    # saturated units, and a new user's runs got learning_rate_too_high at 0.79-0.95 from
    # both methods, where a rate ten times lower stalls too. The overshoot is the
    # optimizer's, not the rate's evidence.
    g = torch.Generator().manual_seed(seed)
    shuffled = Y[torch.randperm(len(Y), generator=g)]

    def run(labels: torch.Tensor) -> ndb.Trace:
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                              nn.Linear(64, 10))
        return _train(model, torch.optim.RMSprop(model.parameters(), lr=1e-2),
                      F.cross_entropy, labels, steps=300,
                      generator=torch.Generator().manual_seed(seed))

    stalled = run(shuffled)
    assert stalled.steps["loss"].iloc[-30:].median() > 2.0  # nothing learned
    assert heuristic_diagnosis(stalled).facts.early_overshoot > 1.5  # the optimizer's
    for method in ("heuristic", "probabilistic"):
        claimed = [h for h in ndb.explain(stalled, method=method) if h.confidence >= 0.5]
        assert all(h.root_cause != "learning_rate_too_high" for h in claimed), (method, claimed)
    _assert_healthy(run(Y))  # the same rate trains on the true labels


def test_an_adam_rate_a_warmup_grows_too_high_is_still_named() -> None:
    # the guard of the test above: a warmup starts Adam's steps as small as there (the
    # first moves the weights by 0.17 of their norm) and grows the rate to 1.0 by step 100;
    # the loss spikes and the run ends at chance. The spikes (and the loss's overshoot of
    # its start) bear the rate out where the first step cannot.
    std = (X - X.mean(0)) / (X.std(0) + 1e-6)
    model = _wide_mlp(1)
    opt = torch.optim.Adam(model.parameters(), lr=1.0)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 100))
    trace = _train(model, opt, F.cross_entropy, Y, inputs=std, steps=300,
                   generator=torch.Generator().manual_seed(1),
                   after_step=lambda i, loss: warmup.step())
    assert trace.steps["update_ratio"].iloc[0] < 0.2
    assert trace.steps["loss"].iloc[-30:].median() > 2.0
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(trace, method=method)[0]
        assert top.root_cause == "learning_rate_too_high" and top.confidence >= 0.5, \
            (method, top)


@pytest.mark.parametrize("seed", [2, 4])
def test_a_short_warmup_to_a_rate_that_inflates_the_weights_is_named(seed: int) -> None:
    # A warmup over 40 steps takes Adam's rate to 1.0: the first step moves the weights by
    # 0.3 of their norm, the loss overshoots about 2x with no spike, the units die and the
    # inflated weights make every later update ratio small. A new user's runs read
    # unknown (0.67-0.86) from both methods (the network here: a negative bias init at
    # 0.53 on seed 2), and what_if(lr_scale=0.1) said 0.98 where the
    # re-runs at 0.1 train to 0.965. The weights grew 23-25x their start in the run's first
    # quarter: under Adam that is the rate's doing (workable rates grow them 2-8x).
    def run(peak: float) -> ndb.Trace:
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                              nn.Linear(64, 10))
        opt = torch.optim.Adam(model.parameters(), lr=peak)
        warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 40))
        return _train(model, opt, F.cross_entropy, Y, steps=400,
                      generator=torch.Generator().manual_seed(seed),
                      after_step=lambda i, loss: warmup.step())

    trace = run(1.0)
    assert trace.steps["loss"].iloc[-40:].median() > 2.0  # at chance
    facts = heuristic_diagnosis(trace).facts
    assert facts.loss_spikes == 0 and facts.early_weight_growth > 15.0
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(trace, method=method)[0]
        assert top.root_cause == "learning_rate_too_high" and top.confidence >= 0.5, \
            (method, top)
    assert ndb.what_if(trace, lr_scale=0.01).p_failure < 0.5
    _assert_healthy(run(1e-2))


@pytest.mark.parametrize("seed", [2, 3])
def test_a_missing_value_code_in_a_few_records_is_a_data_problem_not_the_input_scale(
        seed: int) -> None:
    # a table whose missing values are coded -999 in 5% of the records (3 features each),
    # the rest standardised: the first layer's output range jumps two decades whenever a
    # batch holds such a record. A new user's MLP under SGD got unnormalized_inputs (0.54-
    # 0.72 / 0.79-0.98) or learning_rate_too_high (0.97), and what_if promised that scaling
    # every input by 1e-3 fixes it (0.06); that re-run ends at chance (0.10), and the
    # cleaned table trains (0.96).
    std = (X - X.mean(0)) / (X.std(0) + 1e-6)
    g = torch.Generator().manual_seed(seed)
    coded = std.clone()
    for row in torch.randperm(len(coded), generator=g)[: len(coded) // 20]:
        coded[row, torch.randperm(64, generator=g)[:3]] = -999.0

    def run(inputs: torch.Tensor) -> ndb.Trace:
        model = _wide_mlp(seed)
        return _train(model, torch.optim.SGD(model.parameters(), lr=0.05), F.cross_entropy,
                      Y, inputs=inputs, steps=400, batch=32,
                      generator=torch.Generator().manual_seed(seed))

    trace = run(coded)
    for method in ("heuristic", "probabilistic"):
        claimed = [h for h in ndb.explain(trace, method=method) if h.confidence >= 0.5]
        assert all(h.root_cause in ("data_problem", "unknown") for h in claimed), \
            (method, claimed)
    top = ndb.explain(trace)[0]
    assert top.root_cause == "data_problem", top
    assert "clean" in top.metadata["cause_evidence"]["hint"]
    rescaled = ndb.what_if(trace, input_scale=1e-3)
    assert rescaled.p_failure_factual >= 0.5 and rescaled.p_failure >= 0.5, rescaled
    _assert_healthy(run(std))  # the same loop on the clean table


@pytest.mark.parametrize("seed", [0, 2])
def test_a_missing_value_code_under_adam_is_not_read_as_the_init(seed: int) -> None:
    # a regression table with 99999 in two cells of 5% of its rows, under Adam: the first
    # step's gradient is the coded rows', and the network read it as the init's
    # (init_scale_too_large at 0.70-0.77 here, 0.52-0.92 on a new user's tables) where
    # imputing the cells fixes the run and a smaller init does not
    from sklearn.datasets import make_friedman1

    x, y = make_friedman1(n_samples=1500, n_features=10, noise=0.5, random_state=seed)
    x = (x - x.mean(0)) / x.std(0)
    rng = np.random.default_rng(seed)
    for row in rng.choice(len(x), len(x) // 20, replace=False):
        x[row, rng.choice(10, 2, replace=False)] = 99999.0
    inputs = torch.tensor(x, dtype=torch.float32)
    targets = torch.tensor((y - y.mean()) / y.std(), dtype=torch.float32).unsqueeze(1)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    trace = _train(model, torch.optim.Adam(model.parameters(), lr=1e-3), F.mse_loss,
                   targets, inputs=inputs, steps=400, batch=32,
                   generator=torch.Generator().manual_seed(seed))
    for method in ("heuristic", "probabilistic"):
        claimed = [h for h in ndb.explain(trace, method=method) if h.confidence >= 0.5]
        assert all(h.root_cause in ("data_problem", "unknown") for h in claimed), \
            (method, claimed)


class _BodyAndHead(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x))


@pytest.mark.parametrize("seed", [1, 2])
def test_an_optimizer_built_from_the_head_only_is_not_missing_zero_grad(seed: int) -> None:
    """Fine-tuning code copied into a from-scratch run: Adam gets model.fc.parameters().
    The loop calls opt.zero_grad(), which clears the head only, so the body's gradients
    pile up in .grad while its weights never move (accuracy 0.30 where the twin reaches
    0.86). The network named missing_zero_grad (0.80), the heuristic too (0.54 on seed 2):
    the fix is the optimizer's parameter list, not a zero_grad call."""
    model = _BodyAndHead(seed)
    with pytest.warns(ndb.NeuralDbgWarning, match="none of the optimizers given"):
        trace = _train(model, torch.optim.Adam(model.fc.parameters(), lr=1e-3),
                       F.cross_entropy, Y, steps=300)
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        claimed = [h for h in hyps if h.confidence >= 0.5]
        assert all(h.root_cause == "unknown" for h in claimed), (method, claimed)
        if claimed:
            assert "body.0, body.2" in claimed[0].metadata["hint"], claimed[0].metadata
    twin = _BodyAndHead(seed)
    _assert_healthy(_train(twin, torch.optim.Adam(twin.parameters(), lr=1e-3), F.cross_entropy,
                           Y, steps=300))


class _FrozenByMistake(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Sequential(nn.Linear(64, 16), nn.Tanh())
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.encoder(x)
        self.last_feats = feats.detach()  # kept for logging ...
        return self.head(self.last_feats)  # ... and fed to the head by mistake


def test_a_detached_tensor_that_starves_the_encoder_is_named() -> None:
    model = _FrozenByMistake()
    trace = _train(model, torch.optim.Adam(model.parameters(), lr=1e-2), F.cross_entropy,
                   Y[torch.randperm(len(Y), generator=torch.Generator().manual_seed(4))])
    causes = {h.root_cause for h in ndb.explain(trace) if h.confidence >= 0.5}
    assert causes <= {"gradient_blocked", "data_problem", "unknown"}, causes
    blocked = [h for h in ndb.explain(trace) if h.root_cause == "gradient_blocked"]
    assert blocked and blocked[0].metadata["cause_evidence"]["modules_without_gradient"] == [
        "encoder.0"]


def _l2_on_detached_outputs(model: nn.Module):
    """A loss computed on ``outputs.detach()`` (copied from a metrics helper) plus an L2
    penalty, which keeps ``loss.backward()`` from raising."""
    def loss_fn(outputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        l2 = sum((p ** 2).sum() for p in model.parameters())
        return F.cross_entropy(outputs.detach(), target) + 1e-4 * l2
    return loss_fn


def test_a_loss_on_detached_outputs_is_a_blocked_gradient_not_a_low_rate() -> None:
    """Only the penalty's gradient reaches the weights (no module's output ever gets one):
    the update ratio is tiny and both methods said learning_rate_too_low (0.99 and 0.90)
    before the fix, and what_if promised that a rate 10x or 100x higher would train it (it
    does not)."""
    model = _mlp()
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                   _l2_on_detached_outputs(model), Y)
    assert trace.stats["out_grad_norm"].isna().all()
    assert (trace.stats["param_grad_norm"].dropna() > 0).any()
    for method in ("heuristic", "probabilistic"):
        claimed = [h for h in ndb.explain(trace, method=method) if h.confidence >= 0.5]
        assert claimed and claimed[0].root_cause == "gradient_blocked", (method, claimed[:2])
        assert all(h.root_cause in ("gradient_blocked", "unknown") for h in claimed), method
    model = _mlp()  # the loss on the outputs themselves trains
    _assert_healthy(_train(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                           F.cross_entropy, Y))


def _batches_with_record(record: int, at: int, n: int, steps: int = 150
                         ) -> Iterator[torch.Tensor]:
    """Minibatches of 64 drawn from the first ``n - 1`` records; record ``record`` (the
    last, a corrupted one) joins the batch of step ``at`` only."""
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        idx = torch.randint(0, n - 1, (64,), generator=g)
        if step == at:
            idx[5] = record
        yield idx


@pytest.mark.parametrize("optimizer, whole", [("adam", True), ("sgd", False)])
def test_a_batch_with_a_nan_record_is_a_data_problem(optimizer: str, whole: bool) -> None:
    """One corrupted record (a NaN image, or one missing pixel) reaches the model at step
    60 and the loss is NaN from there on. Both methods said "unknown" before: the first
    module's output turned non-finite while its weights and its earlier outputs were
    sound, which only the input does."""
    inputs = torch.cat([X, X[:1]])
    if whole:
        inputs[-1] = float("nan")
    else:
        inputs[-1, 20] = float("nan")
    record = len(inputs) - 1
    for corrupted in (True, False):
        model = _mlp()
        opt = (torch.optim.Adam(model.parameters(), lr=1e-3) if optimizer == "adam"
               else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
        trace = _train(model, opt, F.cross_entropy, torch.cat([Y, Y[:1]]), inputs=inputs,
                       batches=_batches_with_record(record, 60 if corrupted else -1,
                                                    len(inputs)))
        if not corrupted:
            _assert_healthy(trace)
            continue
        for method in ("heuristic", "probabilistic"):
            top = ndb.explain(trace, method=method)[0]
            assert (top.root_cause, top.failure_type) == ("data_problem", "loss_divergence"), \
                (method, top)
            assert top.confidence >= 0.5 and top.origin_step == 60, (method, top)
            assert top.origin_layer == "0", (method, top)
            # what to check, from either method (the network named none before)
            assert "check the batch of step 60" in top.metadata["hint"], (method, top.metadata)


def test_a_nan_record_after_the_loss_reached_its_floor_is_a_data_problem() -> None:
    """Well-separated clusters: the loss falls from 2.2 to about 1e-5, where it jitters by
    several times its median from batch to batch; one NaN feature at step 70 then makes
    it NaN. That jitter read as loss spikes, so the run did not count as calm before the
    NaN: the heuristic said "unknown" and the network blamed the rate (0.81). A spike must
    also rise by a share of where the loss started."""
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(10, 256, generator=g)
    labels = torch.randint(0, 10, (8192,), generator=g)
    inputs = centres[labels] + 2.0 * torch.randn(8192, 256, generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    perm = torch.randperm(8192, generator=g)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(100):
            idx = perm[(step * 256) % 8192:][:256]
            x = inputs[idx].clone()
            if step == 70:
                x[128, 100] = float("nan")
            opt.zero_grad()
            loss = F.cross_entropy(model(x), labels[idx])
            loss.backward()
            opt.step()
            dbg.step(loss)
    trace = dbg.trace
    floor = trace.steps["loss"].iloc[40:70]
    assert floor.max() < 1e-2 and floor.max() > 3 * floor.median()  # the jitter is there
    assert loss_dynamics(trace).spike_steps == ()
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(trace, method=method)[0]
        assert (top.root_cause, top.failure_type) == ("data_problem", "loss_divergence"), \
            (method, top)
        assert top.confidence >= 0.5 and top.origin_step == 70, (method, top)


@pytest.mark.parametrize("every", [1, 16])
def test_a_record_of_1e30_is_not_blamed_on_the_rate(every: int) -> None:
    """A finite sentinel (1e30) in one record at step 60: the first layer's output jumps to
    1e29 from sound weights, the loss to 1e27 and, after the update, to NaN. Both methods
    named the learning rate with confidence 1.0 / 0.91. With every step recorded the
    heuristic names the data; at every=16 step 60 has no module statistics and neither
    method may name the rate (a loss that jumps 27 decades in one step out of a calm run)."""
    inputs = torch.cat([X, X[:1]])
    inputs[-1, 12] = 1e30
    record = len(inputs) - 1
    for corrupted in (True, False):
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        batches = _batches_with_record(record, 60 if corrupted else -1, len(inputs))
        with ndb.NeuralDbg(model, optimizer=opt, every=every) as dbg:
            for idx in batches:
                opt.zero_grad()
                loss = F.cross_entropy(model(inputs[idx]), torch.cat([Y, Y[:1]])[idx])
                loss.backward()
                opt.step()
                dbg.step(loss)
        trace = dbg.trace
        if not corrupted:
            _assert_healthy(trace)
            continue
        assert trace.steps["loss"].iloc[60] > 1e20 and np.isnan(trace.steps["loss"].iloc[61])
        if every == 1:  # an infinite gradient norm is recorded as such, not as 1.3e154
            grads = trace.stats.loc[trace.stats["step"] == 60, "param_grad_norm"].to_numpy()
            assert np.isinf(grads).any() and not (np.isfinite(grads) & (grads > 1e39)).any()
        for method in ("heuristic", "probabilistic"):
            top = ndb.explain(trace, method=method)[0]
            assert top.root_cause in ("data_problem", "unknown"), (method, top)
            assert top.origin_step == 60, (method, top)
        if every == 1:
            assert ndb.explain(trace)[0].root_cause == "data_problem"


@pytest.mark.parametrize("cell", [nn.GRU, nn.LSTM])
def test_a_nan_in_a_recurrent_input_is_a_data_problem(cell: type[nn.Module]) -> None:
    """One NaN in one sequence at step 70 of an Adam-trained GRU/LSTM classifier: its
    sampled statistics count no NaN at that step but its largest output (taken over every
    element) is NaN. The methods saw the NaN first in the head and said "unknown", the
    origin the head."""
    g = torch.Generator().manual_seed(0)
    seqs = torch.randn(1024, 20, 4, generator=g)
    labels = ((seqs[:, :, 0].sum(1) + 0.5 * seqs[:, -5:, 1].sum(1)) > 0).long()

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = cell(4, 32, batch_first=True)
            self.head = nn.Linear(32, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.rnn(x)[0][:, -1])

    torch.manual_seed(0)
    model = Classifier()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(100):
            idx = torch.randint(0, 1024, (32,), generator=g)
            x = seqs[idx].clone()
            if step == 70:
                x[4, 7, 2] = float("nan")
            opt.zero_grad()
            loss = F.cross_entropy(model(x), labels[idx])
            loss.backward()
            opt.step()
            dbg.step(loss)
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(dbg.trace, method=method)[0]
        assert (top.root_cause, top.failure_type) == ("data_problem", "loss_divergence"), \
            (method, top)
        assert top.confidence >= 0.5 and top.origin_step == 70, (method, top)
        assert top.origin_layer == "rnn", (method, top)
    # and the run's summary says the first non-finite output was the recurrent layer's
    assert summarize_run(dbg.trace).first_nonfinite.module == "rnn"


def test_a_nan_batch_between_recorded_steps_is_not_blamed_on_the_rate() -> None:
    """The same corrupted record at step 60 of a run recorded every 16 steps: that step
    has no module statistics, so the input cannot be seen. Both methods said
    learning_rate_too_high (1.00 and 0.91) before; a loss that turns NaN out of a calm run
    (no blow-up, spike or gradient growth before it) leaves the rate without support, and
    the cause is unknown, with a hint to check the batches."""
    inputs = torch.cat([X, X[:1]])
    inputs[-1] = float("nan")
    targets = torch.cat([Y, Y[:1]])
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with ndb.NeuralDbg(model, optimizer=opt, every=16) as dbg:
        for idx in _batches_with_record(len(inputs) - 1, 60, len(inputs)):
            opt.zero_grad()
            loss = F.cross_entropy(model(inputs[idx]), targets[idx])
            loss.backward()
            opt.step()
            dbg.step(loss)
    trace = dbg.trace
    assert 60 not in set(trace.stats["step"])
    for method in ("heuristic", "probabilistic"):
        claimed = [h for h in ndb.explain(trace, method=method) if h.confidence >= 0.5]
        assert claimed and claimed[0].failure_type == "loss_divergence", (method, claimed)
        assert claimed[0].origin_step == 60, (method, claimed[0])
        assert all(h.root_cause in ("unknown", "data_problem") for h in claimed), \
            (method, claimed)
    hint = ndb.explain(trace)[0].metadata["hint"]
    assert "every=1" in hint and "NaN" in hint, hint


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_a_missing_regression_target_is_a_data_problem_not_the_rate(optimizer: str) -> None:
    """A regression target read as NaN (a missing value) reaches the loss at step 60: every
    module output and weight is sound there, and the loss is NaN from then on. The
    heuristic said learning_rate_too_high at 1.00 on the SGD run, the network 0.91 and
    0.73. The heuristic now names data_problem; the network data_problem or "unknown",
    never a cause in the model or the optimizer."""
    target = (X @ torch.randn(64, 1, generator=torch.Generator().manual_seed(1))).squeeze(1)
    target = torch.cat([target, target[:1]])
    target[-1] = float("nan")
    inputs = torch.cat([X, X[:1]])
    model = nn.Sequential(*_mlp(out=1), nn.Flatten(0))
    opt = (torch.optim.Adam(model.parameters(), lr=1e-3) if optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    trace = _train(model, opt, F.mse_loss, target, inputs=inputs,
                   batches=_batches_with_record(len(inputs) - 1, 60, len(inputs)))
    top = ndb.explain(trace)[0]
    assert (top.root_cause, top.failure_type, top.origin_step) == \
        ("data_problem", "loss_divergence", 60), top
    assert top.confidence >= 0.5
    claimed = [h for h in ndb.explain(trace, method="probabilistic") if h.confidence >= 0.5]
    assert claimed and claimed[0].failure_type == "loss_divergence", claimed
    assert all(h.root_cause in ("data_problem", "unknown") for h in claimed), claimed


def test_a_loop_that_throws_away_nan_batches_is_healthy() -> None:
    """The user guards the loop: a batch whose loss is NaN is logged and skipped, with no
    backward and no optimizer step (corrupted records at steps 30 and 70). The run trains.
    Both methods called it a loss divergence before (the heuristic blamed the rate at 0.51,
    the network at 0.91)."""
    inputs = torch.cat([X, X[:1]])
    inputs[-1] = float("nan")
    targets = torch.cat([Y, Y[:1]])
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(150):
            idx = torch.randint(0, len(inputs) - 1, (64,), generator=g)
            if step in (30, 70):
                idx[5] = len(inputs) - 1
            opt.zero_grad()
            loss = F.cross_entropy(model(inputs[idx]), targets[idx])
            if not torch.isfinite(loss):
                dbg.step(loss)  # logged, then thrown away
                continue
            loss.backward()
            opt.step()
            dbg.step(loss)
    trace = dbg.trace
    assert trace.steps["loss"].isna().sum() == 2
    for method in ("heuristic", "probabilistic"):
        claimed = [h for h in ndb.explain(trace, method=method) if h.confidence >= 0.5]
        assert not claimed, (method, claimed)


class _TabularNet(nn.Module):
    """A category embedding beside numeric features, joined in ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(10, 8)
        self.fc1 = nn.Linear(8 + 64, 64)
        self.act = nn.ReLU()
        self.out = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        category = (x[:, 0] * 9).long().clamp(0, 9)
        return self.out(self.act(self.fc1(torch.cat([self.emb(category), x], dim=1))))


def test_a_nan_that_enters_between_modules_is_not_blamed_on_the_rate() -> None:
    """A NaN among the numeric features reaches the first Linear through a concatenation
    in ``forward``: the embedding, the first module called, stays finite. The network said
    learning_rate_too_high (0.71) before. The first module to turn non-finite had sound
    weights and everything before it was finite: the NaN came from outside the modules,
    the data or an operation in forward(), which the trace cannot tell apart; so the cause
    is unknown, and the hint names the module to check."""
    inputs = torch.cat([X, X[:1]])
    inputs[-1, 20] = float("nan")
    model = _TabularNet()
    trace = _train(model, torch.optim.Adam(model.parameters(), lr=1e-3), F.cross_entropy,
                   torch.cat([Y, Y[:1]]), inputs=inputs,
                   batches=_batches_with_record(len(inputs) - 1, 80, len(inputs)))
    for method in ("heuristic", "probabilistic"):
        claimed = [h for h in ndb.explain(trace, method=method) if h.confidence >= 0.5]
        assert claimed and claimed[0].origin_step == 80, (method, claimed)
        assert all(h.root_cause in ("unknown", "data_problem") for h in claimed), \
            (method, claimed)
    assert "fc1" in ndb.explain(trace)[0].metadata["hint"]


def test_a_high_but_fine_adam_rate_and_a_standardised_large_target_are_healthy() -> None:
    model = _mlp()
    _assert_healthy(_train(model, torch.optim.Adam(model.parameters(), lr=1e-2),
                           F.cross_entropy, Y))
    price = X.sum(1, keepdim=True) * 5000.0 + 1e5  # dollars, then standardised by the user
    model = _mlp(out=1)
    _assert_healthy(_train(model, torch.optim.Adam(model.parameters(), lr=1e-3), F.mse_loss,
                           (price - price.mean()) / price.std()))


class _SeqNet(nn.Module):
    """A GRU read at its last step, as a user writes one (a 4-class task by default)."""

    def __init__(self, n_in: int = 8, n_out: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gru = nn.GRU(n_in, 32, batch_first=True)
        self.head = nn.Linear(32, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(out[:, -1])


def _train_gru(lr: float, clip: float | None) -> ndb.Trace:
    """Six epochs of SGD with momentum, a validation forward after each (no step follows)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 20, 8, generator=g)
    y = (x[:, :, 0].sum(1) > 0).long() * 2 + (x[:, -1, 1] > 0).long()
    model = _SeqNet()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return _train_epochs(model, opt, x, y, g, epochs=6, clip=clip, validate=True,
                         config={"lr": lr})


def _train_epochs(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                  y: torch.Tensor, g: torch.Generator, *, epochs: int,
                  clip: float | None = None, validate: bool = False,
                  config: dict | None = None) -> ndb.Trace:
    """Epochs over ``x`` shuffled by ``g`` in batches of 32, cross-entropy; ``clip``: the
    total gradient norm clipped in the loop (not declared in the config); ``validate``: a
    forward on 64 samples under ``no_grad`` after each epoch (no step follows)."""
    with ndb.NeuralDbg(model, optimizer=opt, config=config) as dbg:
        for _ in range(epochs):
            perm = torch.randperm(len(x), generator=g)
            for i in range(0, len(x), 32):
                idx = perm[i:i + 32]
                opt.zero_grad()
                loss = F.cross_entropy(model(x[idx]), y[idx])
                loss.backward()
                if clip is not None:
                    nn.utils.clip_grad_norm_(model.parameters(), clip)
                opt.step()
                dbg.step(loss)
            if validate:
                with torch.no_grad():
                    model(x[:64])
    return dbg.trace


def _train_gru_adam(lr: float) -> ndb.Trace:
    """Three times the mean of the last 10 of 100 noisy values, Adam, no clipping."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(800, 100, 1, generator=g)
    y = x[:, -10:, 0].mean(1) * 3
    model = _SeqNet(n_in=1, n_out=1)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(150):
            idx = torch.randint(0, 800, (32,), generator=g)
            opt.zero_grad()
            loss = F.mse_loss(model(x[idx]).squeeze(1), y[idx])
            loss.backward()
            opt.step()
            dbg.step(loss)
    return dbg.trace


def test_a_blow_up_in_the_first_steps_that_the_loss_never_recovers_from_is_claimed() -> None:
    """A GRU at Adam 1.0: the gradient norm grows 10^17-fold within 3 steps, the loss jumps
    from ~0.8 to ~200 and falls back only to about twice where it started. Measured from the
    median of its first losses (the blow-up itself) the loss 'fell', and the heuristic gave
    the explosion the impact of a run that still learns (0.40, judged healthy)."""
    trace = _train_gru_adam(1.0)
    loss = trace.steps["loss"].to_numpy()
    assert np.median(loss[-15:]) > loss[0]
    top = _top(trace)
    assert top is not None and (top.failure_type, top.root_cause) == (
        "exploding_gradients", "learning_rate_too_high"), top
    assert top.origin_step <= 2
    _assert_healthy(_train_gru_adam(1e-2))


@pytest.mark.parametrize("clip", [None, 1.0])
def test_a_recurrent_net_at_far_too_high_a_rate_is_the_rate_not_missing_clipping(
        clip: float | None) -> None:
    """GRU at lr 3 (SGD, momentum 0.9): the loss climbs 1.4 -> 4-13 and does so with a clip
    of 1.0 too, so clipping is not the fix; lr 0.3 trains (checked below). Every step moves
    the weights by 5-30% of their size: the rate, not the missing clip, is the cause.
    """
    trace = _train_gru(3.0, clip)
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        claimed = {h.root_cause for h in hyps if h.confidence >= 0.5} - {"unknown"}
        assert hyps and hyps[0].root_cause == "learning_rate_too_high", (method, hyps[:2])
        assert claimed == {"learning_rate_too_high"}, (method, hyps[:3])
    assert _top(_train_gru(0.3, clip)) is None


def test_raw_pixel_inputs_that_kill_units_are_named_not_the_learning_rate() -> None:
    """0-255 pixels into an MLP with a rate tuned for [0, 1] inputs: the first updates blow the
    loss up to ~1e3 and leave the ReLUs dead. Dividing by 255 is the fix (the twin trains)."""
    for method in ("heuristic", "probabilistic"):
        model = _mlp()
        hyps = ndb.explain(_train(model, torch.optim.SGD(model.parameters(), lr=0.05,
                                                         momentum=0.9),
                                  F.cross_entropy, Y, inputs=X * 255.0), method=method)
        assert hyps and hyps[0].root_cause == "unnormalized_inputs", (method, hyps[:2])
        assert hyps[0].confidence >= 0.5
    model = _mlp()
    _assert_healthy(_train(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                           F.cross_entropy, Y, inputs=X))


class _SignSum(nn.Module):
    """An LSTM that tells whether a +-1 sequence sums above zero."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.rnn = nn.LSTM(1, 32, batch_first=True)
        self.head = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class _LSTMClassifier(nn.Module):
    """An LSTM read at its last step: a 3-class task on 4-channel sequences."""

    def __init__(self, num_layers: int, hidden: int) -> None:
        super().__init__()
        self.rnn = nn.LSTM(4, hidden, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def _train_lstm_adam(lr: float, seed: int, *, num_layers: int = 2, hidden: int = 16
                     ) -> ndb.Trace:
    """Three epochs of Adam over a shuffled set of 1,024 sequences, no clipping."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1024, 15, 4, generator=g)
    y = (x[:, :, 0].mean(1) > 0.1).long() + (x[:, :, 1].mean(1) > 0.1).long()
    torch.manual_seed(seed)
    model = _LSTMClassifier(num_layers, hidden)
    return _train_epochs(model, torch.optim.Adam(model.parameters(), lr=lr), x, y, g,
                         epochs=3)


def test_a_loss_that_leaps_after_the_first_step_and_falls_back_to_chance_is_a_failure(
        ) -> None:
    """An LSTM at Adam 1.0: the loss is 1.1 (chance) before the first update, 10 after it,
    and falls back to about 1.2; at 3e-3 it learns (about 0.5). Measured from the median of
    its first losses, the leap itself, the loss "fell" 4x and both reasoners judged the
    run healthy. Measured from the loss on the initial weights it never improved."""
    trace = _train_lstm_adam(1.0, 0)
    loss = trace.steps["loss"].to_numpy()
    assert np.median(loss[:10]) > 2 * loss[0] and np.median(loss[-10:]) > loss[0]
    hyps = ndb.explain(trace, method="probabilistic")
    assert hyps and hyps[0].confidence >= 0.5, hyps[:2]
    assert hyps[0].root_cause == "learning_rate_too_high", hyps[:2]
    heuristic = ndb.explain(trace)
    assert heuristic and heuristic[0].root_cause == "learning_rate_too_high", heuristic[:2]
    twin = _train_lstm_adam(3e-3, 0)
    _assert_healthy(twin)
    assert max((h.confidence for h in ndb.explain(twin, method="probabilistic")),
               default=0.0) < 0.5


@pytest.mark.parametrize("seed", [2, 4])
def test_a_first_step_that_outgrew_the_weights_is_the_rate_for_both_reasoners(seed: int
                                                                              ) -> None:
    """A 1-layer LSTM at Adam 1.0: the first step moves the weights by about 10x their norm
    and the loss leaps (seed 4: 1.16 before it, 9.3 after, back to 1.4 at the end, chance
    1.1; seed 2: 1.12, 4.3, 9.1, ending at 1.75). The stall rule gave a too-high rate half
    its support (0.49), since such a rate more often diverges, and a guard read seed 4's
    fall from the leap as early learning settled at the task's floor: the heuristic said the
    rate at 0.45. The network measured progress from the median of the first three losses,
    the leap itself: seed 2 "learned" and was judged healthy at 0.94, seed 4 hedged at 0.45.
    The first step that outgrew the weights is the damage, as a loss that rose is, and the
    fall back from the leap is no learning."""
    trace = _train_lstm_adam(1.0, seed, num_layers=1, hidden=32)
    assert trace.steps["update_ratio"].iloc[0] > 5.0
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(trace, method=method)[0]
        assert top.root_cause == "learning_rate_too_high", (method, top)
        assert top.confidence >= 0.5, (method, top)
    twin = _train_lstm_adam(3e-3, seed, num_layers=1, hidden=32)
    _assert_healthy(twin)


@pytest.mark.parametrize("seed", [0, 2])
def test_a_rate_cut_fixes_an_lstm_whose_layer_states_never_showed_the_failure(seed: int
                                                                             ) -> None:
    """The 1-layer LSTM at Adam 1.0 again: every block's gradient and activation state
    reads healthy in every slice, the loss rises and falls back above chance. Re-run with
    the rate 300x lower it learns. ``what_if`` said 0.99 for that cut: the abduction moved
    the root cause to none, but the failure type hung on the healthy layer states alone,
    and its noise, abducted from a failure those states did not show, kept the failure in
    any world. The failure the states do not show is now a node of its own, a child of the
    root cause (``causal_models.structure.UNSEEN``)."""
    trace = _train_lstm_adam(1.0, seed, num_layers=1, hidden=32)
    rerun = _train_lstm_adam(3e-3, seed, num_layers=1, hidden=32).steps["loss"].to_numpy()
    assert np.median(rerun[-10:]) < 0.7 * rerun[0]  # the cut run learns
    cut = ndb.what_if(trace, lr_scale=3e-3)
    assert cut.p_failure_factual >= 0.5
    assert cut.p_failure < 0.5, cut.metadata["prediction"]
    assert ndb.what_if(trace, lr_scale=3.0).p_failure >= 0.5  # a higher rate still fails


def _train_norm_mlp(optimizer: str, lr: float, batch_norm: bool) -> ndb.Trace:
    """The digits MLP of :func:`_mlp`, with a batch norm after each hidden layer or none."""
    torch.manual_seed(0)
    norm: Callable[[], list[nn.Module]] = (lambda: [nn.BatchNorm1d(64)]) if batch_norm \
        else (lambda: [])
    model = nn.Sequential(nn.Linear(64, 64), *norm(), nn.ReLU(), nn.Linear(64, 64), *norm(),
                          nn.ReLU(), nn.Linear(64, 10))
    opt = (torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9) if optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=lr))
    return _train(model, opt, nn.CrossEntropyLoss(), Y)


@pytest.mark.parametrize("optimizer, lr, rescued", [("sgd", 5.0, False), ("adam", 0.1, True)])
def test_batch_norm_rescues_adam_not_sgd_from_a_rate_two_decades_too_high(
        optimizer: str, lr: float, rescued: bool) -> None:
    """A ReLU MLP at a hundred times its usual rate, SGD with momentum (0.05) or Adam (1e-3).
    Re-run with a batch norm after each hidden layer, the Adam run trains and the SGD run
    does not: a normalised layer is blind to its weights' scale, so a large step grows them
    and shrinks the next steps, but SGD's step grows with the gradient and two decades up
    its first steps overshoot first (the randomised corpus: 10 of 10 SGD runs with batch
    norm failed at 31-100x). ``what_if(normalization="batch")`` said 0.10 for the SGD run,
    a fix: the network's rule let any normalization cut a rate's fault to 0.3 of itself,
    whatever the optimizer."""
    trace = _train_norm_mlp(optimizer, lr, batch_norm=False)
    rerun = _train_norm_mlp(optimizer, lr, batch_norm=True).steps["loss"].to_numpy()
    assert (np.mean(rerun[-10:]) < 1.0) == rescued  # chance is 2.3
    cf = ndb.what_if(trace, normalization="batch")
    assert cf.p_failure_factual >= 0.5
    assert (cf.p_failure < 0.5) == rescued, cf.metadata["prediction"]
    assert ndb.what_if(trace, lr_scale=0.01).p_failure < 0.5  # the rate cut fixes both


class _FunctionalCNN(nn.Module):
    """A digits CNN as most CNN code writes it: activations and pooling as functions, so no
    module shows the rectified outputs before the dropout."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.c1 = nn.Conv2d(1, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.drop = nn.Dropout(0.1)
        self.fc = nn.Linear(32 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.c1(x.view(-1, 1, 8, 8))), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc(self.drop(x.flatten(1)))


def test_units_killed_behind_a_functional_relu_are_dead_neurons_from_the_rate() -> None:
    """SGD with momentum at lr 2 kills every unit of the CNN's second block; with the ReLU
    applied as ``F.relu`` the dropout after it is the first module whose output shows them
    (every unit zero for the whole batch, which no drop rate does). The dropout was exempt
    from dead units, and both reasoners said vanishing gradients at the dropout, cause
    unknown (0.75 and 0.98), and ``what_if`` kept the rate cut failing (a helper's user
    probe: the run at lr 0.02 trains)."""
    model = _FunctionalCNN()
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=2.0, momentum=0.9),
                   F.cross_entropy, Y)
    assert trace.stats.loc[trace.stats["module_name"] == "drop", "act_frac_dead"].iloc[-1] == 1
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(trace, method=method)[0]
        assert (top.failure_type, top.root_cause) == ("dead_neurons", "learning_rate_too_high"), (
            method, top)
        assert top.confidence >= 0.5
    assert ndb.what_if(trace, lr_scale=0.01).p_failure < 0.5
    twin = _FunctionalCNN()
    _assert_healthy(_train(twin, torch.optim.SGD(twin.parameters(), lr=0.02, momentum=0.9),
                           F.cross_entropy, Y))


@pytest.mark.parametrize("zero_grad", [False, True])
def test_an_lstm_trained_with_adam_without_zero_grad_is_named(zero_grad: bool) -> None:
    """Adam's noisy steps let the summed gradient norm fall now and then (0.66 of the steps
    rise), but it grows like a running sum and 14x faster than the output gradients: the bug,
    not the rate (lr / 10 without zero_grad does not train either). Seed 1 of this script;
    seeds 0 and 2 keep the gradient ratio near 3x and are still read as a too-high rate (an
    open miss: the closing note of the rules' change reports it)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 2, (1600, 20, 1), generator=g).float() * 2 - 1
    y = (x.sum(1).squeeze(-1) > 0).long()
    model = _SignSum()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(300):
            idx = torch.randint(0, 1600, (64,), generator=g)
            if zero_grad:
                opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            if zero_grad:  # the healthy twin clips, as the user's working script did
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            dbg.step(loss)
    if zero_grad:
        _assert_healthy(dbg.trace)
        return
    hyps = ndb.explain(dbg.trace)
    assert hyps and hyps[0].root_cause == "missing_zero_grad", hyps[:2]
    assert not [h for h in hyps if h.confidence >= 0.5
                and h.root_cause not in ("missing_zero_grad", "unknown")], hyps[:4]


def test_a_blow_up_at_lr_20_is_not_read_as_gradients_never_reset() -> None:
    """lr 20 with zero_grad called: the gradient norm grows like t^12, a blow-up; a running sum
    of gradients grows like t (t^2 under momentum). The rate is the cause."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=20.0)
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    with ndb.NeuralDbg(model, optimizer=opt, config={"lr": 20.0}) as dbg:
        for _ in range(30):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dbg.step(loss)
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(dbg.trace, method=method)
        assert hyps and hyps[0].root_cause == "learning_rate_too_high", (method, hyps[:2])
        assert not [h for h in hyps if h.root_cause == "missing_zero_grad"
                    and h.confidence >= 0.5], (method, hyps[:4])


def test_a_softmax_before_cross_entropy_whose_loss_settles_on_its_floor_is_named() -> None:
    """Adam learns the digits through the softmax: the loss falls 2.3 -> ~1.5, 3% above the floor.

    ``CrossEntropyLoss`` on probabilities cannot go below log(1 + 9 / e) = 1.46 for ten
    classes, so a loss that fell a long way (no stall) and settled there is the bug; the
    same network without the softmax goes on to ~0.
    """
    model = nn.Sequential(_mlp(), nn.Softmax(dim=1))
    trace = _train(model, torch.optim.Adam(model.parameters(), lr=3e-3), F.cross_entropy, Y,
                   steps=300)
    floor = torch.log1p(torch.tensor(9.0) / torch.e).item()
    loss = trace.steps.loss
    assert loss.iloc[0] > floor * 1.4 and loss.iloc[-20:].median() < floor * 1.05
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert hyps and hyps[0].root_cause == "loss_output_mismatch", (method, hyps[:2])
    top = _top(trace)
    assert top is not None and top.failure_type == "training_plateau", top
    assert 0 < top.metadata["cause_evidence"]["loss_floor_gap"] < 0.05
    assert "plateau_unclaimable" not in ndb.what_if(trace).metadata  # named: claimed by both
    model = _mlp()
    twin = _train(model, torch.optim.Adam(model.parameters(), lr=3e-3), F.cross_entropy, Y,
                  steps=300)
    _assert_healthy(twin)
    assert not any(h.confidence >= 0.5 for h in ndb.explain(twin, method="probabilistic"))


def _train_scheduled(cut: Callable[[int], float], steps: int = 200) -> ndb.Trace:
    """SGD on the digits with the rate set by ``cut(step)`` (a multiple of 0.1) each step."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * cut(0), momentum=0.9)

    def set_rate(step: int, loss: torch.Tensor) -> None:  # for the next step
        for group in opt.param_groups:
            group["lr"] = 0.1 * cut(step + 1)

    return _train(model, opt, F.cross_entropy, Y, steps=steps, after_step=set_rate)


def test_a_step_schedule_stepped_every_batch_is_a_rate_that_collapsed() -> None:
    """``StepLR(step_size=20, gamma=0.1)`` meant per epoch, stepped per batch: the rate is
    1e-4 of its start by step 60 and the loss stops at ~1.6 (77% accuracy) where the same
    schedule per epoch trains on to ~0.1."""
    trace = _train_scheduled(lambda step: 0.1 ** (step // 20))
    top = _top(trace)
    assert top is not None and top.failure_type == "training_plateau", top
    assert top.root_cause == "learning_rate_too_low", top
    assert top.metadata["evidence"]["lr_collapse_step"] <= 80
    _assert_healthy(_train_scheduled(lambda step: 1.0))


@pytest.mark.parametrize("schedule", ["cosine_to_zero", "cut_after_converging"])
def test_a_rate_that_decays_once_the_run_has_converged_is_healthy(schedule: str) -> None:
    """A cosine decay to 0, and a rate cut 10x four times after the loss converged (what
    ``ReduceLROnPlateau`` does): the loss had nothing left to learn when the rate fell."""
    import math

    if schedule == "cosine_to_zero":
        cut = lambda step: 0.5 * (1.0 + math.cos(math.pi * step / 199))  # noqa: E731
    else:
        cut = lambda step: 0.1 ** min(4, max(0, (step - 100) // 10 + 1))  # noqa: E731
    trace = _train_scheduled(cut)
    assert trace.steps.loss.iloc[-20:].median() < 0.3
    _assert_healthy(trace)


def test_reduce_on_plateau_cutting_a_run_at_its_noise_floor_is_no_rate_too_low() -> None:
    """30% of the labels replaced at random: the loss settles near 1.3 by step ~100, and
    ReduceLROnPlateau (factor 0.1, patience 2, stepped every 10 steps) cuts the rate to
    1e-6 of its start. The cuts followed the stall; both methods named
    learning_rate_too_low (1.00 / 0.83), as a helper's probe found on the same schedule."""
    g = torch.Generator().manual_seed(3)
    noisy = Y.clone()
    flip = torch.rand(len(noisy), generator=g) < 0.3
    noisy[flip] = torch.randint(0, 10, (int(flip.sum()),), generator=g)
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.1, patience=2)
    recent: list[float] = []

    def schedule(step: int, loss: torch.Tensor) -> None:
        recent.append(float(loss.detach()))
        if step % 10 == 9:
            sched.step(sum(recent[-10:]) / 10)

    trace = _train(model, opt, F.cross_entropy, noisy, steps=300, generator=g,
                   after_step=schedule)
    lr = trace.steps["lr"].to_numpy()
    assert lr[-1] < 1e-3 * lr[0]  # the rate collapsed, as the collapse rule reads it
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert not hyps or hyps[0].confidence < 0.5, (method, hyps[0])


def test_a_model_re_created_after_its_optimizer_is_not_read_as_gradients_never_reset() -> None:
    """The optimizer holds the first model's parameters; the loop trains the second one.

    ``opt.zero_grad()`` clears the old parameters, so the new ones pile up gradients like a
    missing ``zero_grad`` would, but nothing ever moves them: adding ``zero_grad`` cannot
    help, and no cause in the vocabulary fits. The capture says so when it starts.
    """
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model = _mlp()  # re-created after the optimizer
    with pytest.warns(ndb.NeuralDbgWarning, match="hold none of the model's"):
        trace = _train(model, opt, F.cross_entropy, Y)
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert hyps and hyps[0].confidence >= 0.5 and hyps[0].root_cause == "unknown", (
            method, hyps[:2])
        assert not any(h.root_cause != "unknown" and h.confidence >= 0.5 for h in hyps)
    assert ndb.explain(trace)[0].metadata["cause_evidence"]["weights_unmoved"] is True


def test_a_short_healthy_run_still_learning_is_no_plateau_for_either_method() -> None:
    """30 steps of SGD whose loss is still falling (1.4 -> ~1.0): too early for a plateau.

    The probabilistic model, fitted on runs of 100 steps or more, read the slow start as a
    stall (training_plateau / unknown at 0.93) on every short run a new user tried.
    """
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 20, generator=g)
    y = (x @ torch.randn(20, 4, generator=g)).argmax(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(30):
            i = (step * 32) % 256
            opt.zero_grad()
            loss = F.cross_entropy(model(x[i:i + 32]), y[i:i + 32])
            loss.backward()
            opt.step()
            dbg.step(loss)
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(dbg.trace, method=method)
        assert not any(h.confidence >= 0.5 for h in hyps), (method, hyps[:2])


def test_a_loop_that_never_calls_opt_step_is_a_stall_not_an_explosion() -> None:
    """``opt.step()`` forgotten: no step is measured, so the gradient norms are NaN (not
    recorded), which the probabilistic model read as non-finite gradients
    (exploding_gradients at 0.92). The loss sits at chance: a stall, cause unknown."""
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    trace = _train(model, opt, F.cross_entropy, Y, steps=100, step=False)
    assert trace.steps["grad_norm"].isna().all()
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert hyps and hyps[0].failure_type == "training_plateau", (method, hyps[:2])
        assert not any(h.root_cause != "unknown" and h.confidence >= 0.5 for h in hyps), (
            method, hyps[:3])
        assert "optimizer.step()" in hyps[0].metadata["hint"], (method, hyps[0].metadata)


def _train_gradientless(bug: str) -> ndb.Trace:
    """Adam on the digits MLP, with the gradient lost before every optimizer step."""
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return _train(model, opt, F.cross_entropy, Y, steps=100,
                  backward=bug != "no_backward",
                  zero_grad_after_backward=bug == "zero_grad_after_backward")


@pytest.mark.parametrize("bug", ["no_backward", "zero_grad_after_backward"])
def test_a_loop_whose_gradients_never_reach_the_step_names_no_cause(bug: str) -> None:
    """``loss.backward()`` forgotten, or ``zero_grad()`` between it and ``opt.step()``: the
    weights never move, the loss sits at chance. No knob in the vocabulary explains it (the
    probabilistic model said learning_rate_too_low at 0.71, which a user would follow for
    nothing), so both methods name the stall with cause 'unknown' and say what to check."""
    trace = _train_gradientless(bug)
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        top = hyps[0]
        assert top.failure_type == "training_plateau" and top.root_cause == "unknown", (
            method, hyps[:2])
        assert top.confidence >= 0.5, (method, top)
        assert "loss.backward()" in top.metadata["hint"], (method, top.metadata)
        assert not any(h.root_cause != "unknown" and h.confidence >= 0.5 for h in hyps), (
            method, hyps[:3])
        assert top.metadata["hint"] in verdict(hyps).sentence, method


def _train_bn_mlp(train_mode: bool, seed: int, *, lr: float = 0.5,
                  learned_scale: float | None = None) -> ndb.Trace:
    """A 5-block BatchNorm MLP on the raw digit pixels (0-16), SGD at 0.5: it trains in
    train() mode; ``model.eval()`` called once before the loop freezes every BatchNorm on
    its initial running statistics, so nothing normalises and the run blows up.
    ``learned_scale`` sets every BatchNorm weight as a pretrained network's would be."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(64, 128), nn.BatchNorm1d(128), nn.ReLU()]
    for _ in range(4):
        layers += [nn.Linear(128, 128), nn.BatchNorm1d(128), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(128, 10))
    if learned_scale is not None:
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, nn.BatchNorm1d):
                    m.weight.fill_(learned_scale)
    model.train(train_mode)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return _train(model, opt, F.cross_entropy, Y, inputs=X * 16.0, steps=200)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_model_trained_in_eval_mode_is_not_blamed_on_its_inputs(seed: int) -> None:
    """Both methods said the inputs were not normalised (the heuristic at 1.00); scaling
    them does not rescue the run, ``model.train()`` does. BatchNorm layers whose outputs are
    off unit std at the first step do not normalise: no cause in the vocabulary, so the
    failure is named with cause 'unknown' and the hint says what to check."""
    trace = _train_bn_mlp(False, seed)
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert hyps and hyps[0].confidence >= 0.5, (method, hyps[:2])
        assert hyps[0].root_cause == "unknown", (method, hyps[:2])
        assert "model.train()" in hyps[0].metadata["hint"], (method, hyps[0].metadata)
        assert not any(h.root_cause != "unknown" and h.confidence >= 0.5 for h in hyps), (
            method, hyps[:3])
    twin = _train_bn_mlp(True, seed)
    for method in ("heuristic", "probabilistic"):
        assert not any(h.confidence >= 0.5 for h in ndb.explain(twin, method=method)), method


def _train_clipped(max_norm: float) -> ndb.Trace:
    model = _mlp()
    return _train(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, Y,
                  steps=200, clip=max_norm)


def test_a_clip_that_caps_every_step_is_named_not_a_low_rate() -> None:
    """``clip_grad_norm_(max_norm=1e-4)`` at lr 0.1: every update is 1e-5 in size and the
    loss stalls. Both methods said learning_rate_too_low (the heuristic at 1.00) to a user
    whose rate is fine; the recorded gradient norm, 1e-4 at every step, shows the clip."""
    trace = _train_clipped(1e-4)
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert hyps[0].failure_type == "training_plateau" and hyps[0].confidence >= 0.5, (
            method, hyps[:2])
        assert hyps[0].root_cause == "unknown" and "max_norm" in hyps[0].metadata["hint"], (
            method, hyps[:2])
        assert not any(h.root_cause != "unknown" and h.confidence >= 0.5 for h in hyps), (
            method, hyps[:3])
    twin = _train_clipped(1.0)
    for method in ("heuristic", "probabilistic"):
        assert not any(h.confidence >= 0.5 for h in ndb.explain(twin, method=method)), method


def test_a_gradient_that_never_changes_under_a_rate_far_too_low_is_no_clip() -> None:
    """The whole data set as one batch at SGD's 1e-6: the weights stay put, so the gradient
    is the same at every step, its norm within 1e-3 of one value as a clip that caps every
    step makes it. A new user's graph network (no clip in the script) got the clip-too-tight
    hint as the cause (unknown, 0.99-1.00) over a rate too low. The loss held as still as
    the gradient says nothing moved, which a clip does not do."""
    model = _mlp()
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=1e-6), F.cross_entropy, Y,
                   steps=200, batches=itertools.repeat(torch.arange(len(X))))
    g = trace.steps["grad_norm"].to_numpy()
    assert np.mean(np.abs(g / np.median(g) - 1) <= 1e-3) >= 0.9  # pinned, as under a clip
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(trace, method=method)[0]
        assert top.failure_type == "training_plateau" and top.confidence >= 0.5, (method, top)
        assert top.root_cause == "learning_rate_too_low", (method, top, top.metadata)
        assert "max_norm" not in top.metadata.get("hint", ""), (method, top.metadata)


@pytest.mark.parametrize("weight_decay, bug", [(1.0, True), (1e-3, False)])
def test_a_weight_decay_that_collapses_the_weights_is_not_a_high_rate(weight_decay: float,
                                                                      bug: bool) -> None:
    """SGD at lr 0.1 with ``weight_decay=1.0``: the weights shrink 300x and the loss stays at
    chance. The update ratio (update / weight norm) then looks like a rate far too high, and
    both methods said learning_rate_too_high (0.59, 0.83), though lowering the rate does not
    help. The twin at weight_decay 1e-3 trains."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=weight_decay)
    trace = _train(model, opt, F.cross_entropy, Y, steps=200)
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        if not bug:
            assert not any(h.confidence >= 0.5 for h in hyps), (method, hyps[:2])
            continue
        assert hyps[0].confidence >= 0.5 and hyps[0].root_cause == "unknown", (method, hyps[:2])
        assert "weight_decay" in hyps[0].metadata["hint"], (method, hyps[0].metadata)
        assert not any(h.root_cause != "unknown" and h.confidence >= 0.5 for h in hyps), (
            method, hyps[:3])


def test_one_failure_claims_one_cause() -> None:
    """Labels unrelated to the inputs: the heuristic named data_problem (0.95) and listed
    learning_rate_too_high at 0.72 under it, a second claim a user would act on. A cause
    listed after the one carrying the failure stays below 0.5."""
    g = torch.Generator().manual_seed(3)
    shuffled = Y[torch.randperm(len(Y), generator=g)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy,
                   shuffled, steps=300)
    hyps = ndb.explain(trace)
    assert hyps[0].confidence >= 0.5 and hyps[0].root_cause == "data_problem", hyps[:2]
    for failure in {h.failure_type for h in hyps}:
        claimed = [h.root_cause for h in hyps if h.failure_type == failure
                   and h.confidence >= 0.5 and h.root_cause != "unknown"]
        assert len(claimed) <= 1, (failure, hyps[:4])


def test_a_failure_claimed_by_a_cause_is_not_also_claimed_unknown() -> None:
    """Epochs of minibatches over a shuffled training split, without ``zero_grad``: the
    heuristic named dead_neurons / missing_zero_grad at 1.00 and, under it,
    dead_neurons / unknown at 0.90 (exploding: 0.84 and 0.72), a cause and "no known cause"
    both claimed for one failure (a helper's new-user probe). Every alternative to the cause
    that carries a failure, "unknown" included, stays below 0.5."""
    order = np.random.default_rng(0).permutation(len(X))[:1400]
    x, y = X[order], Y[order]
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(7):
            perm = torch.randperm(len(x), generator=g)
            for i in range(0, len(x) - 31, 32):
                batch = perm[i:i + 32]
                loss = F.cross_entropy(model(x[batch]), y[batch])  # opt.zero_grad() forgotten
                loss.backward()
                opt.step()
                dbg.step(loss)
    hyps = ndb.explain(dbg.trace)
    assert hyps[0].root_cause == "missing_zero_grad" and hyps[0].confidence >= 0.5, hyps[:2]
    for failure in {h.failure_type for h in hyps}:
        claims = [h.root_cause for h in hyps if h.failure_type == failure
                  and h.confidence >= 0.5]
        assert len(claims) <= 1, (failure, hyps[:4])


def test_dropout_zeros_are_not_dead_units() -> None:
    """``Dropout(0.95)`` after every hidden layer: the network cannot learn (the loss stays
    near chance), but the zeros are the dropout's draws. The heuristic named dead_neurons at
    the Dropout module (0.71); the failure is a stall, its cause unknown."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.95), nn.Linear(128, 128),
                          nn.ReLU(), nn.Dropout(0.95), nn.Linear(128, 10))
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, Y,
                   steps=300)
    dropouts = {"2", "5"}
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert hyps[0].confidence >= 0.5 and hyps[0].failure_type == "training_plateau", (
            method, hyps[:2])
        assert not any(h.failure_type == "dead_neurons" and h.origin_layer in dropouts
                       for h in hyps), (method, hyps[:3])


def test_batchnorm_with_learned_scales_in_train_mode_is_not_read_as_eval() -> None:
    """Fine-tuning: BatchNorm weights at 0.3 (learned, as in a pretrained network) put the
    outputs' std at ~0.3 in train mode too. Only layers still at their initial weight and
    bias are read, so a run that fails at a rate far too high is not told to call
    model.train()."""
    trace = _train_bn_mlp(True, 0, lr=20.0, learned_scale=0.3)
    assert math.isnan(batchnorm_off_factor(trace))  # no layer at its initial affine is read
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert hyps and hyps[0].confidence >= 0.5, (method, hyps[:2])
        assert "model.train()" not in str(hyps[0].metadata.get("hint", "")), (method, hyps[0])


def test_biases_that_kill_every_hidden_layer_are_dead_units_not_missing_normalization() -> None:
    """Both hidden ReLU layers of an MLP start with biases at -5: every unit is dead from
    step 0, so every gradient upstream of the last dead layer is zero. The zero gradients are
    the dead layers' doing: the dead units come first, with the bias as their cause."""
    model = _mlp()
    with torch.no_grad():
        model[0].bias.fill_(-5.0)
        model[2].bias.fill_(-5.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trace = _train(model, opt, F.cross_entropy, Y)
    assert (trace.stat("act_frac_dead")[["1", "3"]] == 1.0).all().all()
    top, hyps = _top(trace), ndb.explain(trace)
    assert (top.failure_type, top.root_cause) == ("dead_neurons", "negative_bias_init")
    assert all(h.confidence < 0.5 for h in hyps[1:])


def _epochs() -> Iterator[torch.Tensor]:
    """Minibatches of shuffled epochs, the DataLoader way (``shuffle=True, drop_last=True``)."""
    g = torch.Generator().manual_seed(0)
    while True:
        order = torch.randperm(len(X), generator=g)
        for i in range(0, len(X) - 63, 64):
            yield order[i:i + 64]


def test_an_all_zero_initialisation_is_symmetric_not_a_negative_bias() -> None:
    """Every weight and bias at 0: each ReLU unit is fed exactly 0 and outputs 0 from step 0,
    which looks like a bias that switched the units off, but no bias is negative; the rows
    are copies of each other. Both methods name the symmetric initialisation."""
    model = _mlp()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, Y,
                   steps=200, batches=_epochs())
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert hyps and hyps[0].confidence >= 0.5, (method, hyps[:2])
        assert hyps[0].root_cause == "symmetric_init", (method, hyps[:2])
        assert not any(h.root_cause == "negative_bias_init" and h.confidence >= 0.5
                       for h in hyps), (method, hyps[:3])


def test_units_a_huge_rate_killed_after_the_first_steps_are_not_blamed_on_the_bias() -> None:
    """Plain SGD at lr 3.0: the ReLU units die within the first steps (alive at step 0).
    The heuristic names the rate; the causal model must not name a negative bias
    initialisation with confidence (the biases started at PyTorch's default)."""
    model = _mlp()
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=3.0), F.cross_entropy, Y,
                   steps=200, batches=_epochs())
    dead = trace.stat("act_frac_dead")[["1", "3"]]
    assert (dead.iloc[0] < 0.5).all() and (dead.iloc[-1] > 0.5).any()
    top = ndb.explain(trace, method="heuristic")[0]
    assert (top.failure_type, top.root_cause) == ("dead_neurons", "learning_rate_too_high")
    hyps = ndb.explain(trace, method="probabilistic")
    assert hyps and hyps[0].failure_type == "dead_neurons" and hyps[0].confidence >= 0.5
    assert not any(h.root_cause == "negative_bias_init" and h.confidence >= 0.5
                   for h in hyps), hyps[:3]


@pytest.mark.parametrize("method", ["heuristic", "probabilistic"])
def test_units_killed_by_a_rate_spike_are_the_rate_though_the_dead_run_barely_moves(
        method: str) -> None:
    """SGD at lr 3.0, full batch: the loss spikes at step 3 (1.9 -> 8.2), the ReLU units
    die and the run sits at chance with updates near zero. The rate's evidence is the median
    update ratio before the failure; over the whole run it is 0.013 here, a hair above the
    0.01 line (0.003 on another processor's rounding, where both methods said dead_neurons
    with cause ``unknown``). The steps before the spike (0.1-0.4) are the ones that tell the
    rate."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    data = torch.arange(len(X))
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=3.0), F.cross_entropy, Y,
                   steps=120, inputs=(X - 0.5) * 2, batches=iter(lambda: data, None))
    loss = trace.steps["loss"].to_numpy()
    assert loss[3] > 3 * loss[2] and loss[-10:].mean() > 2.0  # a spike, then no learning
    assert float(np.median(trace.steps["update_ratio"])) < 0.02
    assert loss_dynamics(trace).update_ratio > 0.1  # the steps before the spike
    top = ndb.explain(trace, method=method)[0]
    assert (top.failure_type, top.root_cause) == ("dead_neurons", "learning_rate_too_high"), top
    assert top.confidence >= 0.5, top


class _SmallCNN(nn.Module):
    """Two 3x3 convolutions (16, 32 channels), a 2x2 max-pool and a head, on 8x8 digits."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(1, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c1(x.view(-1, 1, 8, 8)))
        return self.fc(F.max_pool2d(torch.relu(self.c2(x)), 2).flatten(1))


def test_weights_100x_too_small_under_adam_are_not_read_as_a_rate_too_high() -> None:
    """A CNN whose weight matrices were multiplied by 0.01 after PyTorch's init, Adam at
    a standard 1e-3: Adam steps by about the rate per weight, so against weights 100x
    smaller every update looks large, and the heuristic said exploding_gradients /
    learning_rate_too_high (support 0.59, the top hypothesis; in the probe that found it a
    lower rate made the run worse and the default init fixed it). The biases, which the
    scaling left alone, dominate the layers' outputs, so the signal's gain per layer reads
    normal (0.62); the weights' norms against PyTorch's default (0.05-0.35) show the init."""
    torch.manual_seed(0)
    model = _SmallCNN()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(0.01)
    trace = _train(model, torch.optim.Adam(model.parameters(), lr=1e-3), F.cross_entropy,
                   Y, steps=200, batch=128)
    facts = ndb.methods.heuristic_diagnosis(trace).facts
    assert facts.weight_scale < 0.1 < facts.init_gain
    hyps = ndb.explain(trace)
    assert hyps[0].root_cause != "learning_rate_too_high", hyps[:2]  # it was, at 0.32
    support = hyps[0].metadata["cause_support"]["learning_rate_too_high"]
    assert support < 0.5, support  # 0.59 before the weights' scale was read
    for hyp in hyps:
        assert hyp.root_cause != "learning_rate_too_high" or hyp.confidence < 0.5, hyp


def _plain_stack(depth: int, norm: bool) -> nn.Module:
    """``depth`` hidden ReLU layers of 64 at PyTorch's init, with or without BatchNorm."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    width_in = 64
    for _ in range(depth):
        layers += [nn.Linear(width_in, 64), *([nn.BatchNorm1d(64)] if norm else []), nn.ReLU()]
        width_in = 64
    return nn.Sequential(*layers, nn.Linear(64, 10))


@pytest.mark.parametrize("method", ["heuristic", "probabilistic"])
def test_weights_100x_too_small_under_sgd_are_named_not_a_negative_bias(method: str) -> None:
    """Four hidden ReLU layers whose weight matrices were multiplied by 0.01 after PyTorch's
    init, SGD with momentum at 0.05: the unscaled biases dominate every layer's output, so
    the signal's gain reads sound (1.4) and the forward signal holds; the gradient vanishes
    and the loss does not move. The weights' norm against PyTorch's default (~0.01-0.05)
    shows the init: the heuristic names it; the causal model, which read the init level
    from the forward gain alone, said negative_bias_init (0.71 in the probe that found it)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(0.01)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trace = _train(model, opt, F.cross_entropy, Y, steps=150, batch=128)
    hyps = ndb.explain(trace, method=method)
    assert hyps[0].confidence >= 0.5 and hyps[0].root_cause == "init_scale_too_small", hyps[:3]
    assert not any(h.root_cause == "negative_bias_init" and h.confidence >= 0.5 for h in hyps)


def test_a_gradient_that_fades_across_a_deep_plain_stack_is_missing_normalization() -> None:
    """Twelve hidden ReLU layers at PyTorch's init under SGD 0.05: the biases keep the
    forward signal alive (it shrinks 4.5x over the stack, short of the 10x line), but the
    gradient fades below a thousandth of the output layer's in nine layers and the loss
    does not move. Each layer's own gain is sound and no unit saturates: the depth without
    normalization is the cause (BatchNorm after each layer trains), where the heuristic
    said ``unknown``."""
    def run(norm: bool) -> ndb.Trace:
        model = _plain_stack(12, norm)
        return _train(model, torch.optim.SGD(model.parameters(), lr=0.05), F.cross_entropy,
                      Y, steps=150, batch=128)

    trace = run(False)
    top = ndb.explain(trace)[0]
    assert (top.failure_type, top.root_cause) == ("vanishing_gradients",
                                                  "missing_normalization"), top
    assert top.confidence >= 0.5
    _assert_healthy(run(True))


def test_a_deep_relu_stack_whose_signal_fades_is_not_blamed_on_a_negative_bias() -> None:
    """Eight ReLU layers at PyTorch's default init under SGD: the signal fades with depth, so
    deep layers see little but their random biases and half their units are off from step
    0. That is no negative bias (the biases are symmetric around 0): no method may name
    ``negative_bias_init`` with confidence, where the all-negative offset of a real one is."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(64, 10))
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, Y,
                   steps=250, batches=_epochs())
    assert trace.steps["loss"].iloc[-20:].median() > 2.2  # it learned nothing
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert hyps and hyps[0].confidence >= 0.5, (method, hyps[:2])  # a failure
        assert not any(h.root_cause == "negative_bias_init" and h.confidence >= 0.5
                       for h in hyps), (method, hyps[:3])


def test_weights_scaled_30x_after_init_are_named_though_the_loss_fell_from_thousands() -> None:
    """Every weight matrix multiplied by 30 after PyTorch's init: the first loss is in the
    thousands and collapses to near chance within a few steps, which reads as a run that
    improved by most of its loss. Measured from where it settled, it barely learned (most
    units died in the transient): the stall counts, both methods rank the initialisation
    first and the causal model claims it. The twin at the default init raises nothing."""
    model = _mlp()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(30.0)
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, Y,
                   steps=300)
    loss = trace.steps["loss"]
    assert loss.iloc[0] > 300 and loss.iloc[-30:].median() > 1.5  # no real learning
    # measured from the first window, the loss improved by ~75%: no stall at all
    assert loss_dynamics(trace).stall > 0.5
    heuristic = ndb.explain(trace)
    assert heuristic[0].root_cause == "init_scale_too_large", heuristic[:3]
    assert heuristic[0].confidence > 0.4, heuristic[:3]  # 0.26 with the stall at 0
    hyps = ndb.explain(trace, method="probabilistic")
    assert hyps[0].root_cause == "init_scale_too_large" and hyps[0].confidence >= 0.5, hyps[:3]
    model = _mlp()
    _assert_healthy(_train(model, torch.optim.SGD(model.parameters(), lr=0.1),
                           F.cross_entropy, Y, steps=300))


def _deep_relu(scale: float, seed: int) -> nn.Module:
    """Four hidden ReLU layers of 128 on digits, every weight matrix times ``scale``."""
    torch.manual_seed(seed)
    sizes = [64, 128, 128, 128, 128, 10]
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers += [nn.Linear(sizes[i], sizes[i + 1]), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(scale)
    return model


@pytest.mark.parametrize("method", ["heuristic", "probabilistic"])
@pytest.mark.parametrize("seed", [0, 2])
def test_an_init_5x_that_blows_up_under_momentum_is_not_blamed_on_the_rate(method: str,
                                                                           seed: int) -> None:
    """Weights 5x PyTorch's init (a gain of ~3 per layer, just under the init-gain line),
    SGD with momentum at a standard 0.05, full batch of inputs in [-1, 1]: the loss starts
    at 56-100 (chance is 2.3), blows up past 1e30 within ten steps and ends at chance.
    Every step's update ratio is huge, but the gradients were already 2-4x the weights
    before the first update, which no rate did. On seed 2 both methods used to say
    ``learning_rate_too_high`` (0.71 and 0.98); no method may claim the rate now, and the
    top cause is the init or an honest ``unknown``. Where the causal model names the init
    (seed 0), scaling the weights back must fix the run in ``what_if`` as it does in the
    re-run (the twin at the default init trains)."""
    data = torch.arange(len(X))

    def run(scale: float) -> ndb.Trace:
        model = _deep_relu(scale, seed)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return _train(model, opt, F.cross_entropy, Y, steps=60, inputs=(X - 0.5) * 2,
                      batches=iter(lambda: data, None))

    trace = run(5.0)
    loss = trace.steps["loss"].to_numpy()
    assert loss[0] > 30 and loss.max() > 1e6 and not loss[-5:].mean() < 2.0
    hyps = ndb.explain(trace, method=method)
    assert hyps[0].confidence >= 0.5, hyps[:3]
    assert hyps[0].root_cause in ("init_scale_too_large", "unknown"), hyps[:3]
    assert all(h.root_cause != "learning_rate_too_high" or h.confidence < 0.5 for h in hyps)
    if seed == 0:
        assert hyps[0].root_cause == "init_scale_too_large", hyps[:3]
    if method == "probabilistic" and hyps[0].root_cause == "init_scale_too_large":
        cf = ndb.what_if(trace, init_scale=0.2)
        assert cf.p_failure_factual > 0.9 and cf.p_failure < 0.5, cf
    twin = run(1.0)
    assert twin.steps["loss"].iloc[-5:].mean() < 0.5 * twin.steps["loss"].iloc[0]
    assert not any(h.confidence >= 0.5 for h in ndb.explain(twin, method=method))


def test_a_tiny_bert_at_its_standard_init_is_healthy_though_query_and_key_barely_learn() -> None:
    """A randomly initialised two-layer BERT (Hugging Face's std 0.02 init) trained with
    AdamW and a linear decay: the loss falls. Its attention query/key projections get
    gradients ~1e-6 of the classifier's (near-uniform attention passes little gradient to the
    scores), but the residual stream carries the gradient on to the embeddings: no vanishing
    toward the input, and no method may claim a failure."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=32, num_labels=2)
    model = transformers.BertForSequenceClassification(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    steps = 60
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 - k / steps)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 100, (2000, 12), generator=g)
    labels = (ids[:, 0] < 50).long()
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(steps):
            i = torch.randperm(2000, generator=g)[:16]
            opt.zero_grad()
            loss = model(input_ids=ids[i], labels=labels[i]).loss
            loss.backward()
            opt.step()
            sched.step()
            dbg.step(loss)
    trace = dbg.trace
    grads = trace.stats[trace.stats["step"] == 0].set_index("module_name")["out_grad_norm"]
    query = grads["bert.encoder.layer.0.attention.self.query"]
    assert query < 1e-4 * grads["classifier"]  # the small gradients this is about
    assert grads["bert.embeddings.word_embeddings"] > 0.1 * grads["classifier"]
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert not hyps or hyps[0].confidence < 0.5, (method, hyps[:2])


def _assert_claimed_as_unknown(trace: ndb.Trace, hint: str) -> None:
    """At least one method claims the failure (confidence >= 0.5); every claim of both names
    the cause ``unknown``, and the top claim's hint contains ``hint``."""
    claims = 0
    for method in ("heuristic", "probabilistic"):
        claimed = [h for h in ndb.explain(trace, method=method) if h.confidence >= 0.5]
        assert all(h.root_cause == "unknown" for h in claimed), (method, claimed)
        if claimed:
            claims += 1
            assert hint in claimed[0].metadata["hint"], (method, claimed[0].metadata["hint"])
    assert claims, "the failure is claimed by at least one method"


def _narrow_mlp(seed: int, *, frozen: int) -> nn.Module:
    """Three hidden layers of 8 units; the first ``frozen`` modules' weights frozen."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(),
                          nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 10))
    for module in list(model)[:frozen]:
        module.requires_grad_(False)
    return model


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_stall_behind_frozen_first_layers_names_them_not_the_data(seed: int) -> None:
    """requires_grad_(False) left on the first two layers of a narrow MLP: the loss stays
    near chance (2.3 -> 2.1-2.3) where the twin reaches 0.6. Both methods named
    data_problem (0.95 / 0.90) on seed 1 of the probe's loop and the network
    init_scale_too_small (0.54) on seed 1 of this one: the data is fine, the features are
    frozen."""
    model = _narrow_mlp(seed, frozen=4)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05,
                          momentum=0.9)
    trace = _train(model, opt, F.cross_entropy, Y, steps=300, batch=32)
    _assert_claimed_as_unknown(trace, "layers 0, 2 (79% of the weights) are frozen")
    twin = _narrow_mlp(seed, frozen=0)
    twin_trace = _train(twin, torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9),
                        F.cross_entropy, Y, steps=300, batch=32)
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(twin_trace, method=method)
        assert not hyps or hyps[0].confidence < 0.5, (method, hyps[0])


@pytest.mark.parametrize("seed", [0, 2])
def test_thirty_steps_of_adam_that_have_not_yet_left_their_start_are_no_plateau(
        seed: int) -> None:
    """An MLP under Adam at 1e-3 on a four-class task, read after 30 steps of 64: its loss
    fell about 9% (1.37 -> 1.24 by five-step means) and goes on to a third of its start.
    Both methods called it a plateau (the rules at 0.59-0.68, the causal model at 0.91, once
    blaming the data). Too few losses to tell a stall from a start: the plateau is hedged
    with the reason, and the same run at a rate 10,000x lower, read after 60 steps, is still
    a plateau for both."""
    def run(lr: float, steps: int) -> ndb.Trace:
        g = torch.Generator().manual_seed(1000 + seed)
        x = torch.randn(2048, 20, generator=g)
        w1 = torch.randn(20, 32, generator=g) / 20 ** 0.5
        w2 = torch.randn(32, 4, generator=g) / 32 ** 0.5
        y = (torch.tanh(x @ w1) @ w2).argmax(1)
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                              nn.Linear(64, 4))
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        order = torch.randperm(2048, generator=torch.Generator().manual_seed(seed))
        with ndb.NeuralDbg(model, optimizer=opt) as dbg:
            for i in range(steps):
                idx = order[(i * 64) % 2048:(i * 64) % 2048 + 64]
                opt.zero_grad()
                loss = F.cross_entropy(model(x[idx]), y[idx])
                loss.backward()
                opt.step()
                dbg.step(loss)
        return dbg.trace

    short = run(1e-3, 30)
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(short, method=method)
        assert not any(h.confidence >= 0.5 for h in hyps), (method, hyps[:2])
        plateau = [h for h in hyps if h.failure_type == "training_plateau"]
        assert not plateau or "fewer than 50" in plateau[0].metadata["thin_evidence"]
    stalled = run(1e-7, 60)
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(stalled, method=method)[0]
        assert top.failure_type == "training_plateau" and top.confidence >= 0.5, (method, top)


class _TinyEncoder(nn.Module):
    """One Transformer encoder layer (2 heads, LayerNorm inside) over 4-channel sequences,
    mean-pooled into 3 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 16)
        self.enc = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0,
                                              batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.inp(x)).mean(1))


def _train_encoder_adam(lr: float, seed: int) -> ndb.Trace:
    """Eight epochs of Adam on which of channels 0-2 has the largest mean (512 sequences)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 12, 4, generator=g)
    y = x[:, :, :3].mean(1).argmax(1)
    torch.manual_seed(seed)
    model = _TinyEncoder()
    return _train_epochs(model, torch.optim.Adam(model.parameters(), lr=lr), x, y, g, epochs=8)


def test_a_transformer_at_a_rate_too_high_is_not_blamed_on_its_labels() -> None:
    """A Transformer encoder at Adam 0.1 (seed 4): the loss stalls near chance (1.16 ->
    0.92) where lr 1e-3 learns. The network's prior cut the rate to 0.3 under any
    normalization, and with LayerNorm inside the labels came out ahead: its first answer was
    `data_problem` (0.45 after the stall hedge here; a new user's two such runs got 0.53 and
    0.51, a wrong cause said with confidence). A normalization does not shield attention's
    logits from a large step."""
    trace = _train_encoder_adam(0.1, 4)
    hyps = ndb.explain(trace, method="probabilistic")
    assert hyps[0].root_cause in {"learning_rate_too_high", "unknown"}, hyps[:3]
    assert not [h for h in hyps if h.confidence >= 0.5
                and h.root_cause not in {"learning_rate_too_high", "unknown"}], hyps[:3]


def test_what_if_says_so_when_no_cause_is_singled_out() -> None:
    """The same encoder at Adam 0.1: seed 4's failure splits between the labels and the
    rate (about a third each), and a 100x rate cut, which re-runs and learns, read 0.99
    with nothing to say that the answer rests on a cause the model had not singled out.
    ``explain`` names it ``unknown``; ``what_if`` now gives the causes' shares of the
    failure and a caution, and the rate's share of P(failure) goes (0.99 -> 0.71: the
    strata move on the calibrated scale, where a mixture of causes moved as one raw vector
    came out of the calibration map as a confident "fails anyway"). Seed 0, whose failure
    the rate explains, gets no caution."""
    from neuraldbg.reporting.words import what_if_caveat

    undetermined = ndb.what_if(_train_encoder_adam(0.1, 4), lr_scale=0.01)
    assert undetermined.p_failure_factual >= 0.5
    shares = undetermined.metadata["cause_shares"]
    assert max(v for c, v in shares.items() if c != "unknown") < 0.5, shares
    assert "does not single out" in what_if_caveat(undetermined.metadata)
    assert undetermined.p_failure < (undetermined.p_failure_factual
                                     - 0.5 * shares["learning_rate_too_high"]), undetermined
    determined = ndb.what_if(_train_encoder_adam(0.1, 0), lr_scale=0.01)
    assert determined.metadata["cause_shares"]["learning_rate_too_high"] > 0.9
    assert "cause_undetermined" not in determined.metadata
    assert determined.p_failure < 0.5 <= determined.p_failure_factual


def _train_tiny_weights_mlp(seed: int, scale: float) -> ndb.Trace:
    """Six ReLU layers on a 4-class task, every weight matrix multiplied by ``scale`` after
    construction (the biases keep PyTorch's default), SGD with momentum, ten epochs."""
    from sklearn.datasets import make_classification

    x_np, y_np = make_classification(n_samples=512, n_features=20, n_informative=10,
                                     n_classes=4, random_state=seed)
    x = torch.tensor((x_np - x_np.mean(0)) / x_np.std(0), dtype=torch.float32)
    y = torch.tensor(y_np)
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    width = 20
    for _ in range(5):
        layers += [nn.Linear(width, 64), nn.ReLU()]
        width = 64
    model = nn.Sequential(*layers, nn.Linear(64, 4))
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.mul_(scale)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return _train_epochs(model, opt, x, y, torch.Generator().manual_seed(seed), epochs=10)


@pytest.mark.parametrize("seed", [0, 1])
def test_weights_far_too_small_under_default_biases_are_not_another_cause(seed: int) -> None:
    """Weights x0.05 with the biases at PyTorch's default: the units' outputs are their
    biases, a layer's negative ones are dead from the first step, and the gradient never
    reaches the first layers. The weight scale was read from the parameter norm, biases
    included, whose default norm floors it (0.13 here, above the 0.1 that says too small),
    and the network named a negative bias or a blocked gradient with confidence (0.73,
    0.59), the heuristic missing normalization (0.99). The weight matrices' own rms, kept
    when the capture is entered, reads 0.05, and both name the init."""
    trace = _train_tiny_weights_mlp(seed, 0.05)
    rms = trace.meta["weight_diversity"]["rms"]
    first = trace.modules.set_index("module_name").loc["0"]
    assert rms["0"] * math.sqrt(3 * first["fan_in"]) == pytest.approx(0.05, rel=0.2)
    for method in ("probabilistic", "heuristic"):
        hyps = ndb.explain(trace, method=method)
        claims = [h for h in hyps if h.confidence >= 0.5]
        assert claims and claims[0].root_cause == "init_scale_too_small", (method, hyps[:2])
        assert all(h.root_cause in {"init_scale_too_small", "unknown"} for h in claims), claims
    twin = _train_tiny_weights_mlp(seed, 1.0)
    assert max((h.confidence for h in ndb.explain(twin, method="probabilistic")),
               default=0.0) < 0.5


class _SoftmaxForInference(nn.Module):
    """Trains on logits; its ``nn.Softmax`` serves ``predict`` only (never called in training)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp()
        self.probs = nn.Softmax(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.probs(self.body(x))


@pytest.mark.parametrize("method", ["heuristic", "probabilistic"])
def test_a_softmax_module_the_training_forward_never_calls_is_not_the_output(method: str
                                                                              ) -> None:
    # a rate too low for SGD stalls the run: whatever is named, not a softmax the loss never saw
    model = _SoftmaxForInference()
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=0.003), F.cross_entropy, Y)
    assert output_module(trace) == "body.4"
    assert all(h.root_cause != "loss_output_mismatch" for h in ndb.explain(trace, method=method)
               if h.confidence >= 0.5)


@pytest.mark.parametrize("method", ["heuristic", "probabilistic"])
@pytest.mark.parametrize("in_forward", [True, False])
def test_probabilities_read_through_their_log_that_stall_are_not_a_loss_output_mismatch(
        in_forward: bool, method: str) -> None:
    # the same stall at log K as a logits loss fed probabilities, but the gradient at the
    # logits is cross-entropy's, not squashed 1/K by the softmax: the rate is too low
    model = _SoftmaxInForward() if in_forward else nn.Sequential(_mlp(), nn.Softmax(dim=1))
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=0.01), _nll_of_probabilities,
                   Y, steps=200)
    claims = [h for h in ndb.explain(trace, method=method) if h.confidence >= 0.5]
    assert claims and claims[0].root_cause != "loss_output_mismatch", claims
    assert all(h.root_cause != "loss_output_mismatch" for h in claims)


def _noisy(labels: torch.Tensor, share: float, seed: int = 0) -> torch.Tensor:
    """``labels`` with a ``share`` of them moved to another class at random."""
    g = torch.Generator().manual_seed(seed)
    flip = torch.rand(len(labels), generator=g) < share
    out = labels.clone()
    out[flip] = (labels[flip] + torch.randint(1, 10, (int(flip.sum()),), generator=g)) % 10
    return out


@pytest.mark.parametrize("method", ["heuristic", "probabilistic"])
def test_a_loss_at_the_label_noise_floor_is_not_the_floor_of_a_logits_loss_on_probabilities(
        method: str) -> None:
    # 36% of ten classes' labels moved at random: the best a model can do costs
    # -0.64 log 0.64 - 0.36 log 0.04 = 1.44 nats, next to the floor log(1 + 9/e) = 1.46 that
    # cross-entropy fed probabilities cannot pass. The softmax is read through its log
    # (right), and the gradient at the logits says so: nothing is wrong with the script
    model = _SoftmaxInForward()
    trace = _train(model, torch.optim.Adam(model.parameters(), lr=3e-3), _nll_of_probabilities,
                   _noisy(Y, 0.36), steps=400)
    floor = math.log1p(9 / math.e)
    assert abs(trace.steps["loss"].iloc[-50:].median() / floor - 1) < 0.02  # on the floor
    claims = [h for h in ndb.explain(trace, method=method) if h.confidence >= 0.5]
    assert all(h.root_cause != "loss_output_mismatch" for h in claims), claims
    # the bug itself, on clean labels, still sits on that floor and is named
    model = _SoftmaxInForward()
    bug = _train(model, torch.optim.Adam(model.parameters(), lr=3e-3), F.cross_entropy, Y,
                 steps=400)
    top = ndb.explain(bug, method=method)[0]
    assert (top.root_cause, top.confidence >= 0.5) == ("loss_output_mismatch", True), top


@pytest.mark.parametrize("method", ["heuristic", "probabilistic"])
def test_a_sigmoid_autoencoder_under_mse_that_stalls_is_not_a_loss_output_mismatch(
        method: str) -> None:
    # BCEWithLogitsLoss fed values in (0, 1) cannot go below log(1 + 1/e) = 0.31; an MSE
    # reconstruction loss sits far under it (0.18), so the sigmoid is read rightly and the
    # stall is the rate's, as for the same network written with torch.sigmoid
    def autoencoder() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 64), nn.Sigmoid())

    model = autoencoder()
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=0.01), F.mse_loss, X,
                   steps=300)
    claims = [h for h in ndb.explain(trace, method=method) if h.confidence >= 0.5]
    assert claims and (claims[0].failure_type, claims[0].root_cause) == (
        "training_plateau", "learning_rate_too_low"), claims
    assert all(h.root_cause != "loss_output_mismatch" for h in claims), claims
    # the bug: the same sigmoid under BCEWithLogitsLoss, stalled above that floor
    model = autoencoder()
    bug = _train(model, torch.optim.SGD(model.parameters(), lr=0.01),
                 F.binary_cross_entropy_with_logits, X, steps=300)
    top = ndb.explain(bug, method=method)[0]
    assert (top.root_cause, top.confidence >= 0.5) == ("loss_output_mismatch", True), top


class _DigitsCNN(nn.Module):
    """A small digits CNN with BatchNorm (the usual image classifier); with ``detach_trunk``
    its head reads ``trunk(x).detach()`` and the convolutions never learn."""

    def __init__(self, seed: int, detach_trunk: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.detach_trunk = detach_trunk
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)
        # with ``dropout``: nn.Dropout after each block and before the classifier
        self.drops = nn.ModuleList([nn.Dropout(dropout) for _ in range(3)]) if dropout \
            else None

    def _drop(self, i: int, h: torch.Tensor) -> torch.Tensor:
        return self.drops[i](h) if self.drops is not None else h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self._drop(0, F.max_pool2d(F.relu(self.bn1(self.conv1(x.view(-1, 1, 8, 8)))), 2))
        h = self._drop(1, F.relu(self.bn2(self.conv2(h)))).flatten(1)
        h = F.relu(self.fc1(h.detach() if self.detach_trunk else h))
        return self.fc2(self._drop(2, h))


def test_a_trunk_cut_off_from_the_gradient_under_a_head_that_learns_is_no_dead_layer() -> None:
    # the head alone takes the loss from 2.3 to near 0; the convolutions get no gradient at
    # all, which is not a gradient that died on its way back: read as one, the network said
    # dead_neurons at 0.98 on a run the rules judged healthy
    model = _DigitsCNN(1, detach_trunk=True)
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                   F.cross_entropy, Y, steps=300, batch=32)
    assert trace.steps["loss"].iloc[-30:].median() < 0.1  # it learned
    for method in ("heuristic", "probabilistic"):
        claims = [h for h in ndb.explain(trace, method=method) if h.confidence >= 0.5]
        assert all(h.root_cause == "gradient_blocked" for h in claims), (method, claims)


@pytest.mark.parametrize("seed", [0, 5])
def test_fine_tuning_a_trained_network_is_not_a_failure(seed: int) -> None:
    # trained first (not recorded), then fine-tuned with Adam at 1e-4 under the recorder: the
    # loss starts near 0.001 and stays there. A batch at 0.05 against that median read as a
    # blow-up, and trained weights as an init too large (heuristic 0.65 on seed 0; the
    # network loss_divergence at 0.98 on seed 5)
    model = _DigitsCNN(seed)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(300):
        idx = torch.randint(0, len(X), (32,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(X[idx]), Y[idx]).backward()
        opt.step()
    trace = _train(model, torch.optim.Adam(model.parameters(), lr=1e-4), F.cross_entropy, Y,
                   steps=260, batch=32, generator=g)
    assert trace.steps["loss"].iloc[:13].median() < 0.01  # trained before the recording
    for method in ("heuristic", "probabilistic"):
        claims = [h for h in ndb.explain(trace, method=method) if h.confidence >= 0.5]
        assert not claims, (method, claims)


@pytest.mark.parametrize("method", ["heuristic", "probabilistic"])
def test_a_stall_under_a_clip_that_caps_every_step_is_the_clip_not_a_named_cause(
        method: str) -> None:
    # clip_grad_norm_(..., 1e-3) caps every step: the updates are the rate times 0.001 and
    # the gradients the clip leaves are small from the start, which the network read as a
    # softmax's fed to a logits loss (loss_output_mismatch 0.54); the loss is plain
    # cross-entropy on logits
    model = _mlp()
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                   F.cross_entropy, Y, steps=300, batch=32, clip=1e-3)
    top = ndb.explain(trace, method=method)[0]
    assert (top.failure_type, top.root_cause) == ("training_plateau", "unknown"), top
    assert "max_norm" in top.metadata.get("hint", ""), top.metadata


class _ReverseTagger(nn.Module):
    """A Transformer tagger whose token embedding (std 0.02) is swamped by a learned
    positional table of std 1: the tokens barely reach the encoder and the loss stalls at
    chance, a cause the vocabulary does not name."""

    def __init__(self, vocab: int = 16, length: int = 12, width: int = 32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(vocab, width)
        nn.init.normal_(self.emb.weight, std=0.02)
        self.pos = nn.Parameter(torch.randn(1, length, width))
        layer = nn.TransformerEncoderLayer(width, 4, 64, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.enc(self.emb(x) + self.pos)))


@pytest.mark.parametrize("method", ["heuristic", "probabilistic"])
def test_a_stall_no_known_cause_explains_is_unknown_not_a_data_problem(method: str) -> None:
    model = _ReverseTagger()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(250):
            x = torch.randint(1, 16, (32, 12), generator=g)
            opt.zero_grad()
            loss = F.cross_entropy(model(x).reshape(-1, 16), x.flip(1).reshape(-1))
            loss.backward()
            opt.step()
            dbg.step(loss)
    claims = [h for h in ndb.explain(dbg.trace, method=method) if h.confidence >= 0.5]
    # the labels are the inputs reversed: nothing is wrong with the data
    assert claims and (claims[0].failure_type, claims[0].root_cause) == ("training_plateau",
                                                                         "unknown"), claims
    assert all(h.root_cause != "data_problem" for h in claims), claims


@pytest.mark.parametrize(("seed", "lr"), [(3, 0.05), (2, 0.005)])
def test_dropout_that_drops_nine_units_in_ten_is_no_learning_rate(seed: int, lr: float) -> None:
    # nn.Dropout(0.9) after each block (keep_prob read the other way round): the loss ends
    # at chance at any rate a user tries. Both methods blamed a learning rate too high
    # (0.66 / 0.94 here at 0.05, 0.75-0.98 on a new user's CNN), the network unscaled
    # targets at 0.005 (0.75); the same loop at p = 0.1 trains
    model = _DigitsCNN(seed, dropout=0.9)
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                   F.cross_entropy, Y, steps=300, batch=32)
    assert trace.modules["dropout"].max() == pytest.approx(0.9)
    hinted = 0
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        claimed = [h for h in hyps if h.confidence >= 0.5]
        assert all(h.root_cause == "unknown" for h in claimed), (method, claimed)
        if hyps and hyps[0].root_cause == "unknown":
            hinted += "dropout in drops.0, drops.1, drops.2 zeroes 90%" in hyps[0].metadata.get(
                "hint", "")
    assert hinted, "the top hypothesis of at least one method names the dropout"
    assert "dropout" in ndb.what_if(trace, lr_scale=0.1).metadata["outside_vocabulary"]
    twin = _DigitsCNN(seed, dropout=0.1)
    twin_trace = _train(twin, torch.optim.SGD(twin.parameters(), lr=lr, momentum=0.9),
                        F.cross_entropy, Y, steps=300, batch=32)
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(twin_trace, method=method)
        assert not hyps or hyps[0].confidence < 0.5, (method, hyps[0])


class _OneChannelCNN(nn.Module):
    """A digits CNN whose one convolution has ``channels`` output channels, each pooled to
    one number before the classifier."""

    def __init__(self, seed: int, channels: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(1, channels, 3, padding=1)
        self.fc = nn.Linear(channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.adaptive_avg_pool2d(F.relu(self.conv(x.view(-1, 1, 8, 8))), 1)
        return self.fc(h.flatten(1))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_stall_behind_a_one_channel_layer_is_the_model_not_the_data(seed: int) -> None:
    # every sample reaches the classifier as one number: the loss stays near chance and
    # both methods named data_problem (0.84-0.97 on a new user's digits CNN); the same data
    # and loop train with 16 channels
    model = _OneChannelCNN(seed, 1)
    trace = _train(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                   F.cross_entropy, Y, steps=300, batch=32)
    assert list(trace.modules["units"]) == [1, 10]
    _assert_claimed_as_unknown(trace, "passes through conv, with 1 output unit")
    wide = _DigitsCNN(seed)  # the data and the loop are fine
    wide_trace = _train(wide, torch.optim.SGD(wide.parameters(), lr=0.05, momentum=0.9),
                        F.cross_entropy, Y, steps=300, batch=32)
    assert wide_trace.steps["loss"].iloc[-30:].median() < 0.2
    assert trace.steps["loss"].iloc[-30:].median() > 2.0


def _regression_mlp(seed: int, width: int = 64) -> nn.Module:
    """Two hidden ReLU layers of ``width`` units on 10 features, one output."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(10, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 1))


def _regression(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """1,024 samples of a smooth function of 10 standardised features, standardised target."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1024, 10, generator=g)
    y = torch.sin(x[:, :1]) + x[:, 1:2] * x[:, 2:3] + 0.1 * torch.randn(1024, 1, generator=g)
    return x, (y - y.mean()) / y.std()


@pytest.mark.parametrize("seed", [0, 1])
def test_gradients_never_reset_that_blow_up_under_momentum_are_no_learning_rate(
        seed: int) -> None:
    # an MLP regression under SGD with momentum and no zero_grad(): the summed gradient
    # throws the weights off and the loss reaches 1e14 within 30-40 steps, too fast for the
    # running-sum power law; both methods named learning_rate_too_high (1.00 / 0.98 on a
    # new user's probe) and what_if(lr_scale=0.01) promised a fix the re-run does not keep.
    # The norm stays put while the loss falls 4-100x from one step to the next.
    x, y = _regression(seed)

    def run(lr: float) -> ndb.Trace:
        model = _regression_mlp(seed)
        return _train(model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                      F.mse_loss, y, inputs=x, zero_grad=False, steps=200)

    trace = run(0.05)
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(trace, method=method)[0]
        assert top.root_cause == "missing_zero_grad" and top.confidence >= 0.5, (method, top)
    assert ndb.what_if(trace, lr_scale=0.01).p_failure >= 0.5
    slower = run(0.0005).steps["loss"]  # the re-run at a hundredth of the rate still fails
    assert not np.isfinite(slower).all() or slower.iloc[-20:].median() > slower.iloc[:5].median()


@pytest.mark.parametrize("seed", [0, 3])
def test_dead_units_of_a_one_unit_hidden_layer_are_the_model_not_a_bias(seed: int) -> None:
    # an MLP regression whose hidden layers have one unit each: the unit dies and the loss
    # stays at the target's variance. Both methods named negative_bias_init (0.90-1.00) on
    # default biases; the model is too small (a new user's probe found the same)
    x, y = _regression(seed)
    model = _regression_mlp(seed, width=1)
    trace = _train(model, torch.optim.Adam(model.parameters(), lr=1e-3), F.mse_loss, y,
                   inputs=x, steps=300, batch=32)
    _assert_claimed_as_unknown(trace, "passes through 0, 2, with 1 output unit")


class _AttentionPool(nn.Module):
    """Sequences of 8 vectors pooled by a one-unit scorer's softmax weights, then classified."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(16, 16)
        self.score = nn.Linear(16, 1)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.proj(x))
        weights = torch.softmax(self.score(h), dim=1)
        return self.head((weights * h).sum(dim=1))


def test_a_one_unit_attention_scorer_is_no_narrow_layer() -> None:
    # the scorer has one output unit, but what reaches the classifier is the weighted sum of
    # 16-wide vectors: no bottleneck
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, 16, generator=g)
    y = (x[:, :, 0].mean(1) > 0).long() + 2 * (x[:, 0, 1] > 0).long()
    model = _AttentionPool()
    trace = _train(model, torch.optim.Adam(model.parameters()), F.cross_entropy, y, inputs=x,
                   steps=20)
    assert list(trace.modules.sort_values("forward_order")["units"]) == [16, 1, 4]
    assert narrow_layer(trace) is None


def _clamped_bce(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """BCELoss on raw outputs clamped to [0, 1], as a user silences BCELoss's range error."""
    return F.binary_cross_entropy(outputs.squeeze(-1).clamp(0, 1), targets)


@pytest.mark.parametrize("seed", [4, 9])
def test_a_loss_that_passes_no_gradient_to_the_outputs_is_no_rate_too_low(seed: int) -> None:
    # once every clamped output saturates at 0 or 1 the loss sits near 50 (BCELoss's log
    # clamp) and its gradient at the outputs is exactly 0: both methods named
    # learning_rate_too_low (0.84-1.00 / 0.73 on a new user's probe), which no rate fixes
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=2000, n_features=20, n_informative=8,
                               n_redundant=4, flip_y=0.02, random_state=seed)
    inputs = torch.tensor((x - x.mean(0)) / x.std(0), dtype=torch.float32)
    targets = torch.tensor(y, dtype=torch.float32)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    trace = _train(model, torch.optim.Adam(model.parameters(), lr=1e-3), _clamped_bce,
                   targets, inputs=inputs, steps=300, batch=32,
                   generator=torch.Generator().manual_seed(seed))
    _assert_claimed_as_unknown(trace, "the loss passed no gradient to the model's output")


@pytest.mark.parametrize("seed", [0, 1])
def test_adamw_with_a_weight_decay_far_too_strong_names_the_decay(seed: int) -> None:
    # AdamW at weight_decay=50: the weights shrink to a quarter or less of their norm and
    # the loss stays near chance. The collapse hint asked for a tenth; a new user's 4-class
    # MLP (norm 9.4 -> 1.2 -> 2.0) got data_problem from both methods (0.66-0.68 / 0.97)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=50.0)
    trace = _train(model, opt, F.cross_entropy, Y, steps=300, batch=32,
                   generator=torch.Generator().manual_seed(seed))
    pn = trace.steps["param_norm"]
    assert 0.1 < pn.iloc[-5:].median() / pn.iloc[0] < 0.3  # under the old line of 0.1
    _assert_claimed_as_unknown(trace, "is weight_decay (or the penalty's coefficient) too large")


class _GAN(nn.Module):
    """A generator and a discriminator MLP on 2-D points, one module for the recorder."""

    def __init__(self) -> None:
        super().__init__()
        self.G = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                               nn.Linear(64, 2))
        self.D = nn.Sequential(nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64),
                               nn.LeakyReLU(0.2), nn.Linear(64, 1))


def _ring(n: int, g: torch.Generator) -> torch.Tensor:
    """Points near 8 modes on a circle of radius 2."""
    angle = torch.randint(0, 8, (n,), generator=g).float() * 2 * math.pi / 8
    centres = torch.stack([2 * torch.cos(angle), 2 * torch.sin(angle)], 1)
    return centres + 0.05 * torch.randn(n, 2, generator=g)


def _train_gan(seed: int, *, reset_generator: bool = True) -> tuple[ndb.Trace, _GAN]:
    """The usual alternating GAN loop on the ring, both optimizers given, 800 steps; with
    ``reset_generator=False`` the generator's ``zero_grad()`` is forgotten (a bug both
    methods still read as a rate too high: docs/design-notes.md, session 30)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = _GAN()
    opt_d = torch.optim.Adam(model.D.parameters(), lr=2e-3, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(model.G.parameters(), lr=2e-3, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    ones, zeros = torch.ones(128, 1), torch.zeros(128, 1)
    with ndb.NeuralDbg(model, optimizer=[opt_d, opt_g]) as dbg:
        for _ in range(800):
            real, z = _ring(128, g), torch.randn(128, 4, generator=g)
            fake = model.G(z)
            opt_d.zero_grad()
            d_loss = bce(model.D(real), ones) + bce(model.D(fake.detach()), zeros)
            d_loss.backward()
            opt_d.step()
            if reset_generator:
                opt_g.zero_grad()
            g_loss = bce(model.D(fake), ones)
            g_loss.backward()
            opt_g.step()
            dbg.step(d_loss + g_loss)
    return dbg.trace, model


@pytest.mark.parametrize("seed", [0, 1])
def test_a_healthy_gan_whose_generator_gradient_grows_is_no_explosion(seed: int) -> None:
    # the generator gets almost no gradient from an untrained discriminator, then more as it
    # learns (its first layer's norm grows ~1,000x), while the global norm stays within 20x
    # and every loss finite. The rules read an explosion from a rate too high (0.69-0.77)
    # and the network an explosion of unknown cause (0.80) on a GAN that covers all 8
    # modes; a user following the advice breaks it
    trace, model = _train_gan(seed)
    with torch.no_grad():
        samples = model.G(torch.randn(2000, 4, generator=torch.Generator().manual_seed(99)))
    angle = torch.atan2(samples[:, 1], samples[:, 0])
    modes = torch.round(angle / (2 * math.pi / 8)).remainder(8)
    assert len(set(modes.tolist())) == 8  # it learned every mode
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert not any(h.confidence >= 0.5 for h in hyps), (method, hyps[:2])



@pytest.mark.xfail(strict=True, reason="opt_g.zero_grad() forgotten in a GAN: the summed "
                   "global norm (the discriminator's reset, the generator's piling up) rises "
                   "on 0.83-0.93 of the first steps with a power-law fit of 0.78-0.83, at "
                   "the edge of the running-sum rule's 0.9 and 0.8; both methods say "
                   "learning_rate_too_high (docs/design-notes.md, session 30)")
def test_a_gan_whose_generator_gradients_are_never_reset_is_no_learning_rate() -> None:
    trace, _ = _train_gan(0, reset_generator=False)
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(trace, method=method)[0]
        assert top.root_cause == "missing_zero_grad" and top.confidence >= 0.5, (method, top)


class _GaussianHead(nn.Module):
    """An MLP that predicts a mean and a variance (softplus) for ``GaussianNLLLoss``."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.body(x)
        return out[:, :1], F.softplus(out[:, 1:]) + 1e-6


@pytest.mark.parametrize("seed", [0, 1])
def test_a_loss_that_runs_to_minus_infinity_is_a_failure_named_unknown(seed: int) -> None:
    # BCEWithLogitsLoss on standardised real-valued targets (a regression loss picked from
    # the wrong line): for a target above 1 the loss falls without bound as the logit grows,
    # to -200 within 300 steps while the fit gets worse. A new user's probe found both
    # methods silent (0.30-0.42 / 0.06): a falling loss read as learning.
    x, y = _regression(seed)
    model = _regression_mlp(seed)
    trace = _train(model, torch.optim.Adam(model.parameters(), lr=1e-2),
                   F.binary_cross_entropy_with_logits, y, inputs=x, steps=300)
    assert trace.steps["loss"].iloc[-10:].median() < -10  # the run as the probe saw it
    _assert_claimed_as_unknown(trace, "no lower bound")
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(trace, method=method)[0]
        assert top.failure_type == "loss_divergence" and top.origin_layer == "4", (method, top)
        assert ndb.what_if(trace, method="probabilistic").metadata[
            "outside_vocabulary"].startswith(top.metadata["hint"][:40])


@pytest.mark.parametrize("seed", [0, 1])
def test_a_gaussian_likelihood_that_goes_below_zero_and_settles_is_healthy(seed: int) -> None:
    # GaussianNLLLoss with a learned variance: the loss of a good fit is negative (the
    # density exceeds 1) and settles there; nothing failed.
    x, y = _regression(seed)
    torch.manual_seed(seed)
    model = _GaussianHead()

    def nll(out: tuple[torch.Tensor, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        return F.gaussian_nll_loss(out[0], target, out[1])

    trace = _train(model, torch.optim.Adam(model.parameters(), lr=3e-3), nll, y * 0.3,
                   inputs=x, steps=300)
    assert trace.steps["loss"].iloc[-20:].median() < 0  # the likelihood went below zero
    for method in ("heuristic", "probabilistic"):
        assert all(h.confidence < 0.5 for h in ndb.explain(trace, method=method)), method


def _summed_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels, reduction="sum")


def test_a_loss_summed_over_the_batch_is_a_rate_too_high_with_the_reduction_named() -> None:
    # CrossEntropyLoss(reduction="sum") over batches of 256 under SGD with momentum at a rate
    # meant for the mean: each step is 256 times too large; the loss jumps 1e5-fold in four
    # steps and stays above its start (a helper's MLP went NaN by step 5).
    # The network named init_scale_too_large (0.94: the gradient dwarfs the weights before
    # the first update, as a too-large init makes it) and the rules a tie with targets off
    # scale (the first loss is 256 x ln 10); what_if(lr_scale=1/256) said it would still
    # fail, where the re-run trains
    def run(loss_fn, lr: float, opt=torch.optim.SGD) -> ndb.Trace:
        model = _mlp()
        kwargs = {"momentum": 0.9} if opt is torch.optim.SGD else {}
        return _train(model, opt(model.parameters(), lr=lr, **kwargs), loss_fn, Y,
                      batch=256, steps=120)

    trace = run(_summed_ce, 0.1)
    assert trace.steps["loss"].iloc[-10:].median() > trace.steps["loss"].iloc[0]
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(trace, method=method)[0]
        assert top.root_cause == "learning_rate_too_high" and top.confidence >= 0.5, (method, top)
        assert "reduction='sum'" in top.metadata["hint"] and "256" in top.metadata["hint"]
    assert ndb.what_if(trace, lr_scale=1 / 256).p_failure < 0.5
    slower = run(_summed_ce, 0.1 / 256).steps["loss"]  # the re-run the answer stands for
    assert slower.iloc[-10:].median() < 0.2 * slower.iloc[0]
    # Adam divides by the gradient's own scale: the same sum trains, and nothing is claimed
    adam = run(_summed_ce, 1e-3, torch.optim.Adam)
    assert adam.steps["loss"].iloc[-10:].median() < 0.2 * adam.steps["loss"].iloc[0]
    for method in ("heuristic", "probabilistic"):
        assert all(h.confidence < 0.5 for h in ndb.explain(adam, method=method)), method


def _cross_entropy_of_softmax(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.softmax(logits, dim=1), labels)


def test_a_softmax_the_loss_line_applies_is_read_as_the_model_s_own() -> None:
    # loss_fn(F.softmax(model(x), dim=1), y): the model returns logits, so no module and no
    # output the capture reads shows the probabilities, and the loss settles on the floor
    # log(1 + 9/e) of a logits loss fed them. The network named an explosion of unknown cause
    # (0.98) on a new user's digits MLP; the same bug written with nn.Softmax or in forward()
    # is loss_output_mismatch. The softmax's Jacobian gives the logits 1/K of the gradient.
    model = _mlp()
    trace = _train(model, torch.optim.Adam(model.parameters(), lr=3e-3),
                   _cross_entropy_of_softmax, Y, steps=300)
    floor = math.log1p(9.0 / math.e)
    assert trace.steps.loss.iloc[-20:].median() < floor * 1.05
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(trace, method=method)[0]
        assert top.root_cause == "loss_output_mismatch" and top.confidence >= 0.5, (method, top)


class _SineGRU(nn.Module):
    """A GRU forecaster: the next value of a series from a window of 24."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.gru = nn.GRU(1, 32, batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(x.unsqueeze(-1))
        return self.head(h[:, -1])


def _sine_windows(seed: int, offset: float, amp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of a noisy two-tone series (in sensor units ``offset + amp * s``), and the
    next value standardised."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(3000, dtype=torch.float32)
    s = torch.sin(0.07 * t) + 0.5 * torch.sin(0.23 * t) + 0.1 * torch.randn(3000, generator=g)
    windows = s.unfold(0, 25, 1)
    x, y = offset + amp * windows[:, :24], windows[:, 24:]
    return x, (y - y.mean()) / y.std()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_recurrent_net_fed_raw_values_names_the_inputs_and_what_if_scales_them(
        seed: int) -> None:
    # a GRU forecaster fed sensor values around 3000: its gates saturate at once, it puts
    # out the same value for every window, and its gradient is 0 after a few steps. The
    # input scale was read from the GRU's output, which its tanh bounds (0.7): a new user's
    # probe got missing_gradient_clipping (0.52-0.73) or init_scale_too_small (0.50-0.70)
    # on 9 of 9 runs, and what_if(input_scale=1e-3) said 0.997 where the re-run trains
    def run(offset: float, amp: float) -> ndb.Trace:
        x, y = _sine_windows(seed, offset, amp)
        model = _SineGRU(seed)
        return _train(model, torch.optim.Adam(model.parameters(), lr=3e-3), F.mse_loss, y,
                      inputs=x, steps=250)

    trace = run(3000.0, 1000.0)
    assert trace.meta["model_output"]["input_rms"] > 1000
    assert trace.steps["loss"].iloc[-20:].median() > 0.5  # it learned nothing
    for method in ("heuristic", "probabilistic"):
        claimed = [h for h in ndb.explain(trace, method=method) if h.confidence >= 0.5]
        assert claimed and claimed[0].root_cause == "unnormalized_inputs", (method, claimed)
    # scaled to about unit size, the inputs no longer saturate the gates (at 1e-3, sensor
    # values of 3 +- 1, the re-run trains too, but the network still reads 0.97: the zoo
    # places a first layer's output of std 2 at the edge of "large" inputs)
    assert ndb.what_if(trace, input_scale=1e-4).p_failure < 0.5
    healthy = run(0.0, 1.0)  # the series standardised: the re-run the answer stands for
    assert healthy.steps["loss"].iloc[-20:].median() < 0.2
    for method in ("heuristic", "probabilistic"):
        assert all(h.confidence < 0.5 for h in ndb.explain(healthy, method=method)), method


class _Blocks(nn.Module):
    """Two hidden blocks and a head; ``checkpointed`` runs the blocks through
    ``torch.utils.checkpoint`` with ``use_reentrant`` as given, ``frozen`` under no_grad."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.b1 = nn.Sequential(nn.Linear(64, 128), nn.ReLU())
        self.b2 = nn.Sequential(nn.Linear(128, 128), nn.ReLU())
        self.head = nn.Linear(128, 10)
        self.reentrant: bool | None = None
        self.frozen = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.frozen:
            with torch.no_grad():
                h = self.b2(self.b1(x))
            return self.head(h)
        if self.reentrant is None:
            return self.head(self.b2(self.b1(x)))
        from torch.utils.checkpoint import checkpoint
        h = checkpoint(self.b1, x, use_reentrant=self.reentrant)
        return self.head(checkpoint(self.b2, h, use_reentrant=self.reentrant))


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")
def test_checkpointed_blocks_that_build_no_graph_are_a_blocked_gradient() -> None:
    # checkpoint(..., use_reentrant=True) on an input that does not require a gradient runs
    # the block under no_grad and builds no graph through it: 95% of the weights never get
    # a gradient, and the head alone learns a linear probe of random features. The capture
    # records no call for those blocks (it skips forwards without gradients), so the
    # heuristic said nothing and the network dead_neurons (0.98) at the head, whose units
    # are all alive. With use_reentrant=False the same loop trains.
    def run(reentrant: bool) -> ndb.Trace:
        model = _Blocks(0)
        model.reentrant = reentrant
        return _train(model, torch.optim.Adam(model.parameters(), lr=1e-3), F.cross_entropy,
                      Y, steps=150)

    trace = run(True)
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(trace, method=method)[0]
        assert top.root_cause == "gradient_blocked" and top.confidence >= 0.5, (method, top)
        assert top.origin_layer == "b1.0" and "use_reentrant=False" in top.metadata["hint"]
    _assert_healthy(run(False))


@pytest.mark.filterwarnings("ignore:4 trainable parameter")
def test_a_backbone_frozen_under_no_grad_and_left_out_of_the_optimizer_is_no_bug() -> None:
    # the guard: a linear probe runs its backbone under no_grad on purpose and gives the
    # optimizer the head alone; the backbone never runs with gradients either, but nothing
    # was meant to train it
    model = _Blocks(0)
    model.frozen = True
    trace = _train(model, torch.optim.Adam(model.head.parameters(), lr=1e-2),
                   F.cross_entropy, Y, steps=150)
    assert (trace.stats.groupby("module_name")["calls"].sum()[["b1.0", "b2.0"]] == 0).all()
    for method in ("heuristic", "probabilistic"):
        assert not any(h.root_cause == "gradient_blocked" and h.confidence >= 0.5
                       for h in ndb.explain(trace, method=method)), method


def test_a_small_body_run_under_no_grad_while_its_optimizer_holds_it_is_named() -> None:
    # a body of a sixth of the weights run under torch.no_grad() by mistake, its parameters
    # in the optimizer: the head learns from 16 random features and stalls far above the
    # fixed twin. Below half the weights, what names it is that the body comes before every
    # layer that trained (a new user's body of 35% of the weights: 0.38 accuracy, nothing
    # claimed by the heuristic, dead_neurons/unknown at 0.98 by the network).
    class Net(nn.Module):
        def __init__(self, bug: bool) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.body = nn.Sequential(nn.Linear(64, 16), nn.ReLU())
            self.head = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 10))
            self.bug = bug

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.bug:
                with torch.no_grad():
                    x = self.body(x)
                return self.head(x)
            return self.head(self.body(x))

    def run(bug: bool) -> ndb.Trace:
        model = Net(bug)
        return _train(model, torch.optim.Adam(model.parameters(), lr=1e-3), F.cross_entropy,
                      Y, steps=200)

    trace = run(True)
    share = 1040 / sum(p.numel() for p in Net(True).parameters())
    assert share < 0.2
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(trace, method=method)[0]
        assert top.root_cause == "gradient_blocked" and top.confidence >= 0.5, (method, top)
        assert top.origin_layer == "body.0", top
    _assert_healthy(run(False))
