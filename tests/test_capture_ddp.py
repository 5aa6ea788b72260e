"""DDP: two processes on gloo (CPU) write one run directory, one shard per rank."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import neuraldbg as ndb
from neuraldbg.ranks import combine_ranks

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not available")

_WORKER = textwrap.dedent("""
    import json, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch import nn
    import neuraldbg as ndb

    def run(rank, world, port, out):
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        torch.manual_seed(0)  # the same initial weights on both ranks
        model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                              nn.Linear(32, 1))
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
        x = torch.randn(64, 16, generator=g)
        y = x[:, :1].sin()
        norms = []
        with ndb.NeuralDbg(ddp, optimizer=opt, out=out, flush_every=25) as dbg:
            for _ in range(80):
                opt.zero_grad()
                loss = ((ddp(x) - y) ** 2).mean()
                loss.backward()  # gradients averaged over the ranks here
                norms.append(torch.cat([p.grad.flatten() for p in ddp.parameters()])
                             .norm().item())
                opt.step()
                dbg.step(loss)
        with open(f"{out}/norms-{rank}.json", "w") as fh:
            json.dump(norms, fh)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(run, args=(2, int(sys.argv[1]), sys.argv[2]), nprocs=2, join=True)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_write_shards_that_load_as_one_run(tmp_path):
    import json

    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(script), str(_free_port()), str(out)],
                          capture_output=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert sorted(p.name for p in out.glob("rank-*")) == ["rank-0", "rank-1"]
    trace = ndb.load_trace(out)
    assert sorted(trace.steps["rank"].unique()) == [0, 1]
    assert trace.meta["ranks"] == [0, 1] and trace.meta["status"] == "complete"
    assert len(trace.steps) == 160 and set(trace.stats["rank"]) == {0, 1}
    for rank in (0, 1):
        mine = trace.steps[trace.steps["rank"] == rank]
        expected = json.loads((out / f"norms-{rank}.json").read_text())
        np.testing.assert_allclose(mine["grad_norm"], expected, rtol=1e-3)
        assert mine["step"].tolist() == list(range(80))
    by_rank = trace.steps.pivot(index="step", columns="rank", values="loss")
    assert (by_rank[0] != by_rank[1]).all()  # each rank its own data
    combined = combine_ranks(trace)
    assert combined.steps["step"].tolist() == list(range(80))
    np.testing.assert_allclose(combined.steps["loss"], by_rank.mean(axis=1), rtol=1e-12)
    assert not combined.stats.duplicated(["step", "module_name"]).any()
    for method in ("heuristic", "probabilistic"):
        hyps = ndb.explain(trace, method=method)
        assert all(h.confidence < 0.5 for h in hyps), (method, hyps[:2])
