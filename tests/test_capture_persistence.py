"""Trace persistence under real use: re-entry, failed enters, concurrent writers, disk full."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

import neuraldbg as ndb


def epoch(model, opt, dbg, steps=10, x=None):
    x = torch.randn(32, 8) if x is None else x
    with dbg:
        for _ in range(steps):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            dbg.step(loss)


def small():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


@pytest.mark.parametrize("streamed", [True, False])
def test_a_with_block_per_epoch_appends(tmp_path, streamed):
    model, opt = small()
    out = tmp_path / "run" if streamed else None
    dbg = ndb.NeuralDbg(model, optimizer=opt, out=out, overwrite=True, flush_every=4)
    for _ in range(3):
        epoch(model, opt, dbg)
    trace = ndb.load_trace(out) if streamed else dbg.trace
    assert trace.steps["step"].tolist() == list(range(30))
    assert trace.meta["n_steps"] == 30 and trace.meta["status"] == "complete"
    assert sorted(trace.stats["step"].unique()) == list(range(30))
    if streamed:
        assert not (out / ".lock").exists()  # released between epochs
        assert dbg.trace.steps["step"].tolist() == list(range(30))


def test_failed_enter_leaves_the_object_usable(tmp_path):
    model, opt = small()
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    dbg = ndb.NeuralDbg(model, optimizer=opt, out=blocker / "run")
    with pytest.raises(OSError):
        dbg.__enter__()
    assert all(len(m._forward_hooks) == 0 for m in model.modules())
    assert not opt._optimizer_step_pre_hooks
    dbg.out = tmp_path / "run"
    epoch(model, opt, dbg, steps=3)
    assert ndb.load_trace(tmp_path / "run").steps["step"].tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="config cannot be stored"):
        ndb.NeuralDbg(model, config={"fn": print})


def test_capture_config_every_is_not_overridden_by_the_default():
    model, opt = small()
    dbg = ndb.NeuralDbg(model, optimizer=opt, capture_config=ndb.CaptureConfig(every=16))
    assert dbg.cfg.every == 16
    epoch(model, opt, dbg, steps=40)
    assert sorted(dbg.trace.stats["step"].unique()) == [0, 16, 32]
    explicit = ndb.NeuralDbg(model, every=4, capture_config=ndb.CaptureConfig(every=16))
    assert explicit.cfg.every == 4  # an explicit argument still wins
    with pytest.raises(TypeError, match="capture_config=CaptureConfig"):
        ndb.NeuralDbg(model, config=ndb.CaptureConfig(every=16))


def test_a_second_writer_to_one_directory_is_refused(tmp_path):
    model, opt = small()
    first = ndb.NeuralDbg(model, optimizer=opt, out=tmp_path / "run")
    second = ndb.NeuralDbg(model, optimizer=opt, out=tmp_path / "run", overwrite=True)
    with first:
        with pytest.raises(ndb.TraceLockedError, match=f"pid {os.getpid()}"):
            second.__enter__()
    assert not second._active
    with pytest.raises(FileExistsError, match="overwrite=True"):
        ndb.NeuralDbg(model, optimizer=opt, out=tmp_path / "run").__enter__()


_RACE = textwrap.dedent("""
    import sys, time, torch
    import neuraldbg as ndb
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = float(sys.argv[2])
    while time.time() < start:
        pass
    try:
        with ndb.NeuralDbg(model, optimizer=opt, out=sys.argv[1], config={"who": sys.argv[3]}):
            for _ in range(5):
                opt.zero_grad(); loss = model(torch.randn(8, 4)).pow(2).mean()
                loss.backward(); opt.step()
                time.sleep(0.05)
        print("wrote")
    except (ndb.TraceLockedError, FileExistsError) as exc:
        print("refused", type(exc).__name__)
""")


def test_two_processes_racing_for_one_directory_one_wins(tmp_path):
    import time

    start = time.time() + 3.0
    procs = [subprocess.Popen([sys.executable, "-c", _RACE, str(tmp_path / "run"), str(start),
                               str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}) for i in range(2)]
    outs = [p.communicate(timeout=120)[0].decode().strip() for p in procs]
    assert sorted(o.split()[0] for o in outs) == ["refused", "wrote"], outs
    trace = ndb.load_trace(tmp_path / "run")
    winner = next(i for i, o in enumerate(outs) if o == "wrote")
    assert trace.meta["config"] == {"who": str(winner)} and trace.meta["status"] == "complete"


def test_disk_full_raises_the_real_error_and_keeps_what_was_written(tmp_path):
    out = tmp_path / "full"
    script = textwrap.dedent(f"""
        import resource, signal, torch
        import neuraldbg as ndb
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(32, 8)
        dbg = ndb.NeuralDbg(model, optimizer=opt, out={str(out)!r}, flush_every=20)
        try:
            with dbg:
                for step in range(200):
                    if step == 50:  # files above 4 KiB now fail: a chunk is bigger
                        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
                    opt.zero_grad()
                    loss = model(x).pow(2).mean()
                    loss.backward()
                    opt.step()
                    dbg.step(loss)
        except OSError as exc:
            print("ERROR", type(exc).__name__, exc.errno, exc.filename)
            print("CHAIN", type(exc.__context__).__name__)
        print("STEPS", len(dbg.trace.steps))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = dict(line.split(" ", 1) for line in proc.stdout.decode().splitlines())
    assert "ERROR" in lines, proc.stderr.decode()[-2000:]
    kind, errno_, filename = lines["ERROR"].split(" ", 2)
    assert kind == "OSError" and int(errno_) == 27 and str(out) in filename  # EFBIG
    assert int(lines["STEPS"]) == 60  # the refused chunk is still in memory
    trace = ndb.load_trace(out)
    assert trace.steps["step"].tolist() == list(range(40))  # two chunks made it to disk
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "write_failed" and "could not write" in meta["error"]
    assert np.isfinite(trace.steps["loss"]).all()
    assert not (out / ".lock").exists()
