"""The CPU code paths every zoo run is pinned to, so that a seed gives one run on any machine.

One thread and deterministic algorithms (:func:`experiments.runner.pinned_execution`) are
not enough for a run to be the same bit for bit on another machine of the same kind: the
libraries under torch choose their kernels by the processor they find. Measured on a Xeon
with AVX-512 against the committed report of an earlier machine of the same kind, the
default suite's zoo runs differed (heuristic cause AC@1 0.98 there, 1.00 here, from the same
commit). Each choice and its pin:

- ATen's vectorised kernels (reductions, ``log_softmax``, ...) are compiled for several
  instruction sets and dispatched on the best one present: ``ATEN_CPU_CAPABILITY=avx2``,
  read once, at the first operation of the process.
- oneMKL (matrix products, and the ``tanh`` and ``exp`` of its vector library) picks its
  branch by the processor and blocks by its cache sizes: conditional numerical
  reproducibility on its ``COMPATIBLE`` branch (SSE2 without the approximate reciprocal
  instructions; read at oneMKL's first call), the one branch Intel supports on every x86-64
  processor, Intel's or not. The branches named after an instruction set are for Intel
  processors only: on an AMD EPYC of this kind ``MKL_CBWR=AVX2,STRICT`` fell back to the
  processor's own branch without a word (``MKL_VERBOSE=1`` printed ``CNR:AUTO,STRICT``), and
  the default suite's zoo runs there gave heuristic cause AC@1 0.98 against the committed
  1.00 of a Xeon, from the same commit.
- oneDNN (convolutions) and NNPACK JIT or dispatch their kernels by processor and cache:
  both off inside a run (:func:`kernel_flags`), so a convolution is an unfold and a oneMKL
  product, pinned as above.
- numpy dispatches its ufunc loops (``exp``, ``log``, sums) on the processor's SIMD level,
  and the OpenBLAS it bundles (with scipy's) picks a kernel per processor: the model fits,
  the posteriors and the baselines compute with them. Measured: with numpy on its AVX-512
  loops and OpenBLAS on SkylakeX kernels rather than AVX2 and Haswell, the same zoo runs
  gave a baseline's cause AC@3 16/54 rather than 15/54 and moved the probabilistic method's
  ECE in the last digits. ``NPY_DISABLE_CPU_FEATURES`` (the AVX-512 levels),
  ``OPENBLAS_CORETYPE=Haswell`` and one OpenBLAS thread, all read when numpy is imported.

AVX2 is the newest instruction set every x86-64 server of the last decade has; on a machine
without it ATen falls back to its portable kernels and the runs differ (the provenance says
so, :func:`cpu_paths`).

References
----------
Intel. oneMKL Developer Guide, "Obtaining Numerically Reproducible Results" (2024).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["PINNED_ENV", "pin_cpu_paths", "cpu_paths", "kernel_flags", "check_pinned"]

#: The environment every zoo run computes under (see the module docstring).
PINNED_ENV: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE",
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    "OPENBLAS_CORETYPE": "Haswell",
    "OPENBLAS_NUM_THREADS": "1",
}
#: The variables numpy and OpenBLAS read when numpy is imported (too late after that).
_AT_NUMPY_IMPORT = ("NPY_DISABLE_CPU_FEATURES", "OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS")
_numpy_first = False


def pin_cpu_paths() -> None:
    """Set :data:`PINNED_ENV` in this process's environment (a value already set is kept).

    Call it before the process imports numpy (numpy and OpenBLAS read theirs then) and
    before its first torch operation (ATen reads its capability then): ``experiments`` does
    on import, and the benchmark's and the tests' entry points import it first of all.
    Worker processes, started with ``spawn``, inherit it.
    """
    global _numpy_first
    if "numpy" in sys.modules and any(k not in os.environ for k in _AT_NUMPY_IMPORT):
        _numpy_first = True
    for name, value in PINNED_ENV.items():
        os.environ.setdefault(name, value)


def cpu_paths() -> dict[str, Any]:
    """The code paths this process computes with, for a result's provenance.

    ``processor`` names the machine's processor (vendor and model, from ``/proc/cpuinfo``):
    the paths should make it irrelevant, and where two machines disagree it says which.
    """
    import torch

    return {"processor": _processor(),
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "numpy_pinned": not _numpy_first,
            **{k.lower(): os.environ.get(k, "(unpinned)") for k in PINNED_ENV
               if k != "ATEN_CPU_CAPABILITY"},
            "mkldnn_in_runs": False, "nnpack_in_runs": False}


def _processor() -> str:
    """Vendor and model name of the first processor in ``/proc/cpuinfo`` ("unknown" without)."""
    import platform

    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    parts = [fields.get("vendor_id", ""), fields.get("model name", "")]
    return " ".join(p for p in parts if p) or platform.processor() or "unknown"


_warned = False


def check_pinned() -> None:
    """Warn once when this process does not compute on the pinned code paths.

    It happens when the process computed with torch before :func:`pin_cpu_paths` ran (import
    ``experiments`` first, or set ``ATEN_CPU_CAPABILITY=avx2`` in the environment), imported
    numpy before it, set one of :data:`PINNED_ENV` to another value itself, or runs on a
    processor without AVX2; the runs then differ from the committed results in the last
    bits, and a run on a knife edge can change its outcome.
    """
    global _warned
    import torch

    want = PINNED_ENV["ATEN_CPU_CAPABILITY"].upper()
    have = torch.backends.cpu.get_cpu_capability()
    late = [f"ATen capability {have}, not the pinned {want}"] if have != want else []
    late += [f"{k}={os.environ.get(k)!r}, not {v!r}" for k, v in PINNED_ENV.items()
             if k != "ATEN_CPU_CAPABILITY" and os.environ.get(k) != v]
    if _numpy_first:
        late.append("numpy imported before the pin (its SIMD and OpenBLAS kernels unpinned)")
    if late and not _warned:
        _warned = True
        pinned = " ".join(f"{k}={shlex.quote(v)}" for k, v in PINNED_ENV.items())
        warnings.warn(
            f"zoo runs in this process compute with {'; '.join(late)}, so they may differ "
            f"from the committed results in the last bits. Import experiments before numpy "
            f"and any torch operation, or start the process with {pinned}.", RuntimeWarning,
            stacklevel=3)


@contextlib.contextmanager
def kernel_flags() -> Iterator[None]:
    """Turn oneDNN and NNPACK off for the block (their kernels depend on the processor)."""
    import torch

    # set_flags with the other settings None: ``mkldnn.flags`` would also set TF32 (and warn)
    mkldnn = torch.backends.mkldnn.set_flags(False, None, None, None)
    with torch.backends.nnpack.flags(enabled=False):
        try:
            yield
        finally:
            torch.backends.mkldnn.set_flags(mkldnn[0], None, None, None)
