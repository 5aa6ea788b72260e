"""The Gumbel-max mechanism of the counterfactual's slice nodes (one function each).

Checked against what the mechanism must satisfy, not against its own output: the abducted
noise reproduces the observed state (a no-op is exact); averaged over the factual world it is
a fresh standard Gumbel (so the counterfactual's marginal is the new table's column); the
answer does not depend on the order the states are listed in (the inverse CDF's did).
"""

from __future__ import annotations

import numpy as np

from causal_models.mechanisms import gumbel_max, posterior_gumbels


def _abduct(p: np.ndarray, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Observed states drawn from ``p`` and the noise abducted from them."""
    rng = np.random.default_rng(seed)
    observed = rng.choice(len(p), size=n, p=p)
    logits = np.log(np.tile(p, (n, 1)))
    return observed, posterior_gumbels(rng, logits, observed)


def test_the_abducted_noise_reproduces_the_observed_state() -> None:
    p = np.array([0.7, 0.2, 0.06, 0.04])
    observed, noise = _abduct(p, 2000, seed=0)
    np.testing.assert_array_equal(gumbel_max(np.log(np.tile(p, (2000, 1))), noise), observed)


def test_over_the_factual_world_the_noise_is_a_standard_gumbel() -> None:
    """Then the counterfactual under new parents, averaged, is the new column exactly."""
    p = np.array([0.7, 0.2, 0.06, 0.04])
    new = np.array([0.05, 0.15, 0.5, 0.3])
    n = 40_000
    _, noise = _abduct(p, n, seed=1)
    assert abs(noise.mean() - np.euler_gamma) < 0.02  # a standard Gumbel's mean
    assert abs(noise.std() - np.pi / np.sqrt(6)) < 0.02
    shares = np.bincount(gumbel_max(np.log(np.tile(new, (n, 1))), noise), minlength=4) / n
    np.testing.assert_allclose(shares, new, atol=0.01)


def test_the_answer_does_not_depend_on_the_order_of_the_states() -> None:
    """A run that diverged, asked under a healthy column: with the failure listed last (as
    the inverse CDF needed) or first, the same share comes back healthy."""
    factual = np.array([0.0005, 0.0005, 0.93, 0.068, 0.0005])  # healthy, ..., divergence
    healthy_world = np.array([0.986, 0.001, 0.0, 0.0, 0.013])  # ... plateau last
    n = 20_000
    rng = np.random.default_rng(2)
    answers = []
    for order in (np.arange(5), np.array([4, 3, 2, 1, 0])):
        observed = np.full(n, int(np.where(order == 3)[0][0]))  # the divergence, wherever it is
        noise = posterior_gumbels(rng, np.log(np.tile(factual[order], (n, 1)) + 1e-300),
                                  observed)
        cf = gumbel_max(np.log(np.tile(healthy_world[order], (n, 1)) + 1e-300), noise)
        answers.append(float(np.mean(order[cf] == 0)))
    assert answers[0] > 0.95  # the inverse CDF in the first order answered 0.80
    assert abs(answers[0] - answers[1]) < 0.01
