"""Zoo runs travel through Ray, not a shared filesystem.

The Ray backend ships every finished run a task names to the worker as the bytes of its
Parquet and JSON files and brings back every run the task finishes. The end-to-end test hides
the driver's results directory from the Ray workers (their cluster runs in a mount namespace
where that directory is an empty tmpfs), so any path that leaks to a worker reads nothing and
writes where the driver never looks; the scores must then still equal the local backend's.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import harness
from benchmarks.executor import LocalExecutor
from benchmarks.runs import RunSpec, execute_run, is_finished, load, pack_run, unpack_run
from benchmarks.suites import SUITES

SPEC = RunSpec("lr_too_high", None, 0)


def _tiny_suite():  # noqa: ANN202
    return SUITES["tiny"].with_(name="tiny-ray", latency=False, splits=("family",),
                                n_resamples=50)


def test_pack_and_unpack_a_real_run(tmp_path: Path) -> None:
    src = Path(execute_run(SPEC.to_dict(), str(tmp_path / "a" / SPEC.key())))
    files = pack_run(src)
    assert "DONE" in files and "meta.json" in files
    assert any(name.endswith(".parquet") for name in files)
    dst = unpack_run(files, tmp_path / "b" / SPEC.key())
    assert is_finished(dst)
    a, b = load(src), load(dst)
    pd.testing.assert_frame_equal(a.stats, b.stats)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert a.meta == b.meta
    assert not list((tmp_path / "b").rglob("*.tmp"))


def test_pack_and_unpack_refuse_bad_input(tmp_path: Path) -> None:
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "meta.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="not a finished trace"):
        pack_run(tmp_path / "half")
    with pytest.raises(ValueError, match="not a finished trace"):
        unpack_run({"meta.json": b"{}"}, tmp_path / "x")
    with pytest.raises(ValueError, match="leave its directory"):
        unpack_run({"DONE": b"", "meta.json": b"{}", "../evil": b""}, tmp_path / "y")
    assert not (tmp_path / "evil").exists()


def _where(path: str) -> str:
    """A task that reports the path it was given (reversed, so that the executor's mapping of
    worker paths back to the driver's leaves it alone) and whether a finished run is there."""
    return f"{path[::-1]}|{is_finished(Path(path))}"


def test_ray_tasks_get_private_copies_and_ship_runs_back(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    from benchmarks.executor import RayExecutor

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ships _where itself
    root = tmp_path / "runs"
    done = root / "done" / SPEC.key()
    execute_run(SPEC.to_dict(), str(done))
    new = root / "new" / SPEC.key()
    with RayExecutor(2, progress=False) as ex:
        seen = ex.map([(_where, {"path": str(done)})], root=root)[0]
        made = ex.map([(execute_run, {"spec": SPEC.to_dict(), "path": str(new)})], root=root)
    given, finished = seen.split("|")
    given = given[::-1]
    assert finished == "True" and not given.startswith(str(root))  # a copy, elsewhere
    assert made == [str(new)] and is_finished(new)  # the worker's path mapped back
    pd.testing.assert_frame_equal(load(new).stats, load(done).stats)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def hidden_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """A one-node Ray cluster whose processes see ``tmp_path/driver`` as an empty tmpfs."""
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a throwaway cluster on this host only
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unprivileged mount namespaces (unshare -rm) to hide a directory")
    driver = tmp_path / "driver"
    driver.mkdir()
    port = _free_port()
    ray_bin = str(Path(sys.executable).parent / "ray")
    temp = Path("/tmp") / f"ndbg-ray-{os.getpid()}-{port}"  # short: socket paths are limited
    cmd = (f"mount -t tmpfs none {driver} && exec {ray_bin} start --head --block "
           f"--port {port} --num-cpus 2 --include-dashboard false --temp-dir {temp} "
           f"--disable-usage-stats")
    head = subprocess.Popen(["unshare", "-rm", "sh", "-c", cmd], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while not (temp / "session_latest").exists():
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the Ray head did not start: " + head.stderr.read().decode()[-2000:])
            time.sleep(1)
        yield driver, f"127.0.0.1:{port}"
    finally:
        os.killpg(head.pid, 15)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, 9)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_ray_without_a_shared_filesystem_scores_as_local(hidden_cluster, tmp_path: Path) -> None:  # noqa: ANN001, E501
    from benchmarks.executor import RayExecutor

    driver, address = hidden_cluster
    suite, methods = _tiny_suite(), ["heuristic", "probabilistic"]
    (driver / "seen-by-the-driver").write_text("")
    with RayExecutor(address=address, progress=False) as ex:
        assert ex.workers == 2
        assert ex.map([(os.listdir, {"path": str(driver)})]) == [[]]  # hidden from workers
        remote = harness.run_benchmark(suite, driver / "tiny", executor=ex,
                                       run_dir=driver / "runs", methods=methods)
    local = harness.run_benchmark(suite, tmp_path / "local" / "tiny",
                                  executor=LocalExecutor(1, progress=False),
                                  run_dir=tmp_path / "local" / "runs", methods=methods)
    assert remote.notes["run_errors"] == 0 and remote.runs["finished"].all()
    assert (remote.records["error"] == "").all()
    assert remote.notes["n_counterfactual_reruns"] > 0
    assert remote.counterfactuals["actual_failure"].notna().all()  # re-runs came back, judged
    assert all(str(driver / "runs") in p for p in remote.records["run"])  # driver's paths

    def scores(res: harness.BenchmarkResult, root: Path) -> pd.DataFrame:
        cols = ["label", "run", "pred_failure", "pred_cause", "confidence", "cause_rank",
                "suggested_fix", "hypotheses"]
        rec = res.records[[c for c in cols if c in res.records.columns]].copy()
        rec["run"] = [p.replace(str(root), "") for p in rec["run"]]
        rec["hypotheses"] = [h.replace(str(root), "") for h in rec["hypotheses"]]
        return rec.sort_values(["label", "run"]).reset_index(drop=True)

    pd.testing.assert_frame_equal(scores(remote, driver / "runs"),
                                  scores(local, tmp_path / "local" / "runs"))
    cf_cols = ["split", "fold", "knobs", "p_failure", "predicted", "actual_failure",
               "actual_outcome"]
    pd.testing.assert_frame_equal(remote.counterfactuals[cf_cols],
                                  local.counterfactuals[cf_cols])
    m_remote, m_local = harness.compute_metrics(remote), harness.compute_metrics(local)
    for key in ("methods", "counterfactual_validity", "mcnemar"):
        assert m_remote.get(key) == m_local.get(key), key


def _nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_progress_beats_while_a_long_task_runs_in_process(capsys, monkeypatch) -> None:  # noqa: ANN001
    import benchmarks.executor as E

    monkeypatch.setattr(E, "_HEARTBEAT_S", 0.2)
    assert E.LocalExecutor(1, progress=True).map([(_nap, {"seconds": 1.0})],
                                                 description="folds") == [1.0]
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "folds: 1 tasks" and lines[-1].startswith("folds: 1/1 done")
    assert 2 <= sum("(tasks running)" in line for line in lines) <= 6
