"""The benchmarks: the zoo run, scored and compared; ``python -m benchmarks``.

Importing the package pins the zoo's CPU code paths first (:mod:`experiments.cpu_paths`):
numpy and OpenBLAS read theirs when numpy is imported, so every ``python -m benchmarks.*``
command computes on the same paths as the committed results.
"""

from experiments.cpu_paths import pin_cpu_paths

pin_cpu_paths()
