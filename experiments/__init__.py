"""The failure zoo: reproducible training failures with ground truth.

Scenario families make real training runs fail in known ways (or stay healthy, as
controls). Each run is seeded, deterministic, recorded with :class:`neuraldbg.NeuralDbg` and
labelled in ``trace.meta["ground_truth"]``; ``trace.meta["config"]`` holds only what a user's
own config would.

>>> from experiments import list_families, run_scenario, run_counterfactual
>>> trace = run_scenario("lr_too_high", seed=0)                 # doctest: +SKIP
>>> fixed = run_counterfactual(trace, lr_scale=0.1)             # doctest: +SKIP
"""

from experiments.cpu_paths import pin_cpu_paths

pin_cpu_paths()  # before any torch operation: ATen reads its capability at the first one

from experiments import (  # noqa: E402, F401 - importing a family module registers its families
    activations,
    compound,
    healthy,
    init,
    inputs,
    lr,
    numerics,
    structural,
    user_bug_controls,
    user_bugs,
)
from experiments.families import (  # noqa: E402
    FamilySpec,
    get_family,
    list_families,
    register_family,
)
from experiments.runner import run_counterfactual, run_scenario  # noqa: E402
from neuraldbg.knobs import KNOB_NAMES, Knobs, make_knobs  # noqa: E402

__all__ = [
    "FamilySpec",
    "Knobs",
    "KNOB_NAMES",
    "get_family",
    "list_families",
    "make_knobs",
    "register_family",
    "run_counterfactual",
    "run_scenario",
]
