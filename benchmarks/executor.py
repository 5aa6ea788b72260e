"""The executor seam: how benchmark tasks run (local processes by default, Ray for big sweeps).

A task is a module-level function and a dict of JSON-compatible keyword arguments; its
result is JSON-compatible too. That keeps the two backends interchangeable: local worker
processes (``concurrent.futures``) and a Ray cluster, where a task may land on another host
and must not depend on the caller's memory or disk. Results come back in task order; a
progress bar advances as tasks finish, in whatever order they finish.

Tasks name zoo runs by their path under a trace cache, the ``root`` given to
:meth:`Executor.map`. Local workers share this machine's disk and read and write there. A Ray
worker may be on a host that cannot see it, so :class:`RayExecutor` ships files instead: every
finished run a task names goes to the worker as the bytes of its Parquet and JSON files (put
in Ray's object store once per run), is rebuilt in a private temporary directory there, and
the task's paths are rewritten to point at it; every run the task finishes there comes back
the same way and is written under ``root`` on the driver. No shared filesystem is needed.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Literal

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from experiments.cpu_paths import PINNED_ENV

__all__ = ["Executor", "LocalExecutor", "RayExecutor", "Task", "make_executor", "BACKENDS"]

Task = tuple[Callable[..., Any], dict[str, Any]]

#: Names accepted by ``--backend``.
BACKENDS: tuple[str, ...] = ("local", "ray")


def _init_worker() -> None:
    """Worker set-up: one torch thread per process (the workers already fill the cores)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)


def _call(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    return fn(**kwargs)


#: Seconds between progress lines when output is not a terminal and no task has finished.
_HEARTBEAT_S = 30.0


class _LineProgress:
    """Progress for a log file or CI (output not a terminal): one line when a batch starts,
    then a line every 10% of its tasks, at the end, and a heartbeat line every 30 s while no
    task finishes (from a background thread, so a long task run in the calling process, as
    with one worker, is not silent either)."""

    def __init__(self, every_s: float | None = None) -> None:
        self.every_s = _HEARTBEAT_S if every_s is None else every_s
        self._tasks: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def __enter__(self) -> _LineProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(min(self.every_s, 1.0)):
            for job in list(self._tasks):
                self.heartbeat(job)

    def add_task(self, description: str, total: int) -> int:
        with self._lock:
            job = len(self._tasks)
            self._tasks[job] = {"description": description, "total": total, "done": 0,
                                "t0": time.monotonic(), "last": time.monotonic(), "shown": 0}
            print(f"{description}: {total} tasks", flush=True)
        return job

    def advance(self, job: int) -> None:
        with self._lock:
            t = self._tasks[job]
            t["done"] += 1
            now = time.monotonic()
            step = max(1, t["total"] // 10)
            if (t["done"] == t["total"] or t["done"] - t["shown"] >= step
                    or now - t["last"] >= self.every_s):
                print(f"{t['description']}: {t['done']}/{t['total']} done, "
                      f"{now - t['t0']:.0f} s", flush=True)
                t["last"], t["shown"] = now, t["done"]

    def heartbeat(self, job: int) -> None:
        """A line when nothing was printed for ``every_s`` seconds (long tasks running)."""
        with self._lock:
            t = self._tasks[job]
            now = time.monotonic()
            if t["done"] < t["total"] and now - t["last"] >= self.every_s:
                print(f"{t['description']}: {t['done']}/{t['total']} done, "
                      f"{now - t['t0']:.0f} s (tasks running)", flush=True)
                t["last"] = now


def _say_nothing_to_do(show: bool, description: str) -> None:
    """One line for a batch with no task (every zoo run reused), so the log shows the stage."""
    if show:
        print(f"{description}: nothing to run", flush=True)


def _progress(show: bool) -> Any:
    if show and not sys.stdout.isatty():
        return _LineProgress()
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not show,
        transient=False,
    )


class Executor(ABC):
    """Runs a batch of tasks and returns their results in task order.

    Parameters
    ----------
    workers : int, optional
        Parallel workers; defaults to the number of CPU cores.
    progress : bool, default=True
        Show a progress bar while the tasks run.
    """

    name: str = "base"

    def __init__(self, workers: int | None = None, *, progress: bool = True) -> None:
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                    or workers < 1):
            raise ValueError(f"workers must be a positive integer or None, got {workers!r}.")
        self.workers = workers or os.cpu_count() or 1
        self.progress = progress

    @abstractmethod
    def map(self, tasks: Sequence[Task], *, description: str = "tasks",
            root: str | os.PathLike[str] | None = None) -> list[Any]:
        """Run ``fn(**kwargs)`` for every ``(fn, kwargs)`` in ``tasks``; results in task order.

        Parameters
        ----------
        tasks : sequence of (callable, dict)
        description : str
            Label of the progress lines.
        root : path, optional
            The trace cache the tasks' run paths lie under. A backend whose workers may not
            see this machine's disk (Ray) ships the finished runs a task names there and the
            runs it writes there (see the module docstring); local workers ignore it.
        """

    def close(self) -> None:
        """Release the backend's resources (no-op for local processes)."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalExecutor(Executor):
    """Worker processes on this machine (``concurrent.futures``, the default backend).

    With one worker the tasks run in the calling process, one after the other (no start-up
    cost, simplest to debug). Worker processes are started with ``spawn``: forking a process
    that already initialised torch's thread pools can deadlock.
    """

    name = "local"

    def map(self, tasks: Sequence[Task], *, description: str = "tasks",
            root: str | os.PathLike[str] | None = None) -> list[Any]:
        results: list[Any] = [None] * len(tasks)
        if not tasks:
            _say_nothing_to_do(self.progress, description)
            return results
        with _progress(self.progress) as bar:
            job = bar.add_task(description, total=len(tasks))
            if self.workers == 1 or len(tasks) == 1:
                for i, (fn, kwargs) in enumerate(tasks):
                    results[i] = fn(**kwargs)
                    bar.advance(job)
                return results
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=min(self.workers, len(tasks)), mp_context=ctx,
                                     initializer=_init_worker) as pool:
                futures = {pool.submit(_call, fn, kwargs): i for i, (fn, kwargs) in
                           enumerate(tasks)}
                pending = set(futures)
                while pending:
                    done, pending = wait(pending, timeout=_HEARTBEAT_S,
                                         return_when=FIRST_COMPLETED)
                    for fut in done:
                        results[futures[fut]] = fut.result()
                        bar.advance(job)
        return results


class RayExecutor(Executor):
    """Tasks as Ray remote functions: a local Ray instance, or a cluster given by ``address``.

    Ray is an optional extra (``pip install -c constraints.txt '.[ray]'``). Each task asks
    for one CPU, so Ray schedules as many at once as the cluster has cores. Task arguments,
    results and the zoo traces under ``root`` all travel through Ray (the traces as the bytes
    of their Parquet and JSON files), so the cluster's hosts need no shared filesystem; only
    the driver writes to its results directory (see the README, "Scaling out").

    Parameters
    ----------
    workers : int, optional
        CPUs of the local Ray instance started here (ignored when joining a cluster).
    address : str, optional
        Address of a running Ray cluster (``"auto"`` or ``"ray://host:10001"``); default: start
        a local instance and shut it down on :meth:`close`.
    progress : bool, default=True
        Show a progress bar.

    Raises
    ------
    ImportError
        If Ray is not installed.
    """

    name = "ray"

    def __init__(self, workers: int | None = None, *, address: str | None = None,
                 progress: bool = True) -> None:
        super().__init__(workers, progress=progress)
        try:
            import ray
        except ImportError as exc:
            raise ImportError(
                "--backend ray needs Ray, an optional extra: pip install -c constraints.txt "
                "'.[ray]' (or use the default --backend local)."
            ) from exc
        self._ray = ray
        self._started = False
        # a Ray worker imports numpy before any task runs: the CPU code paths travel in its
        # environment (experiments.cpu_paths), as they do to a local worker process
        env = {"OMP_NUM_THREADS": "1", **PINNED_ENV}
        if not ray.is_initialized():
            if address is None:
                ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False,
                         configure_logging=False, runtime_env={"env_vars": env})
            else:
                ray.init(address=address, log_to_driver=False, runtime_env={"env_vars": env})
            self._started = True
        if address is not None:  # the cluster's cores, for the harness's task split
            self.workers = max(1, int(ray.cluster_resources().get("CPU", self.workers)))
        self._remote = ray.remote(num_cpus=1)(_ray_call)
        self._shipped: dict[str, Any] = {}  # relative run path -> ObjectRef of its files

    def map(self, tasks: Sequence[Task], *, description: str = "tasks",
            root: str | os.PathLike[str] | None = None) -> list[Any]:
        ray = self._ray
        results: list[Any] = [None] * len(tasks)
        if not tasks:
            _say_nothing_to_do(self.progress, description)
            return results
        base = str(Path(root).resolve()) if root is not None else None
        refs = [self._remote.remote(fn, kwargs, base, self._inputs(kwargs, base))
                for fn, kwargs in tasks]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        with _progress(self.progress) as bar:
            job = bar.add_task(description, total=len(tasks))
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=_HEARTBEAT_S)
                for ref in done:
                    out = ray.get(ref)
                    _land(out["files"], base)
                    results[index[ref]] = out["result"]
                    bar.advance(job)
        return results

    def _inputs(self, kwargs: dict[str, Any], base: str | None) -> dict[str, Any]:
        """Object refs of the finished runs under ``base`` that ``kwargs`` names, by relative
        path; each run is packed and put in the object store once per executor."""
        from benchmarks.runs import is_finished, pack_run

        if base is None:
            return {}
        out = {}
        for path in sorted(_paths_under(kwargs, base)):
            rel = Path(path).relative_to(base).as_posix()
            if rel not in self._shipped and is_finished(path):
                self._shipped[rel] = self._ray.put(pack_run(path))
            if rel in self._shipped:
                out[rel] = self._shipped[rel]
        return out

    def close(self) -> None:
        self._shipped.clear()
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
            self._started = False


def _ray_call(fn: Callable[..., Any], kwargs: dict[str, Any], base: str | None,
              inputs: dict[str, Any]) -> dict[str, Any]:
    """A task on a Ray worker, in a private copy of the runs it names (see the module doc).

    Returns ``{"result": ..., "files": {relative run path: packed files}}``: the task's
    result with the private directory's paths turned back into the driver's, and every run
    the task finished there.
    """
    _init_worker()
    if base is None:
        return {"result": fn(**kwargs), "files": {}}
    import ray

    from benchmarks.runs import finished_runs, pack_run, unpack_run

    local = Path(tempfile.mkdtemp(prefix="neuraldbg-runs-"))
    try:
        for rel, files in zip(inputs, ray.get(list(inputs.values())), strict=True):
            unpack_run(files, local / rel)
        result = fn(**_swap(kwargs, base, str(local)))
        made = {p.relative_to(local).as_posix(): p for p in finished_runs(local)}
        files = {rel: pack_run(p) for rel, p in made.items() if rel not in inputs}
        return {"result": _swap(result, str(local), base), "files": files}
    finally:
        shutil.rmtree(local, ignore_errors=True)


def _paths_under(obj: Any, base: str) -> set[str]:
    """Strings in ``obj`` (dict keys and values, lists, tuples) naming a path under ``base``."""
    if isinstance(obj, str):
        return {obj} if obj.startswith(base + os.sep) else set()
    if isinstance(obj, dict):
        return set().union(*(_paths_under(k, base) | _paths_under(v, base)
                             for k, v in obj.items()))
    if isinstance(obj, (list, tuple)):
        return set().union(*(_paths_under(v, base) for v in obj))
    return set()


def _swap(obj: Any, old: str, new: str) -> Any:
    """``obj`` with the directory prefix ``old`` replaced by ``new`` in every string (also
    inside JSON strings such as a fold's list of fitting runs)."""
    if isinstance(obj, str):
        return obj.replace(old, new)
    if isinstance(obj, dict):
        return {_swap(k, old, new): _swap(v, old, new) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_swap(v, old, new) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_swap(v, old, new) for v in obj)
    return obj


def _land(files: dict[str, dict[str, bytes]], base: str | None) -> None:
    """Write the runs a Ray task finished under the driver's ``base``."""
    from benchmarks.runs import unpack_run

    if base is None:  # no root given: the task shipped nothing
        return
    for rel, packed in files.items():
        unpack_run(packed, Path(base) / rel)


def make_executor(backend: Literal["local", "ray"] = "local", workers: int | None = None, *,
                  address: str | None = None, progress: bool = True) -> Executor:
    """Build the executor named by ``--backend``.

    Parameters
    ----------
    backend : {"local", "ray"}, default="local"
        Local worker processes, or Ray.
    workers : int, optional
        Parallel workers (default: the number of CPU cores).
    address : str, optional
        With ``"ray"``: a running cluster's address (default: a local Ray instance).
    progress : bool, default=True
        Show a progress bar.

    Raises
    ------
    ValueError
        If ``backend`` is not one of :data:`BACKENDS`, or ``address`` is given for "local".
    """
    if backend == "local":
        if address is not None:
            raise ValueError(f"address={address!r} needs backend='ray'; the local backend "
                             "runs on this machine only.")
        return LocalExecutor(workers, progress=progress)
    if backend == "ray":
        return RayExecutor(workers, address=address, progress=progress)
    raise ValueError(f"Unknown backend {backend!r}. Valid backends are: {list(BACKENDS)}")
