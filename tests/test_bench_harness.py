"""The benchmark end to end on a tiny suite of real zoo runs, against values computed by hand.

Two test-only methods make the expected metrics computable by hand from the suite's ground
truth alone: ``_oracle`` answers the truth at confidence 0.8 (it reads the ground truth,
which only a test may do), ``_constant`` always blames a too-high learning rate at 0.6. The
real methods' metrics are recomputed here from their stored hypotheses with independent code.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks import harness, report
from benchmarks.executor import LocalExecutor
from benchmarks.repair import best_fix_by_what_if
from benchmarks.runs import is_finished, load
from benchmarks.suites import SUITES, Suite
from neuraldbg.methods import register_method
from neuraldbg.records import FAILURE_TYPES, HEALTHY, Hypothesis
from neuraldbg.sufficiency import MIN_STEPS


@register_method("_oracle")
class _Oracle:
    def explain(self, trace):  # noqa: ANN001, ANN201
        gt = trace.ground_truth
        if gt["failure_type"] == HEALTHY:
            return []
        return [Hypothesis(gt["failure_type"], gt["root_cause"], gt["origin_layers"][0],
                           int(gt["onset_step"] or 0), 0.8, {})]


@register_method("_constant")
class _Constant:
    def explain(self, trace):  # noqa: ANN001, ANN201
        return [Hypothesis("loss_divergence", "learning_rate_too_high", trace.module_names[0],
                           0, 0.6, {})]


def test_local_executor_keeps_task_order() -> None:
    tasks = [(json.dumps, {"obj": i}) for i in range(5)] + [(os.getpid, {})] * 2
    res = LocalExecutor(2, progress=False).map(tasks)
    assert res[:5] == [str(i) for i in range(5)]
    assert os.getpid() not in res[5:]  # really in worker processes
    assert LocalExecutor(1, progress=False).map([(os.getpid, {})]) == [os.getpid()]


def test_ray_executor_local_instance() -> None:
    pytest.importorskip("ray")
    from benchmarks.executor import RayExecutor

    with RayExecutor(2, progress=False) as ex:
        assert ex.map([(json.dumps, {"obj": i}) for i in range(4)]) == ["0", "1", "2", "3"]
        assert os.getpid() not in ex.map([(os.getpid, {})])


def test_suites_keep_fit_and_score_seeds_apart() -> None:
    for s in SUITES.values():
        assert not set(s.fit_seeds) & set(s.score_seeds)
    with pytest.raises(ValueError, match="fit and score seeds"):
        Suite("bad", score_seeds=(0, 1), fit_seeds=(1,))


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> harness.BenchmarkResult:
    import experiments

    if not hasattr(experiments, "run_scenario"):
        pytest.skip("the failure zoo (experiments.run_scenario) is not in this tree yet")

    out = tmp_path_factory.mktemp("bench")
    suite = SUITES["tiny"].with_(name="tiny-test", latency=True, n_resamples=100,
                                 splits=("architecture", "family"),
                                 ablations=(("no-rule-sensor", (("rule_evidence", False),)),
                                            ("run-level", (("slices", False),))),
                                 randomised_runs=RANDOMISED_RUNS)
    methods = ["_oracle", "_constant", "heuristic", "autotrainer", "probabilistic"]
    return harness.run_benchmark(suite, out / "tiny", executor=LocalExecutor(1, progress=False),
                                 run_dir=out / "runs", methods=methods)


#: Randomised-knob runs of the test suite's "randomised" ablation (one per recipe and more).
RANDOMISED_RUNS = 4


def _truths(rec: pd.DataFrame) -> pd.DataFrame:
    return rec.drop_duplicates("run").set_index("run")


def test_oracle_and_constant_by_hand(bench: harness.BenchmarkResult) -> None:
    rec = bench.records
    assert (rec["error"] == "").all(), rec.loc[rec["error"] != "", "error"].tolist()
    t = _truths(rec)
    n = len(t)
    failing = t[t["true_failure"] != HEALTHY]
    n_fail = len(failing)
    assert n == 4 and n_fail == 3  # 3 failure families + 1 healthy, seed 0
    m = harness.compute_metrics(bench)["methods"]
    o = m["_oracle"]
    assert o["failure_accuracy"]["value"] == 1.0
    assert o["cause_ac@1"]["value"] == 1.0 and o["cause_mrr"]["value"] == 1.0
    assert o["layer_accuracy"]["value"] == 1.0 and o["healthy_fpr"]["value"] == 0.0
    # the oracle names the failure as soon as a prefix holds MIN_STEPS finished steps (a
    # thinner one is hedged below 0.5 for every method); prefixes grow 0, 1, 2, 4, 8... past
    # the onset
    ladder = [0, 1, 2, 4, 8, 16, 32]
    expected = [next(d for d in ladder if onset + d + 1 >= MIN_STEPS)
                for onset in failing["onset_step"].astype(int)]
    assert o["detection_median_latency"]["value"] == float(np.median(expected))
    # confidence 0.8 on the failing runs (right), 1.0 on the healthy run (right)
    assert o["ece"]["value"] == pytest.approx(0.2 * n_fail / n)
    assert o["brier"]["value"] == pytest.approx(0.04 * n_fail / n)
    assert o["nll"]["value"] == pytest.approx(-math.log(0.8) * n_fail / n, rel=1e-5)
    c = m["_constant"]
    p = float(np.mean(t["true_failure"] == "loss_divergence"))
    assert c["failure_accuracy"]["value"] == pytest.approx(p)
    assert c["ece"]["value"] == pytest.approx(abs(p - 0.6))
    assert c["healthy_fpr"]["value"] == 1.0
    lr = float(np.mean(failing["true_cause"] == "learning_rate_too_high"))
    assert c["cause_ac@1"]["value"] == pytest.approx(lr)
    assert c["cause_mrr"]["value"] == pytest.approx(lr)  # one cause named: rank 1 or absent


def test_real_methods_recomputed_by_hand(bench: harness.BenchmarkResult) -> None:
    rec = bench.records
    m = harness.compute_metrics(bench)["methods"]
    for label in ("heuristic", "autotrainer"):
        g = rec[rec["label"] == label]
        right, ranks, fps = [], [], []
        for _, r in g.iterrows():
            hyps = json.loads(r["hypotheses"])
            flagged = [h for h in hyps if h["confidence"] >= 0.5]
            top = max(flagged, key=lambda h: h["confidence"]) if flagged else None
            said = top["failure_type"] if top else HEALTHY
            right.append(said == r["true_failure"])
            if r["true_failure"] == HEALTHY:
                fps.append(bool(flagged))
            else:
                causes = list(dict.fromkeys(h["root_cause"] for h in hyps))
                ranks.append(causes.index(r["true_cause"]) + 1 if r["true_cause"] in causes
                             else None)
        assert m[label]["failure_accuracy"]["value"] == pytest.approx(np.mean(right))
        assert m[label]["cause_ac@1"]["value"] == pytest.approx(np.mean([x == 1 for x in ranks]))
        assert m[label]["cause_mrr"]["value"] == pytest.approx(
            np.mean([1 / x if x else 0.0 for x in ranks]))
        assert m[label]["healthy_fpr"]["value"] == pytest.approx(np.mean(fps))


def test_fitted_method_never_scored_on_what_it_was_fitted_on(
        bench: harness.BenchmarkResult) -> None:
    runs = bench.runs.set_index("path")
    rec = bench.records
    prob = rec[rec["label"] == "probabilistic[architecture]"]
    assert set(prob["run"]) == set(_truths(rec).index)  # every scored run, once
    assert prob["run"].is_unique
    for _, f in bench.folds.iterrows():
        assert f["error"] == "", f["error"]
        if f["split"] == "family/randomised":  # its own test below
            continue
        fitted = runs.loc[json.loads(f["fit_runs"])]
        assert len(fitted) > 0
        assert (fitted["architecture"] != f["fold"]).all()
        assert (fitted["role"] == "fit").all()
        scored = prob[prob["fold"] == f["fold"]]
        assert not set(fitted["seed"]) & set(scored["seed"])
        assert (scored["architecture"] == f["fold"]).all()
    cf = bench.counterfactuals
    assert len(cf) > 0 and cf["p_failure"].between(0, 1).all()


def test_counterfactual_and_repair_reruns_are_real(bench: harness.BenchmarkResult) -> None:
    reps = bench.repairs
    o = reps[reps["label"] == "_oracle"]
    assert len(o) == 3  # one per failing scored run
    for _, r in o.iterrows():
        fix = json.loads(r["fix"])
        truth = _truths(bench.records).loc[r["run"], "true_cause"]
        assert fix == harness.FIX_BY_CAUSE[truth]
        trace = load(r["rerun"])
        assert all(trace.ground_truth["knobs"][k] == v for k, v in fix.items())  # fix applied
        assert r["rerun_outcome"] in (HEALTHY, *FAILURE_TYPES)  # judged by the zoo's judge
        assert r["repaired"] == (r["rerun_outcome"] == HEALTHY)
    cf = bench.counterfactuals
    assert len(cf) == 0 or cf["actual_outcome"].isin([HEALTHY, *FAILURE_TYPES]).all()


def test_only_runs_that_show_their_declared_outcome_are_scored(
        bench: harness.BenchmarkResult) -> None:
    runs = bench.runs
    score = runs[runs["role"] == "score"]
    assert score["shown"].notna().all()
    for path, shown in zip(score["path"], score["shown"], strict=True):  # by hand
        t = load(path)
        healthy = t.ground_truth["failure_type"] == HEALTHY
        assert shown == (report_health(t) == healthy)
    assert set(bench.records["run"]) == set(score.loc[score["shown"].eq(True), "path"])
    assert bench.notes["unshown_score_runs"] == sorted(
        f"{r.family}/seed {r.seed}" for r in score[score["shown"].eq(False)].itertuples())


def report_health(trace) -> bool:  # noqa: ANN001
    from experiments.run_statistics import health_report

    return bool(health_report(trace)["healthy"])


def test_a_run_that_does_not_show_its_declared_failure_is_not_scored_as_it() -> None:
    from benchmarks.fit_default import declared_outcome_shown
    from experiments import run_scenario

    # the fix applied: a run that trains healthily, labelled healthy, shows its outcome...
    run = run_scenario("softmax_overflow", seed=0, input_scale=1 / 128)
    assert run.ground_truth["failure_type"] == HEALTHY and declared_outcome_shown(run)
    # ... and, labelled with the family's failure, does not (a seed on a knife edge)
    run.meta = {**run.meta, "ground_truth": {**run.ground_truth,
                                             "failure_type": "loss_divergence"}}
    assert not declared_outcome_shown(run)


def test_finished_runs_are_reused(bench: harness.BenchmarkResult) -> None:
    paths = [Path(p) for p in bench.runs["path"]]
    assert all(is_finished(p) for p in paths)
    stamp = {p: (p / "DONE").stat().st_mtime_ns for p in paths}
    again = harness.run_benchmark(bench.suite, bench.out.parent / "again",
                                  executor=LocalExecutor(1, progress=False),
                                  run_dir=Path(bench.runs["path"].iloc[0]).parents[2],
                                  methods=["_constant"])
    assert {p: (p / "DONE").stat().st_mtime_ns for p in paths} == stamp
    assert len(again.records) == len(_truths(bench.records))


def test_report_files(bench: harness.BenchmarkResult) -> None:
    metrics = harness.compute_metrics(bench)
    report.write_metrics(metrics, bench.out)
    path = report.write_benchmark_report(metrics, bench.out)
    text = path.read_text()
    assert "| _oracle | 1.00" in text
    assert (bench.out / "figures" / "reliability.png").stat().st_size > 1000
    assert (bench.out / "figures" / "ac_at_k.png").is_file()
    assert json.loads((bench.out / "metrics.json").read_text())["methods"]["_oracle"]


class _Late:
    """Names the true failure only once it has seen 6 steps past the onset."""

    def __init__(self, truth: dict) -> None:
        self.truth = truth

    def explain(self, trace):  # noqa: ANN001, ANN201
        if int(trace.steps["step"].max()) >= self.truth["onset_step"] + 6:
            return [Hypothesis(self.truth["failure_type"], "unknown", "x", 0, 0.9, {})]
        return []


def test_latency_on_prefixes_by_hand(bench: harness.BenchmarkResult) -> None:
    t = _truths(bench.records)
    run = t[(t["true_failure"] != HEALTHY) & t["onset_step"].notna()].index[0]
    trace = load(run)
    truth = trace.ground_truth
    # prefixes end at onset + 0, 1, 2, 4, 8, ...: first seen at offset 8
    assert harness._latency(_Late(truth), trace, truth) == 8.0
    other = {**truth, "failure_type": "dead_neurons"}
    assert math.isnan(harness._latency(_Constant(), trace, other))


class _WhatIf:
    def explain(self, trace):  # noqa: ANN001, ANN201
        return []

    def what_if(self, trace, **knobs):  # noqa: ANN001, ANN003, ANN201
        from types import SimpleNamespace

        return SimpleNamespace(p_failure={"lr_scale": 0.9, "init_scale": 0.2}.get(
            next(iter(knobs)), 0.5))


def test_suggested_fixes() -> None:
    hyps = [Hypothesis("exploding_gradients", "learning_rate_too_high", "a", 0, 0.8, {}),
            Hypothesis("exploding_gradients", "init_scale_too_large", "a", 0, 0.7, {})]
    assert harness.suggest_fix(hyps) == {"lr_scale": 0.1}
    assert harness.suggest_fix([Hypothesis("dead_neurons", "x", "a", 0, 0.4, {})]) is None
    own = Hypothesis("dead_neurons", "unknown", "a", 0, 0.9, {"suggested_fix": {"grad_clip": 2.0}})
    assert harness.suggest_fix([own]) == {"grad_clip": 2.0}
    # a causal model picks, among its causes' fixes, the one its what_if likes best
    fix, p = best_fix_by_what_if(_WhatIf(), None, hyps)
    assert fix == {"init_scale": 0.1} and p == 0.2


def test_progress_prints_lines_when_output_is_not_a_terminal(capsys) -> None:  # noqa: ANN001
    LocalExecutor(1, progress=True).map([(json.dumps, {"obj": i}) for i in range(20)],
                                        description="zoo runs")
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "zoo runs: 20 tasks"
    assert lines[-1].startswith("zoo runs: 20/20 done")
    assert 3 <= len(lines) <= 12  # every 10% of the tasks, not one line per task


def test_address_needs_the_ray_backend() -> None:
    from benchmarks.executor import make_executor

    with pytest.raises(ValueError, match="needs backend='ray'"):
        make_executor("local", address="auto")


def test_ablation_rows_score_the_same_runs_with_the_switch_live(
        bench: harness.BenchmarkResult) -> None:
    rec = bench.records[bench.records["error"] == ""]
    full = rec[rec["label"] == "probabilistic[family]"].set_index("run")
    abl = rec[rec["label"] == "probabilistic[family/no-rule-sensor]"].set_index("run")
    assert len(abl) and sorted(abl.index) == sorted(full.index)
    # the ablated model does not observe the heuristic's verdict; the full model does

    def observed(frame: pd.DataFrame) -> set[str]:
        return {k for h in frame["hypotheses"] for hyp in json.loads(h)[:1]
                for k in hyp["metadata"].get("evidence", {})}

    assert "rule_failure" in observed(full)
    assert "rule_failure" not in observed(abl) and observed(abl)
    metrics = harness.compute_metrics(bench)
    assert "probabilistic[family/no-rule-sensor]" in metrics["methods"]
    assert not [k for k in metrics["mcnemar"] if "/" in k]  # McNemar: heuristic vs main rows


def test_run_level_ablation_observes_one_slice(bench: harness.BenchmarkResult) -> None:
    rec = bench.records[bench.records["error"] == ""]

    def slices(label: str) -> set[str]:
        rows = rec[rec["label"] == label]
        return {k.rsplit("@", 1)[1] for h in rows["hypotheses"] for hyp in json.loads(h)[:1]
                for k in hyp["metadata"].get("evidence", {}) if "@" in k}

    assert slices("probabilistic[family]") == {"0", "1"}
    assert slices("probabilistic[family/run-level]") == {"0"}
    full = set(rec[rec["label"] == "probabilistic[family]"]["run"])
    assert set(rec[rec["label"] == "probabilistic[family/run-level]"]["run"]) == full


def test_randomised_ablation_fits_on_the_randomised_corpus_only(
        bench: harness.BenchmarkResult) -> None:
    from benchmarks.knob_effects import RECIPES

    runs = bench.runs.set_index("path")
    corpus = runs[runs["role"] == "randomised"]
    assert len(corpus) == RANDOMISED_RUNS and corpus["finished"].all()
    assert set(corpus["family"]) == set(RECIPES) and (corpus["seed"] >= 2000).all()
    folds = bench.folds[bench.folds["split"] == "family/randomised"]
    rec = bench.records[bench.records["label"] == "probabilistic[family/randomised]"]
    assert (rec["error"] == "").all()
    assert sorted(rec["run"]) == sorted(_truths(bench.records).index)  # every scored run once
    for _, f in folds.iterrows():
        assert f["error"] == "", f["error"]
        fitted = runs.loc[json.loads(f["fit_runs"])]
        assert (fitted["role"] == "randomised").all() and f["n_fit"] == len(fitted)
        scored = set(rec[rec["fold"] == f["fold"]]["family"])
        assert scored and not scored & set(fitted["family"])  # a recipe never scores itself
    assert len(folds) < rec["family"].nunique()  # families outside the corpus share one fit


def test_randomised_runs_are_labelled_by_the_judge_and_the_cause_rule(
        bench: harness.BenchmarkResult) -> None:
    from benchmarks.knob_effects import CauseRule, label_randomised_run
    from benchmarks.runs import run_outcome

    rule = CauseRule()
    assert rule.causes({"lr_scale": 20.0, "init_scale": 1.0}) == ["learning_rate_too_high"]
    assert rule.causes({"lr_scale": 20.0, "activation": "sigmoid"}) == [
        "learning_rate_too_high", "saturating_activation"]
    assert rule.causes({"lr_scale": 1.0, "init_scale": 1.0, "activation": "relu"}) == []
    for path in bench.runs[bench.runs["role"] == "randomised"]["path"]:
        judged = run_outcome(load(path))["outcome"]
        gt = label_randomised_run(load(path)).ground_truth
        assert gt["failure_type"] == judged
        causes = rule.causes(gt["knobs"])
        if judged == HEALTHY:
            assert gt["root_cause"] == "none"
        else:
            assert gt["root_cause"] == (causes[0] if len(causes) == 1 else "unknown")
