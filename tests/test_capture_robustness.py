"""Capture robustness: odd module outputs, NaN/Inf, frozen weights, crashes, bad trace dirs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import neuraldbg as ndb


class TupleOut(nn.Module):
    def forward(self, x):
        return (x.long(), x * 2.0)  # an integer tensor first, then a float one


class DictOut(nn.Module):
    def forward(self, x):
        return {"idx": x.argmax(dim=-1), "h": torch.tanh(x)}


class NoneOut(nn.Module):
    def forward(self, x):
        return None


class OddNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.tup = TupleOut()
        self.dic = DictOut()
        self.none = NoneOut()
        self.relu = nn.ReLU(inplace=True)
        self.shared = nn.Linear(6, 6)
        self.head = nn.Linear(6, 1)
        self.rnn = nn.GRU(6, 6, batch_first=True)

    def forward(self, x):
        h = self.relu(self.fc(x))
        _, h = self.tup(h)
        h = self.dic(h)["h"]
        self.none(h)
        h = self.shared(self.shared(h))  # the same module twice in one step
        out, _ = self.rnn(h.unsqueeze(1))
        return self.head(out.squeeze(1))


def run_steps(model, steps=5, x=None, opt=None, **kw):
    opt = opt or torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
    x = torch.randn(16, 6) if x is None else x
    with ndb.NeuralDbg(model, optimizer=opt, **kw) as dbg:
        for _ in range(steps):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            dbg.step(loss)
    return dbg


def test_tuple_dict_none_integer_outputs_inplace_and_shared_modules():
    model = OddNet()
    trace = run_steps(model).trace
    stats = trace.stats.set_index(["step", "module_name"])
    assert stats.loc[(0, "shared"), "calls"] == 2
    assert stats.loc[(0, "tup"), "act_max_abs"] > 0  # the float member of the tuple was used
    assert stats.loc[(0, "dic"), "act_frac_saturated"] >= 0
    assert (0, "none") not in stats.index  # no tensor output, no parameters: no row
    assert stats.loc[(0, "relu"), "act_frac_zero"] > 0  # in-place ReLU measured
    assert np.isfinite(stats.loc[(0, "rnn"), "out_grad_norm"])
    assert stats.loc[(0, "shared"), "out_grad_norm"] > 0  # both calls' gradients counted
    # hooks gone after exit
    assert all(len(m._forward_hooks) == 0 for m in model.modules())


def test_nan_and_inf_are_recorded_not_raised():
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    x = torch.randn(8, 4)
    x[0, 0] = float("nan")
    x[1, 1] = float("inf")
    trace = run_steps(model, steps=3, x=x).trace
    s = trace.stats.set_index(["step", "module_name"])
    assert s.loc[(0, "0"), "act_nan"] > 0
    assert s.loc[(0, "2"), "act_nan"] > 0
    assert not np.isfinite(s.loc[(0, "0"), "out_grad_norm"]) or not np.isfinite(
        s.loc[(0, "0"), "param_grad_norm"])
    assert not np.isfinite(trace.steps["loss"].iloc[0])


def test_inf_in_activation_counted():
    class Overflow(nn.Module):
        def forward(self, x):
            return x * torch.tensor(float("inf"))

    model = nn.Sequential(nn.Linear(3, 3), Overflow())
    trace = run_steps(model, steps=1, x=torch.ones(2, 3)).trace
    s = trace.stats.set_index("module_name")
    assert s.loc["1", "act_inf"] + s.loc["1", "act_nan"] == 6


def test_frozen_parameters():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    for p in model[0].parameters():
        p.requires_grad_(False)
    trace = run_steps(model, steps=3, x=torch.randn(8, 4)).trace
    mods = trace.modules.set_index("module_name")
    assert mods.loc["0", "n_trainable"] == 0 and mods.loc["0", "n_params"] == 20
    s = trace.stats.set_index(["step", "module_name"])
    assert np.isnan(s.loc[(0, "0"), "param_grad_norm"])
    assert s.loc[(0, "2"), "param_grad_norm"] > 0
    assert (trace.steps["update_norm"] > 0).all()


@pytest.mark.parametrize("after_step", [False, True])
def test_exception_in_loop_removes_hooks_and_keeps_trace(tmp_path, after_step):
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = ndb.NeuralDbg(model, optimizer=opt, out=tmp_path / "run", flush_every=4)
    with pytest.raises(RuntimeError, match="boom"):
        with dbg:
            for step in range(10):
                opt.zero_grad()
                loss = model(torch.randn(8, 4)).pow(2).mean()
                if step == 6 and not after_step:
                    raise RuntimeError("boom")  # after the forward of step 6
                loss.backward()
                opt.step()
                if step == 6:
                    raise RuntimeError("boom")  # the optimizer stepped, dbg.step not called
                dbg.step(loss)
    assert all(len(m._forward_hooks) == 0 for m in model.modules())
    trace = ndb.load_trace(tmp_path / "run")
    assert trace.meta["status"] == "failed" and "boom" in trace.meta["error"]
    if after_step:  # the parameters moved: a step, marked incomplete (no loss)
        assert trace.steps["step"].tolist() == list(range(7))
        assert trace.steps["complete"].tolist() == [True] * 6 + [False]
        assert np.isfinite(trace.steps["grad_norm"]).all()
        assert 6 in set(trace.stats["step"])
    else:  # a forward no optimizer step followed is not a step
        assert trace.steps["step"].tolist() == list(range(6))
        assert trace.steps["complete"].all() and np.isfinite(trace.steps["loss"]).all()
        assert 6 not in set(trace.stats["step"])
    assert trace.meta["n_steps"] == len(trace.steps)


def test_save_and_load_round_trip(tmp_path):
    dbg = run_steps(nn.Sequential(nn.Linear(6, 3), nn.Sigmoid()), steps=4,
                    config={"lr": 0.01, "note": "x"}, seed=7)
    path = dbg.trace.save(tmp_path / "t")
    loaded = ndb.load_trace(path)
    assert loaded.meta["config"] == {"lr": 0.01, "note": "x"} and loaded.meta["seed"] == 7
    assert loaded.meta["versions"]["torch"] == torch.__version__
    np.testing.assert_allclose(loaded.stats["act_mean"], dbg.trace.stats["act_mean"])
    assert loaded.steps.equals(dbg.trace.steps)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        dbg.trace.save(tmp_path / "t")


def test_bad_trace_directories_give_clear_errors(tmp_path):
    with pytest.raises(ndb.TraceFormatError, match="does not exist"):
        ndb.load_trace(tmp_path / "missing")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "data.csv").write_text("a,b\n")
    with pytest.raises(ndb.TraceFormatError, match="meta.json is missing"):
        ndb.load_trace(tmp_path / "foreign")
    (tmp_path / "foreign" / "meta.json").write_text('{"hello": 1}')
    with pytest.raises(ndb.TraceFormatError, match="format"):
        ndb.load_trace(tmp_path / "foreign")

    good = run_steps(nn.Sequential(nn.Linear(6, 1)), steps=2).trace.save(tmp_path / "good")
    meta = json.loads((good / "meta.json").read_text())
    meta["schema_version"] = ndb.SCHEMA_VERSION + 1
    (good / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ndb.SchemaVersionError, match="newer"):
        ndb.load_trace(good)
    meta["schema_version"] = ndb.SCHEMA_VERSION
    (good / "meta.json").write_text(json.dumps(meta))
    part = next((good / "stats").glob("part-*.parquet"))
    part.write_bytes(part.read_bytes()[:40])  # truncated chunk
    with pytest.raises(ndb.TraceFormatError, match=part.name):
        ndb.load_trace(good)
    (good / "meta.json").write_text("{not json")
    with pytest.raises(ndb.TraceFormatError, match="not valid JSON"):
        ndb.load_trace(good)


def test_bad_arguments_are_named():
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="every must be a positive integer"):
        ndb.NeuralDbg(model, every=0)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        ndb.NeuralDbg("model")
    dbg = ndb.NeuralDbg(model)
    with pytest.raises(ndb.CaptureError, match="outside the `with dbg:` block"):
        dbg.step(1.0)


def test_sigkill_mid_run_leaves_flushed_steps(tmp_path):
    out = tmp_path / "killed"
    script = textwrap.dedent(f"""
        import os, signal, torch
        import neuraldbg as ndb
        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(32, 8)
        with ndb.NeuralDbg(model, optimizer=opt, out={str(out)!r}, flush_every=50) as dbg:
            for step in range(500):
                opt.zero_grad()
                loss = model(x).pow(2).mean()
                loss.backward()
                opt.step()
                dbg.step(loss)
                if step == 299:
                    os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    trace = ndb.load_trace(out)
    assert trace.meta["status"] == "running"  # it never got to say otherwise
    assert trace.steps["step"].tolist() == list(range(300))  # 6 chunks of 50, all flushed
    assert set(trace.stats["step"]) == set(range(300))
    assert not list(Path(out).rglob(".*tmp*"))


def test_bfloat16_loss_and_outputs():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).to(torch.bfloat16)
    x = torch.randn(16, 4, dtype=torch.bfloat16)
    trace = run_steps(model, steps=3, x=x).trace
    assert np.isfinite(trace.steps["loss"]).all() and np.isfinite(trace.steps["grad_norm"]).all()
    s = trace.stats.set_index(["step", "module_name"])
    assert 0 <= s.loc[(2, "1"), "act_frac_zero"] <= 1
