"""Export a trace as TensorBoard event files, so a run opens in the tool users already have.

Needs the optional extra (``pip install 'neuraldbg[tensorboard]'``); written with
:class:`torch.utils.tensorboard.SummaryWriter`. Tags:

- ``run/<column>``: the per-step scalars of ``trace.steps`` (loss, lr, grad_norm, ...);
- ``layers/<statistic>/<module_name>``: per-layer statistics at every recorded step;
- ``diagnosis/verdict`` (text, step 0), ``diagnosis/hypotheses`` (text, at each hypothesis's
  origin step) and ``diagnosis/events`` (text, one entry per step with events).

Non-finite values are written as they are (TensorBoard shows NaN and Inf); a row without a
measurement (NaN because a module was not called) is skipped.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from neuraldbg.errors import MissingDependencyError
from neuraldbg.methods import heuristic_diagnosis
from neuraldbg.records import Event, Hypothesis
from neuraldbg.reporting.summary import module_types
from neuraldbg.reporting.words import verdict
from neuraldbg.stat_tables import wide_stats
from neuraldbg.trace import Trace, load_trace

__all__ = ["export_tensorboard", "STEP_SCALARS", "LAYER_STATISTICS"]

#: Columns of ``trace.steps`` written as ``run/<column>``.
STEP_SCALARS: tuple[str, ...] = ("loss", "lr", "grad_norm", "param_norm", "update_norm",
                                 "update_ratio")
#: Columns of ``trace.stats`` written as ``layers/<statistic>/<module_name>``.
LAYER_STATISTICS: tuple[str, ...] = ("out_grad_norm", "param_grad_norm", "update_ratio",
                                     "act_std", "act_max_abs", "act_frac_dead",
                                     "act_frac_saturated")


def _writer(logdir: Path) -> Any:  # SummaryWriter: an optional import
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise MissingDependencyError(
            "TensorBoard export needs the tensorboard package, which is not installed. "
            "Install the extra: pip install 'neuraldbg[tensorboard]'.") from exc
    return SummaryWriter(log_dir=str(logdir))


def _hypothesis_md(h: Hypothesis, types: dict[str, str]) -> str:
    kind = types.get(h.origin_layer, "")
    return (f"**{h.failure_type}** caused by `{h.root_cause}` in `{h.origin_layer}` "
            f"({kind}) at step {h.origin_step}, confidence {h.confidence:.2f}")


def _event_md(e: Event) -> str:
    return f"`{e.module_name}`: {e.kind} ({e.from_state} -> {e.to_state})"


def export_tensorboard(trace: Trace | str | os.PathLike[str], logdir: str | os.PathLike[str],
                       ) -> Path:
    """Write a run's scalars, per-layer statistics, events and hypotheses for TensorBoard.

    Parameters
    ----------
    trace : Trace or trace directory
    logdir : str or path-like
        Directory for the event files (created); open it with ``tensorboard --logdir``.

    Returns
    -------
    pathlib.Path
        ``logdir``.

    Raises
    ------
    MissingDependencyError
        If the ``tensorboard`` package is not installed (an ``ImportError``).
    TraceFormatError
        If ``trace`` is a directory that is not a readable trace.
    NotADirectoryError
        If ``logdir`` is an existing file.
    """
    trace = trace if isinstance(trace, Trace) else load_trace(trace)
    logdir = Path(logdir)
    if logdir.exists() and not logdir.is_dir():
        raise NotADirectoryError(
            f"TensorBoard log directory {logdir} is an existing file: pass a directory (new or "
            "existing), e.g. runs/tb, and open it with tensorboard --logdir.")
    writer = _writer(logdir)
    try:
        steps = trace.steps
        step_ids = steps["step"].to_numpy(dtype=np.int64) if len(steps) else []
        for col in STEP_SCALARS:
            if col not in steps:
                continue
            values = steps[col].to_numpy(dtype=float)
            keep = ~np.isnan(values) | (col == "loss")  # a NaN loss is a fact; others: unmeasured
            for s, v in zip(step_ids[keep], values[keep], strict=True):
                writer.add_scalar(f"run/{col}", float(v), int(s))
        rec_steps, names, tables = wide_stats(trace, LAYER_STATISTICS)
        for stat in LAYER_STATISTICS:
            arr = tables[stat]
            for j, name in enumerate(names):
                values = arr[:, j]
                keep = ~np.isnan(values)
                for s, v in zip(rec_steps[keep], values[keep], strict=True):
                    writer.add_scalar(f"layers/{stat}/{name or '(model)'}", float(v), int(s))
        if len(steps) and len(trace.stats):
            diag = heuristic_diagnosis(trace)
            types = module_types(trace)
            writer.add_text("diagnosis/verdict", verdict(diag.hypotheses, types).sentence, 0)
            by_step: dict[int, list[str]] = defaultdict(list)
            for rank, h in enumerate(diag.hypotheses, 1):
                by_step[int(h.origin_step)].append(f"{rank}. {_hypothesis_md(h, types)}")
            for s, lines in sorted(by_step.items()):
                writer.add_text("diagnosis/hypotheses", "  \n".join(lines), s)
            events: dict[int, list[str]] = defaultdict(list)
            for e in diag.events:
                events[int(e.step)].append(_event_md(e))
            for s, lines in sorted(events.items()):
                writer.add_text("diagnosis/events", "  \n".join(lines), s)
    finally:
        writer.close()
    return logdir
