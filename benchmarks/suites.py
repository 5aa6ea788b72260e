"""Benchmark suites: which zoo runs are made, which are scored, what is re-run.

Seeds for fitting the probabilistic model and seeds for scoring are disjoint (fit seeds start
at 100), so no method is scored on a run it was fitted on, even inside its own family.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

__all__ = ["Suite", "SUITES", "ABLATIONS", "RANDOMISED_RUNS", "get_suite"]


@dataclass(frozen=True, slots=True)
class Suite:
    """What one benchmark invocation runs.

    Attributes
    ----------
    name : str
        Output goes to ``results/<name>/``.
    families : tuple of str or None
        Zoo families to run (None: every registered family).
    n_failure, n_healthy : int or None
        With ``families`` None, keep only this many failure / healthy families (in registry
        order, one per failure type first): the tiny suite's selection.
    severities : {"default", "all"}
        Each family at its default severity, or at every severity of its sweep.
    score_seeds : tuple of int
        Seeds of the runs every method is scored on.
    fit_seeds : tuple of int
        Seeds of the runs the probabilistic model is fitted on (disjoint from ``score_seeds``).
    fit_corpus : {"zoo", "suite"}
        What the folds of a fitted method are fitted on (their held-out family or architecture
        always left out): ``"zoo"``, the corpus the shipped model is fitted on
        (``python -m benchmarks.fit_default``: every severity of each family plus its
        declared knob changes, at the fit seeds); ``"suite"``, the suite's own runs at the fit
        seeds (the tiny suite, to stay quick).
    counterfactual_seeds : tuple of int
        Score seeds whose runs are really re-run under each knob change the zoo declares
        (counterfactual validity).
    repair_seeds : tuple of int
        Score seeds whose failing runs are re-run with each method's top suggested fix.
    latency : bool
        Measure detection latency (each method on growing prefixes of the run).
    splits : tuple of str
        Held-out splits for fitted methods: ``"family"`` (leave-one-family-out) and/or
        ``"architecture"`` (leave-one-architecture-out).
    fit_params : tuple of (str, value) pairs
        Hyperparameters of the per-fold fits of the probabilistic model that differ from its
        shipped defaults: a cheap fit for suites that must finish quickly (2-fold instead of
        4-fold calibration); empty for the shipped model.
    ablations : tuple of (str, tuple of (str, value) pairs)
        Variants of the probabilistic model scored as extra rows on the leave-one-family-out
        folds, each a name and the estimator parameters it changes (see :data:`ABLATIONS`);
        labelled ``probabilistic[family/<name>]``.
    randomised_runs : int
        With more than 0, one ablation row more, ``probabilistic[family/randomised]``: the
        model fitted on this many runs of the randomised-knob corpus
        (:func:`benchmarks.knob_effects.corpus_specs`, labelled by
        :func:`~benchmarks.knob_effects.label_randomised_run`) instead of the zoo's
        observational runs, scored on the same held-out families (a recipe's randomised runs
        left out of the fit when its family is scored).
    n_resamples : int
        Bootstrap resamples per interval.
    every : int
        Capture's per-module sampling period for the zoo runs.
    """

    name: str
    families: tuple[str, ...] | None = None
    n_failure: int | None = None
    n_healthy: int | None = None
    severities: Literal["default", "all"] = "default"
    # Score seeds start at 10: the heuristic's thresholds were chosen looking at zoo seeds
    # 0-4, so scoring there would grade it on what it was tuned on.
    score_seeds: tuple[int, ...] = (10, 11)
    fit_seeds: tuple[int, ...] = (100, 101)
    fit_corpus: Literal["zoo", "suite"] = "zoo"
    counterfactual_seeds: tuple[int, ...] = (10,)
    repair_seeds: tuple[int, ...] = (10,)
    latency: bool = True
    splits: tuple[str, ...] = ("family", "architecture")
    fit_params: tuple[tuple[str, Any], ...] = (("calibration_cv", 2),)
    ablations: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    randomised_runs: int = 0
    n_resamples: int = 1000
    every: int = 1

    def __post_init__(self) -> None:
        overlap = set(self.score_seeds) & set(self.fit_seeds)
        if overlap:
            raise ValueError(f"Suite {self.name!r}: seeds {sorted(overlap)} are both fit and "
                             "score seeds; a method must never be scored on what it was "
                             "fitted on. Make fit_seeds and score_seeds disjoint.")
        for attr in ("counterfactual_seeds", "repair_seeds"):
            extra = set(getattr(self, attr)) - set(self.score_seeds)
            if extra:
                raise ValueError(f"Suite {self.name!r}: {attr} {sorted(extra)} are not score "
                                 f"seeds {list(self.score_seeds)}.")
        bad = set(self.splits) - {"family", "architecture"}
        if bad:
            raise ValueError(f"Unknown splits {sorted(bad)}; valid: ['family', 'architecture'].")

    def with_(self, **changes: Any) -> Suite:
        """A copy with some fields changed."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (written into metrics.json)."""
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


#: Ablations of the probabilistic model through its estimator's parameters: without the
#: heuristic's verdict as a sensor; without the time slices (one slice over the whole run);
#: its rule priors alone (a prior strength no data can move, no recalibration). The fourth,
#: fitted on randomised rather than observational runs, changes the fitting corpus, not a
#: parameter: :attr:`Suite.randomised_runs`.
ABLATIONS: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = (
    ("no-rule-sensor", (("rule_evidence", False),)),
    ("run-level", (("slices", False),)),
    ("priors-only", (("prior_strength", 1e6), ("calibration", "none"))),
)

#: Runs of the randomised-knob corpus the "randomised" ablation is fitted on.
RANDOMISED_RUNS = 90

#: Named suites of ``python -m benchmarks --suite``.
SUITES: dict[str, Suite] = {
    # a few families, one seed each: the end-to-end test and a smoke run. Named, so that a
    # family added to the zoo (the user-bug families sort before these by name) does not
    # change it; they are the ones n_failure=3, n_healthy=1 picked before.
    "tiny": Suite("tiny", families=("dead_relu_bias", "deep_sigmoid", "init_too_large",
                                    "healthy_cnn"),
                  n_failure=3, n_healthy=1, score_seeds=(0,), fit_seeds=(100,),
                  fit_corpus="suite", counterfactual_seeds=(0,), repair_seeds=(0,),
                  n_resamples=200),
    # every family at its default severity, 2 scored + 2 fitting seeds: `make bench`
    # (folds fitted exactly as the shipped model is, calibration included). Every registered
    # family is in it, the user-bug families of experiments/user_bugs.py and their
    # look-alike controls included (164 runs more, ~120 s CPU measured on a loaded machine)
    "default": Suite("default", fit_params=()),
    # the default suite with the four ablation rows added (on its leave-one-family-out
    # folds): every row of the default suite comes out the same, so papers.build adds the
    # ablation rows to the default report. Kept out of `make bench` for its time (the
    # randomised corpus's runs to train and four more fits per family)
    "ablation": Suite("ablation", fit_params=(), ablations=ABLATIONS,
                      randomised_runs=RANDOMISED_RUNS),
    # every severity of every sweep, 3 scored + 3 fitting seeds; counterfactuals re-run for
    # two seeds, repairs for all three (a long run: use --backend ray on a cluster)
    "full": Suite("full", severities="all", score_seeds=(10, 11, 12),
                  fit_seeds=(100, 101, 102), counterfactual_seeds=(10, 11),
                  repair_seeds=(10, 11, 12), fit_params=(),
                  n_resamples=2000),
}


def get_suite(name: str) -> Suite:
    """The suite registered as ``name``.

    Raises
    ------
    KeyError
        Listing the known suites.
    """
    try:
        return SUITES[name]
    except KeyError:
        raise KeyError(f"Unknown suite {name!r}. Known suites are: {sorted(SUITES)}") from None
