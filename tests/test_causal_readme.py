"""The worked extension example of causal_models/README.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "causal_models" / "README.md"


def _example() -> str:
    text = README.read_text()
    after = text.split("<!-- worked-example -->", 1)[1]
    match = re.search(r"```python\n(.*?)```", after, flags=re.S)
    assert match, "the README lost its worked example"
    return match.group(1)


def test_readme_worked_example_registers_fits_and_explains() -> None:
    from causal_models import registry as cm_registry
    from experiments import families as zoo_registry

    namespace: dict[str, object] = {}
    try:
        exec(compile(_example(), str(README), "exec"), namespace)  # noqa: S102
        top = namespace["top"]
        assert top.root_cause == "positive_bias_init"
        assert "fault:positive_bias_init" in namespace["model"].structure_.states
    finally:
        if "positive_bias_init" in {c.name for c in cm_registry.list_root_causes()}:
            cm_registry.unregister("positive_bias_init")
        zoo_registry.FAMILIES.discard("sigmoid_positive_bias")
