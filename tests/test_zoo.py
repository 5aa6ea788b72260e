"""Failure zoo: registry, knobs, determinism, ground truth. Real training, small models."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import experiments
from experiments import get_family, list_families, make_knobs, run_counterfactual, run_scenario
from experiments.families import register_family
from experiments.run_statistics import health_report

GT_KEYS = {"family", "architecture", "kind", "failure_type", "root_cause", "origin_layers",
           "onset_step", "onset_tolerance", "severity", "seed", "knobs", "canonical_fix",
           "equivalent_fixes", "counterfactuals", "manifestation"}


def test_registry_has_enough_families_across_architectures():
    failures = list_families("failure")
    healthy = list_families("healthy")
    assert len(failures) >= 12
    assert len(healthy) >= 5
    assert {"MLP", "CNN", "CNN+BN", "residual", "Transformer"} <= {s.architecture for s in healthy}
    assert {"GRU", "LSTM"} & {s.architecture for s in healthy}
    assert len({s.architecture for s in failures}) >= 5
    assert {"digits", "digits_image"} & {s.data for s in failures}
    assert {"teacher", "sequence"} & {s.data for s in failures}
    for spec in failures:
        assert spec.canonical_fix or spec.code_fix, spec.name
        assert spec.default_severity in spec.severities
        assert len(spec.severities) >= 3, spec.name


def test_registry_rejects_duplicates_and_lists_known_names_on_a_miss():
    with pytest.raises(ValueError, match="already registered"):
        register_family(name="lr_too_high", kind="healthy", architecture="MLP", data="digits",
                        description="dup", severities=(1.0,))(lambda s: None)
    with pytest.raises(ValueError, match="Known scenario families are: .*lr_too_high"):
        get_family("lr_to_high")


def test_knobs_are_validated_with_the_allowed_values():
    assert make_knobs(lr_scale=0.1).changed() == {"lr_scale": 0.1}
    with pytest.raises(ValueError, match="Valid knobs are"):
        make_knobs(learning_rate=0.1)
    with pytest.raises(ValueError, match="Valid values are"):
        make_knobs(activation="swish")
    with pytest.raises(ValueError, match="positive multiplier"):
        make_knobs(lr_scale=-1.0)
    with pytest.raises(ValueError, match="Valid knobs"):
        run_scenario("healthy_mlp", lr=0.1)


def _parquet_bytes(root: Path, sub: str) -> list[bytes]:
    return [p.read_bytes() for p in sorted((root / sub).glob("part-*.parquet"))]


def test_same_family_severity_seed_gives_byte_identical_parquet(tmp_path):
    a = run_scenario("unnormalized_inputs", seed=3, out=tmp_path / "a")
    run_scenario("unnormalized_inputs", seed=3, out=tmp_path / "b")
    run_scenario("unnormalized_inputs", seed=4, out=tmp_path / "c")
    stats_a = _parquet_bytes(tmp_path / "a", "stats")
    assert stats_a and stats_a == _parquet_bytes(tmp_path / "b", "stats")
    assert _parquet_bytes(tmp_path / "a", "steps") == _parquet_bytes(tmp_path / "b", "steps")
    # a different seed is a different run (the comparison above can fail)
    assert stats_a != _parquet_bytes(tmp_path / "c", "stats")
    assert a.meta["seed"] == 3 and a.ground_truth["seed"] == 3


def test_ground_truth_schema_and_config_without_labels():
    trace = run_scenario("dead_relu_bias", seed=0)
    gt = trace.ground_truth
    assert GT_KEYS <= set(gt)
    assert gt["failure_type"] == "dead_neurons" and gt["root_cause"] == "negative_bias_init"
    assert set(gt["origin_layers"]) == {"fc2", "act2"}
    assert set(gt["origin_layers"]) <= set(trace.module_names)
    assert gt["onset_step"] == 0 and gt["onset_tolerance"] >= 1
    assert set(gt["knobs"]) == set(experiments.KNOB_NAMES)
    for cf in gt["counterfactuals"]:
        assert set(cf) >= {"knobs", "expected"}
    # what the reasoners may read: a user's config, never the label
    config = trace.meta["config"]
    text = repr(config).lower()
    assert not {"family", "failure_type", "root_cause", "severity"} & set(config)
    for forbidden in ("dead_relu_bias", "dead_neurons", "negative_bias", "family"):
        assert forbidden not in text
    assert {"lr", "optimizer", "batch_size", "architecture", "depth", "width", "activation",
            "normalization", "init", "grad_clip", "steps", "data"} <= set(config)
    # the fault is real: act2 is dead from the first recorded step
    assert trace.stat("act_frac_dead")["act2"].iloc[0] == 1.0


def test_lr_spike_onset_is_the_spike_step_and_the_loss_blows_up_there():
    trace = run_scenario("lr_spike", seed=0)
    gt = trace.ground_truth
    assert gt["onset_step"] == 100
    loss = trace.steps.set_index("step")["loss"]
    assert np.isfinite(loss.loc[:100]).all()
    assert loss.loc[:100].iloc[-10:].max() < 1.0
    after = loss.loc[101:106].to_numpy()
    assert (~np.isfinite(after)).any() or after.max() > 10 * loss.loc[90:100].median()


def test_every_knob_acts_on_any_family():
    base = run_scenario("healthy_mlp", seed=0)
    lr = run_scenario("healthy_mlp", seed=0, lr_scale=0.5)
    assert np.allclose(lr.steps["lr"], 0.5 * base.steps["lr"])
    init = run_scenario("healthy_mlp", seed=0, init_scale=2.0)
    w0 = base.stats[(base.stats.step == 0) & (base.stats.module_name == "fc1")]["param_norm"]
    w1 = init.stats[(init.stats.step == 0) & (init.stats.module_name == "fc1")]["param_norm"]
    assert float(w1.iloc[0]) > 1.5 * float(w0.iloc[0])
    inp = run_scenario("healthy_mlp", seed=0, input_scale=10.0)
    a0 = base.stat("act_std")["fc1"].iloc[0]
    assert inp.stat("act_std")["fc1"].iloc[0] > 5 * a0
    clip = run_scenario("healthy_mlp", seed=0, grad_clip=0.05)
    assert clip.steps["grad_norm"].max() <= 0.05 + 1e-6
    assert base.steps["grad_norm"].max() > 0.05
    act = run_scenario("healthy_mlp", seed=0, activation="tanh")
    types = dict(zip(act.modules.module_name, act.modules.module_type))
    assert types["act1"] == "Tanh" and act.meta["config"]["activation"] == "tanh"
    norm = run_scenario("healthy_mlp", seed=0, normalization="layer")
    assert {"norm1", "norm2", "norm3"} <= set(norm.module_names)
    assert norm.ground_truth["knobs"]["normalization"] == "layer"


def test_healthy_control_stays_healthy():
    for seed in (0, 1):
        trace = run_scenario("healthy_transformer", seed=seed)
        loss = trace.steps["loss"].to_numpy()
        assert np.isfinite(loss).all()
        assert loss[-15:].mean() < 0.7 * loss[:5].mean()
        report = health_report(trace)
        assert report["healthy"], report
        gt = trace.ground_truth
        assert gt["failure_type"] == "healthy" and gt["root_cause"] == "none"
        assert gt["origin_layers"] == [] and gt["onset_step"] is None


def test_canonical_fix_makes_the_run_healthy_and_is_labelled_so():
    from experiments.manifest import judge_outcome

    spec = get_family("init_too_large")
    trace = run_scenario("init_too_large", seed=1)
    assert not math.isfinite(trace.steps["loss"].iloc[-1])
    assert judge_outcome(trace)["outcome"] == "exploding_gradients"
    fixed = run_counterfactual(trace, **spec.canonical_fix)
    assert fixed.ground_truth["seed"] == 1
    assert fixed.ground_truth["knobs"]["init_scale"] == pytest.approx(1 / 3)
    assert fixed.ground_truth["failure_type"] == "healthy"
    assert fixed.ground_truth["onset_step"] is None
    verdict = judge_outcome(fixed)
    assert verdict["outcome"] == "healthy", verdict
    assert np.isfinite(fixed.steps["loss"]).all()
    # a knob change with a declared failing outcome keeps the failure label
    still = run_counterfactual(trace, lr_scale=0.1)
    assert still.ground_truth["failure_type"] == "exploding_gradients"
    assert judge_outcome(still)["outcome"] == "exploding_gradients"


def test_run_counterfactual_needs_a_zoo_trace():
    trace = run_scenario("softmax_overflow", seed=0)
    trace.meta["ground_truth"] = None
    with pytest.raises(ValueError, match="run_scenario"):
        run_counterfactual(trace, lr_scale=0.1)


def test_runs_use_one_thread_and_leave_no_hooks():
    trace = run_scenario("resnet_no_norm", seed=0)
    assert trace.meta["status"] == "complete"
    assert torch.get_num_threads() == 1


def test_compound_family_labels_both_causes_and_a_partial_fix_keeps_one():
    spec = get_family("compound_dead_and_slow")
    assert set(spec.root_causes) == {"negative_bias_init", "learning_rate_too_low"}
    assert set(spec.canonical_fix) == {"normalization", "lr_scale"}
    both = run_scenario("compound_dead_and_slow", seed=0)
    assert set(both.ground_truth["root_causes"]) == set(spec.root_causes)
    assert both.ground_truth["secondary_failure_types"] == ["training_plateau"]
    half = run_scenario("compound_dead_and_slow", seed=0, normalization="batch")
    gt = half.ground_truth
    assert gt["failure_type"] == "training_plateau"
    assert gt["root_causes"] == ["learning_rate_too_low"]
    # BatchNorm revived act2, but the learning rate is still 1000x too low
    assert half.stat("act_frac_dead")["act2"].mean() < 0.2
    assert health_report(half)["loss_ratio"] > 0.7


def test_the_zoo_fingerprint_follows_every_module_the_capture_imports(tmp_path):
    """Trace caches are keyed by the fingerprint: a change to any module the capture reaches
    (a helper split out of capture.py later included) must change it; the reasoner's must not."""
    import shutil

    import neuraldbg
    from experiments.runner import fingerprint_sources, zoo_fingerprint

    repo = Path(neuraldbg.__file__).resolve().parent.parent
    for pkg in ("experiments", "neuraldbg"):
        shutil.copytree(repo / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    hashed = {p.relative_to(tmp_path).as_posix() for p in fingerprint_sources(tmp_path)}
    assert {"neuraldbg/capture.py", "neuraldbg/grad_norms.py", "neuraldbg/sampling.py",
            "neuraldbg/capture_sink.py", "neuraldbg/param_norms.py",
            "neuraldbg/knobs.py"} <= hashed
    assert "neuraldbg/causes.py" not in hashed
    before = zoo_fingerprint(tmp_path)
    with open(tmp_path / "neuraldbg" / "causes.py", "a") as fh:
        fh.write("\n# a reasoner edit\n")
    assert zoo_fingerprint(tmp_path) == before
    with open(tmp_path / "neuraldbg" / "grad_norms.py", "a") as fh:
        fh.write("\n# a capture edit\n")
    assert zoo_fingerprint(tmp_path) != before
