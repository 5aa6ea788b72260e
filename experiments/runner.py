"""Train one scenario for real under :class:`neuraldbg.NeuralDbg`, knobs applied generically.

The knobs act the same way on every family:

- ``lr_scale``: the base learning rate and the whole schedule (spikes included) multiplied;
- ``init_scale``: every parameter with ``ndim >= 2`` multiplied after the family's own init;
- ``input_scale``: every input batch multiplied;
- ``grad_clip``: ``clip_grad_norm_`` to that value before each optimizer step;
- ``activation`` / ``normalization``: the model built with that activation / normalization.

A run seeds python, numpy and torch once from its seed, draws its batches from its own
generator, and trains on one intra-op thread with torch's deterministic algorithms on
(:func:`pinned_execution`, restored afterwards): the same family, severity, seed and knobs give
the same statistics bit for bit whatever the caller's thread count, worker count or scheduling
(measured: ``dead_relu_high_lr`` traces differed between 1 and 2 threads before).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

import neuraldbg as ndb
from experiments.architectures import build_model
from experiments.cpu_paths import check_pinned, kernel_flags
from experiments.datasets import load_dataset
from experiments.families import FamilySpec, build_scenario, get_family
from experiments.run_statistics import onset_series
from experiments.scenario import OnsetRule, Scenario, TrainConfig
from experiments.scripts import get_script
from neuraldbg.knobs import Knobs, make_knobs

__all__ = ["run_scenario", "run_counterfactual", "expected_outcome", "measure_onset",
           "seed_everything", "pinned_execution", "zoo_fingerprint",
           "fingerprint_sources"]

#: What a zoo run's trace depends on: the zoo, and every ``neuraldbg`` module that the
#: capture (``capture.py``) and the zoo's own ``neuraldbg`` imports reach, followed through
#: their imports (the package ``__init__`` aside), so that a new capture module is never
#: left out of the hash.
_FINGERPRINT_ROOTS = ("neuraldbg/capture.py",)


def _neuraldbg_imports(path: Path, root: Path) -> list[Path]:
    """The ``neuraldbg`` module files a source file imports, the package ``__init__`` aside.

    Both ``import neuraldbg.x`` and ``from neuraldbg import x`` count.
    """
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name.split(".")[0] != "neuraldbg" or name == "neuraldbg":
                continue
            base = root / Path(*name.split("."))
            found += [f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()]
    return found


def fingerprint_sources(root: Path | None = None) -> list[Path]:
    """Every file :func:`zoo_fingerprint` hashes, sorted.

    ``experiments/`` and the closure of the ``neuraldbg`` modules the capture and the zoo
    import.
    """
    root = root or Path(__file__).resolve().parent.parent
    zoo = sorted((root / "experiments").rglob("*.py"))
    todo = [root / r for r in _FINGERPRINT_ROOTS] + zoo
    seen: set[Path] = set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        todo += _neuraldbg_imports(f, root)
    return sorted(seen)


def zoo_fingerprint(root: Path | None = None) -> str:
    """Short hash of the zoo's and the capture's source files (what a trace depends on).

    Trace caches (the benchmark's, the default model's fit) key their runs by it, so an
    edited scenario or capture never reuses a stale trace.
    """
    import hashlib

    root = root or Path(__file__).resolve().parent.parent
    h = hashlib.sha1()
    for f in fingerprint_sources(root):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy's and torch's global generators (scenario runs only)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


@contextlib.contextmanager
def pinned_execution() -> Iterator[None]:
    """One intra-op thread, deterministic algorithms and pinned kernels for the block.

    A matrix product split over more threads sums in another order, so its float32 result
    (and a knife-edge run's outcome) would depend on the machine's load and the worker count;
    pinning inside the run, not in the caller, makes every entry point agree. The kernels are
    those of :mod:`experiments.cpu_paths` (oneDNN and NNPACK off, ATen and oneMKL on their
    AVX2 branch), so the run is also the same on another processor. Restored afterwards.
    """
    check_pinned()
    threads = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with kernel_flags():
            yield
    finally:
        torch.use_deterministic_algorithms(det, warn_only=warn_only)
        torch.set_num_threads(threads)


def _naive_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # log(sum(exp(z))) without the max shift: overflows once a logit passes ~88 (float32).
    return (logits.exp().sum(dim=1).log() - logits.gather(1, y[:, None]).squeeze(1)).mean()


def _one_hot_bce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # class labels as one-hot multi-label targets: the loss applies its own sigmoid
    return F.binary_cross_entropy_with_logits(logits, F.one_hot(y, logits.shape[1]).float())


def _loss_fn(train: TrainConfig) -> Any:
    table = {"cross_entropy": F.cross_entropy, "naive_cross_entropy": _naive_cross_entropy,
             "mse": F.mse_loss, "bce_with_logits": _one_hot_bce}
    if train.loss not in table:
        raise ValueError(f"Unknown loss {train.loss!r}. Valid values: {sorted(table)}")
    return table[train.loss]


_LOSS_NAMES = {"naive_cross_entropy": "custom_softmax_cross_entropy"}


def expected_outcome(spec: FamilySpec, severity: float, knobs: Knobs) -> dict[str, Any] | None:
    """The declared outcome of family ``spec`` at ``severity`` under ``knobs``, or None.

    The scenario as defined fails with the family's failure type; the baseline severity is
    healthy; a knob setting listed among the fixes or counterfactuals (at the default
    severity) has the outcome determined for it by re-running. Anything else is unknown.
    """
    changed = knobs.changed()
    if spec.kind == "healthy" and not changed:
        return {"expected": "healthy"}
    if spec.kind == "failure":
        base_sev, base_knobs = spec.baseline_of(severity)
        if severity == base_sev and changed == make_knobs(**base_knobs).changed():
            return {"expected": "healthy"}
        if not changed:
            return {"expected": spec.failure_type, "root_cause": spec.root_cause}
    if severity != spec.default_severity:
        return None
    for item in spec.expected_outcomes():
        if make_knobs(**item["knobs"]).changed() == changed:
            return item
    return None


def _oriented(values: np.ndarray, rule: OnsetRule) -> np.ndarray:
    v = np.where(np.isnan(values), np.inf, values)
    if rule.scale == "log":
        with np.errstate(divide="ignore"):
            v = np.log10(np.clip(v, 1e-30, None))
    v = np.where(np.isposinf(v), 1e6, v)
    return -v if rule.direction == "below" else v


def measure_onset(trace: ndb.Trace, rule: OnsetRule | None,
                  twin: ndb.Trace | None = None) -> int | None:
    """Onset step of ``trace`` under ``rule`` (None when the rule never fires).

    Parameters
    ----------
    trace : neuraldbg.Trace
        The faulty run.
    rule : OnsetRule or None
    twin : neuraldbg.Trace, optional
        The healthy twin (same seed, baseline severity); required for ``twin`` rules.
    """
    if rule is None:
        return None
    if rule.kind == "fixed":
        return rule.step
    if rule.kind == "nonfinite":
        loss = trace.steps["loss"].to_numpy(dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(loss))
        return int(trace.steps["step"].iloc[bad[0]]) if len(bad) else None
    if rule.statistic is None:
        raise ValueError(f"A {rule.kind!r} onset rule needs a statistic, got {rule}.")
    series = onset_series(trace, rule.statistic, rule.module)
    if series.empty:
        return None
    if rule.kind == "twin":
        if twin is None:
            raise ValueError("A 'twin' onset rule needs the healthy twin run.")
        ref = onset_series(twin, rule.statistic, rule.module)
        f = pd.Series(_oriented(series.to_numpy(dtype=np.float64), rule), index=series.index)
        r = pd.Series(_oriented(ref.to_numpy(dtype=np.float64), rule), index=ref.index)
        gap = (f - r.reindex(f.index)).dropna()
        hit = gap.index[gap.to_numpy() >= rule.margin]
        return int(hit[0]) if len(hit) else None
    if rule.threshold is None:
        raise ValueError(f"A 'crossing' onset rule needs a threshold, got {rule}.")
    threshold = rule.threshold * (abs(series.iloc[0]) if rule.relative else 1.0)
    values = series.to_numpy(dtype=np.float64)
    if rule.direction == "above":
        hit_mask = ~np.isfinite(values) | (values > threshold)
    else:
        hit_mask = np.isfinite(values) & (values < threshold)
    idx = np.flatnonzero(hit_mask)
    return int(series.index[idx[0]]) if len(idx) else None


def _all_param_layers(model: torch.nn.Module) -> list[str]:
    return [name for name, mod in model.named_modules()
            if len(list(mod.children())) == 0 and any(True for _ in mod.parameters(recurse=False))]


def _config(scen: Scenario, knobs: Knobs, arch: Any, grad_clip: float | None,
            data_desc: str) -> dict[str, Any]:
    """What a user's own config would say about the run: no family name, no fault label."""
    train = scen.train
    cfg: dict[str, Any] = {
        "architecture": arch.kind,
        "depth": arch.depth,
        "width": arch.width,
        "activation": arch.activation,
        "normalization": arch.normalization,
        "init": {"scheme": arch.init, "gain": arch.init_gain * knobs.init_scale},
        "optimizer": train.optimizer,
        "lr": train.lr * knobs.lr_scale,
        "momentum": train.momentum,
        "batch_size": train.batch_size,
        "steps": train.steps,
        "grad_clip": grad_clip,
        "loss": _LOSS_NAMES.get(train.loss, train.loss),
        "data": data_desc,
        "input_normalization": "standardize" if scen.data.standardize else "none",
        "input_scale": knobs.input_scale,
    }
    if arch.kind == "rnn":
        cfg["cell"] = arch.cell
    if arch.kind == "transformer":
        cfg["heads"] = arch.heads
    return cfg


def run_scenario(family: str | FamilySpec, severity: float | None = None, seed: int = 0,
                 out: str | os.PathLike[str] | None = None, every: int = 1,
                 **knobs: Any) -> ndb.Trace:
    """Train one scenario for real under NeuralDbg and return its trace.

    Parameters
    ----------
    family : str or FamilySpec
        A registered family (see :func:`experiments.list_families`).
    severity : float, optional
        Severity of the injected fault; the family's default when None.
    seed : int, default=0
        Seeds python, numpy and torch once (initialisation and batch order).
    out : str or path-like, optional
        Save the trace to this directory (``meta.json`` holds config and ground truth).
    every : int, default=1
        Record per-module statistics every ``every`` steps.
    **knobs
        ``lr_scale``, ``init_scale``, ``input_scale``, ``grad_clip``, ``activation``,
        ``normalization``, relative to the scenario (see :mod:`neuraldbg.knobs`).

    Returns
    -------
    neuraldbg.Trace
        ``trace.meta["ground_truth"]`` holds the labels; ``trace.meta["config"]`` only what
        a user's config would.

    Raises
    ------
    ValueError
        For an unknown family or knob, or a knob value it does not accept.
    """
    spec = get_family(family)
    sev = spec.default_severity if severity is None else float(severity)
    return _run(spec, sev, int(seed), out, every, make_knobs(**knobs), with_onset=True)


def _run(spec: FamilySpec, sev: float, seed: int, out: str | os.PathLike[str] | None,
         every: int, kn: Knobs, *, with_onset: bool) -> ndb.Trace:
    """Train one scenario (see :func:`run_scenario`) under :func:`pinned_execution`;
    ``with_onset=False`` skips the healthy twin a ``twin`` onset rule needs (the twin itself
    is made that way)."""
    with pinned_execution():
        return _train(spec, sev, seed, out, every, kn, with_onset=with_onset)


def _train(spec: FamilySpec, sev: float, seed: int, out: str | os.PathLike[str] | None,
           every: int, kn: Knobs, *, with_onset: bool) -> ndb.Trace:
    scen = build_scenario(spec, sev)
    arch = replace(scen.arch,
                   activation=kn.activation or scen.arch.activation,
                   normalization=kn.normalization or scen.arch.normalization)
    grad_clip = kn.grad_clip if kn.grad_clip is not None else scen.train.grad_clip
    train = scen.train

    seed_everything(seed)
    data = load_dataset(scen.data)
    model = build_model(arch, tuple(data.x.shape[1:]), data.n_classes)
    if kn.init_scale != 1.0:
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim >= 2:
                    p.mul_(kn.init_scale)
    base_lr = train.lr * kn.lr_scale
    if train.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=base_lr,
                                                     momentum=train.momentum)
    elif train.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=base_lr)
    else:
        raise ValueError(f"Unknown optimizer {train.optimizer!r}. Valid values: ['sgd', 'adam']")
    loss_fn = _loss_fn(train)
    script = get_script(train.script)

    outcome = expected_outcome(spec, sev, kn)
    label = outcome["expected"] if outcome is not None else None
    healthy = label == ndb.HEALTHY
    gt: dict[str, Any] = {
        "family": spec.name,
        "architecture": spec.architecture,
        "kind": spec.kind,
        "failure_type": label,
        "root_cause": ("none" if healthy else
                       (outcome.get("root_cause", spec.root_cause) if outcome else None)),
        "root_causes": ([] if healthy else [outcome["root_cause"]]
                        if outcome and kn.changed() and "root_cause" in outcome
                        else list(spec.root_causes)),
        "secondary_failure_types": ([] if healthy or kn.changed()
                                    else list(spec.secondary_failure_types)),
        "origin_layers": [],
        "origin_scope": "none" if healthy else scen.origin_scope,
        "onset_step": None,
        "onset_tolerance": scen.onset.tolerance if scen.onset is not None else 0,
        "onset_rule": None if healthy or scen.onset is None else scen.onset.to_dict(),
        "severity": sev,
        "seed": int(seed),
        "knobs": kn.to_dict(),
        "expected_outcome_known": outcome is not None,
        "scenario_failure_type": spec.failure_type,
        "scenario_root_cause": spec.root_cause,
        "canonical_fix": dict(spec.canonical_fix),
        "code_fix": spec.code_fix,
        "equivalent_fixes": [dict(f) for f in spec.equivalent_fixes],
        "counterfactuals": [dict(c) for c in spec.counterfactuals],
        "manifestation": {"checked": False,
                          "how": "python -m experiments manifest, or the suite, records it"},
    }
    if not healthy and spec.kind == "failure":
        gt["origin_layers"] = (_all_param_layers(model) if scen.origin_scope == "global"
                               else list(scen.origin_layers))
    config = _config(scen, kn, arch, grad_clip, data.description)

    gen = torch.Generator().manual_seed(seed)
    n = len(data.y)
    params = [p for p in model.parameters() if p.requires_grad]

    def clip() -> None:
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)

    if script.setup is not None:
        script.setup(model)
    first_bad: int | None = None
    dbg = ndb.NeuralDbg(model, optimizer=opt, every=every, config=config, seed=int(seed),
                        ground_truth=gt)
    with dbg:
        for step in range(train.steps):
            factor = 1.0
            if train.lr_spike is not None:
                s0, mult, length = train.lr_spike
                if s0 <= step < s0 + length:
                    factor = mult
            for group in opt.param_groups:
                group["lr"] = base_lr * factor
            idx = torch.randint(0, n, (train.batch_size,), generator=gen)
            xb = data.x[idx]
            if kn.input_scale != 1.0:
                xb = xb * kn.input_scale
            yb = data.y[idx]
            if train.noisy_batch_every and step > 0 and step % train.noisy_batch_every == 0:
                yb = torch.randint(0, data.n_classes, yb.shape, generator=gen)
            loss = script.step(model, opt, loss_fn, xb, yb, clip, step, train.script_period)
            dbg.step(loss)
            if first_bad is None and not math.isfinite(float(loss.detach())):
                first_bad = step
            if first_bad is not None and step - first_bad >= train.stop_after_nonfinite:
                break
    trace = dbg.trace
    if not healthy and spec.kind == "failure" and label is not None and with_onset:
        twin = None
        if scen.onset is not None and scen.onset.kind == "twin":
            base_sev, base_knobs = spec.baseline_of(sev)
            twin_knobs = kn.replace(**base_knobs)
            twin = _run(spec, base_sev, seed, None, every, twin_knobs, with_onset=False)
        gt["onset_step"] = measure_onset(trace, scen.onset, twin)
    trace.meta["ground_truth"] = gt
    if out is not None:
        trace.save(Path(out), overwrite=True)
    return trace


def run_counterfactual(trace: ndb.Trace, out: str | os.PathLike[str] | None = None,
                       every: int | None = None, **knobs: Any) -> ndb.Trace:
    """Re-run the scenario of ``trace`` (same family, severity and seed) with knobs changed.

    Knobs not given keep the values the original run used.

    Parameters
    ----------
    trace : neuraldbg.Trace
        A run made by :func:`run_scenario` (its ``meta["ground_truth"]`` names the scenario).
    out : str or path-like, optional
        Save the new trace there.
    every : int, optional
        Recording interval; the original run's when None.
    **knobs
        Knob changes, e.g. ``lr_scale=0.1``.

    Returns
    -------
    neuraldbg.Trace

    Raises
    ------
    ValueError
        If the trace carries no zoo ground truth, or for an invalid knob.
    """
    gt = trace.meta.get("ground_truth") or {}
    if "family" not in gt or "severity" not in gt or "seed" not in gt:
        raise ValueError(
            "run_counterfactual needs a trace made by experiments.run_scenario: its "
            "meta['ground_truth'] must name the family, severity and seed (got keys "
            f"{sorted(gt)}). Use run_scenario(family, ...) for other runs."
        )
    used = dict(gt.get("knobs") or {})
    merged = make_knobs(**{**used, **knobs})
    return run_scenario(gt["family"], severity=gt["severity"], seed=int(gt["seed"]), out=out,
                        every=int(every if every is not None else trace.meta.get("every", 1)),
                        **merged.to_dict())
