"""The recorded run: pandas tables in memory, Parquet chunks plus JSON metadata on disk.

Layout of a trace directory::

    meta.json                   schema version, run config, seed, versions, status, ground truth
    modules.parquet             one row per monitored module
    steps/part-000000.parquet   one row per training step, written in chunks
    stats/part-000000.parquet   one row per (recorded step, module), written in chunks

Every file is written under a temporary name and renamed, so a reader never sees half a
file: a run that is killed loses at most the chunk being written. Nothing is ever
unpickled: Parquet and JSON only.
"""

from __future__ import annotations

import json
import os
import socket
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from neuraldbg.errors import SchemaVersionError, TraceFormatError, TraceLockedError

__all__ = [
    "SCHEMA_VERSION",
    "TRACE_FORMAT",
    "STEP_COLUMNS",
    "STAT_COLUMNS",
    "MODULE_COLUMNS",
    "Trace",
    "TraceWriter",
    "load_trace",
    "rank_shard",
    "rank_shards",
]

TRACE_FORMAT = "neuraldbg-trace"
SCHEMA_VERSION = 1

#: Columns of ``trace.steps`` (one row per training step).
STEP_COLUMNS: dict[str, str] = {
    "step": "training step, counted by ``dbg.step(loss)`` from 0",
    "loss": "loss passed to ``dbg.step`` (NaN when the step has none: see ``complete``)",
    "lr": "learning rate of the first parameter group, read when the optimizer stepped",
    "grad_norm": "global L2 norm of all parameter gradients before the optimizer step",
    "param_norm": "global L2 norm of all trainable parameters before the optimizer step "
    "(recorded steps only, NaN otherwise: it needs a pass over every weight)",
    "update_norm": "global L2 norm of the optimizer's change to the parameters, ||dW|| "
    "(recorded steps only; a parameter tensor larger than CaptureConfig.sample_size is "
    "measured on a fixed strided sample of its elements and scaled up)",
    "update_ratio": "update_norm / param_norm",
    "recorded": "True when per-module statistics were recorded at this step",
    "complete": "False for a step without a loss: interrupted after the optimizer stepped "
    "and before ``dbg.step`` (an exception, a crash), or ``dbg.step()`` called without one",
    "stepped": "False when no optimizer stepped in this step: a ``GradScaler`` skipped it "
    "(non-finite scaled gradients), or the run stopped before the optimizer stepped; its "
    "gradient, parameter and update norms are then NaN. True when no optimizer was given "
    "(nothing tells), and in traces written before this column existed",
}

#: Columns of ``trace.stats`` (one row per recorded step and module).
STAT_COLUMNS: dict[str, str] = {
    "step": "training step",
    "module_name": "qualified name as ``model.named_modules()`` spells it",
    "calls": "forward calls of the module in this step (2 for shared weights used twice)",
    "act_mean": "mean of the module output (averaged over calls; NaN elements left out, "
    "they are counted in act_nan)",
    "act_std": "standard deviation of the module output",
    "act_max_abs": "largest |x| of the output",
    "act_frac_zero": "share of output elements exactly zero",
    "act_frac_dead": "share of units (features/channels) exactly zero for the whole batch",
    "act_frac_saturated": "share of outputs in the flat region of the module's activation",
    "act_nan": "NaN elements in the output (summed over calls)",
    "act_inf": "Inf elements in the output (summed over calls)",
    "out_grad_norm": "L2 norm of the loss gradient with respect to the module output",
    "param_grad_norm": "L2 norm of the gradients of the module's own parameters",
    "param_norm": "L2 norm of the module's own parameters before the optimizer step",
    "update_ratio": "||dW|| / ||W|| of the module's parameters across the optimizer step",
}

#: Columns of ``trace.modules`` (one row per monitored module).
MODULE_COLUMNS: dict[str, str] = {
    "module_name": "qualified name as ``model.named_modules()`` spells it",
    "module_type": "class name, e.g. ``Linear``",
    "order": "index in ``named_modules()`` order (definition order)",
    "forward_order": "order of the first forward call in a recorded training step, whatever "
    "the output (-1 if never called there: unused, or called only under no_grad)",
    "depth": "nesting depth (number of dots in the name)",
    "parent": "qualified name of the parent module ('' for top-level children)",
    "activation_family": "how saturation is judged: sigmoid, tanh, softmax, relu, smooth, linear, "
    "norm, other",
    "n_params": "number of parameters the module owns directly",
    "n_trainable": "number of those that require grad",
    "fan_in": "inputs per output unit of the weight (in_features x kernel size); 0 without one",
    "fan_out": "outputs per input unit of the weight (out_features x kernel size); 0 without one",
    "parameters": "qualified names of the trainable parameters counted in this row, comma "
    "separated: the module's own, and those of children it calls functionally (the "
    "out_proj of nn.MultiheadAttention)",
    "units": "output units or channels of a weighted module (``out_features``, "
    "``out_channels``, ``embedding_dim``, ``hidden_size``, ``embed_dim``); 0 for others",
    "dropout": "share of its inputs a dropout module zeroes in training (its ``p``); NaN for "
    "other modules and in traces written before this column",
}


def _write_error(exc: OSError, path: Path) -> OSError:
    """The file system's error, naming the file that could not be written."""
    reason = exc.strerror or str(exc)
    err = OSError(exc.errno, f"{reason}: could not write the trace file {path} (earlier "
                             "chunks are kept; free space or choose another out= directory)",
                  str(path))
    return err


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _write_error(exc, path) from exc


def _atomic_write_parquet(path: Path, frame: pd.DataFrame) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    table = pa.Table.from_pandas(frame, preserve_index=False)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _write_error(exc, path) from exc


def _json_default(value: Any) -> Any:
    # numpy scalars, paths and tuples appear in configs; everything else is a user error.
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if isinstance(value, (Path, set, frozenset)):
        return str(value) if isinstance(value, Path) else sorted(value)
    if hasattr(value, "to_dict"):
        return value.to_dict()
    raise TypeError(
        f"Value {value!r} of type {type(value).__name__} cannot be stored in trace metadata; "
        "pass JSON-compatible values (numbers, strings, lists, dicts) in config/ground_truth."
    )


def check_json(value: Any, name: str) -> None:
    """Raise ``TypeError`` naming ``name`` if ``value`` cannot be stored in ``meta.json``."""
    try:
        json.dumps(value, default=_json_default)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} cannot be stored in the trace: {exc}") from exc


def _dump_json(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, indent=2, sort_keys=True, default=_json_default).encode()


@dataclass
class Trace:
    """A recorded training run.

    Attributes
    ----------
    steps : pandas.DataFrame
        One row per step; columns in :data:`STEP_COLUMNS`.
    stats : pandas.DataFrame
        One row per (recorded step, module); columns in :data:`STAT_COLUMNS`.
    modules : pandas.DataFrame
        One row per monitored module; columns in :data:`MODULE_COLUMNS`.
    meta : dict
        Schema version, config, seed, library versions, status and ground truth.
    """

    steps: pd.DataFrame
    stats: pd.DataFrame
    modules: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def module_names(self) -> list[str]:
        """Monitored modules in forward order (definition order for never-called ones)."""
        mods = self.modules.copy()
        never = mods["forward_order"] < 0
        last = mods["forward_order"].max() + 1
        mods.loc[never, "forward_order"] = last + mods.loc[never, "order"]
        return mods.sort_values(["forward_order", "order"])["module_name"].tolist()

    @property
    def n_steps(self) -> int:
        """Number of steps in the trace."""
        return int(len(self.steps))

    @property
    def ground_truth(self) -> dict[str, Any] | None:
        """The scenario's ground truth when a failure-zoo run wrote it, else ``None``."""
        return self.meta.get("ground_truth")

    def stat(self, column: str) -> pd.DataFrame:
        """One statistic as a wide table: rows are steps, columns modules in forward order.

        Parameters
        ----------
        column : str
            A column of :data:`STAT_COLUMNS` other than ``step`` and ``module_name``.

        Raises
        ------
        KeyError
            If ``column`` is not a statistic of the trace.
        """
        if column not in self.stats.columns or column in ("step", "module_name"):
            valid = [c for c in self.stats.columns if c not in ("step", "module_name")]
            raise KeyError(f"Unknown statistic {column!r}. Valid statistics are: {valid}")
        wide = self.stats.pivot_table(
            index="step", columns="module_name", values=column, aggfunc="last", dropna=False
        )
        order = [m for m in self.module_names if m in wide.columns]
        return wide.reindex(columns=order)

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the trace as a directory of Parquet tables and ``meta.json``.

        Parameters
        ----------
        path : str or path-like
            Target directory; created if missing.
        overwrite : bool, default=False
            Replace an existing trace in ``path``.

        Returns
        -------
        pathlib.Path
            The directory written.
        """
        writer = TraceWriter(path, overwrite=overwrite)
        try:
            writer.write_modules(self.modules)
            if len(self.steps) or len(self.stats):
                writer.write_chunk(self.steps, self.stats)
            writer.write_meta(self.meta)
        finally:
            writer.close()
        return writer.root


class TraceWriter:
    """Writes a trace directory incrementally: modules once, then chunks, meta any time.

    One writer per directory at a time: a lock file (``.lock``, created with an exclusive
    create, so two processes cannot both succeed) is taken before anything is checked or
    written and removed by :meth:`close`. A lock left by a process that died on this host is
    taken over.

    Parameters
    ----------
    path : str or path-like
        Directory to write. Created if missing.
    overwrite : bool, default=False
        Allow replacing a directory that already holds a trace.
    append : bool, default=False
        Continue the trace already in ``path`` (new chunks after the existing ones).

    Raises
    ------
    FileExistsError
        If ``path`` already holds a trace and neither ``overwrite`` nor ``append`` is set.
    TraceLockedError
        If another writer holds the directory.
    """

    def __init__(self, path: str | os.PathLike[str], *, overwrite: bool = False,
                 append: bool = False) -> None:
        self.root = Path(path)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock: Path | None = None
        self._acquire()
        try:
            existing = sorted((self.root / "steps").glob("part-*.parquet"))
            if (self.root / "meta.json").exists() and not append:
                if not overwrite:
                    raise FileExistsError(
                        f"{self.root} already holds a trace (meta.json exists). Choose another "
                        "directory or pass overwrite=True to replace it."
                    )
                for sub in ("steps", "stats"):
                    for part in (self.root / sub).glob("part-*.parquet"):
                        part.unlink()
                existing = []
            (self.root / "steps").mkdir(exist_ok=True)
            (self.root / "stats").mkdir(exist_ok=True)
        except BaseException:
            self.close()
            raise
        self._n_chunks = int(existing[-1].stem.split("-")[1]) + 1 if existing else 0

    def _acquire(self) -> None:
        lock = self.root / ".lock"
        info = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode()
        for _ in range(2):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if _stale_lock(lock):
                    lock.unlink(missing_ok=True)
                    continue
                holder = _read_lock(lock)
                raise TraceLockedError(
                    f"{self.root} is being written by another process ({holder}; lock file "
                    f"{lock}). Give each run its own directory (under DDP each rank writes "
                    "its own shard of one directory by itself); if no process writes there "
                    "any more, delete the lock file."
                ) from None
            with os.fdopen(fd, "wb") as fh:
                fh.write(info)
            self._lock = lock
            return
        raise TraceLockedError(f"Could not take the lock {lock}: another process keeps "
                               "re-creating it. Give each run its own directory.")

    def close(self) -> None:
        """Release the directory (remove the lock file). Safe to call twice."""
        if self._lock is not None:
            self._lock.unlink(missing_ok=True)
            self._lock = None

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Write ``meta.json`` atomically (format tag and schema version included)."""
        full = {"format": TRACE_FORMAT, "schema_version": SCHEMA_VERSION, **meta}
        _atomic_write_bytes(self.root / "meta.json", _dump_json(full))

    def write_modules(self, modules: pd.DataFrame) -> None:
        """Write the module table."""
        _atomic_write_parquet(self.root / "modules.parquet", modules)

    def write_chunk(self, steps: pd.DataFrame, stats: pd.DataFrame) -> None:
        """Write one chunk of steps and statistics, each under a temporary name then renamed.

        Raises
        ------
        OSError
            The error of the file system (disk full, file too large, ...), naming the file.
            Nothing of the chunk is left on disk, and earlier chunks are untouched.
        """
        name = f"part-{self._n_chunks:06d}.parquet"
        # stats first: a chunk counts as present once its steps file exists.
        _atomic_write_parquet(self.root / "stats" / name, stats)
        try:
            _atomic_write_parquet(self.root / "steps" / name, steps)
        except BaseException:
            (self.root / "stats" / name).unlink(missing_ok=True)
            raise
        self._n_chunks += 1


def _read_lock(lock: Path) -> str:
    try:
        info = json.loads(lock.read_text())
        return f"pid {info.get('pid')} on {info.get('host')}"
    except (OSError, ValueError):
        return "unknown process"


def _stale_lock(lock: Path) -> bool:
    """True when the lock's process ran on this host and no longer exists."""
    try:
        info = json.loads(lock.read_text())
        pid, host = int(info["pid"]), info["host"]
    except (OSError, ValueError, KeyError, TypeError):
        return False  # being written right now, or not ours to judge
    if host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


#: Columns without which a chunk is not a chunk of that table (older schemas have them too).
_KEY_COLUMNS = {"steps": ("step", "loss"), "stats": ("step", "module_name")}


def _read_parts(root: Path, sub: str, columns: Iterable[str]) -> pd.DataFrame:
    parts = sorted((root / sub).glob("part-*.parquet"))
    frames = []
    for part in parts:
        if sub == "stats" and not (root / "steps" / part.name).exists():
            continue  # a stats chunk whose steps chunk was never written: the run died between
        try:
            frame = pq.read_table(part).to_pandas()
        except (pa.ArrowInvalid, OSError) as exc:
            raise TraceFormatError(
                f"Trace chunk {part} is unreadable ({exc}). The file is truncated or not "
                "Parquet; delete it to load the remaining chunks."
            ) from exc
        missing = [c for c in _KEY_COLUMNS.get(sub, ()) if c not in frame.columns]
        if missing:
            raise TraceFormatError(
                f"Trace chunk {part} has no {' or '.join(map(repr, missing))} column: it is not "
                f"a {sub} chunk of a NeuralDBG trace (a file copied into the wrong folder?). "
                "Put back the chunk the run wrote, or delete it to load the others."
            )
        frames.append(_checked_chunk(part, frame, columns))
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in columns})
    return pd.concat(frames, ignore_index=True)


#: Columns of the step and statistics tables that hold text or flags, not numbers.
_NON_NUMERIC = frozenset({"module_name", "recorded", "complete", "stepped"})


def _checked_chunk(part: Path, frame: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    """A chunk with numbers in its numeric columns and every known column present.

    A numeric column that holds text is a damaged file: the error names the chunk and the
    column. A known column the chunk lacks (written by an older NeuralDBG, or a damaged
    file) is added as NaN, not measured, with a warning, so that no method stops on it.
    Columns the schema does not name (a newer writer's) are left as they are.
    """
    columns = tuple(columns)
    for column in columns:
        if column in _NON_NUMERIC or column not in frame.columns \
                or pd.api.types.is_numeric_dtype(frame[column]):
            continue
        try:
            frame[column] = pd.to_numeric(frame[column])
        except (TypeError, ValueError) as exc:
            raise TraceFormatError(
                f"Trace chunk {part}: column {column!r} holds values that are not numbers "
                f"({exc}); the file is damaged. Put back the chunk the run wrote, or delete it "
                "to load the others."
            ) from exc
    absent = [c for c in columns if c not in frame.columns and c not in _NON_NUMERIC]
    if absent:
        warnings.warn(f"Trace chunk {part} has no {', '.join(map(repr, absent))} column(s) "
                      "(written by an older NeuralDBG, or a damaged file): they read as not "
                      "measured.", stacklevel=4)
        frame = frame.assign(**{c: np.nan for c in absent})
    return frame


def rank_shard(root: str | os.PathLike[str], rank: int) -> Path:
    """Directory of rank ``rank``'s shard in a distributed run's trace directory."""
    return Path(root) / f"rank-{rank}"


def rank_shards(root: Path) -> list[tuple[int, Path]]:
    """``(rank, directory)`` of the rank shards in ``root``, by rank (empty if none)."""
    if not root.is_dir():
        return []
    found = []
    for d in root.glob("rank-*"):
        tail = d.name.split("-", 1)[1]
        if d.is_dir() and tail.isdigit() and (d / "meta.json").exists():
            found.append((int(tail), d))
    return sorted(found)


def _merge_ranks(root: Path, shards: list[tuple[int, Path]]) -> Trace:
    """One trace from the shards of a distributed run, every row tagged with its ``rank``."""
    traces = [(rank, load_trace(d)) for rank, d in shards]
    steps = pd.concat([t.steps.assign(rank=r) for r, t in traces], ignore_index=True)
    stats = pd.concat([t.stats.assign(rank=r) for r, t in traces], ignore_index=True)
    if len(steps):
        steps = steps.sort_values(["step", "rank"], kind="stable").reset_index(drop=True)
    meta = dict(traces[0][1].meta)
    statuses = [t.meta.get("status") for _, t in traces]
    meta.update({
        "ranks": [r for r, _ in traces],
        "status": next((s for s in ("failed", "write_failed", "running") if s in statuses),
                       statuses[0]),
        "rank_status": {str(r): t.meta.get("status") for r, t in traces},
        "n_steps": max(int(t.meta.get("n_steps") or 0) for _, t in traces),
    })
    return Trace(steps=steps, stats=stats, modules=traces[0][1].modules, meta=meta)


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Load a trace directory written by :class:`NeuralDbg` or :meth:`Trace.save`.

    Only Parquet and JSON are read; nothing is unpickled, so a trace from a colleague cannot
    run code. A run that crashed or was killed loads with every chunk it finished.

    A distributed run's directory holds one shard per rank (``rank-0/``, ``rank-1/``, ...,
    each written by its own process); they are merged into one trace whose ``steps`` and
    ``stats`` carry a ``rank`` column (the diagnosis methods combine the ranks per step,
    :func:`neuraldbg.ranks.combine_ranks`).

    Parameters
    ----------
    path : str or path-like
        The trace directory.

    Returns
    -------
    Trace

    Raises
    ------
    TraceFormatError
        If the directory, ``meta.json``, ``modules.parquet``, ``steps/`` or ``stats/`` is
        missing or unreadable (where the run recorded steps), a chunk or the module table is
        not one of its table's, or the directory is not a NeuralDBG trace.
    SchemaVersionError
        If the trace was written with a newer schema than this version reads.
    """
    root = Path(path)
    shards = rank_shards(root)
    if shards and not (root / "meta.json").exists():
        return _merge_ranks(root, shards)
    if not root.is_dir():
        raise TraceFormatError(
            f"No trace directory at {root}: it does not exist or is not a directory. Pass the "
            "directory given to trace.save(...) or NeuralDbg(out=...)."
        )
    meta_path = root / "meta.json"
    if not meta_path.is_file():
        raise TraceFormatError(
            f"{meta_path} is missing: {root} is not a NeuralDBG trace directory (expected "
            "meta.json, modules.parquet, steps/ and stats/)."
        )
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{meta_path} is not valid JSON ({exc}); the file is "
                               "damaged.") from exc
    if not isinstance(meta, dict) or meta.get("format") != TRACE_FORMAT:
        raise TraceFormatError(
            f"{meta_path} does not describe a NeuralDBG trace (its 'format' field is "
            f"{meta.get('format') if isinstance(meta, dict) else None!r}, expected "
            f"{TRACE_FORMAT!r})."
        )
    if meta.get("config") is not None and not isinstance(meta["config"], dict):
        raise TraceFormatError(
            f"{meta_path}: 'config' must be a JSON object (the run metadata passed as "
            f"NeuralDbg(config={{...}})), got {type(meta['config']).__name__}; the file was "
            "edited or damaged."
        )
    version = meta.get("schema_version")
    if not isinstance(version, int):
        raise TraceFormatError(f"{meta_path} has no integer 'schema_version' (got {version!r}).")
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"Trace {root} uses schema version {version}, newer than the {SCHEMA_VERSION} this "
            "NeuralDBG reads. Upgrade neuraldbg (pip install -U neuraldbg) to load it."
        )
    modules_path = root / "modules.parquet"
    try:
        modules = pq.read_table(modules_path).to_pandas()
    except (pa.ArrowInvalid, OSError, FileNotFoundError) as exc:
        raise TraceFormatError(
            f"{modules_path} is missing or unreadable ({exc}); the trace directory is incomplete."
        ) from exc
    missing = [c for c in ("module_name", "order", "forward_order") if c not in modules.columns]
    if missing:
        raise TraceFormatError(
            f"{modules_path} has no {' or '.join(map(repr, missing))} column: it is not a "
            "NeuralDBG module table (another table copied in its place?). Copy the whole trace "
            "directory again."
        )
    has_steps = any((root / "steps").glob("part-*.parquet"))
    # (a run whose first chunk could not be written, status write_failed, has none)
    if not has_steps and (any((root / "stats").glob("part-*.parquet")) or (
            meta.get("status") == "complete" and int(meta.get("n_steps") or 0) > 0)):
        raise TraceFormatError(
            f"{root / 'steps'} holds no step chunks, but {root} records steps (meta.json's "
            "n_steps or stats/): a partial copy? Copy the whole trace directory (meta.json, "
            "modules.parquet, steps/ and stats/)."
        )
    if has_steps and not (root / "stats").is_dir():
        raise TraceFormatError(
            f"{root / 'stats'} is missing: {root} holds steps but no per-module statistics "
            "(a partial copy?). Copy the whole trace directory (meta.json, modules.parquet, "
            "steps/ and stats/)."
        )
    steps = _read_parts(root, "steps", STEP_COLUMNS)
    stats = _read_parts(root, "stats", STAT_COLUMNS)
    if len(steps):
        steps = steps.sort_values("step", kind="stable").reset_index(drop=True)
    if "stepped" not in steps.columns:  # written before the column existed: nothing tells
        steps["stepped"] = True
    return Trace(steps=steps, stats=stats, modules=modules, meta=meta)
