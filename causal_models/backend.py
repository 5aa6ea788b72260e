"""pgmpy, imported quietly, and the inference objects built once per fitted network.

Every module of :mod:`causal_models` that needs pgmpy goes through here: its import warns
about its own deprecations, and ``pgmpy.estimators`` imports scikit-learn, which loading a
fitted model and answering queries do not need.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["import_pgmpy", "new_network", "network_cache", "normalised_joint",
           "variable_elimination"]

# Per-network caches, keyed by the network object's identity: pgmpy's DAG hashes and compares
# by structure, so two fitted models with the same graph (every fold of a benchmark) would
# share a WeakKeyDictionary entry and answer with each other's tables.
_CACHES: dict[int, dict[str, Any]] = {}


def import_pgmpy(*, estimators: bool = True) -> tuple[Any, Any, Any, Any]:
    """Import pgmpy quietly.

    Parameters
    ----------
    estimators : bool, default=True
        Also import ``pgmpy.estimators`` (it imports scikit-learn); ``False`` for loading a
        fitted model and answering queries, which need only the model, factors and inference.

    Returns
    -------
    tuple
        ``(pgmpy.models, pgmpy.estimators or None, pgmpy.inference, TabularCPD)``.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgmpy.inference as inf
        import pgmpy.models as models
        from pgmpy.factors.discrete import TabularCPD

        est: Any = None
        if estimators:
            import pgmpy.estimators

            est = pgmpy.estimators
    return models, est, inf, TabularCPD


def new_network(nodes: Iterable[str], edges: Iterable[tuple[str, str]]) -> Any:
    """An empty pgmpy ``DiscreteBayesianNetwork`` with these nodes and edges (no tables)."""
    models, _, _, _ = import_pgmpy(estimators=False)
    network = models.DiscreteBayesianNetwork()
    network.add_nodes_from(nodes)
    network.add_edges_from(edges)
    return network


def network_cache(network: Any) -> dict[str, Any]:
    """A dict that lives as long as ``network`` does, for objects derived from it.

    Keyed by the network's identity, not its hash (see the comment on the cache).
    """
    key = id(network)
    if key not in _CACHES:
        _CACHES[key] = {}
        weakref.finalize(network, _CACHES.pop, key, None)
    return _CACHES[key]


#: Pruned networks one variable-elimination engine keeps (the oldest goes first).
MAX_PRUNED = 256


def variable_elimination(network: Any) -> Any:
    """Exact variable elimination (pgmpy's) on ``network``, built once per network.

    pgmpy prunes the network before every query (d-separated nodes, then the ancestral
    graph of the query and evidence nodes, each table marginalised to what is left): graph
    work that depends on the query's variables and on *which* nodes are observed, not on
    their states, and that took two thirds of a query's time. The engine returned here
    keeps each pruned network by (query variables, evidence nodes in order) and answers
    from it; the answer is the one pgmpy's own engine gives, to the last bit.
    """
    cache = network_cache(network)
    if "variable_elimination" not in cache:
        _, _, inf, _ = import_pgmpy(estimators=False)
        cache["variable_elimination"] = _pruning_cached(inf.VariableElimination)(network)
    return cache["variable_elimination"]


def _pruning_cached(base: type) -> type:
    """``base`` (pgmpy's ``VariableElimination``) with its pruning step memoised."""

    class CachedPruningVariableElimination(base):
        def _prune_bayesian_model(self, variables: Any, evidence: Any) -> Any:
            evidence = {} if evidence is None else evidence
            pruned = self.__dict__.setdefault("_pruned", {})
            key = (tuple(variables), tuple(evidence))
            if key not in pruned:
                if len(pruned) >= MAX_PRUNED:
                    pruned.pop(next(iter(pruned)))
                bn, kept = super()._prune_bayesian_model(variables, evidence)
                pruned[key] = (bn, frozenset(kept))
            bn, kept = pruned[key]
            return bn, {var: state for var, state in evidence.items() if var in kept}

    return CachedPruningVariableElimination


def normalised_joint(engine: Any, variables: list[str], evidence: Mapping[str, str]) -> Any:
    """The normalised joint posterior factor of ``variables`` given ``evidence``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        factor = engine.query(variables, evidence=evidence, show_progress=False, joint=True)
    factor = factor.copy()
    factor.normalize()
    return factor
