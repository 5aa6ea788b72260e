"""Ranking the causes of one symptom: evidence decides, never list order; ties and "unknown"."""

from __future__ import annotations

from neuraldbg.hypotheses import rank_causes


def _ev(tag: str) -> dict[str, str]:
    return {"tag": tag}


def test_the_best_supported_cause_carries_the_symptom() -> None:
    kept, resolution, tied = rank_causes({"a_cause": (0.9, _ev("a")),
                                           "b_cause": (0.3, _ev("b"))}, 0.05, 3)
    assert resolution == "evidence" and tied == []
    assert [c for c, _, _ in kept][:1] == ["a_cause"]


def test_a_tie_is_reported_and_carried_by_unknown_whatever_the_listing_order() -> None:
    one = {"x_cause": (0.80, _ev("x")), "y_cause": (0.78, _ev("y"))}
    two = dict(reversed(list(one.items())))
    results = [rank_causes(c, 0.05, 3) for c in (one, two)]
    assert results[0] == results[1]
    kept, resolution, tied = results[0]
    assert resolution == "tie" and sorted(tied) == ["x_cause", "y_cause"]
    assert kept[0][0] == "unknown"


def test_unknown_with_its_own_support_beats_weak_specific_causes() -> None:
    kept, resolution, _ = rank_causes({"unknown": (0.9, _ev("u")), "a_cause": (0.4, _ev("a"))},
                                       0.05, 3)
    assert resolution == "unknown" and kept[0] == ("unknown", 0.9, _ev("u"))


def test_no_candidate_at_all_is_unknown() -> None:
    kept, resolution, _ = rank_causes({}, 0.05, 3)
    assert resolution == "unknown" and kept == [("unknown", 1.0, {})]
