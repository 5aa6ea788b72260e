"""The one registry type: duplicates rejected, misses list the known names, public removal."""

from __future__ import annotations

import pytest

import experiments
from experiments.families import FAMILIES, register_family
from neuraldbg.errors import NeuralDbgError
from neuraldbg.methods import METHODS, register_method, unregister_method
from neuraldbg.records import extend_vocabulary, failure_types, retract_vocabulary, root_causes
from neuraldbg.registry_base import DuplicateNameError, Registry, UnknownNameError


def test_register_get_names_and_order() -> None:
    reg: Registry[int] = Registry("widget")

    @reg.register("b")
    def b() -> int:  # a decorator returns what it decorates
        return 2

    assert reg.add("a", 1) == 1
    assert reg.names() == ["b", "a"] and list(reg) == ["b", "a"] and len(reg) == 2
    assert reg.get("b") is b and "a" in reg and "c" not in reg
    assert reg.items() == [("b", b), ("a", 1)] and reg.values() == [b, 1]


def test_duplicate_is_rejected_before_decorating() -> None:
    reg: Registry[int] = Registry("widget")
    reg.add("a", 1)
    with pytest.raises(DuplicateNameError,
                       match=r"widget named 'a' is already registered.*\['a'\]"):
        reg.register("a")
    with pytest.raises(ValueError, match="already registered"):
        reg.add("a", 2)
    assert reg.get("a") == 1
    with pytest.raises(ValueError, match="non-empty string"):
        reg.add("", 3)


def test_a_miss_is_one_error_that_lists_the_known_names() -> None:
    reg: Registry[int] = Registry("family", plural="families")
    reg.add("x", 1)
    with pytest.raises(UnknownNameError) as info:
        reg.get("y")
    err = info.value
    assert isinstance(err, KeyError) and isinstance(err, ValueError)
    assert isinstance(err, NeuralDbgError)
    assert str(err) == "Unknown family 'y'. Known families are: ['x']."  # no KeyError quotes
    with pytest.raises(KeyError):
        reg.unregister("y")


def test_unregister_and_discard() -> None:
    reg: Registry[int] = Registry("widget")
    reg.add("a", 1)
    assert reg.unregister("a") == 1 and "a" not in reg
    reg.discard("a")  # tolerated
    reg.add("a", 5)  # the name is free again
    assert reg.get("a") == 5


def test_methods_use_it_with_a_public_unregister() -> None:
    @register_method("registry_test_method")
    class Method:
        def explain(self, trace: object) -> list:
            return []

    try:
        assert METHODS.get("registry_test_method") is Method
    finally:
        assert unregister_method("registry_test_method") is Method
    assert "registry_test_method" not in METHODS
    with pytest.raises(UnknownNameError, match="Unknown diagnosis method"):
        unregister_method("registry_test_method")


def test_vocabulary_extensions_are_registered_and_retracted() -> None:
    extend_vocabulary(failure_types=("registry_test_ft",), root_causes=("registry_test_rc",))
    extend_vocabulary(failure_types=("registry_test_ft",))  # twice: harmless
    try:
        assert failure_types()[-1] == "registry_test_ft"
        assert root_causes()[-1] == "registry_test_rc"
    finally:
        retract_vocabulary("registry_test_ft")
        retract_vocabulary("registry_test_rc")
    assert "registry_test_ft" not in failure_types()
    assert "registry_test_rc" not in root_causes()
    retract_vocabulary("vanishing_gradients")  # the contract's own names stay
    assert "vanishing_gradients" in failure_types()


def test_zoo_families_use_it() -> None:
    spec = experiments.get_family("lr_too_high")
    with pytest.raises(DuplicateNameError, match="scenario family named 'lr_too_high'"):
        register_family(**spec.to_dict())(lambda severity: None)
    with pytest.raises(KeyError, match="Known scenario families are"):
        experiments.get_family("no_such_family")
    assert "lr_too_high" in FAMILIES
