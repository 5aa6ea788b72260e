"""Where the capture's finished chunks go: kept in memory, or streamed to a trace directory.

:class:`neuraldbg.capture.Recorder` drains its device buffers into a :data:`Chunk` (numpy
columns of ``trace.steps`` and ``trace.stats``) at each flush and hands it here. Without
``out=`` the chunks stay in memory; with it each chunk is written as a Parquet part through
:class:`neuraldbg.trace.TraceWriter`. A chunk the disk refused stays in memory, in order,
so the next flush tries it again and :meth:`CaptureSink.assemble` still returns it. Nothing
here touches the training path: it runs at flushes and when the trace is read.
"""

from __future__ import annotations

import contextlib
import platform
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from neuraldbg.capture_config import CaptureConfig
from neuraldbg.step_log import Chunk
from neuraldbg.trace import (
    SCHEMA_VERSION,
    STAT_COLUMNS,
    STEP_COLUMNS,
    TRACE_FORMAT,
    Trace,
    TraceWriter,
    load_trace,
)

__all__ = ["CaptureSink", "RunInfo", "run_meta"]


@dataclass(frozen=True)
class RunInfo:
    """What ``meta.json`` says about a run that does not change while it goes.

    Attributes
    ----------
    config : dict
        The user's run metadata.
    seed : int, optional
        The run's seed; ``None``: ``torch.initial_seed()`` when the meta is written.
    cfg : CaptureConfig
        The capture settings in force.
    model_class : str
        The model's class name.
    optimizer_class : str or list of str, optional
        The optimizers' class names (one name for one optimizer).
    grad_scaler : bool
        Whether a ``GradScaler`` was given.
    root_parameters : list of str
        Parameters the root module owns directly.
    device : str
        The model's device.
    ground_truth : dict, optional
        Known truth about the run (failure-zoo scenarios).
    """

    config: dict[str, Any]
    seed: int | None
    cfg: CaptureConfig
    model_class: str
    optimizer_class: str | list[str] | None
    grad_scaler: bool
    root_parameters: list[str]
    device: str
    ground_truth: dict[str, Any] | None


def run_meta(info: RunInfo, *, status: str, error: str | None, rank: tuple[int, int] | None,
             n_steps: int, started: float | None,
             weight_diversity: dict[str, Any] | None,
             model_output: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's ``meta.json`` content (schema and format fields are the writer's)."""
    from neuraldbg.version import __version__

    cfg = info.cfg
    return {
        "status": status,
        "error": error,
        "config": info.config,
        "seed": info.seed if info.seed is not None else int(torch.initial_seed()),
        "every": cfg.every,
        "flush_every": cfg.flush_every,
        "capture_config": {f.name: getattr(cfg, f.name) for f in fields(cfg)},
        "model_class": info.model_class,
        "optimizer_class": info.optimizer_class,
        "grad_scaler": info.grad_scaler,
        "root_parameters": info.root_parameters,
        "rank": rank[0] if rank else None,
        "world_size": rank[1] if rank else None,
        "device": info.device,
        "n_steps": n_steps,
        "started_unix": started,
        "versions": {
            "neuraldbg": __version__,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "ground_truth": info.ground_truth,
        "weight_diversity": weight_diversity,
        "model_output": model_output,
    }


def _frame(chunks: list[Chunk], part: int, columns: dict[str, str]) -> pd.DataFrame:
    """One table (0: steps, 1: stats) of ``chunks``, concatenated column by column."""
    if not chunks:
        return pd.DataFrame(columns=list(columns))
    return pd.DataFrame({c: np.concatenate([ch[part][c] for ch in chunks]) for c in columns},
                        columns=list(columns))


class CaptureSink:
    """The finished chunks of one recorder, in memory or on disk (see the module notes)."""

    def __init__(self) -> None:
        self._chunks: list[Chunk] = []      # in memory (no ``out=``)
        self._unwritten: list[Chunk] = []   # streaming: not yet on disk
        self._writer: TraceWriter | None = None

    @property
    def streaming(self) -> bool:
        """Whether chunks go to a directory (since a successful :meth:`open`)."""
        return self._writer is not None

    def open(self, root: Path, *, overwrite: bool, append: bool, modules: pd.DataFrame,
             meta: dict[str, Any]) -> None:
        """Start streaming to ``root``: the module table and ``meta.json`` are written now.

        A later :meth:`open` (the recorder entered again) replaces the writer once the new
        one is ready; a failed one leaves the previous directory as the trace's.

        Raises
        ------
        OSError, FileExistsError, CaptureError
            From :class:`~neuraldbg.trace.TraceWriter`; nothing is left open then.
        """
        writer = TraceWriter(root, overwrite=overwrite, append=append)
        try:
            writer.write_modules(modules)
            writer.write_meta(meta)
        except BaseException:
            writer.close()
            raise
        self._writer = writer

    def close(self) -> None:
        """Release the directory (its lock); the trace is still read from it."""
        if self._writer is not None:
            self._writer.close()

    def add(self, chunk: Chunk) -> None:
        """Queue a finished chunk (written at the next :meth:`write`)."""
        (self._unwritten if self._writer is not None else self._chunks).append(chunk)

    def write(self, modules: pd.DataFrame | None, meta: dict[str, Any] | None) -> None:
        """Write the queued chunks in order, then the module table and meta when given.

        Raises
        ------
        OSError
            When a chunk cannot be written: it and the later ones stay queued.
        """
        if self._writer is None:
            return
        while self._unwritten:
            steps, stats = self._unwritten[0]
            self._writer.write_chunk(pd.DataFrame(steps, columns=list(STEP_COLUMNS)),
                                     pd.DataFrame(stats, columns=list(STAT_COLUMNS)))
            self._unwritten.pop(0)
        if modules is not None:
            self._writer.write_modules(modules)
        if meta is not None:
            self._writer.write_meta(meta)

    def write_meta_quietly(self, meta: dict[str, Any]) -> None:
        """Write ``meta.json`` if the disk still allows it (after a failed write)."""
        if self._writer is not None:
            with contextlib.suppress(OSError):
                self._writer.write_meta(meta)

    def assemble(self, modules: pd.DataFrame, meta: dict[str, Any]) -> Trace:
        """The trace recorded so far: what is on disk plus what the disk refused."""
        if self._writer is None:
            return Trace(steps=_frame(self._chunks, 0, STEP_COLUMNS),
                         stats=_frame(self._chunks, 1, STAT_COLUMNS), modules=modules,
                         meta={"format": TRACE_FORMAT, "schema_version": SCHEMA_VERSION,
                               **meta})
        trace = load_trace(self._writer.root)
        if not self._unwritten:
            return trace
        return Trace(
            steps=pd.concat([trace.steps, _frame(self._unwritten, 0, STEP_COLUMNS)],
                            ignore_index=True),
            stats=pd.concat([trace.stats, _frame(self._unwritten, 1, STAT_COLUMNS)],
                            ignore_index=True),
            modules=trace.modules, meta={**trace.meta, **meta})
