"""The neuraldbg command on a real recorded run."""

from __future__ import annotations

import json

import torch
from torch import nn

import neuraldbg as ndb
from neuraldbg.cli import main


def _record(path) -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(32, 4)
    with ndb.NeuralDbg(model, optimizer=opt, out=path, config={"lr": 0.05}) as dbg:
        for _ in range(20):
            opt.zero_grad()
            loss = (model(x) - x[:, :1]).pow(2).mean()
            loss.backward()
            opt.step()
            dbg.step(loss)


def test_show_explain_graph(tmp_path, capsys):
    _record(tmp_path / "run")
    assert main(["show", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "complete" in out and "20" in out
    assert main(["explain", "--json", str(tmp_path / "run")]) == 0
    hyps = json.loads(capsys.readouterr().out)
    assert isinstance(hyps, list)
    assert all({"failure_type", "root_cause", "confidence"} <= set(h) for h in hyps)
    assert main(["graph", str(tmp_path / "run")]) == 0
    assert capsys.readouterr().out.startswith(("flowchart", "graph"))


def test_missing_trace_is_a_clear_error(tmp_path, capsys):
    assert main(["explain", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().out
