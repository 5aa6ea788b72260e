"""``python -m benchmarks.bug_families --from-results``: sums the harness's per-run verdicts.

Unit test of one function on hand-built tables (the tables ``make bench`` writes are
exercised by ``tests/test_bench_harness.py``).
"""

from __future__ import annotations

import pandas as pd

from benchmarks.bug_families import CONTROLS, HELD_OUT, TUNING, from_results


def test_from_results_counts_each_group_with_the_harness_columns(tmp_path) -> None:
    rows = [  # (family, true failure, failure right, cause rank, confident wrong, flagged)
        (HELD_OUT[0], "exploding_gradients", True, 1.0, False, True),
        (HELD_OUT[1], "training_plateau", False, 2.0, True, True),
        (TUNING[0], "training_plateau", True, float("nan"), None, True),
        (CONTROLS[0], "healthy", True, float("nan"), None, False),
        ("lr_too_high", "exploding_gradients", True, 1.0, False, True),
    ]
    pd.DataFrame([{"family": f, "true_failure": t, "failure_correct": ok, "cause_rank": r,
                   "confident_wrong": cw, "flagged": fl, "label": "heuristic", "error": ""}
                  for f, t, ok, r, cw, fl in rows]).to_parquet(tmp_path / "records.parquet")
    pd.DataFrame([{"family": HELD_OUT[0], "split": "family", "predicted": "healthy",
                   "actual_failure": False, "error": ""},
                  {"family": HELD_OUT[0], "split": "family", "predicted": "healthy",
                   "actual_failure": True, "error": ""}]).to_parquet(
        tmp_path / "counterfactuals.parquet")
    out = from_results(str(tmp_path))
    new = out["new"]["heuristic"]
    assert (new["n_failing"], new["n_healthy"]) == (3, 1)
    assert new["failure_accuracy"].startswith("3/4")
    assert new["failure_accuracy_failing"].startswith("2/3")
    assert new["cause_ac1"].startswith("1/3") and new["confident_wrong"].startswith("1/3")
    assert new["healthy_fpr"].startswith("0/1")
    assert out["existing"]["heuristic"]["cause_ac1"].startswith("1/1")
    assert out["what_if"]["new"]["family"] == {"fixes": "1/1 = 1.00",
                                               "still_fails": "0/1 = 0.00"}
