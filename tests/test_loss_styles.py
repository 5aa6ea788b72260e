"""Losses as users write them, beyond cross-entropy and squared error, through real hooks.

A heteroscedastic regression trained with ``nn.GaussianNLLLoss`` (the negative log-likelihood
of a density, which goes below zero as the fit sharpens), a Poisson regression whose loss
drops its constant term, a policy-gradient surrogate, a binary task whose loss settles far
above zero (a quarter of its labels flipped), and an easy task trained until its loss is
exactly zero.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import make_blobs, make_classification
from torch import nn

import neuraldbg as ndb

STEPS = 300


class _Heteroscedastic(nn.Module):
    """A mean and a variance head on a small tanh body."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.mean = nn.Linear(64, 1)
        self.logvar = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.mean(h), self.logvar(h).exp()


def _gaussian_nll_run(lr: float, shift: float = 0.0) -> ndb.Trace:
    """y = sin(x) with noise growing in |x|; ``shift`` is added to the loss (same gradients)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1500, 1, generator=g) * 6 - 3
    y = torch.sin(x) + (0.05 + 0.1 * x.abs()) * torch.randn(1500, 1, generator=g)
    model, nll = _Heteroscedastic(), nn.GaussianNLLLoss()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(STEPS):
            idx = torch.randint(0, len(x), (64,), generator=g)
            opt.zero_grad()
            mean, var = model(x[idx])
            loss = nll(mean, y[idx], var) + shift
            loss.backward()
            opt.step()
            dbg.step(loss)
    return dbg.trace


def test_a_negative_log_likelihood_falling_below_zero_is_learning():
    """The loss falls from about 0.4 to -1.2: read as a ratio to its start it 'rose'
    (the probabilistic method said training_plateau at 0.89 before the fix)."""
    trace = _gaussian_nll_run(lr=3e-3)
    loss = trace.steps["loss"]
    assert loss.iloc[0] > 0 > -1.0 > loss.iloc[-20:].mean()
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert all(h.confidence < 0.5 for h in hyps), (method, hyps[:2])


def test_a_negative_loss_that_does_not_move_is_still_a_stall():
    """The same model at a rate 300,000x too low, its loss shifted below zero throughout:
    read from the loss's own floor (below its lowest value), the run still did not
    learn, and both methods say so."""
    trace = _gaussian_nll_run(lr=1e-8, shift=-2.0)
    assert (trace.steps["loss"] < 0).all()
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(trace, method=method)[0]
        assert (top.failure_type, top.root_cause) == ("training_plateau",
                                                      "learning_rate_too_low"), method
        assert top.confidence >= 0.5, method


def _train_minibatches(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                       y: torch.Tensor, loss_fn, *, steps: int, batch: int, n: int,
                       generator: torch.Generator | None = None) -> ndb.Trace:
    """Random minibatches of ``batch`` from the first ``n`` examples, one step each (drawn
    with ``generator``, by default one seeded with 2)."""
    g = generator if generator is not None else torch.Generator().manual_seed(2)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(steps):
            idx = torch.randint(0, n, (batch,), generator=g)
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            dbg.step(loss)
    return dbg.trace


def test_a_loss_that_fell_and_settled_at_its_tasks_floor_is_no_plateau():
    """Binary classification with 25% of the labels flipped and weakly separated classes:
    the binary cross-entropy falls from ln 2 = 0.69 to about 0.59 and settles, at the task's
    floor (held-out accuracy about 0.66, an RBF SVM's). No cause explains a stall and the
    loss fell by more than a stall allows (the probabilistic method said training_plateau,
    cause unknown, at 0.91 before the fix)."""
    x, y = make_classification(n_samples=3000, n_features=10, n_informative=4, flip_y=0.25,
                               class_sep=0.5, random_state=0)
    x = (x - x.mean(0)) / x.std(0)
    xt, yt = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)[:, None]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    trace = _train_minibatches(model, opt, xt, yt,
                               nn.functional.binary_cross_entropy_with_logits, steps=STEPS,
                               batch=32, n=2250)
    with torch.no_grad():
        held_out = ((model(xt[2250:]) > 0).float() == yt[2250:]).float().mean().item()
    assert held_out > 0.6  # it learned what there is to learn (chance 0.5)
    loss = trace.steps["loss"].to_numpy()
    assert np.median(loss[:30]) > 0.66 and np.median(loss[-30:]) < 0.62
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert all(h.confidence < 0.5 for h in hyps), (method, hyps[:2])
    # what_if's factual still reads the model's plateau, and says why explain does not claim it
    cf = ndb.what_if(trace)
    assert cf.p_failure_factual > 0.5 and "floor" in cf.metadata["plateau_unclaimable"]


def test_an_easy_task_trained_to_a_loss_of_zero_is_no_failure():
    """Ten well-separated blobs, Adam at 0.1: the cross-entropy reaches exactly 0 within the
    run (gradients ~1e-11, the softmax one-hot). The heuristic said training_plateau (0.58)
    and the causal model saturated_activations (0.67), both of unknown cause, before the
    fix."""
    x, y = make_blobs(n_samples=2000, centers=10, n_features=16, cluster_std=0.3,
                      random_state=0)
    x = (x - x.mean(0)) / x.std(0)
    xt, yt = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    trace = _train_minibatches(model, opt, xt, yt, nn.functional.cross_entropy, steps=600,
                               batch=64, n=2000)
    assert trace.steps["loss"].iloc[-20:].max() < 1e-6
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert all(h.confidence < 0.5 for h in hyps), (method, hyps[:2])
        assert not hyps or "learned its training data" in hyps[0].metadata["thin_evidence"]
    assert "learned" in ndb.what_if(trace, lr_scale=0.1).metadata["thin_evidence"]


def _hand_written_bce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy written out on probabilities, as in many tutorials."""
    p = torch.sigmoid(logits)
    return -(target * torch.log(p) + (1 - target) * torch.log(1 - p)).mean()


def _separable_blobs_run(loss_fn) -> ndb.Trace:
    """Two blobs six standard deviations apart, a ReLU MLP under Adam at 1e-2."""
    x, y = make_blobs(n_samples=1000, centers=[[-3, -3], [3, 3]], cluster_std=1.0,
                      random_state=0)
    xt, yt = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)[:, None]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return _train_minibatches(model, opt, xt, yt, loss_fn, steps=150, batch=32, n=1000)


def test_a_hand_written_loss_at_log_zero_is_no_learning_rate_problem():
    """The hand-written BCE learns the blobs to a loss of ~1e-4, then a sigmoid rounds to 1
    and ``0 * log(0)`` is NaN, while every module output is finite. Both methods said
    loss_divergence / learning_rate_too_high (1.0 and 0.91) before the fix: a smaller rate
    only delays the NaN; the loss on logits never has it."""
    trace = _separable_blobs_run(_hand_written_bce)
    loss = trace.steps["loss"].to_numpy()
    first_nan = int(np.flatnonzero(~np.isfinite(loss))[0])
    assert np.median(loss[first_nan - 3:first_nan]) < 1e-3 * loss[0]
    top = ndb.explain(trace)[0]
    assert (top.failure_type, top.root_cause) == ("loss_divergence", "loss_output_mismatch")
    assert top.origin_step == first_nan
    for method in ("heuristic", "probabilistic"):
        claimed = [h for h in ndb.explain(trace, method=method) if h.confidence >= 0.5]
        assert claimed and all(h.root_cause in ("loss_output_mismatch", "unknown")
                               for h in claimed), (method, claimed[:2])
    # the same run with the loss computed from the logits trains and stays finite
    fixed = _separable_blobs_run(nn.functional.binary_cross_entropy_with_logits)
    assert np.isfinite(fixed.steps["loss"]).all()
    for method in ("heuristic", "probabilistic"):
        assert all(h.confidence < 0.5 for h in ndb.explain(fixed, method=method)), method


class _MaskedLogits(nn.Module):
    """Logits of the classes a sample does not allow set to -inf (an action mask)."""

    def forward(self, logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        return logits.masked_fill(~allowed, float("-inf"))


class _MaskedClassifier(nn.Module):
    def __init__(self, log_softmax: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.fc = nn.Linear(64, 10)
        self.mask = _MaskedLogits()
        self.out = nn.LogSoftmax(dim=-1) if log_softmax else nn.Identity()

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        return self.out(self.mask(self.fc(self.body(x)), allowed))


def _masked_run(log_softmax: bool, every: int, seed: int) -> ndb.Trace:
    """10 classes from a random tanh teacher; each sample allows its class and ~40% of the
    others."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4096, 20, generator=g)
    teacher = torch.tanh(x @ torch.randn(20, 32, generator=g) / 2.2) @ torch.randn(32, 10,
                                                                                   generator=g)
    y = teacher.argmax(1)
    allowed = torch.rand(len(x), 10, generator=g) < 0.4
    allowed[torch.arange(len(x)), y] = True
    torch.manual_seed(seed)
    model = _MaskedClassifier(log_softmax)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    loss_fn = nn.NLLLoss() if log_softmax else nn.CrossEntropyLoss()
    with ndb.NeuralDbg(model, optimizer=opt, every=every) as dbg:
        for _ in range(200):
            idx = torch.randint(0, len(x), (64,), generator=g)
            opt.zero_grad()
            loss = loss_fn(model(x[idx], allowed[idx]), y[idx])
            loss.backward()
            opt.step()
            dbg.step(loss)
    return dbg.trace


@pytest.mark.parametrize(("log_softmax", "every", "seed"),
                         [(False, 1, 0), (False, 1, 1), (True, 1, 0), (False, 16, 0)])
def test_logits_masked_with_minus_infinity_are_no_divergence(log_softmax: bool, every: int,
                                                             seed: int):
    """A module that masks logits with -inf (an action mask, a LogSoftmax over masked
    logits) outputs infinities at every step by design while the loss falls and stays
    finite: the heuristic said loss_divergence (0.50, "the first non-finite value was the
    output of mask") and the network dead_neurons (0.51) on a helper's healthy runs."""
    trace = _masked_run(log_softmax, every, seed)
    loss = trace.steps["loss"].to_numpy()
    assert np.isfinite(loss).all() and loss[-10:].mean() < 0.5 * loss[:5].mean()
    assert (trace.stats.loc[trace.stats["module_name"] == "mask", "act_inf"] > 0).all()
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert not hyps or hyps[0].confidence < 0.5, (method, hyps[0])


def _multilabel_run(seed: int, sigmoid_module: bool) -> ndb.Trace:
    """40 tags, ~1.5% positive: an MLP ending in nn.Sigmoid under nn.BCELoss (the
    tutorials' form), or its twin with raw logits under nn.BCEWithLogitsLoss."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(1200 + seed)
    x = torch.randn(4096, 20, generator=g)
    tags = ((x @ torch.randn(20, 40, generator=g) / 20**0.5 - 2.2) * 3 > 0).float()
    layers: list[nn.Module] = [nn.Linear(20, 128), nn.ReLU(), nn.Linear(128, 40)]
    model = nn.Sequential(*layers, *([nn.Sigmoid()] if sigmoid_module else []))
    loss_fn = nn.BCELoss() if sigmoid_module else nn.BCEWithLogitsLoss()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return _train_minibatches(model, opt, x, tags, loss_fn, steps=STEPS, batch=64, n=len(x),
                              generator=g)


def test_a_sigmoid_output_saturating_on_mostly_zero_targets_is_no_failure():
    """Near-0 probabilities for the negative tags are the right output under BCELoss: the
    output Sigmoid is 'saturated' for most of them while the loss falls 0.64 -> 0.03. The
    causal model said saturated_activations / loss_output_mismatch at 0.68 on this seed
    (0.18 on seeds 0-4) as on a helper's run; the BCEWithLogitsLoss twin (same losses, no
    Sigmoid layer) raised nothing."""
    for sigmoid_module in (True, False):
        trace = _multilabel_run(5, sigmoid_module)
        loss = trace.steps["loss"].to_numpy()
        assert loss[-20:].mean() < 0.1 * loss[:3].mean()
        for method in ("heuristic", "probabilistic"):
            hyps = ndb.explain(trace, method=method)
            assert not hyps or hyps[0].confidence < 0.5, (sigmoid_module, method, hyps[0])
        cf = ndb.what_if(trace, lr_scale=0.5)  # says why explain disagrees with its factual
        assert cf.p_failure_factual < 0.5 or "saturation_unclaimable" in cf.metadata


def _noisy_blobs_run(seed: int) -> ndb.Trace:
    """Three well separated blobs, 30% of the labels redrawn at random: the loss falls to
    its noise floor (about 0.64) within ~30 of 300 steps and stays there."""
    x, y = make_blobs(n_samples=4096, centers=3, n_features=10, cluster_std=1.0,
                      center_box=(-8.0, 8.0), random_state=seed)
    g = torch.Generator().manual_seed(seed)
    labels = torch.tensor(y)
    flip = torch.rand(len(labels), generator=g) < 0.3
    labels[flip] = torch.randint(0, 3, (int(flip.sum()),), generator=g)
    xt = torch.tensor((x - x.mean(0)) / x.std(0), dtype=torch.float32)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return _train_minibatches(model, opt, xt, labels, nn.functional.cross_entropy, steps=STEPS,
                              batch=64, n=len(xt), generator=g)


@pytest.mark.parametrize("seed", [0, 4])
def test_a_loss_that_falls_early_to_its_noise_floor_is_no_plateau(seed: int):
    """The loss falls from ~0.95 to its label-noise floor (~0.64) within 30 steps and stays:
    the plateau rule measures from its first tenth of the run, which holds that fall, and
    read a stall (heuristic 0.75-0.82, causal model 0.91 on these seeds, and on every seed
    0-7). A small language model reaching its source's entropy by step 40 did the same in
    a helper's probe."""
    trace = _noisy_blobs_run(seed)
    loss = trace.steps["loss"].to_numpy()
    assert np.median(loss[-30:]) < 0.75 * np.median(loss[:3])
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert all(h.confidence < 0.5 for h in hyps), (method, hyps[:2])
        if hyps:
            assert "noise" in hyps[0].metadata.get("thin_evidence", ""), hyps[0].metadata


def _huber_with_bad_targets(lr: float) -> ndb.Trace:
    """An MLP regression under ``F.huber_loss`` whose targets hold 20 outliers among 2,048
    (+30: bad labels), shuffled epochs of 64: about half the batches carry one."""
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(2001)
    x = torch.randn(2048, 10, generator=g)
    w = torch.randn(10, generator=g)
    y = (torch.sin(x @ w / 10 ** 0.5 * 2) + 0.3 * x[:, 0] * x[:, 1]
         + 0.05 * torch.randn(2048, generator=g))
    y[torch.randperm(2048, generator=torch.Generator().manual_seed(8001))[:20]] += 30.0
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    order = torch.Generator().manual_seed(1)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(6):
            perm = torch.randperm(2048, generator=order)
            for i in range(0, 2048, 64):
                idx = perm[i:i + 64]
                opt.zero_grad()
                loss = nn.functional.huber_loss(model(x[idx]).squeeze(1), y[idx])
                loss.backward()
                opt.step()
                dbg.step(loss)
    return dbg.trace


def test_a_few_bad_targets_holding_the_median_batch_loss_are_no_plateau():
    """Half the batches carry an outlier whose Huber loss does not fall, so the median batch
    loss rose over the run (first and last tenth) while the other batches' loss fell
    several-fold: the heuristic said training_plateau at 1.00 and the causal model at 0.91.
    Its twin at a rate 10,000x lower does not learn, and both methods still say so."""
    trace = _huber_with_bad_targets(lr=2e-3)
    loss = trace.steps["loss"].to_numpy()
    tenth = len(loss) // 10
    assert np.median(loss[-tenth:]) > np.median(loss[:tenth])  # the median "rose" ...
    assert np.quantile(loss[-tenth:], 0.25) < 0.3 * np.quantile(loss[:tenth], 0.25)  # ...
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert all(h.confidence < 0.5 for h in hyps), (method, hyps[:2])
    stalled = _huber_with_bad_targets(lr=2e-7)
    for method in ("heuristic", "probabilistic"):
        top = ndb.explain(stalled, method=method)[0]
        assert top.failure_type == "training_plateau" and top.confidence >= 0.5, (method, top)


def _poisson_run(seed: int, full: bool) -> tuple[ndb.Trace, float]:
    """Counts ~ Poisson(exp(f / 6)) of friedman1's f, an MLP on the log rate, Adam 3e-3.

    Returns the trace and the held-out R^2 of the predicted rate against the true one.
    """
    from sklearn.datasets import make_friedman1

    x, f = make_friedman1(n_samples=2000, n_features=10, noise=0.0, random_state=seed)
    x = (x - x[:1500].mean(0)) / x[:1500].std(0)
    rate = np.exp(f / 6.0)
    counts = np.random.default_rng(seed).poisson(rate[:1500])
    xs = torch.tensor(x, dtype=torch.float32)
    y = torch.tensor(counts, dtype=torch.float32)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    nll = nn.PoissonNLLLoss(log_input=True, full=full)
    g = torch.Generator().manual_seed(seed)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(800):
            idx = torch.randint(0, 1500, (64,), generator=g)
            opt.zero_grad()
            loss = nll(model(xs[idx]).squeeze(1), y[idx])
            loss.backward()
            opt.step()
            dbg.step(loss)
    with torch.no_grad():
        pred = model(xs[1500:]).squeeze(1).exp().numpy()
    true = rate[1500:]
    return dbg.trace, float(1 - ((pred - true) ** 2).sum() / ((true - true.mean()) ** 2).sum())


@pytest.mark.parametrize("seed", [1, 2])
def test_a_poisson_likelihood_below_zero_with_gradient_spikes_is_healthy(seed: int):
    """``PoissonNLLLoss(log_input=True)`` drops the log(y!) term: the loss runs to -30
    with single batches at -45, and count batches far off the rest spike the gradient norm
    8-14x. A new user's healthy runs (rate R^2 0.92-0.95) were exploding gradients at 0.50
    for both methods, measured from a floor one noisy batch set; ``full=True``, which only
    adds that constant back, was healthy."""
    trace, r2 = _poisson_run(seed, full=False)
    assert r2 > 0.9 and trace.steps["loss"].min() < -30
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert all(h.confidence < 0.5 for h in hyps), (method, hyps[:2])
    # what_if keeps the causal model's own reading, and says why explain does not claim it
    answer = ndb.what_if(trace)
    assert answer.p_failure_factual < 0.5 or answer.metadata.get("explosion_unclaimable")


class _PolicyWithValueHead(nn.Module):
    """A policy and a value head on one body; a REINFORCE loop leaves the value unused."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
        self.pi = nn.Linear(64, 10)
        self.v = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        self.value = self.v(h)  # computed for a critic the loss never uses
        return self.pi(h)


@pytest.mark.parametrize("value_head", [False, True])
def test_a_policy_gradient_surrogate_near_zero_is_no_plateau(value_head: bool):
    """REINFORCE on a contextual bandit (digits, reward 1 for the right class): the
    surrogate -(r - b) log pi(a) hovers near zero while the greedy policy learns. A new
    user's runs at 0.95 greedy accuracy were plateaus at 0.70-0.98 for both methods, and
    with a value head the loss leaves unused, a blocked gradient at 1.00."""
    from sklearn.datasets import load_digits

    x, labels = load_digits(return_X_y=True)
    xs = torch.tensor((x - x.mean(0)) / (x.std(0) + 1e-6), dtype=torch.float32)
    ys = torch.tensor(labels)
    torch.manual_seed(0)
    policy = (_PolicyWithValueHead() if value_head else
              nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)))
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    baseline = 0.0
    with ndb.NeuralDbg(policy, optimizer=opt) as dbg:
        for _ in range(800):
            idx = torch.randint(0, 1500, (64,), generator=g)
            dist = torch.distributions.Categorical(logits=policy(xs[idx]))
            action = dist.sample()
            reward = (action == ys[idx]).float()
            loss = -((reward - baseline) * dist.log_prob(action)).mean() \
                - 0.01 * dist.entropy().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            baseline = 0.9 * baseline + 0.1 * float(reward.mean())
            dbg.step(loss)
    with torch.no_grad():
        greedy = (policy(xs[1500:]).argmax(1) == ys[1500:]).float().mean().item()
    assert greedy > 0.85 and (dbg.trace.steps["loss"] < 0).any()
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(dbg.trace, method=method)
        assert all(h.confidence < 0.5 for h in hyps), (method, hyps[:2])
