"""The paper's knob-effect (DoWhy) section, on hand-built results (a unit test of one function)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # papers is not installed
from papers import build  # noqa: E402


def test_newcombe_matches_the_published_example() -> None:
    from scipy.stats import binomtest

    # Newcombe (1998), Stat. Med. 17:873, example (a): 56/70 vs 48/80 -> [0.0524, 0.3339]
    a, b = (binomtest(k, n).proportion_ci(method="wilson") for k, n in ((56, 70), (48, 80)))
    low, high = build._newcombe(56 / 70, [a.low, a.high], 48 / 80, [b.low, b.high])
    assert low == pytest.approx(0.0524, abs=2e-4) and high == pytest.approx(0.3339, abs=2e-4)


def _effect(name: str, rand: float, dowhy: dict, net: float) -> dict:
    return {"treatment": name, "n_treated": 50, "n_control": 100, "randomised": rand,
            "p_fail_treated": [0.6, [0.46, 0.72]], "p_fail_control": [0.6 - rand, [0.5 - rand, 0.7 - rand]],
            "dowhy": dowhy, "confounded": {"n": 80, "naive": rand + 0.2, "adjusted": rand + 0.05},
            "network_do": net}


def test_knob_effect_table_and_finding(tmp_path: Path) -> None:
    missing = build.knob_effects_section(tmp_path / "absent.json")
    assert build.KNOB_EFFECTS_COMMAND in missing and "|" not in missing
    ok = {"estimate": 0.5, "placebo": 0.01, "random_common_cause": 0.5, "data_subset": 0.48}
    bad = {"estimate": 0.0, "placebo": 0.2, "random_common_cause": 0.0, "data_subset": 0.3}
    path = tmp_path / "knob_effects.json"
    path.write_text(json.dumps({"runs": 150, "failure_rate": 0.3, "effects": [
        _effect("lr >= 10x", 0.5, ok, 0.3), _effect("sigmoid units", 0.0, bad, -0.4)]}))
    text = build.knob_effects_section(path)
    rows = [line for line in text.splitlines() if line.startswith("| lr") or
            line.startswith("| sigmoid")]
    assert len(rows) == 2
    assert "+0.01 pass / +0.50 pass / +0.48 pass" in rows[0]
    assert "+0.20 FAIL / +0.00 pass / +0.30 FAIL" in rows[1]
    assert "excludes zero for 1 of 2 treatments: lr >= 10x (+0.50)" in text
    assert "pass for every treatment but sigmoid units" in text
    assert "closer to the randomised effect than the naive difference for 2 of 2" in text
    assert "has the sign of 1 of the 1 effects" in text
    assert text == build.knob_effects_section(path)  # the same text every time


def test_the_committed_ablation_run_joins_when_no_local_one_exists(tmp_path: Path) -> None:
    """A fresh clone has no results/ablation: the committed copy's rows join the default
    report if it scored the same runs, and a local ablation run takes precedence."""
    results = tmp_path / "results" / "default"
    results.mkdir(parents=True)
    assert build.ablation_dir(results) == build.COMMITTED_ABLATION
    committed = json.loads((build.COMMITTED_ABLATION / "metrics.json").read_text())
    rows = [k for k in committed["methods"] if k.startswith("probabilistic[family/")]
    assert sorted(rows) == sorted(f"probabilistic[family/{n}]" for n in (
        "no-rule-sensor", "run-level", "priors-only", "randomised"))
    same = {"suite": committed["suite"], "notes": committed["notes"],
            "methods": {"heuristic": committed["methods"]["heuristic"]}}
    joined = build.with_ablation_rows(same, build.ablation_dir(results))
    assert set(rows) <= set(joined["methods"]) and joined["ablation_source"]["differs"] == []
    other = {**same, "notes": {**committed["notes"], "zoo_fingerprint": "another-zoo"}}
    kept = build.with_ablation_rows(other, build.ablation_dir(results))
    assert not set(rows) & set(kept["methods"])
    assert kept["ablation_source"]["differs"] == ["notes.zoo_fingerprint"]
    local = tmp_path / "results" / "ablation"
    local.mkdir()
    (local / "metrics.json").write_text("{}")
    assert build.ablation_dir(results) == local
