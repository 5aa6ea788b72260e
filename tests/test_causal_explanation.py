"""The probabilistic reasoner's hypotheses: a failing run's cause is conditioned on the run
failing, and an undetermined cause is an honest ``unknown`` that still claims the failure."""

from __future__ import annotations

import numpy as np
import pytest

import experiments
import neuraldbg as ndb
from benchmarks.fit_default import with_family_labels
from causal_models import ProbabilisticReasoner
from causal_models.explanation import (
    cause_given_failure,
    name_undetermined_cause,
    name_undetermined_type,
    tied_causes,
)

#: The bug held out of the fit and the runs the model learns from: the same bug in an MLP
#: under SGD (its gradients blow up), a healthy CNN, and a plateau with another cause.
HELD_OUT = "zero_grad_per_epoch_cnn_adam"
FIT_FAMILIES = ("zero_grad_per_epoch_mlp", "healthy_cnn", "shuffled_labels_mlp")


def _run(family: str, seed: int, severity: float | None = None, **knobs: object) -> ndb.Trace:
    return with_family_labels(experiments.run_scenario(family, severity=severity, seed=seed,
                                                       **knobs))


@pytest.fixture(scope="module")
def held_out_bug() -> tuple[ProbabilisticReasoner, ndb.Trace]:
    """A model fitted without any Adam CNN that never resets its gradients, and such a run."""
    traces = []
    for name in FIT_FAMILIES:
        spec = experiments.get_family(name)
        traces.append(_run(name, 100))
        if spec.kind == "failure":
            traces.append(_run(name, 100, severity=spec.baseline_severity))
    model = ProbabilisticReasoner(calibration_cv=2).fit(traces)
    return model, experiments.run_scenario(HELD_OUT, seed=0)


def test_a_failing_runs_cause_is_conditioned_on_the_run_failing(held_out_bug) -> None:
    """Adam on gradients summed over an epoch: the loss stalls while the gradients grow.
    Fitted on three families, the network splits the failure between a plateau and
    exploding gradients and leaves part of each type's joint mass on the root cause of a
    healthy run ("none"); the rules name the bug. That mass is no evidence for any cause:
    conditioned on the run failing, the bug is named (it was "unknown" at 0.75, the bug at
    0.08, when the gradient states still read the growth as healthy and the type was a
    plateau alone)."""
    model, trace = held_out_bug
    hyps = model.explain(trace)
    top = hyps[0]
    assert top.root_cause == "missing_zero_grad", hyps[:3]
    assert top.failure_type in ("training_plateau", "exploding_gradients"), hyps[:3]
    assert top.confidence >= 0.5
    # the claim is P(failure) x P(cause | failure, the run fails): above the raw joint, and
    # never above the failure's posterior (the type's own, or P(any failure) where the
    # evidence splits the failure over types none of which reaches 0.5)
    ceiling = max(top.metadata["p_failure_type"], top.metadata.get("p_failure_claimed", 0.0))
    assert top.metadata["p_joint"] < top.confidence <= ceiling + 1e-9
    assert top.metadata["p_root_cause_given_failure"] >= 0.5
    assert "none" not in {h.root_cause for h in hyps}
    for ft in {h.failure_type for h in hyps}:
        mine = [h for h in hyps[1:] if h.failure_type == ft and h.root_cause != "unknown"]
        if mine:
            assert sum(h.confidence for h in mine) <= mine[0].metadata["p_failure_type"] + 1e-9


def test_cause_given_failure_sets_the_healthy_runs_cause_aside() -> None:
    causes = np.array(["none", "missing_zero_grad", "data_problem", "unknown"], dtype=object)
    row = np.array([0.6, 0.3, 0.05, 0.05])
    assert np.allclose(cause_given_failure(row, causes), [0.0, 0.75, 0.125, 0.125])
    assert not cause_given_failure(np.array([0.9, 0.0, 0.0, 0.0]), causes).any()


def test_an_unknown_cause_under_a_clear_failure_claims_the_failure() -> None:
    """The rules abstain and no registered cause fits (the leak's own state is the most
    probable cause, at 0.39): the failure, at 0.92, is claimed with ``unknown``, not read as
    a healthy run."""
    def hyp(cause: str, joint: float) -> ndb.Hypothesis:
        return ndb.Hypothesis("saturated_activations", cause, "rnn", 40, joint,
                              {"p_failure_type": 0.92, "p_healthy": 0.01})

    hyps = [hyp("unknown", 0.39), hyp("saturating_activation", 0.26)]
    out = name_undetermined_cause(hyps)
    assert [(h.root_cause, h.confidence) for h in out] == [("unknown", 0.92),
                                                           ("saturating_activation", 0.26)]
    assert out[0].metadata["cause_undetermined"] == {"unknown": 0.39,
                                                     "saturating_activation": 0.26}
    unclear = [hyp("unknown", 0.39)]
    unclear[0].metadata["p_failure_type"] = 0.45  # the failure itself is not shown
    assert name_undetermined_cause(unclear) == unclear


def test_causes_tied_in_the_posterior_are_a_tie_not_list_order() -> None:
    """Two causes whose tables still hold the same prior get the same probability given the
    failure; whichever the vocabulary lists first must not be claimed."""
    causes = np.array(["none", "data_problem", "missing_zero_grad", "unknown"], dtype=object)
    cond = cause_given_failure(np.array([0.1, 0.45, 0.45 * (1 + 1e-9), 0.1]), causes)
    assert sorted(tied_causes(cond, causes)) == ["data_problem", "missing_zero_grad"]
    assert tied_causes(cause_given_failure(np.array([0.1, 0.46, 0.44, 0.1]), causes),
                       causes) == []

    def hyp(cause: str, conf: float) -> ndb.Hypothesis:
        return ndb.Hypothesis("training_plateau", cause, "0", 12, conf,
                              {"p_failure_type": 1.0, "p_healthy": 0.0,
                               "cause_resolution": "tie",
                               "tied_causes": ["data_problem", "missing_zero_grad"]})

    out = name_undetermined_cause([hyp("data_problem", 0.5), hyp("missing_zero_grad", 0.5)])
    assert (out[0].root_cause, out[0].confidence) == ("unknown", 1.0)
    assert all(h.confidence < 0.5 for h in out[1:]) and len(out) == 3
    assert "tied" in out[0].metadata["reason"]


def test_a_failure_split_over_types_is_still_a_failure() -> None:
    """P(healthy) 0.01 with no failure type at 0.5 (a GRU whose features were detached:
    plateau 0.49, vanishing 0.24, dead 0.22) was judged healthy at 0.62; the likeliest type
    now claims P(the run fails from its cause)."""
    def hyp(ft: str, p_ft: float, cause: str, share: float) -> ndb.Hypothesis:
        return ndb.Hypothesis(ft, cause, "gru", 30, p_ft * share,
                              {"p_failure_type": p_ft, "p_healthy": 0.01})

    hyps = [hyp("training_plateau", 0.49, "gradient_blocked", 0.77),
            hyp("vanishing_gradients", 0.24, "gradient_blocked", 0.77),
            hyp("dead_neurons", 0.22, "gradient_blocked", 0.77)]
    share = {"gradient_blocked": 0.77, "symmetric_init": 0.12}
    out = name_undetermined_cause(name_undetermined_type(hyps, 0.99, share))
    assert (out[0].failure_type, out[0].root_cause) == ("training_plateau", "gradient_blocked")
    assert out[0].confidence == pytest.approx(0.99 * 0.77)
    assert out[0].metadata["p_failure_type"] == 0.49  # the type's own posterior stays
    assert out[0].metadata["failure_type_undetermined"] == {
        "training_plateau": 0.49, "vanishing_gradients": 0.24, "dead_neurons": 0.22}
    assert out[1:] == hyps[1:]
    # the cause undetermined too: the failure is claimed with "unknown" at P(failure)
    out = name_undetermined_cause(name_undetermined_type(hyps, 0.99, {"gradient_blocked": 0.4}))
    assert (out[0].root_cause, out[0].confidence) == ("unknown", 0.99)
    # a type that is shown, or a failure that is not, is left as it was
    assert name_undetermined_type(hyps, 0.45, share) == hyps
    shown = [hyp("training_plateau", 0.6, "gradient_blocked", 0.77)]
    assert name_undetermined_type(shown, 0.99, share) == shown
