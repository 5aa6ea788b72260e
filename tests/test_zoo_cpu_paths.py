"""The zoo's runs compute on pinned CPU code paths (experiments.cpu_paths)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments.cpu_paths import PINNED_ENV, cpu_paths
from experiments.runner import pinned_execution

ROOT = Path(__file__).resolve().parent.parent
_HAS_AVX2 = "avx2" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() \
    else False


def _python(code: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in PINNED_ENV}
    env.update(extra, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True)


@pytest.mark.skipif(not _HAS_AVX2, reason="the pinned branch needs a processor with AVX2")
def test_importing_the_zoo_pins_aten_and_mkl_in_a_fresh_process() -> None:
    out = _python("import experiments, os, torch; torch.ones(2) + 1; "
                  "print(torch.backends.cpu.get_cpu_capability(), os.environ['MKL_CBWR'])")
    assert out.stdout.split() == ["AVX2", "COMPATIBLE"]


@pytest.mark.skipif(not _HAS_AVX2, reason="the pinned branch needs a processor with AVX2")
def test_a_process_that_computed_before_the_pin_is_warned_with_the_fix() -> None:
    # ATen reads its capability at the first operation: importing the zoo after one is late
    out = _python("import warnings, torch; torch.ones(2) + 1\n"
                  "from experiments.runner import pinned_execution\n"
                  "warnings.simplefilter('always')\n"
                  "with pinned_execution(): pass\n")
    assert "not the pinned AVX2" in out.stderr
    assert "numpy imported before the pin" in out.stderr  # torch imported numpy first
    assert "ATEN_CPU_CAPABILITY=avx2" in out.stderr


@pytest.mark.skipif(not _HAS_AVX2, reason="the pinned branch needs a processor with AVX2")
def test_importing_the_zoo_first_pins_numpy_and_openblas() -> None:
    out = _python("import experiments, numpy, threadpoolctl\n"
                  "from experiments.cpu_paths import cpu_paths\n"
                  "blas = [i for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas']\n"
                  "print(cpu_paths()['numpy_pinned'], sorted({i['architecture'] for i in blas}),"
                  " sorted({i['num_threads'] for i in blas}))")
    assert out.stdout.split(maxsplit=1) == ["True", "['Haswell'] [1]\n"]


def test_onemkl_computes_on_the_pinned_branch_on_this_processor() -> None:
    # oneMKL ignores a branch the processor does not support and says nothing: only its
    # verbose log tells which branch a product ran on (an instruction-set branch such as
    # AVX2 falls back to AUTO on a processor that is not Intel's)
    out = _python("import experiments, torch\n"
                  "a = torch.ones(64, 64)\n"
                  "a @ a\n", MKL_VERBOSE="1")
    cnr = [w for line in out.stdout.splitlines() if "GEMM" in line
           for w in line.split() if w.startswith("CNR:")]
    assert cnr and set(cnr) == {"CNR:" + PINNED_ENV["MKL_CBWR"]}, out.stdout[-2000:]


def test_runs_compute_without_onednn_and_nnpack_and_restore_them() -> None:
    before = torch.backends.mkldnn.enabled
    with pinned_execution():
        assert not torch.backends.mkldnn.enabled
        # a convolution is then an unfold and a oneMKL product, pinned by MKL_CBWR
        with torch.profiler.profile() as prof:
            torch.nn.functional.conv2d(torch.randn(16, 3, 12, 12), torch.randn(4, 3, 3, 3))
        names = {e.name for e in prof.events()}
        assert not any("mkldnn" in n or "nnpack" in n for n in names), names
    assert torch.backends.mkldnn.enabled == before
    with torch.profiler.profile() as prof:  # outside a run, torch's own choice again
        torch.nn.functional.conv2d(torch.randn(16, 3, 12, 12), torch.randn(4, 3, 3, 3))
    if torch.backends.mkldnn.is_available():
        assert any("mkldnn" in e.name for e in prof.events())


def test_provenance_names_the_code_paths() -> None:
    paths = cpu_paths()
    assert paths["mkl_cbwr"] == os.environ["MKL_CBWR"]
    assert paths["aten_cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def test_every_benchmark_command_computes_on_the_pinned_paths() -> None:
    # what_if_check imports numpy at its top: the package pins before that
    out = _python("import benchmarks.what_if_check\n"
                  "from experiments.cpu_paths import cpu_paths\n"
                  "print(cpu_paths()['numpy_pinned'])")
    assert out.stdout.strip() == "True"


def test_a_path_set_otherwise_in_the_environment_is_kept_and_warned() -> None:
    out = _python("import warnings, experiments, os\n"
                  "from experiments.runner import pinned_execution\n"
                  "warnings.simplefilter('always')\n"
                  "with pinned_execution(): pass\n"
                  "print(os.environ['MKL_CBWR'])", MKL_CBWR="AUTO")
    assert out.stdout.strip() == "AUTO"  # the user's setting stands ...
    assert "MKL_CBWR='AUTO', not 'COMPATIBLE'" in out.stderr  # ... and is named
