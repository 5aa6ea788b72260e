"""Capture overhead: step time with NeuralDbg / without, interleaved in one process.

Run ``python -m benchmarks.overhead`` (``make overhead``). Two interleavings, side by side:

- **rounds**: for each model and each ``every``, rounds of ``--steps`` training steps
  alternate between the bare loop and the loop under ``NeuralDbg`` (entering, leaving and
  flushing included); the reported ratio is the median of the per-pair ratios, with its
  interquartile range, so machine load that comes and goes hits both sides of a pair.
- **steps**: two identical models, one bare and one under ``NeuralDbg``, take alternate
  training steps, each timed on its own; the ratio of the trimmed means (slowest 10% of
  steps left out on each side) is reported. Interleaving at the step level makes the figure
  stable on a shared machine; the two models also share the caches, so both sides run a
  little colder than a single training loop would.

``--in-loop`` instead times each part of the capture per call inside the training loop.
Also reported: host syncs (``aten._local_scalar_dense``) added per step, and resident-memory
growth per 1,000 steps while streaming a trace to disk.
"""

from __future__ import annotations

from benchmarks import native_cpu_paths

native_cpu_paths()  # timed as a user's training runs: before numpy and torch load

import argparse
import collections
import copy
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import neuraldbg as ndb
from neuraldbg.syncs import HostSyncCounter


def make_mlp() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    return model, torch.randn(128, 784), torch.randint(0, 10, (128,))


def make_cnn() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    model = nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(32 * 5 * 5, 10))
    return model, torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))


MODELS = {"mlp": make_mlp, "cnn": make_cnn}


#: Clock of a round: CPU time of this process (default; on a shared machine other processes'
#: load inflates wall time but barely this, and torch runs single-threaded here) or wall time.
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
_clock = CLOCKS["cpu"]


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                y: torch.Tensor, dbg: ndb.NeuralDbg | None) -> None:
    """One step of the loop every measurement here times: the user's loop, bare or hooked."""
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    if dbg is not None:
        dbg.step(loss)


def _round(model, opt, x, y, steps: int, dbg: ndb.NeuralDbg | None) -> float:
    t0 = _clock()
    if dbg is not None:
        dbg.__enter__()
    try:
        for _ in range(steps):
            _train_step(model, opt, x, y, dbg)
    finally:
        if dbg is not None:
            dbg.__exit__(None, None, None)
    return _clock() - t0


def measure_ratio(name: str, every: int, *, steps: int, rounds: int) -> dict[str, float]:
    """Median round time under NeuralDbg / median bare round time, interleaved."""
    torch.manual_seed(0)
    model, x, y = MODELS[name]()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    # One recorder for the whole measurement, as in one long run: its one-time set-up (index
    # tensors, the update snapshot) is not paid again each round. One round = one flush
    # period, so flushes count as often as in a real run; entering and leaving it (hooks
    # attached and removed) are counted in every round.
    dbg = ndb.NeuralDbg(model, optimizer=opt, every=every, flush_every=steps)
    for warm in (None, dbg):
        _round(model, opt, x, y, steps // 4, warm)
    bare, hooked = [], []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for use in order:
            (hooked if use else bare).append(_round(model, opt, x, y, steps, dbg if use else None))
    # Each round's ratio is taken against the bare round next to it, so load that comes and
    # goes on a shared machine hits both sides of a pair; the median of the pairs is robust.
    pairs = sorted(h / b for h, b in zip(hooked, bare))
    q1, q3 = pairs[len(pairs) // 4], pairs[(3 * len(pairs)) // 4]
    return {
        "model": name,
        "every": every,
        "ratio": statistics.median(pairs),
        "ratio_iqr": [q1, q3],
        "bare_ms_per_step": 1e3 * statistics.median(bare) / steps,
        "hooked_ms_per_step": 1e3 * statistics.median(hooked) / steps,
    }


#: Parts of the capture switched off for ``--breakdown`` (each row keeps less than the last).
PARTS = {
    "full": "everything",
    "no forward hooks": "parameter norms, update, gradient norm, step bookkeeping",
    "gradient norm only": "the every-step global gradient norm and step bookkeeping",
    "bookkeeping only": "dbg.step() and the optimizer hooks, measuring nothing",
}


def _switch_off(dbg: ndb.NeuralDbg, part: str) -> None:
    """Disable parts of a recorder's work (benchmark-only: patches private methods)."""
    if part == "full":
        return
    dbg._attach_forward_hooks = lambda: None
    meter = dbg._meter
    if part == "gradient norm only":
        before = meter.before_update
        meter.before_update = lambda slot, *, recorded, snapshot, **kw: before(
            slot, recorded=False, snapshot=False, **kw)
    elif part == "bookkeeping only":
        meter.before_update = lambda slot, *, recorded, snapshot, **kw: None
        meter.after_update = lambda slot, **kw: None


def measure_alternating(name: str, every: int, *, steps: int,
                        part: str = "full") -> dict[str, float]:
    """Trimmed-mean step time of a hooked model / a bare twin, alternating step by step."""
    torch.manual_seed(0)
    bare, x, y = MODELS[name]()
    hooked = copy.deepcopy(bare)
    opts = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in (bare, hooked)]
    times: tuple[list[float], list[float]] = ([], [])
    warmup = 50
    dbg = ndb.NeuralDbg(hooked, optimizer=opts[1], every=every)
    _switch_off(dbg, part)
    with dbg:
        for i in range(steps + warmup):
            for side, (model, opt) in enumerate(zip((bare, hooked), opts)):
                t0 = _clock()
                _train_step(model, opt, x, y, dbg if side else None)
                if i >= warmup:
                    times[side].append(_clock() - t0)

    def trimmed(v: list[float]) -> float:
        v = sorted(v)
        return statistics.mean(v[:len(v) - len(v) // 10])

    return {"ratio": trimmed(times[1]) / trimmed(times[0]),
            "bare_ms_per_step": 1e3 * trimmed(times[0]),
            "hooked_ms_per_step": 1e3 * trimmed(times[1])}


#: Parts of the capture timed inside the training loop by ``--in-loop``: (owner, method).
IN_LOOP_PARTS = (
    ("recorder", "_pre_step_hook"), ("meter", "before_update"), ("recorder", "_post_step_hook"),
    ("recorder", "step"), ("recorder", "_close_step"), ("recorder", "_forward_hook"),
    ("batch", "add"), ("batch", "close"), ("out_grads", "add"), ("out_grads", "close"),
    ("recorder", "flush"),
)


def in_loop_timings(name: str, every: int, *, steps: int) -> dict[str, dict[str, float]]:
    """Median wall time of each part of the capture per call, timed inside a training loop.

    On a small model on the CPU an operation inside the loop, where the model's own kernels
    have just evicted the caches, costs several times its time in a warm micro-benchmark;
    this says which parts cost what there. Benchmark-only: it wraps the recorder's private
    methods on one instance (the timers add about a microsecond per call).
    """
    torch.manual_seed(0)
    model, x, y = MODELS[name]()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    dbg = ndb.NeuralDbg(model, optimizer=opt, every=every)
    owners = {"recorder": dbg, "meter": dbg._meter, "batch": dbg._batch,
              "out_grads": dbg._out_grads}
    times: dict[str, list[float]] = {}

    def timed(label: str, method):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                times.setdefault(label, []).append(time.perf_counter() - t0)
        return wrapper

    for owner, attr in IN_LOOP_PARTS:  # instance attributes: the hooks bind them at enter
        obj = owners[owner]
        setattr(obj, attr, timed(f"{owner}.{attr}", getattr(obj, attr)))
    warmup = 50
    with dbg:
        for i in range(steps + warmup):
            if i == warmup:
                times.clear()
            _train_step(model, opt, x, y, dbg)
    return {label: {"median_us": 1e6 * statistics.median(v), "calls_per_step": len(v) / steps}
            for label, v in times.items()}


def host_syncs_per_step(name: str, steps: int = 20) -> float:
    """Extra ``_local_scalar_dense`` calls per step caused by NeuralDbg (target 0)."""
    torch.manual_seed(0)
    model, x, y = MODELS[name]()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    counts = []
    for use in (False, True):
        dbg = ndb.NeuralDbg(model, optimizer=opt, flush_every=10 * steps) if use else None
        if dbg is not None:
            dbg.__enter__()
        with HostSyncCounter() as mode:
            for _ in range(steps):
                _train_step(model, opt, x, y, dbg)
        if dbg is not None:
            dbg.__exit__(None, None, None)
        counts.append(mode.count)
    return (counts[1] - counts[0]) / steps


class _OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched while active, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


def extra_ops_per_step(name: str, every: int, steps: int = 32) -> dict[str, float]:
    """Aten ops NeuralDbg adds per step, total and by op (``every`` a divisor of ``steps``).

    Steady state: after two flush periods of ``steps`` steps (every cached view of a buffer
    row made), the ops of the next ``steps - 1`` steps, which hold no flush. On a small
    model on the CPU each dispatched op costs a few microseconds whatever its size, so this
    count is the capture's fixed cost per step.
    """
    torch.manual_seed(0)
    model, x, y = MODELS[name]()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    counts = []
    for use in (False, True):
        dbg = ndb.NeuralDbg(model, optimizer=opt, every=every, flush_every=steps) if use \
            else None
        if dbg is not None:
            dbg.__enter__()
        counter = _OpCounter()
        for i in range(3 * steps - 1):
            if i == 2 * steps:
                counter.__enter__()
            _train_step(model, opt, x, y, dbg)
        counter.__exit__(None, None, None)
        if dbg is not None:
            dbg.__exit__(None, None, None)
        counts.append(counter.counts)
    extra = counts[1].copy()
    extra.subtract(counts[0])
    by_op = {op: n / (steps - 1) for op, n in extra.most_common() if n}
    return {"total": sum(extra.values()) / (steps - 1), "by_op": by_op}


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    import os

    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def memory_growth(name: str = "mlp", steps: int = 3000) -> float:
    """RSS growth (MiB) per 1,000 steps between step 1,000 and the end, streaming to disk."""
    torch.manual_seed(0)
    model, x, y = MODELS[name]()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with tempfile.TemporaryDirectory() as tmp:
        with ndb.NeuralDbg(model, optimizer=opt, out=Path(tmp) / "run") as dbg:
            rss_at = {}
            for step in range(steps):
                _train_step(model, opt, x, y, dbg)
                if step + 1 in (1000, steps):
                    rss_at[step + 1] = _rss_mib()
    return (rss_at[steps] - rss_at[1000]) / ((steps - 1000) / 1000)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100,
                        help="steps per round (= flush_every of the hooked rounds)")
    parser.add_argument("--rounds", type=int, default=21,
                        help="interleaved rounds per setting")
    parser.add_argument("--every", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--clock", choices=list(CLOCKS), default="cpu",
                        help="time rounds by process CPU time (robust to other load) or wall")
    parser.add_argument("--alternate-steps", type=int, default=600,
                        help="steps per model for the step-interleaved ratio (0 to skip)")
    parser.add_argument("--breakdown", action="store_true",
                        help="only the step-interleaved ratio with parts of the capture "
                             "switched off, to see where the overhead goes")
    parser.add_argument("--in-loop", action="store_true",
                        help="only the median time of each part of the capture per call, "
                             "timed inside the training loop")
    parser.add_argument("--memory-steps", type=int, default=3000,
                        help="steps for the memory check (0 to skip)")
    parser.add_argument("--out", type=Path, default=Path("results/overhead.json"))
    args = parser.parse_args(argv)
    global _clock
    _clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    console = Console()
    if args.breakdown:
        return _breakdown(args, console)
    if args.in_loop:
        return _in_loop(args, console)
    rows = []
    for name in args.models:
        for every in args.every:
            rows.append(measure_ratio(name, every, steps=args.steps, rounds=args.rounds))
            if args.alternate_steps:
                alt = measure_alternating(name, every, steps=args.alternate_steps)
                rows[-1].update({f"steps_{k}": v for k, v in alt.items()})
            console.log(f"{name} every={every}: {rows[-1]['ratio']:.3f}x (rounds)"
                        + (f", {rows[-1]['steps_ratio']:.3f}x (steps)"
                           if args.alternate_steps else ""))
    syncs = {name: host_syncs_per_step(name) for name in args.models}
    ops = {f"{name} every={every}": extra_ops_per_step(name, every)
           for name in args.models for every in args.every}
    mem = memory_growth(steps=args.memory_steps) if args.memory_steps > 1000 else None
    table = Table(title="NeuralDbg capture overhead, hooked / bare step time "
                        f"({args.clock} time)")
    for col in ("model", "every", "rounds ratio", "IQR", "bare ms/step", "hooked ms/step",
                "steps ratio"):
        table.add_column(col, justify="right")
    for r in rows:
        iqr = f"{r['ratio_iqr'][0]:.2f}-{r['ratio_iqr'][1]:.2f}"
        alt = f"{r['steps_ratio']:.3f}x" if "steps_ratio" in r else "-"
        table.add_row(r["model"], str(r["every"]), f"{r['ratio']:.3f}x", iqr,
                      f"{r['bare_ms_per_step']:.3f}", f"{r['hooked_ms_per_step']:.3f}", alt)
    console.print(table)
    console.print(f"host syncs added per step: {syncs}")
    console.print("aten ops added per step: " + ", ".join(
        f"{k}: {v['total']:.1f}" for k, v in ops.items()))
    if mem is not None:
        console.print(f"RSS growth while streaming: {mem:.2f} MiB per 1,000 steps")
    result = {"rows": rows, "host_syncs_per_step": syncs, "extra_ops_per_step": ops,
              "rss_mib_per_1000_steps": mem,
              "steps_per_round": args.steps, "rounds": args.rounds, "threads": args.threads,
              "clock": args.clock,
              "torch": torch.__version__}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


def _table(title: str, columns: tuple[str, ...]) -> Table:
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right")
    return table


def _write(args: argparse.Namespace, suffix: str, result: dict) -> dict:
    """Write ``result`` beside ``--out`` as ``<stem>_<suffix>.json`` and return it."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_name(f"{args.out.stem}_{suffix}.json").write_text(json.dumps(result, indent=2))
    return result


def _sweep(args: argparse.Namespace, console: Console, title: str, columns: tuple[str, ...],
           parts_of: Callable[[str, int], Iterable[tuple[str, dict]]],
           cells: Callable[[dict], tuple[str, ...]]) -> list[dict]:
    """One row per (model, every, part) of ``parts_of(model, every)``, printed as a table."""
    table = _table(title, ("model", "every", "part", *columns))
    rows = []
    for name in args.models:
        for every in args.every:
            for part, r in parts_of(name, every):
                row = {"model": name, "every": every, "part": part, **r}
                rows.append(row)
                table.add_row(name, str(every), part, *cells(row))
    console.print(table)
    return rows


def _breakdown(args: argparse.Namespace, console: Console) -> dict:
    def parts_of(name: str, every: int) -> Iterable[tuple[str, dict]]:
        for part in PARTS:
            r = measure_alternating(name, every, steps=args.alternate_steps, part=part)
            yield part, {**r, "extra_us_per_step":
                         1e3 * (r["hooked_ms_per_step"] - r["bare_ms_per_step"])}

    rows = _sweep(args, console, "Where the overhead goes (step-interleaved, hooked / bare)",
                  ("ratio", "extra us/step"), parts_of,
                  lambda r: (f"{r['ratio']:.3f}x", f"{r['extra_us_per_step']:.0f}"))
    return _write(args, "breakdown", {"breakdown": rows, "parts": PARTS, "clock": args.clock,
                                      "torch": torch.__version__})


def _in_loop(args: argparse.Namespace, console: Console) -> dict:
    rows = _sweep(args, console, "Capture parts timed inside the training loop (median per call)",
                  ("us per call", "calls per step"),
                  lambda name, every: in_loop_timings(name, every,
                                                      steps=args.alternate_steps).items(),
                  lambda r: (f"{r['median_us']:.1f}", f"{r['calls_per_step']:.2f}"))
    return _write(args, "in_loop", {"in_loop": rows, "torch": torch.__version__})


if __name__ == "__main__":
    main()
