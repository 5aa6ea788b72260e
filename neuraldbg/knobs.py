"""The intervention knobs of the contract: one record per knob, validated once.

A knob is relative to the run as it happened (or the scenario as a zoo family defines it):
``lr_scale=1.0``, ``init_scale=1.0``, ``input_scale=1.0``, ``grad_clip=None``,
``activation=None`` and ``normalization=None`` leave it as it is. :data:`KNOBS` describes each
knob (its meaning, the values it accepts, the causal-model node it acts on and, for a
multiplier, how many decades one level of that node spans); :class:`Knobs` is one run's
setting of all of them. The zoo's runner, the CLI, the repair table and the causal model all
read these, so a new knob is added here, once.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = [
    "KNOBS",
    "KNOB_NAMES",
    "ACTIVATIONS",
    "NORMALIZATIONS",
    "Knob",
    "Knobs",
    "make_knobs",
    "validate_knobs",
]

Activation = Literal["relu", "leaky_relu", "gelu", "tanh", "sigmoid"]
Normalization = Literal["batch", "layer", "none"]

#: Values the ``activation`` knob accepts.
ACTIVATIONS: tuple[str, ...] = ("relu", "leaky_relu", "gelu", "tanh", "sigmoid")
#: Values the ``normalization`` knob accepts.
NORMALIZATIONS: tuple[str, ...] = ("batch", "layer", "none")


@dataclass(frozen=True, slots=True)
class Knob:
    """One intervention knob of the contract.

    Attributes
    ----------
    name : str
        The keyword users pass (``what_if(lr_scale=0.1)``, ``--lr-scale 0.1``).
    kind : {"multiplier", "threshold", "choice"}
        ``multiplier``: a positive factor relative to the run (1.0 changes nothing);
        ``threshold``: a positive bound (``None`` changes nothing); ``choice``: one of
        ``choices`` (``None`` changes nothing).
    description : str
        What the knob does, in words (shown by ``--help`` and in error messages).
    node : str
        The causal model's node the knob acts on.
    level_width : float or None
        For a multiplier: decades of the factor per level of ``node`` (a tenfold cut of the
        learning rate is one ``lr_level`` step). ``None`` for the other kinds.
    choices : tuple of str
        The accepted values of a ``choice`` knob; empty otherwise.
    """

    name: str
    kind: Literal["multiplier", "threshold", "choice"]
    description: str
    node: str
    level_width: float | None = None
    choices: tuple[str, ...] = ()

    def allowed(self) -> str:
        """The values the knob accepts, in words (for messages and ``--help``)."""
        if self.kind == "choice":
            return f"one of {list(self.choices)}"
        if self.kind == "multiplier":
            return "a positive multiplier (finite; 1.0 leaves the run as it was)"
        return "a positive threshold (inf: no clipping)"

    def validate(self, value: Any) -> Any:
        """``value`` checked and normalised (a float, or one of ``choices``).

        Raises
        ------
        ValueError
            If the value is not accepted; the message says what is.
        """
        if self.kind == "choice":
            if value not in self.choices:
                raise ValueError(f"Invalid value {value!r} for knob {self.name!r}. Valid "
                                 f"values are: {list(self.choices)}.")
            return value
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        # (NaN is not > 0; a threshold may be infinite: a clip that never bites)
        if not (number and float(value) > 0
                and (math.isfinite(float(value)) or self.kind == "threshold")):
            raise ValueError(f"Invalid value {value!r} for knob {self.name!r}: expected "
                             f"{self.allowed()}.")
        return float(value)


#: The contract's knobs, in the order the contract lists them.
KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("lr_scale", "multiplier", "every learning rate multiplied by k, the "
         "whole schedule included", node="lr_level", level_width=1.0),
    Knob("init_scale", "multiplier", "the initial weight matrices and kernels (ndim >= 2) "
         "multiplied by k", node="init_level", level_width=0.5),
    Knob("input_scale", "multiplier", "every input batch multiplied by k", node="input_level",
         level_width=1.0),
    Knob("grad_clip", "threshold", "total gradient norm clipped to c before each optimizer "
         "step", node="clipping"),
    Knob("activation", "choice", "saturating or rectifying activations replaced by this one",
         node="activation", choices=ACTIVATIONS),
    Knob("normalization", "choice", "this normalization after each hidden layer",
         node="normalization", choices=NORMALIZATIONS),
)}
#: Names of the knobs, in the order the contract lists them.
KNOB_NAMES: tuple[str, ...] = tuple(KNOBS)


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


def validate_knobs(**knobs: Any) -> dict[str, Any]:
    """Check knob names and values; return those that were given (not ``None``), normalised.

    Raises
    ------
    ValueError
        For an unknown knob or a value it does not accept; the message lists what is allowed.

    Examples
    --------
    >>> validate_knobs(lr_scale=0.1, activation=None)
    {'lr_scale': 0.1}
    """
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise ValueError(f"Invalid knob(s) {unknown}. Valid knobs are: {list(KNOBS)} "
                         "(the contract's intervention names).")
    return {name: KNOBS[name].validate(value) for name, value in knobs.items()
            if value is not None}


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
    return Knobs(**validate_knobs(**knobs))
