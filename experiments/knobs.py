"""The six intervention knobs of the contract, validated once.

Every knob is relative to the scenario as a family defines it: ``lr_scale=1.0``,
``init_scale=1.0``, ``input_scale=1.0``, ``grad_clip=None``, ``activation=None`` and
``normalization=None`` leave the scenario as it is. The runner applies them to any family in
the same way, so a counterfactual re-run is the same family with one knob changed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["KNOB_NAMES", "ACTIVATIONS", "NORMALIZATIONS", "Knobs", "make_knobs"]

Activation = Literal["relu", "leaky_relu", "gelu", "tanh", "sigmoid"]
Normalization = Literal["batch", "layer", "none"]

#: Names of the knobs, in the order the contract lists them.
KNOB_NAMES: tuple[str, ...] = (
    "lr_scale", "init_scale", "input_scale", "grad_clip", "activation", "normalization",
)
#: Values the ``activation`` knob accepts.
ACTIVATIONS: tuple[str, ...] = ("relu", "leaky_relu", "gelu", "tanh", "sigmoid")
#: Values the ``normalization`` knob accepts.
NORMALIZATIONS: tuple[str, ...] = ("batch", "layer", "none")


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            f"Invalid value {value!r} for knob {name!r}: expected a positive finite number "
            f"(a multiplier relative to the scenario, 1.0 leaves it as it is)."
        )
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"Invalid value {value!r} for knob {name!r}: expected a positive finite number "
            f"(a multiplier relative to the scenario, 1.0 leaves it as it is)."
        )
    return value


@dataclass(frozen=True, slots=True)
class Knobs:
    """Intervention knobs of one run, relative to the scenario as defined.

    Attributes
    ----------
    lr_scale : float
        Every learning rate of the run, the whole schedule included, multiplied by this.
    init_scale : float
        Initial weight matrices and kernels (``ndim >= 2``) multiplied by this after the
        scenario's own initialisation.
    input_scale : float
        Every input batch multiplied by this.
    grad_clip : float or None
        Total gradient norm clipped to this before each optimizer step; ``None`` keeps the
        scenario's own clipping (most scenarios have none).
    activation : {"relu", "leaky_relu", "gelu", "tanh", "sigmoid"} or None
        Hidden activations replaced by this one; ``None`` keeps the scenario's.
    normalization : {"batch", "layer", "none"} or None
        Normalization after each hidden layer; ``None`` keeps the scenario's.
    """

    lr_scale: float = 1.0
    init_scale: float = 1.0
    input_scale: float = 1.0
    grad_clip: float | None = None
    activation: Activation | None = None
    normalization: Normalization | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of all six knobs."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Knobs:
        """Inverse of :meth:`to_dict` (validated like :func:`make_knobs`)."""
        return make_knobs(**data)

    def changed(self) -> dict[str, Any]:
        """The knobs that differ from the scenario as defined."""
        default = Knobs()
        return {k: v for k, v in self.to_dict().items() if getattr(default, k) != v}

    def replace(self, **changes: Any) -> Knobs:
        """A copy with some knobs changed (validated)."""
        return make_knobs(**{**self.to_dict(), **changes})


def make_knobs(**knobs: Any) -> Knobs:
    """Validate knob keyword arguments and return :class:`Knobs`.

    Parameters
    ----------
    **knobs
        Any of :data:`KNOB_NAMES`.

    Returns
    -------
    Knobs

    Raises
    ------
    ValueError
        For an unknown knob or a value it does not accept; the message lists what is allowed.

    Examples
    --------
    >>> make_knobs(lr_scale=0.1).changed()
    {'lr_scale': 0.1}
    """
    unknown = sorted(set(knobs) - set(KNOB_NAMES))
    if unknown:
        raise ValueError(
            f"Invalid knob(s) {unknown}. Valid knobs are: {list(KNOB_NAMES)} "
            "(the contract's intervention names)."
        )
    out: dict[str, Any] = {}
    for name in ("lr_scale", "init_scale", "input_scale"):
        if name in knobs and knobs[name] is not None:
            out[name] = _positive(name, knobs[name])
    clip = knobs.get("grad_clip")
    if clip is not None:
        out["grad_clip"] = _positive("grad_clip", clip)
    act = knobs.get("activation")
    if act is not None:
        if act not in ACTIVATIONS:
            raise ValueError(
                f"Invalid value {act!r} for knob 'activation'. Valid values are: "
                f"{list(ACTIVATIONS)} or None to keep the scenario's activation."
            )
        out["activation"] = act
    norm = knobs.get("normalization")
    if norm is not None:
        if norm not in NORMALIZATIONS:
            raise ValueError(
                f"Invalid value {norm!r} for knob 'normalization'. Valid values are: "
                f"{list(NORMALIZATIONS)} or None to keep the scenario's normalization."
            )
        out["normalization"] = norm
    return Knobs(**out)
