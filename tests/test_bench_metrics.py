"""Benchmark metrics against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from benchmarks import metrics as M
from benchmarks import stats as S
from neuraldbg.records import Hypothesis


def H(ft: str, rc: str, conf: float, layer: str = "0", step: int = 0) -> Hypothesis:
    return Hypothesis(ft, rc, layer, step, conf, {})


CONF = [0.9, 0.9, 0.62, 0.1]
CORRECT = [True, False, True, False]


def test_ece_by_hand() -> None:
    # bin (13/15, 14/15]: two runs, accuracy 0.5, confidence 0.9 -> 0.4 * 2/4 = 0.2
    # bin (9/15, 10/15]: 0.62, correct -> 0.38 * 1/4 = 0.095; bin (1/15, 2/15]: 0.1, wrong -> 0.025
    assert M.top1_expected_calibration_error(CONF, CORRECT, 15) == pytest.approx(0.32)
    t = M.reliability_table(CONF, CORRECT, 15)
    assert t["count"].sum() == 4
    assert t.loc[13, "count"] == 2 and t.loc[13, "accuracy"] == 0.5
    assert t.loc[9, "count"] == 1 and t.loc[1, "count"] == 1


def test_brier_and_nll_by_hand() -> None:
    assert M.top1_brier_score(CONF, CORRECT) == pytest.approx((0.01 + 0.81 + 0.38**2 + 0.01) / 4)
    nll = -(math.log(0.9) + math.log(0.1) + math.log(0.62) + math.log(0.9)) / 4
    assert M.top1_negative_log_likelihood(CONF, CORRECT) == pytest.approx(nll)
    # a certain wrong answer is clipped (as causal_models.calibration clips), not infinite
    assert M.top1_negative_log_likelihood([1.0], [False]) == pytest.approx(-math.log(1e-12))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        M.top1_brier_score([1.5], [True])
    assert M.top1_brier_score([1.0000000000000002], [True]) == 0.0  # round-off is clipped


def test_rank_metrics_by_hand() -> None:
    ranks = [1, 2, np.nan, 4]
    assert M.ac_at_k(ranks, 1) == 0.25
    assert M.ac_at_k(ranks, 3) == 0.5
    assert M.avg_at_k(ranks, 5) == pytest.approx((0.25 + 0.5 + 0.5 + 0.75 + 0.75) / 5)
    assert M.mean_reciprocal_rank(ranks) == pytest.approx((1 + 0.5 + 0 + 0.25) / 4)


def test_cause_rank_counts_distinct_causes_in_list_order() -> None:
    hyps = [H("exploding_gradients", "learning_rate_too_high", 0.8),
            H("loss_divergence", "learning_rate_too_high", 0.7),
            H("exploding_gradients", "init_scale_too_large", 0.3)]
    assert M.cause_rank(hyps, "learning_rate_too_high") == 1
    assert M.cause_rank(hyps, "init_scale_too_large") == 2
    assert M.cause_rank(hyps, "negative_bias_init") is None


def test_predicted_label_threshold() -> None:
    assert M.predicted_label([]) == ("healthy", 1.0)
    assert M.predicted_label([H("dead_neurons", "x", 0.3)]) == ("healthy", pytest.approx(0.7))
    assert M.predicted_label([H("dead_neurons", "x", 0.5)]) == ("dead_neurons", 0.5)


def test_score_run_by_hand() -> None:
    truth = {"failure_type": "dead_neurons", "root_cause": "negative_bias_init",
             "origin_layers": ["net.2", "net.3"], "onset_step": 10, "onset_tolerance": 3}
    hyps = [H("dead_neurons", "learning_rate_too_high", 0.9, "net.3", 14),
            H("dead_neurons", "negative_bias_init", 0.6, "net.2", 10)]
    s = M.score_run(hyps, truth)
    assert s["failure_correct"] and s["confidence"] == 0.9
    assert s["cause_rank"] == 2.0
    assert s["layer_correct"] is True
    assert s["onset_error"] == 4.0 and s["onset_hit"] is False
    healthy = {"failure_type": "healthy", "root_cause": "none", "origin_layers": [],
               "onset_step": None, "onset_tolerance": 0}
    s = M.score_run(hyps, healthy)
    assert not s["failure_correct"] and s["flagged"] and math.isnan(s["cause_rank"])
    s = M.score_run([H("dead_neurons", "x", 0.2)], healthy)
    assert s["failure_correct"] and not s["flagged"] and s["confidence"] == pytest.approx(0.8)


def test_mcnemar_by_hand() -> None:
    a = [1, 1, 1, 0, 0, 1]
    b = [0, 0, 0, 0, 1, 1]
    res = M.mcnemar_test(a, b)
    assert (res["a_only"], res["b_only"], res["both"], res["neither"]) == (3, 1, 1, 1)
    # exact: 2 * P(X <= 1), X ~ Binomial(4, 1/2) = 2 * 5/16
    assert res["pvalue"] == pytest.approx(0.625)
    assert M.mcnemar_test([1, 0], [1, 0])["pvalue"] == 1.0


def test_exact_interval_is_not_degenerate_at_the_edges() -> None:
    # EVALUATION: 28/28 reads [0.88, 1.00] and 0/16 reads [0.00, 0.21] (Clopper-Pearson)
    all_right = S.proportion_interval(np.ones(28, dtype=bool))
    assert all_right["value"] == 1.0 and all_right["high"] == 1.0
    assert all_right["low"] == pytest.approx(0.8766, abs=1e-4)
    none = S.proportion_interval(np.zeros(16, dtype=bool))
    assert none["low"] == 0.0 and none["high"] == pytest.approx(0.2059, abs=1e-4)
    assert S.proportion_interval([])["n"] == 0 and math.isnan(S.proportion_interval([])["value"])
    # NaN entries (metric undefined on that run) are dropped, not counted as misses
    assert S.proportion_interval([1.0, np.nan, 0.0])["n"] == 2


def test_family_bootstrap_resamples_whole_families() -> None:
    # two families, perfectly correlated inside: the spread is that of 2 draws, not 100
    x = np.array([0.0] * 50 + [1.0] * 50)
    fam = np.array(["a"] * 50 + ["b"] * 50)
    res = S.family_bootstrap({"x": x}, lambda x: np.mean(x), fam, n_resamples=2000, seed=1)
    assert res["value"] == 0.5 and res["n_groups"] == 2
    assert res["low"] == 0.0 and res["high"] == 1.0  # a run bootstrap would give ~[0.4, 0.6]
    again = S.family_bootstrap({"x": x}, lambda x: np.mean(x), fam, n_resamples=2000, seed=1)
    assert again == res
    one = S.family_bootstrap({"x": x}, lambda x: np.mean(x), ["a"] * 100)
    assert math.isnan(one["low"])  # one family: no interval rather than a false one
    with pytest.raises(ValueError, match="differ in length"):
        S.family_bootstrap({"x": x}, lambda x: np.mean(x), ["a"])


def test_sharpness_counts_distinct_confidences() -> None:
    assert M.sharpness([0.7, 0.7, 0.7]) == {"distinct": 1, "std": pytest.approx(0.0)}
    assert M.sharpness([0.5, 1.0])["std"] == pytest.approx(0.25)


def test_confident_wrong_counts_specific_wrong_causes_only() -> None:
    truth = {"failure_type": "dead_neurons", "root_cause": "negative_bias_init",
             "origin_layers": [], "onset_step": None, "onset_tolerance": 0}
    assert M.score_run([H("dead_neurons", "learning_rate_too_high", 0.8)], truth)[
        "confident_wrong"] is True
    assert M.score_run([H("dead_neurons", "unknown", 0.9)], truth)["confident_wrong"] is False
    assert M.score_run([H("dead_neurons", "learning_rate_too_high", 0.4)], truth)[
        "confident_wrong"] is False
    assert M.score_run([H("dead_neurons", "negative_bias_init", 0.9)], truth)[
        "confident_wrong"] is False


def test_summarize_by_hand() -> None:
    rows = [
        # failing, right type, cause at rank 1, layer right, onset off by 2 (tolerance 3)
        dict(true_failure="dead_neurons", failure_correct=True, cause_rank=1.0, layer_correct=True,
             onset_hit=True, onset_error=2.0, flagged=True, confidence=0.8, latency=1.0),
        # failing, wrong type, cause at rank 3, layer wrong, onset off by 10
        dict(true_failure="vanishing_gradients", failure_correct=False, cause_rank=3.0,
             layer_correct=False, onset_hit=False, onset_error=10.0, flagged=True, confidence=0.6,
             latency=np.nan),
        # healthy, flagged (false positive)
        dict(true_failure="healthy", failure_correct=False, cause_rank=np.nan, layer_correct=None,
             onset_hit=None, onset_error=np.nan, flagged=True, confidence=0.7, latency=np.nan),
        # healthy, silent
        dict(true_failure="healthy", failure_correct=True, cause_rank=np.nan, layer_correct=None,
             onset_hit=None, onset_error=np.nan, flagged=False, confidence=1.0, latency=np.nan),
    ]
    frame = pd.DataFrame(rows).assign(family=["f1", "f2", "h1", "h2"],
                                      confident_wrong=[False, True, None, None])
    s = M.summarize(frame, n_resamples=200)
    assert s["failure_accuracy"]["value"] == 0.5
    assert s["failure_accuracy_failing"]["value"] == 0.5
    assert s["cause_ac@1"]["value"] == 0.5 and s["cause_ac@3"]["value"] == 1.0
    assert s["cause_mrr"]["value"] == pytest.approx((1 + 1 / 3) / 2)
    assert s["layer_accuracy"]["value"] == 0.5
    assert s["onset_hit"]["value"] == 0.5 and s["onset_median_error"]["value"] == 6.0
    assert s["detection_rate"]["value"] == 0.5
    assert s["detection_median_latency"]["value"] == 1.0
    assert s["healthy_fpr"]["value"] == 0.5
    assert s["brier"]["value"] == pytest.approx((0.04 + 0.36 + 0.49 + 0.0) / 4)
    assert s["confident_wrong"]["value"] == 0.5 and s["confident_wrong"]["n"] == 2
    assert s["sharpness_distinct"]["value"] == 4
    assert s["cause_ac@1"]["interval"] == "clopper-pearson"
    assert s["cause_mrr"]["interval"] == "family bootstrap"
    for v in s.values():
        assert v["low"] <= v["value"] <= v["high"] or math.isnan(v["low"])


def test_counterfactual_validity_and_repair_by_hand() -> None:
    cases = pd.DataFrame({"p_failure": [0.9, 0.2, 0.6, 0.1, 0.8],
                          "actual_failure": [True, False, False, True, True],
                          "family": ["a", "a", "b", "b", "c"]})
    v = M.counterfactual_validity(cases, n_resamples=100)
    assert v["accuracy"]["value"] == 0.6
    assert v["accuracy_still_fails"]["value"] == pytest.approx(2 / 3)  # 0.9, 0.8 right; 0.1 not
    assert v["accuracy_fixed"]["value"] == 0.5  # 0.2 right, 0.6 wrong
    assert v["balanced_accuracy"]["value"] == pytest.approx((2 / 3 + 0.5) / 2)
    assert v["brier"]["value"] == pytest.approx((0.01 + 0.04 + 0.36 + 0.81 + 0.04) / 5)
    # the constant "still fails" answer scores 0.5 balanced, whatever the base rate
    const = cases.assign(p_failure=1.0)
    assert M.counterfactual_validity(const)["balanced_accuracy"]["value"] == 0.5
    r = M.repair_rate(pd.DataFrame({"repaired": [True, False, True]}))
    assert r["value"] == pytest.approx(2 / 3) and r["k"] == 2
