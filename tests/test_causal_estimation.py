"""The fast paths of causal_models' fit answer exactly what pgmpy's own code answers.

``estimate_tables`` counts every table in one pass (pgmpy's ``BayesianEstimator`` groups
by each node in turn), and the variable-elimination engine keeps its pruned networks; both
must give pgmpy's numbers to the last bit, or the benchmark's numbers would move.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from causal_models.backend import import_pgmpy, normalised_joint, variable_elimination
from causal_models.estimation import estimate_tables, family_weights
from causal_models.structure import build_structure


@pytest.fixture(scope="module")
def structure():
    return build_structure(n_slices=2, n_blocks=2, prior_strength=20.0, rule_trust=0.9)


def _frame(structure, n: int, seed: int) -> tuple[pd.DataFrame, np.ndarray]:
    """``n`` rows of states drawn per node (a unit test of one function: no trace needed)."""
    rng = np.random.default_rng(seed)
    data = pd.DataFrame({node: rng.choice(list(states), size=n)
                         for node, states in structure.states.items()})
    families = [f"family{i}" for i in rng.integers(0, 7, size=n)]
    return data, family_weights(families, "family")


def _pgmpy_tables(structure, data: pd.DataFrame, weights: np.ndarray):
    """What pgmpy's BayesianEstimator estimates, node by node (the reference)."""
    _, est, _, _ = import_pgmpy()
    from causal_models.backend import new_network

    frame = data.reindex(columns=list(structure.states)).copy()
    frame["_weight"] = weights
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimator = est.BayesianEstimator(new_network(structure.states, structure.edges), frame,
                                          state_names=dict(structure.states))
        return {node: estimator.estimate_cpd(node, prior_type="dirichlet",
                                             pseudo_counts=structure.prior[node], weighted=True)
                for node in structure.states}


@pytest.mark.parametrize("n, seed", [(40, 0), (317, 1)])
def test_tables_are_pgmpys_to_the_bit(structure, n, seed):
    data, weights = _frame(structure, n, seed)
    model = estimate_tables(structure, data, weights)
    reference = _pgmpy_tables(structure, data, weights)
    for node, cpd in reference.items():
        ours = model.get_cpds(node)
        assert ours.variables == cpd.variables
        assert ours.state_names == cpd.state_names
        assert np.array_equal(ours.values, cpd.values), node  # exact, not allclose


def test_a_state_outside_the_node_is_named(structure):
    data, weights = _frame(structure, 10, 2)
    data.loc[3, "failure_type"] = "not_a_failure"
    with pytest.raises(ValueError, match="failure_type.*not_a_failure"):
        estimate_tables(structure, data, weights)


def test_cached_pruning_answers_as_pgmpy(structure):
    data, weights = _frame(structure, 120, 3)
    network = estimate_tables(structure, data, weights)
    _, _, inf, _ = import_pgmpy(estimators=False)
    plain = inf.VariableElimination(network)
    cached = variable_elimination(network)
    observed = structure.observed_nodes()
    for i in range(12):  # the same evidence nodes, other states: the pruned network reused
        row = data.iloc[i]
        evidence = {n: row[n] for n in observed[: 20 + i % 3]}
        for variables in (["failure_type", "root_cause"], ["failure_type"]):
            ours = normalised_joint(cached, variables, evidence)
            theirs = normalised_joint(plain, variables, evidence)
            assert ours.variables == theirs.variables
            assert np.array_equal(ours.values, theirs.values)
    assert len(cached._pruned) == 6  # 3 evidence node sets x 2 query variable sets
