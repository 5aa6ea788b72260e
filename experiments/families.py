"""The scenario-family registry: :data:`FAMILIES`, a :class:`neuraldbg.registry_base.Registry`.

A family is a builder ``severity -> Scenario`` plus its labels (:class:`FamilySpec`). The
decorator rejects a duplicate name; a lookup miss lists the known names;
``FAMILIES.unregister(name)`` removes one.

Examples
--------
>>> from experiments.families import register_family
>>> @register_family(name="my_family", kind="failure", architecture="MLP", data="digits",
...                  description="...", failure_type="training_plateau",
...                  root_cause="learning_rate_too_low", default_severity=100.0,
...                  severities=(10.0, 100.0), baseline_severity=1.0,
...                  canonical_fix={"lr_scale": 100.0})
... def build(severity):  # doctest: +SKIP
...     return Scenario(...)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from experiments.scenario import Scenario
from neuraldbg.knobs import make_knobs
from neuraldbg.registry_base import Registry

__all__ = ["FAMILIES", "FamilySpec", "register_family", "get_family", "list_families", "build_scenario"]

Builder = Callable[[float], Scenario]


@dataclass(frozen=True, slots=True)
class FamilySpec:
    """Labels and settings of one scenario family.

    Attributes
    ----------
    name : str
        Registry name, e.g. ``"lr_too_high"``.
    kind : {"failure", "healthy"}
        A failure family or a healthy control.
    architecture : str
        ``MLP``, ``CNN``, ``CNN+BN``, ``residual``, ``GRU``, ``LSTM`` or ``Transformer``.
    data : str
        Dataset name (see :class:`experiments.scenario.DataConfig`).
    description : str
        What is injected and what it does.
    default_severity : float
        Severity of a plain run.
    severities : tuple of float
        Severities of the sweep, mildest first.
    baseline_severity : float or None
        Severity at which the fault is absent: the healthy baseline of the family for the
        manifestation check. None for healthy controls (their own baseline) and for
        families whose baseline is the same severity with ``baseline_knobs``.
    baseline_knobs : dict
        Knobs of the baseline runs (usually none).
    failure_type : str
        The symptom (``"healthy"`` for a control).
    root_cause : str
        The cause (``"none"`` for a control); the primary one of a compound family.
    root_causes : tuple of str
        Every injected cause (compound families list two).
    secondary_failure_types : tuple of str
        Further symptoms a compound family shows besides ``failure_type``.
    canonical_fix : dict
        Knobs that undo the fault; re-running with them trains healthily (checked by
        ``python -m experiments manifest --counterfactuals``).
    equivalent_fixes : tuple of dict
        Other knob settings that also make the run healthy (checked the same way).
    counterfactuals : tuple of dict
        ``{"knobs": {...}, "expected": failure_type or "healthy"}``: outcomes under knob
        changes, determined by re-running and checked the same way.
    code_fix : str
        The change to the user's code that removes a bug no knob can undo (``"call
        opt.zero_grad() every step"``); such a family may leave ``canonical_fix`` empty, and
        its counterfactuals then record the knob changes a user would try that do not help.
    """

    name: str
    kind: Literal["failure", "healthy"]
    architecture: str
    data: str
    description: str
    default_severity: float = 1.0
    severities: tuple[float, ...] = ()
    baseline_severity: float | None = None
    baseline_knobs: dict[str, Any] = field(default_factory=dict)
    failure_type: str = "healthy"
    root_cause: str = "none"
    root_causes: tuple[str, ...] = ()
    secondary_failure_types: tuple[str, ...] = ()
    canonical_fix: dict[str, Any] = field(default_factory=dict)
    equivalent_fixes: tuple[dict[str, Any], ...] = ()
    counterfactuals: tuple[dict[str, Any], ...] = ()
    code_fix: str = ""

    @property
    def counterfactual_knobs(self) -> tuple[str, ...]:
        """Names of the knobs this family's fixes and counterfactuals change."""
        names: set[str] = set(self.canonical_fix)
        for fix in self.equivalent_fixes:
            names |= set(fix)
        for cf in self.counterfactuals:
            names |= set(cf["knobs"])
        return tuple(sorted(names))

    def expected_outcomes(self) -> list[dict[str, Any]]:
        """Every knob setting with a declared outcome: fixes first, then counterfactuals."""
        out = [{"knobs": dict(self.canonical_fix), "expected": "healthy",
                "source": "canonical_fix"}]
        out += [{"knobs": dict(f), "expected": "healthy", "source": "equivalent_fix"}
                for f in self.equivalent_fixes]
        out += [{**dict(cf), "source": "counterfactual"} for cf in self.counterfactuals]
        return [o for o in out if o["knobs"]]

    def baseline_of(self, severity: float) -> tuple[float, dict[str, Any]]:
        """Severity and knobs of the healthy baseline runs for a run at ``severity``."""
        if self.kind == "healthy":
            return severity, {}
        base = severity if self.baseline_severity is None else self.baseline_severity
        return base, dict(self.baseline_knobs)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form."""
        return asdict(self)


#: Scenario families by name: ``(spec, builder)``. ``FAMILIES.unregister(name)`` removes one.
FAMILIES: Registry[tuple[FamilySpec, Builder]] = Registry("scenario family",
                                                          plural="scenario families")


def _check_spec(spec: FamilySpec) -> None:
    from neuraldbg.records import HEALTHY, failure_types, root_causes

    known_ft, known_rc = failure_types(), root_causes()  # read now: extensions count

    if spec.kind not in ("failure", "healthy"):
        raise ValueError(f"Family {spec.name!r}: kind must be 'failure' or 'healthy', "
                         f"got {spec.kind!r}.")
    if spec.kind == "healthy":
        if spec.failure_type != HEALTHY or spec.root_cause != "none":
            raise ValueError(f"Healthy family {spec.name!r} must have failure_type 'healthy' "
                             "and root_cause 'none'.")
    else:
        for ft in (spec.failure_type, *spec.secondary_failure_types):
            if ft not in known_ft:
                raise ValueError(f"Family {spec.name!r}: unknown failure_type {ft!r}. Valid "
                                 f"failure types are: {list(known_ft)}")
        for rc in (spec.root_cause, *spec.root_causes):
            if rc not in known_rc:
                raise ValueError(f"Family {spec.name!r}: unknown root_cause {rc!r}. Valid "
                                 f"root causes are: {list(known_rc)}")
        if spec.baseline_severity is None and not spec.baseline_knobs:
            raise ValueError(f"Failure family {spec.name!r} needs a baseline_severity (the "
                             "severity at which the fault is absent) or baseline_knobs (the "
                             "knobs that remove it at the same severity).")
        if not spec.canonical_fix and not spec.code_fix:
            raise ValueError(f"Failure family {spec.name!r} needs a canonical_fix (the knobs "
                             "that undo the fault) or, for a bug no knob undoes, a code_fix "
                             "(the change to the user's code that removes it).")
    for knobs in [spec.canonical_fix, spec.baseline_knobs, *spec.equivalent_fixes,
                  *(cf["knobs"] for cf in spec.counterfactuals)]:
        make_knobs(**knobs)  # raises on an unknown knob or value
    for cf in spec.counterfactuals:
        if set(cf) - {"knobs", "expected", "root_cause"} or "expected" not in cf:
            raise ValueError(f"Family {spec.name!r}: a counterfactual is a dict with 'knobs', "
                             f"'expected' and optionally 'root_cause'; got {cf!r}.")
        if cf["expected"] != HEALTHY and cf["expected"] not in known_ft:
            raise ValueError(f"Family {spec.name!r}: counterfactual outcome {cf['expected']!r} "
                             f"is not 'healthy' or one of {list(known_ft)}.")
    if spec.default_severity not in spec.severities:
        raise ValueError(f"Family {spec.name!r}: default_severity {spec.default_severity} is not "
                         f"in its severities {spec.severities}.")


def register_family(**spec_fields: Any) -> Callable[[Builder], Builder]:
    """Register a scenario family: decorator over its builder ``severity -> Scenario``.

    Parameters
    ----------
    **spec_fields
        The fields of :class:`FamilySpec`.

    Returns
    -------
    callable
        The decorator; it returns the builder unchanged.

    Raises
    ------
    ValueError
        If a family of that name is already registered, or a label or knob is invalid.
    """
    spec = FamilySpec(**spec_fields)
    if spec.root_cause != "none" and not spec.root_causes:
        spec = FamilySpec(**{**spec.to_dict(), "root_causes": (spec.root_cause,)})

    def decorator(builder: Builder) -> Builder:
        _check_spec(spec)
        FAMILIES.add(spec.name, (spec, builder))  # DuplicateNameError on a taken name
        return builder

    return decorator


def _lookup(name: str | FamilySpec) -> tuple[FamilySpec, Builder]:
    return FAMILIES.get(name.name if isinstance(name, FamilySpec) else name)


def get_family(name: str | FamilySpec) -> FamilySpec:
    """The :class:`FamilySpec` registered under ``name``.

    Raises
    ------
    neuraldbg.registry_base.UnknownNameError
        If no family has that name (a ``ValueError``); the message lists the known ones.
    """
    return _lookup(name)[0]


def list_families(kind: Literal["failure", "healthy"] | None = None) -> list[FamilySpec]:
    """Registered families (failures first, then healthy controls, each in name order).

    Parameters
    ----------
    kind : {"failure", "healthy"} or None, default=None
        Only families of that kind.
    """
    specs = [spec for spec, _ in FAMILIES.values() if kind is None or spec.kind == kind]
    return sorted(specs, key=lambda s: (s.kind != "failure", s.name))


def build_scenario(name: str | FamilySpec, severity: float | None = None) -> Scenario:
    """The scenario of family ``name`` at ``severity`` (its default when None)."""
    spec, builder = _lookup(name)
    sev = spec.default_severity if severity is None else float(severity)
    return builder(sev)
