"""The manifestation check: a labelled failure counts only where it shows.

As in DeepCrime (Humbatova et al., ISSTA 2021), a fault is *manifest* when a statistical test
on measured statistics separates the faulty runs from the healthy baseline runs of the same
family across seeds. Here: a one-sided exact Mann-Whitney U test on the family's primary
symptom statistic (p <= ``alpha``; with 3 seeds against 3 this needs complete separation),
and a median difference of at least the symptom's margin (a factor on the log scale, an
absolute difference on the linear scale). A Welch t-test on the same transformed values is
recorded as further evidence. A statistical difference alone is not a failure: every faulty
run must also fail the generic health check, and every baseline run must pass it. Healthy
controls must pass it on every seed.

The same module judges single runs (:func:`judge_outcome`): a counterfactual re-run or a
repair is healthy when its primary statistic lies within the margin of its family's
baseline runs and it passes the generic health check.

References
----------
.. [1] N. Humbatova, G. Jahangirova, P. Tonella. "DeepCrime: Mutation Testing of Deep
   Learning Systems Based on Real Faults." ISSTA 2021.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

import neuraldbg as ndb
from experiments.families import build_scenario, get_family
from experiments.runner import run_scenario
from experiments.scenario import Manifestation
from experiments.run_statistics import compute_statistic, health_report
from neuraldbg.knobs import make_knobs

__all__ = [
    "check_family",
    "check_counterfactuals",
    "judge_outcome",
    "sweep_family",
    "separation_test",
    "classify_generic",
]

_BIG = 1e6  # stands for +inf on the transformed scale (ranks only; effect sizes cap here)


def _transform(values: Sequence[float], symptom: Manifestation) -> np.ndarray:
    """Values on the comparison scale, oriented so that 'more failed' is larger."""
    v = np.asarray(values, dtype=np.float64)
    v = np.where(np.isnan(v), np.inf, v)
    if symptom.scale == "log":
        with np.errstate(divide="ignore"):
            v = np.log10(np.clip(v, 1e-30, None))
    v = np.where(np.isposinf(v), _BIG, np.where(np.isneginf(v), -_BIG, v))
    return -v if symptom.direction == "less" else v


def separation_test(fault: Sequence[float], baseline: Sequence[float], symptom: Manifestation,
                    *, alpha: float = 0.05) -> dict[str, Any]:
    """Does ``symptom`` separate faulty runs from baseline runs?

    Parameters
    ----------
    fault, baseline : sequence of float
        The statistic's value per seed.
    symptom : Manifestation
    alpha : float, default=0.05
        Level of the one-sided exact Mann-Whitney U test.

    Returns
    -------
    dict
        ``separated``, ``p_mannwhitney``, ``p_welch`` (NaN when undefined), ``effect`` (median
        difference on the comparison scale, oriented), ``margin``, the raw values.
    """
    f = _transform(fault, symptom)
    b = _transform(baseline, symptom)
    p_mw = float(stats.mannwhitneyu(f, b, alternative="greater", method="exact").pvalue)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        # nearly identical values (all seeds blew up) make the t statistic degenerate
        warnings.simplefilter("ignore", RuntimeWarning)
        if np.ptp(f) == 0 and np.ptp(b) == 0:
            p_welch = 0.0 if f[0] > b[0] else 1.0
        else:
            p_welch = float(stats.ttest_ind(f, b, equal_var=False, alternative="greater").pvalue)
    effect = float(np.median(f) - np.median(b))
    return {
        "statistic": symptom.label,
        "direction": symptom.direction,
        "scale": symptom.scale,
        "margin": symptom.margin,
        "fault_values": [float(x) for x in fault],
        "baseline_values": [float(x) for x in baseline],
        "p_mannwhitney": p_mw,
        "p_welch": p_welch if math.isfinite(p_welch) else None,
        "effect": min(effect, _BIG),
        "separated": bool(p_mw <= alpha and effect >= symptom.margin),
    }


def classify_generic(trace: ndb.Trace) -> str:
    """A coarse failure label for a run that fails the generic health check ("healthy" if
    it passes): non-finite loss, mostly dead layer, mostly saturated layer, or no learning."""
    report = health_report(trace)
    if report["healthy"]:
        return ndb.HEALTHY
    if not report["finite"]:
        return "loss_divergence"
    if report["max_dead_share"] > 0.5:
        return "dead_neurons"
    if report["max_saturated_share"] > 0.5:
        return "saturated_activations"
    return "training_plateau"


def _symptom_values(trace: ndb.Trace, symptoms: Sequence[Manifestation]) -> dict[str, float]:
    return {s.label: compute_statistic(trace, s.statistic, s.module) for s in symptoms}


def _per_step(trace: ndb.Trace, symptom: Manifestation) -> Any:  # pandas.Series over steps
    """The per-step series behind a symptom (for the empirical onset)."""
    name = symptom.statistic
    if name.startswith("@"):  # a raw recorded column (steps, or stats of symptom.module)
        from experiments.run_statistics import onset_series

        return onset_series(trace, name[1:], symptom.module).astype(float)
    if name in ("max_grad_norm", "grad_growth"):
        s = trace.steps.set_index("step")["grad_norm"]
    elif name in ("final_loss", "loss_ratio", "max_loss_jump", "nonfinite_step"):
        s = trace.steps.set_index("step")["loss"]
    elif name == "max_act":
        s = trace.stats.groupby("step")["act_max_abs"].max()
        bad = trace.stats.groupby("step")[["act_nan", "act_inf"]].sum().sum(axis=1) > 0
        s = s.where(~bad, np.inf)
    else:
        column = {"dead_share": "act_frac_dead", "saturated_share": "act_frac_saturated",
                  "out_grad_norm": "out_grad_norm", "param_grad_norm": "param_grad_norm"}[name]
        rows = trace.stats[trace.stats["module_name"] == symptom.module]
        s = rows.set_index("step")[column]
    return s.astype(float)


def _empirical_onsets(fault: Sequence[ndb.Trace], baseline: Sequence[ndb.Trace],
                      symptom: Manifestation) -> list[int | None]:
    """First step where each faulty run leaves the baseline runs' envelope (per step, in the
    failure direction, by the symptom's margin)."""
    import pandas as pd

    if symptom.statistic == "nonfinite_step":  # follow the loss itself, upwards, 1000x
        symptom = Manifestation("final_loss", direction="greater", scale="log", margin=3.0)
    base = pd.concat([_per_step(t, symptom).rename(i) for i, t in enumerate(baseline)], axis=1)
    base_t = base.apply(lambda col: pd.Series(_transform(col.to_numpy(), symptom),
                                              index=col.index))
    upper = base_t.max(axis=1)
    out: list[int | None] = []
    for trace in fault:
        s = _per_step(trace, symptom)
        vals = pd.Series(_transform(s.to_numpy(), symptom), index=s.index)
        joined = pd.concat([vals.rename("f"), upper.rename("u")], axis=1).dropna(subset=["f"])
        hit = joined.index[(joined["f"] - joined["u"].fillna(-_BIG)) >= symptom.margin]
        out.append(int(hit[0]) if len(hit) else None)
    return out


def check_family(name: str, severity: float | None = None, seeds: Sequence[int] = (0, 1, 2), *,
                 alpha: float = 0.05, fault_traces: Sequence[ndb.Trace] | None = None,
                 baseline_traces: Sequence[ndb.Trace] | None = None) -> dict[str, Any]:
    """Run (or take) the faulty and baseline runs of a family and test manifestation.

    Parameters
    ----------
    name : str
        A registered family.
    severity : float, optional
        The family's default severity when None.
    seeds : sequence of int, default=(0, 1, 2)
    alpha : float, default=0.05
    fault_traces, baseline_traces : sequence of Trace, optional
        Runs already made (the suite passes its own); missing ones are run here.

    Returns
    -------
    dict
        JSON-compatible evidence: ``manifest`` (failure families) or ``healthy`` (controls),
        the per-symptom tests, the baseline health, measured and empirical onsets.
    """
    spec = get_family(name)
    sev = spec.default_severity if severity is None else float(severity)
    scen = build_scenario(spec, sev)
    if fault_traces is None:
        fault_traces = [run_scenario(name, severity=sev, seed=s) for s in seeds]
    health = [health_report(t) for t in fault_traces]
    if spec.kind == "healthy":
        ok = all(h["healthy"] for h in health)
        return {"checked": True, "family": name, "kind": "healthy", "severity": sev,
                "seeds": list(seeds), "healthy": ok, "manifest": False,
                "health": [_jsonable(h) for h in health],
                "method": "generic health check on every seed: finite loss, final/initial "
                          "loss <= 0.7, no layer > 50% dead or saturated"}
    base_sev, base_knobs = spec.baseline_of(sev)
    if baseline_traces is None:
        baseline_traces = [run_scenario(name, severity=base_sev, seed=s, **base_knobs)
                           for s in seeds]
    base_health = [health_report(t) for t in baseline_traces]
    tests = []
    for symptom in scen.manifestations:
        f = [compute_statistic(t, symptom.statistic, symptom.module) for t in fault_traces]
        b = [compute_statistic(t, symptom.statistic, symptom.module) for t in baseline_traces]
        tests.append(separation_test(f, b, symptom, alpha=alpha))
    primary = tests[0]
    onsets = [(t.ground_truth or {}).get("onset_step") for t in fault_traces]
    onset_symptom = scen.manifestations[0]
    rule = scen.onset
    if rule is not None and rule.kind in ("twin", "crossing") and rule.statistic is not None:
        # follow the statistic the onset rule follows, against all baseline seeds
        onset_symptom = Manifestation(f"@{rule.statistic}", module=rule.module,
                                direction="greater" if rule.direction == "above" else "less",
                                scale=rule.scale, margin=rule.margin)
    empirical = _empirical_onsets(fault_traces, baseline_traces, onset_symptom)
    tol = scen.onset.tolerance if scen.onset is not None else 0
    consistent = all(o is not None and e is not None and abs(o - e) <= tol
                     for o, e in zip(onsets, empirical))
    baseline_crossings = None
    if scen.onset is not None and scen.onset.kind == "crossing":
        from experiments.runner import measure_onset

        baseline_crossings = [measure_onset(t, scen.onset) for t in baseline_traces]
    baseline_ok = all(h["healthy"] for h in base_health)
    faults_fail = not any(h["healthy"] for h in health)
    return {
        "checked": True,
        "family": name,
        "kind": "failure",
        "severity": sev,
        "seeds": list(seeds),
        "baseline": {"severity": base_sev, "knobs": base_knobs,
                     "healthy": baseline_ok, "health": [_jsonable(h) for h in base_health]},
        "manifest": bool(primary["separated"] and baseline_ok and faults_fail),
        "faults_fail_health_check": faults_fail,
        "fault_health": [_jsonable(h) for h in health],
        "tests": tests,
        "onset_steps": onsets,
        "empirical_onsets": empirical,
        "onset_tolerance": tol,
        "onset_consistent": consistent,
        "baseline_onset_crossings": baseline_crossings,
        "method": f"one-sided exact Mann-Whitney U (alpha={alpha}) on the primary symptom "
                  "plus a median difference >= its margin; every faulty run fails and every "
                  "baseline run passes the generic health check",
    }


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, (np.floating, np.integer, np.bool_)):
        return _jsonable(obj.item())
    return obj


_BASELINE_CACHE: dict[tuple[str, float], list[dict[str, float]]] = {}


def _baseline_values(name: str, severity: float, seeds: Sequence[int]) -> list[dict[str, float]]:
    key = (name, severity)
    if key not in _BASELINE_CACHE:
        spec = get_family(name)
        scen = build_scenario(spec, severity)
        base_sev, base_knobs = spec.baseline_of(severity)
        _BASELINE_CACHE[key] = [
            _symptom_values(run_scenario(name, severity=base_sev, seed=s, **base_knobs),
                            scen.manifestations)
            for s in seeds
        ]
    return _BASELINE_CACHE[key]


def judge_outcome(trace: ndb.Trace, *, seeds: Sequence[int] = (0, 1, 2)) -> dict[str, Any]:
    """Judge one zoo run (a counterfactual re-run, a repair): healthy or which failure.

    The run still shows its family's failure when its primary symptom lies beyond every
    baseline run by the symptom's margin and it fails the generic health check; otherwise it
    is healthy if it passes that check, else it gets the generic label of
    :func:`classify_generic`. Baseline runs
    are made once per family and severity and cached for the process.

    Returns
    -------
    dict
        ``outcome`` ("healthy" or a failure type) and the evidence.
    """
    gt = trace.ground_truth or {}
    if "family" not in gt:
        raise ValueError("judge_outcome needs a run made by experiments.run_scenario (its "
                         "ground truth names the family).")
    spec = get_family(gt["family"])
    generic = classify_generic(trace)
    if spec.kind == "healthy":
        return {"outcome": generic, "generic": generic}
    sev = float(gt["severity"])
    scen = build_scenario(spec, sev)
    primary = scen.manifestations[0]
    value = compute_statistic(trace, primary.statistic, primary.module)
    base = [b[primary.label] for b in _baseline_values(spec.name, sev, seeds)]
    v = _transform([value], primary)[0]
    b = _transform(base, primary)
    persists = bool(v - b.max() >= primary.margin) and generic != ndb.HEALTHY
    outcome = spec.failure_type if persists else generic
    return {"outcome": outcome, "persists": persists, "generic": generic,
            "statistic": primary.label, "value": value, "baseline_values": base}


def check_counterfactuals(name: str, seeds: Sequence[int] = (0, 1, 2)) -> list[dict[str, Any]]:
    """Re-run every declared fix and counterfactual of a family and compare outcomes.

    Returns
    -------
    list of dict
        One per declared knob setting: knobs, expected, the judged outcome per seed, and
        ``agrees`` (every seed judged as declared).
    """
    spec = get_family(name)
    results = []
    for item in spec.expected_outcomes():
        knobs = make_knobs(**item["knobs"]).changed()
        outcomes = [judge_outcome(run_scenario(name, seed=s, **knobs), seeds=seeds)["outcome"]
                    for s in seeds]
        results.append({"knobs": knobs, "expected": item["expected"], "source": item["source"],
                        "outcomes": outcomes,
                        "agrees": all(o == item["expected"] for o in outcomes)})
    return results


def sweep_family(name: str, seeds: Sequence[int] = (0, 1, 2)) -> list[dict[str, Any]]:
    """The manifestation check at every severity of a failure family (mildest first)."""
    spec = get_family(name)
    if spec.kind != "failure":
        raise ValueError(f"{name!r} is a healthy control; only failure families have severities "
                         "to sweep.")
    return [check_family(name, severity=s, seeds=seeds) for s in spec.severities]
