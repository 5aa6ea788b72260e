"""Failure zoo: the manifestation check, the single-run judge, the suite and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import neuraldbg as ndb
from experiments import run_scenario
from experiments.manifest import check_family, judge_outcome, separation_test
from experiments.scenario import Manifestation
from experiments.suite import is_complete, plan_suite, run_suite

ROOT = Path(__file__).resolve().parents[1]


def test_separation_test_needs_complete_separation_and_the_margin():
    s = Manifestation("dead_share", module="act2", direction="greater", scale="linear", margin=0.3)
    assert separation_test([1.0, 0.9, 0.95], [0.0, 0.05, 0.02], s)["separated"]
    # overlapping seeds: no separation whatever the medians
    assert not separation_test([1.0, 0.01, 0.95], [0.0, 0.05, 0.02], s)["separated"]
    # fully separated but below the margin: not a failure
    assert not separation_test([0.12, 0.13, 0.14], [0.0, 0.05, 0.02], s)["separated"]
    low = Manifestation("out_grad_norm", module="fc1", direction="less", scale="log", margin=1.0)
    assert separation_test([1e-8, 2e-8, 1e-8], [1e-2, 2e-2, 1e-2], low)["separated"]
    assert not separation_test([1e-2, 2e-2, 1e-2], [1e-8, 2e-8, 1e-8], low)["separated"]


@pytest.mark.parametrize("family", ["dead_relu_bias", "init_too_large", "softmax_overflow"])
def test_failure_family_manifests_against_its_baseline_over_three_seeds(family):
    res = check_family(family, seeds=(0, 1, 2))
    assert res["manifest"], res["tests"][0]
    assert res["baseline"]["healthy"]
    assert res["tests"][0]["p_mannwhitney"] <= 0.05
    assert res["onset_consistent"], (res["onset_steps"], res["empirical_onsets"])
    json.dumps(res, default=str)  # JSON-compatible evidence


def test_healthy_control_passes_the_check_over_three_seeds():
    res = check_family("healthy_mlp", seeds=(0, 1, 2))
    assert res["healthy"], res["health"]


def test_a_mild_severity_does_not_manifest():
    # a bias of -0.25 kills under a tenth of act2: the check must not call it a failure
    res = check_family("dead_relu_bias", severity=0.25, seeds=(0, 1, 2))
    assert not res["manifest"]


def test_judge_outcome_on_a_counterfactual_that_keeps_the_failure():
    trace = run_scenario("deep_sigmoid", seed=0, lr_scale=10.0)
    assert trace.ground_truth["failure_type"] == "vanishing_gradients"
    assert judge_outcome(trace)["outcome"] == "vanishing_gradients"


def test_suite_runs_in_workers_records_manifestation_and_resumes(tmp_path):
    out = tmp_path / "suite"
    plan = plan_suite(["softmax_overflow"], seeds=2)
    assert [r.role for r in plan] == ["run", "run", "baseline", "baseline"]
    dirs = run_suite(out, seeds=2, workers=1, families=["softmax_overflow"], progress=False)
    assert len(dirs) == 2 and all(is_complete(d) for d in dirs)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runs_made"] == 4 and not summary["errors"]
    trace = ndb.load_trace(dirs[0])
    evidence = trace.ground_truth["manifestation"]
    assert evidence["checked"] and evidence["family"] == "softmax_overflow"
    assert len(evidence["tests"][0]["fault_values"]) == 2
    # resume: nothing recomputed, the finished traces untouched
    before = (dirs[0] / "stats").stat().st_mtime_ns, sorted(p.name for p in dirs[0].iterdir())
    run_suite(out, seeds=2, workers=1, families=["softmax_overflow"], progress=False)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runs_made"] == 0 and summary["runs_resumed"] == 4
    assert ((dirs[0] / "stats").stat().st_mtime_ns,
            sorted(p.name for p in dirs[0].iterdir())) == before


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "experiments", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_list_shows_families_architectures_and_knobs():
    res = _cli("list")
    assert res.returncode == 0, res.stderr
    for word in ("lr_too_high", "healthy_transformer", "Transformer", "CNN+BN", "lr_scale",
                 "failure families"):
        assert word in res.stdout


def test_cli_run_writes_a_trace_with_ground_truth(tmp_path):
    out = tmp_path / "run"
    res = _cli("run", "lr_spike", "--severity", "30", "--seed", "1", "--out", str(out))
    assert res.returncode == 0, res.stderr
    trace = ndb.load_trace(out)
    assert trace.ground_truth["family"] == "lr_spike"
    assert trace.ground_truth["severity"] == 30.0 and trace.ground_truth["seed"] == 1
    assert trace.ground_truth["onset_step"] == 100
    bad = _cli("run", "lr_spike", "--out", str(tmp_path / "x"), "--activation", "swish")
    assert bad.returncode == 2 and "Valid values are" in bad.stderr
