"""TensorBoard export of a real failing run, read back with TensorBoard's own event reader."""

from __future__ import annotations

import math

import pytest
from zoo_runs import zoo_trace

import neuraldbg as ndb
from neuraldbg.cli import main
from neuraldbg.tensorboard import LAYER_STATISTICS, export_tensorboard

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="the [tensorboard] extra is not installed (make venv installs it)")


def _read(logdir):
    acc = event_accumulator.EventAccumulator(
        str(logdir), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    acc.Reload()
    return acc


def _texts(acc, tag):
    return {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors(tag)}


def test_export_reads_back_with_tensorboards_event_reader(tmp_path, capsys):
    trace = zoo_trace("lr_too_high")
    trace.save(tmp_path / "run")
    assert main(["export", str(tmp_path / "run"), "--tensorboard", str(tmp_path / "tb")]) == 0
    assert "tensorboard --logdir" in capsys.readouterr().out
    acc = _read(tmp_path / "tb")
    tags = acc.Tags()
    # per-step scalars: every step, values equal to the trace's (NaN loss kept as NaN)
    loss = acc.Scalars("run/loss")
    assert [e.step for e in loss] == trace.steps["step"].tolist()
    for event, value in zip(loss, trace.steps["loss"], strict=True):
        assert (math.isnan(event.value) and math.isnan(value)) or math.isclose(
            event.value, value, rel_tol=1e-6) or (math.isinf(value) and math.isinf(event.value))
    assert {"run/lr", "run/grad_norm", "run/update_ratio"} <= set(tags["scalars"])
    # per-layer statistics, one series per module and statistic
    wide = trace.stat("out_grad_norm")
    for module in ("conv1", "fc", "out"):
        assert f"layers/out_grad_norm/{module}" in tags["scalars"]
        got = {e.step: e.value for e in acc.Scalars(f"layers/out_grad_norm/{module}")}
        want = wide[module].dropna()
        assert sorted(got) == [int(s) for s in want.index]
        s = int(want.index[3])
        assert math.isclose(got[s], float(want.loc[s]), rel_tol=1e-6)
    assert sum(t.startswith("layers/") for t in tags["scalars"]) <= (
        len(LAYER_STATISTICS) * len(trace.modules))
    # the diagnosis as text entries: verdict, hypotheses at their origin step, events
    verdict = _texts(acc, "diagnosis/verdict/text_summary")
    assert verdict[0].startswith("The run failed: exploding gradients")
    hyps = _texts(acc, "diagnosis/hypotheses/text_summary")
    top = ndb.explain(trace)[0]
    assert "exploding_gradients" in hyps[top.origin_step] and "conv1" in hyps[top.origin_step]
    events = _texts(acc, "diagnosis/events/text_summary")
    assert events and any("gradient_exploding" in text for text in events.values())


def test_export_without_the_extra_says_how_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(ndb.NeuralDbgError, match=r"pip install 'neuraldbg\[tensorboard\]'"):
        export_tensorboard(zoo_trace("healthy_mlp"), tmp_path / "tb")


def test_export_to_an_existing_file_says_to_pass_a_directory(tmp_path, capsys):
    zoo_trace("lr_too_high").save(tmp_path / "run")
    (tmp_path / "report.html").write_text("x")
    assert main(["export", str(tmp_path / "run"), "--tensorboard",
                 str(tmp_path / "report.html")]) == 2
    err = capsys.readouterr().err
    assert "is an existing file: pass a directory" in err and "Traceback" not in err
