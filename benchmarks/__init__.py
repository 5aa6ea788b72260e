"""The benchmarks: the zoo run, scored and compared; ``python -m benchmarks``.

Importing the package pins the zoo's CPU code paths first (:mod:`experiments.cpu_paths`):
numpy and OpenBLAS read theirs when numpy is imported, so every ``python -m benchmarks.*``
command computes on the same paths as the committed results. The commands that measure
time as a user's training sees it (:mod:`benchmarks.overhead`,
:mod:`benchmarks.probabilistic_speed`) undo the pin first (:func:`native_cpu_paths`).
"""

import os

from experiments.cpu_paths import PINNED_ENV, pin_cpu_paths

pin_cpu_paths()


def native_cpu_paths() -> None:
    """Undo :func:`~experiments.cpu_paths.pin_cpu_paths` for a command that measures time.

    The pinned paths make the numbers the same on every processor, at a cost: oneMKL's
    ``COMPATIBLE`` branch took a 256 x 256 product 2.3x longer than the processor's own on
    an AMD EPYC, which makes every training step slower and a capture overhead, a ratio to
    it, look smaller than users will see (measured on that machine, MLP 6 x 256: pinned, a
    bare step of 7.0-8.1 ms and an overhead of 1.17x every step and 1.03x every 16; on the
    processor's own paths, 4.0-4.3 ms and 1.28x and 1.07x). Call it before the command
    imports numpy or runs a torch operation (each library reads its variable then); it
    removes each pinned variable whose value is the pin's.
    """
    for name, value in PINNED_ENV.items():
        if os.environ.get(name) == value:
            del os.environ[name]
