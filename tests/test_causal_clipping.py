"""``grad_clip=c``: the value of ``c`` matters, judged against the run's gradient norms.

A clip far above every gradient norm of a run caps nothing and changes nothing; one that
caps the bursts only, or most steps, is a different intervention. The observed clipping of a
run is read the same way from its (post-clip) recorded norms.
"""

from __future__ import annotations

import numpy as np
import pytest

import causal_models
import experiments
from causal_models.evidence import clip_share, clipping_state, observe_knobs
from experiments import run_statistics


def test_clip_share_and_state_compare_the_threshold_with_the_norms() -> None:
    norms = np.array([0.5] * 8 + [5.0, np.nan])
    # above every finite norm: it would have acted only at the overflow, too late
    assert clip_share(norms, 100.0) == 0.0
    assert clip_share(norms, 1e40) == 0.0
    assert clip_share(norms[:9], 100.0) == 0.0
    assert clip_share(norms, 1.0) == pytest.approx(0.2)  # the burst and the NaN
    assert clip_share(norms, 0.4) == pytest.approx(1.0)
    # a clipped run records its norms at the threshold: they count as capped
    assert clip_share(np.array([0.4999997, 0.3]), 0.5) == pytest.approx(0.5)
    assert clip_share(np.zeros(0), 1.0) == 0.0
    assert [clipping_state(s) for s in (0.0, 0.01, 0.49, 0.5, 1.0)] == [
        "none", "peaks", "peaks", "tight", "tight"]


@pytest.fixture(scope="module")
def rnn_run():
    """A recurrent net without clipping whose gradient bursts wreck training (seed 0)."""
    return experiments.run_scenario("rnn_no_clip", seed=0)


def test_observed_clipping_reads_the_configured_value_against_the_run(rnn_run) -> None:
    assert observe_knobs(rnn_run)["clipping"] == "none"
    tight = experiments.run_scenario("rnn_no_clip", seed=0, grad_clip=0.5)
    assert observe_knobs(tight)["clipping"] == "tight"
    loose = experiments.run_scenario("rnn_no_clip", seed=0, grad_clip=1e4)
    assert observe_knobs(loose)["clipping"] == "none"  # configured, but it never capped
    # ... and really changed nothing: the same losses as the unclipped run
    np.testing.assert_allclose(loose.steps["loss"].to_numpy(), rnn_run.steps["loss"].to_numpy())


def test_what_if_clip_value_is_compared_with_the_recorded_norms(rnn_run) -> None:
    """A clip at the norms' lower quartile re-runs healthy; one above them all changes
    nothing. Until the failure the layer states do not show had a node of its own
    (``causal_models.structure.UNSEEN``), the tight clip read 0.86: the abduction moved the
    root cause to none, and the healthy slice states kept the failure through its noise."""
    model = causal_models.load_default_model()
    norms = rnn_run.steps["grad_norm"].to_numpy(dtype=float)
    # below a quarter of the recorded norms: it caps most steps, whatever the run's scale
    tight_clip = round(float(np.quantile(norms[np.isfinite(norms)], 0.25)), 3)
    as_is = model.what_if(rnn_run)
    loose = model.what_if(rnn_run, grad_clip=1e4)
    tight = model.what_if(rnn_run, grad_clip=tight_clip)
    assert loose.metadata["action"] == {}  # a clip that never bites is no action
    assert loose.metadata["no_op"]
    assert tight.metadata["action"]["clipping"] == "tight"
    assert loose.p_failure == pytest.approx(as_is.p_failure, abs=1e-9)
    assert as_is.p_failure > 0.5
    assert tight.p_failure < 0.5 < loose.p_failure
    # against really re-running the seed with each clip
    for cf, clip in ((loose, 1e4), (tight, tight_clip)):
        rerun = experiments.run_scenario("rnn_no_clip", seed=0, grad_clip=clip)
        failed = not run_statistics.health_report(rerun)["healthy"]
        assert (cf.p_failure >= 0.5) == failed, (clip, cf.p_failure)


def test_a_clip_just_above_the_largest_recorded_norm_changes_nothing(rnn_run) -> None:
    """The contract's no-op: a threshold above every recorded norm never bites, however
    close to the largest it lies; one just below it caps that step (the peaks)."""
    model = causal_models.load_default_model()
    norms = rnn_run.steps["grad_norm"].to_numpy(dtype=float)
    peak = float(np.max(norms[np.isfinite(norms)]))
    as_is = model.what_if(rnn_run)
    for factor in (1.0001, 1.005):
        cf = model.what_if(rnn_run, grad_clip=peak * factor)
        assert cf.metadata["no_op"] and cf.p_failure == as_is.p_failure_factual
    below = model.what_if(rnn_run, grad_clip=peak * 0.999)
    assert below.metadata["action"]["clipping"] == "peaks"


def test_a_run_clipped_at_c_is_unchanged_by_its_own_clip() -> None:
    clipped = experiments.run_scenario("rnn_no_clip", seed=0, grad_clip=0.5)
    model = causal_models.load_default_model()
    same = model.what_if(clipped, grad_clip=0.5)
    assert same.metadata["no_op"] and same.p_failure == same.p_failure_factual
