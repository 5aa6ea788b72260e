"""Each knob's average causal effect on failure: randomised runs, DoWhy, the network's do().

``python -m benchmarks.knob_effects --runs 160`` draws knob settings at random for each run
(the learning-rate and init multipliers log-uniform, the activation, normalization and
clipping uniform over their choices) on the zoo's healthy MLP, CNN and residual recipes,
trains every run (cached as the benchmark caches runs) and judges it with the zoo's judge
(:func:`benchmarks.runs.run_outcome`). Because the knobs were assigned at random, the
difference in failure rates between a knob's arms is an unbiased estimate of its average
effect: the re-run answer. For each binary treatment (a rate ten times the recipe's or more,
an init three times or more, sigmoid units, batch normalization, clipping at 1) it reports:

- ``randomised``: the difference in failure rates between the arms, with a Wilson interval
  per arm;
- ``dowhy``: DoWhy's estimate of the same effect (identified by the back-door criterion with
  the other knobs and the recipe as common causes, estimated by linear regression), with its
  three refuters: a placebo treatment (the effect should vanish), a random common cause and
  a random half of the data (the effect should stay);
- ``confounded``: on an observational subset in which the treated runs were picked where
  failure is likelier anyway (sigmoid units for every treatment but the activation's, the
  CNN recipe for that), the naive difference in failure rates and DoWhy's adjusted estimate,
  which should move back to the randomised one;
- ``network``: the shipped causal network's ``do()`` of the corresponding node, averaged over
  this corpus's runs (g-computation): for each run, with its architecture and its other
  drawn knobs kept and no bug in its code, P(failure | do(treated levels)) - P(failure |
  do(control levels)), the levels those the arms' multipliers reach from a recipe at "ok"
  (``network_do``); and the same under the network's own priors for everything else
  (``network_do_prior``: the zoo's population, where half the runs carry a code bug).

It writes ``results/knob_effects.json`` and prints one table.
"""

from __future__ import annotations

import argparse
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import causal_models
from benchmarks.runs import RunSpec, execute_run, load, run_outcome, run_path, zoo_fingerprint
from causal_models.labels import level_index
from causal_models.posterior import joint_posterior
from causal_models.registry import KNOB_NODES, list_root_causes
from causal_models.structure import LEVEL_WIDTH, unmodelled_causes
from neuraldbg.records import HEALTHY
from neuraldbg.trace import Trace

__all__ = ["TREATMENTS", "CauseRule", "CAUSE_RULE", "draw_knobs", "corpus_specs", "run_corpus",
           "label_randomised_run", "estimate", "main"]

#: Seeds of the randomised runs start here (apart from the zoo's fit and score seeds).
FIRST_SEED = 2000

#: The zoo's healthy recipes the corpus randomises (fast, three architectures).
RECIPES: tuple[str, ...] = ("healthy_mlp", "healthy_cnn", "healthy_resnet")
#: Binary treatments: name -> (column, test on the drawn value, network node, control
#: level(s), treated level(s)).
TREATMENTS: dict[str, tuple[str, Any, str, tuple[str, ...], tuple[str, ...]]] = {
    "lr >= 10x": ("lr_scale", lambda v: v >= 10.0, "lr_level", ("low", "ok"),
                  ("high", "very_high")),
    "init >= 3x": ("init_scale", lambda v: v >= 3.0, "init_level", ("small", "ok"),
                   ("large", "very_large")),
    "sigmoid units": ("activation", lambda v: v == "sigmoid", "activation", ("relu",),
                      ("sigmoid",)),
    "batch norm": ("normalization", lambda v: v == "batch", "normalization", ("none",),
                   ("batch",)),
    "clip at 1": ("grad_clip", lambda v: v == 1.0, "clipping", ("none",), ("peaks",)),
}


def draw_knobs(rng: np.random.Generator) -> dict[str, Any]:
    """One run's knobs, drawn at random (every knob independent of every other)."""
    return {"lr_scale": float(10.0 ** rng.uniform(-1.5, 2.0)),
            "init_scale": float(10.0 ** rng.uniform(-0.5, 0.75)),
            "activation": str(rng.choice(["relu", "tanh", "sigmoid"])),
            "normalization": str(rng.choice(["none", "batch"])),
            "grad_clip": float(rng.choice([0.0, 1.0]))}


def corpus_specs(n_runs: int, seed: int) -> list[tuple[RunSpec, dict[str, Any]]]:
    """The randomised corpus's first ``n_runs`` runs and each run's drawn knobs.

    Run ``i`` trains recipe ``RECIPES[i % 3]`` at seed ``FIRST_SEED + i`` with knobs drawn by
    :func:`draw_knobs` from one generator seeded ``seed``; the spec asks only for the knobs
    that differ from the recipe (no clipping, no normalization are its defaults).
    """
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_runs):
        knobs = draw_knobs(rng)
        asked = {k: v for k, v in knobs.items() if not (k == "grad_clip" and v == 0.0)}
        if asked.get("normalization") == "none":
            asked.pop("normalization")
        out.append((RunSpec(RECIPES[i % len(RECIPES)], None, FIRST_SEED + i, asked), knobs))
    return out


def run_corpus(n_runs: int, seed: int, run_dir: Path) -> pd.DataFrame:
    """Train ``n_runs`` randomised runs (cached); one row per run with knobs and outcome."""
    fingerprint = zoo_fingerprint()
    rows = []
    for spec, knobs in corpus_specs(n_runs, seed):
        path = run_path(run_dir, spec, fingerprint)
        execute_run(spec.to_dict(), str(path))
        outcome = run_outcome(load(path))
        rows.append({"recipe": spec.family, **knobs, "failed": int(outcome["failed"]),
                     "outcome": outcome["outcome"], "path": str(path)})
    return pd.DataFrame(rows)


@dataclass(frozen=True, slots=True)
class CauseRule:
    """How a failing randomised run's root cause is named from the knobs it was drawn with.

    A randomised run has no injected cause: the zoo's judge says whether and how it failed,
    and this rule names the knob to blame. Each threshold is a multiple of the recipe's
    value; a failing run with exactly one knob beyond its threshold gets that knob's cause,
    one with none or several gets ``"unknown"`` (no guess where the draw is ambiguous).

    Attributes
    ----------
    lr_high : float, default=10.0
        ``lr_scale`` at or above this: ``learning_rate_too_high`` (the ``"lr >= 10x"``
        treatment of :data:`TREATMENTS`).
    lr_low : float, default=0.1
        ``lr_scale`` at or below this: ``learning_rate_too_low`` (a decade below the recipe;
        draws reach 10**-1.5).
    init_large : float, default=3.0
        ``init_scale`` at or above this: ``init_scale_too_large`` (the ``"init >= 3x"``
        treatment).
    init_small : float, default=0.5
        ``init_scale`` at or below this: ``init_scale_too_small`` (draws reach 10**-0.5).
    """

    lr_high: float = 10.0
    lr_low: float = 0.1
    init_large: float = 3.0
    init_small: float = 0.5

    def causes(self, knobs: dict[str, Any]) -> list[str]:
        """The causes the drawn knobs point at (sigmoid units: ``saturating_activation``)."""
        lr, init = float(knobs.get("lr_scale", 1.0)), float(knobs.get("init_scale", 1.0))
        named = [(lr >= self.lr_high, "learning_rate_too_high"),
                 (lr <= self.lr_low, "learning_rate_too_low"),
                 (init >= self.init_large, "init_scale_too_large"),
                 (init <= self.init_small, "init_scale_too_small"),
                 (knobs.get("activation") == "sigmoid", "saturating_activation")]
        return [cause for hit, cause in named if hit]


#: The rule :func:`label_randomised_run` applies.
CAUSE_RULE = CauseRule()


def label_randomised_run(trace: Trace, rule: CauseRule = CAUSE_RULE) -> Trace:
    """The randomised run with fitting labels in its ground truth (fitting only).

    ``failure_type`` is the zoo's judgement of the run (:func:`benchmarks.runs.run_outcome`:
    for a healthy recipe, the generic health check's label), ``root_cause`` the one knob
    :class:`CauseRule` blames (``"unknown"`` when none or several, ``"none"`` when healthy);
    ``scenario_root_cause`` is ``"none"``, so the knob levels come from the drawn knobs alone.
    """
    failure = run_outcome(trace)["outcome"]
    causes = rule.causes(trace.ground_truth.get("knobs") or {})
    cause = "none" if failure == HEALTHY else (causes[0] if len(causes) == 1 else "unknown")
    gt = {**trace.ground_truth, "failure_type": failure, "root_cause": cause,
          "scenario_root_cause": "none"}
    trace.meta = {**trace.meta, "ground_truth": gt}
    return trace


def _wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    if n == 0:
        return [math.nan, math.nan]
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(centre - half, 3), round(centre + half, 3)]


def _design(data: pd.DataFrame) -> pd.DataFrame:
    """Binary treatment columns, the recipe one-hot, failure."""
    out = pd.DataFrame({name: data[col].map(test).astype(int)
                        for name, (col, test, *_) in TREATMENTS.items()})
    out.columns = [f"t{i}" for i in range(len(TREATMENTS))]
    for recipe in RECIPES[1:]:
        out[f"recipe_{recipe}"] = (data["recipe"] == recipe).astype(int)
    out["failed"] = data["failed"].astype(int)
    return out


def _dowhy(design: pd.DataFrame, treatment: str, refute: bool, seed: int) -> dict[str, Any]:
    from dowhy import CausalModel

    common = [c for c in design.columns if c not in (treatment, "failed")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = CausalModel(data=design, treatment=treatment, outcome="failed",
                            common_causes=common)
        estimand = model.identify_effect(proceed_when_unidentifiable=True)
        est = model.estimate_effect(estimand, method_name="backdoor.linear_regression")
        out: dict[str, Any] = {"estimate": round(float(est.value), 3)}
        if refute:
            kw = {"random_seed": seed}
            placebo = model.refute_estimate(estimand, est, method_name="placebo_treatment_refuter",
                                            placebo_type="permute", num_simulations=20, **kw)
            common_cause = model.refute_estimate(estimand, est,
                                                 method_name="random_common_cause",
                                                 num_simulations=20, **kw)
            subset = model.refute_estimate(estimand, est, method_name="data_subset_refuter",
                                           subset_fraction=0.5, num_simulations=20, **kw)
            out.update({"placebo": round(float(placebo.new_effect), 3),
                        "random_common_cause": round(float(common_cause.new_effect), 3),
                        "data_subset": round(float(subset.new_effect), 3)})
    return out


def _network(node: str, control: tuple[str, ...], treated: tuple[str, ...]) -> float:
    """The network's do() under its own priors: every other node as the network expects it."""
    model = causal_models.load_default_model()

    def p_fail(levels: tuple[str, ...]) -> float:
        return float(np.mean([1.0 - model.intervene({node: lv})[HEALTHY] for lv in levels]))

    return round(p_fail(treated) - p_fail(control), 3)


#: The corpus's architecture context as the run's trace shows it (read per run).
_TRACE_CONTEXT: tuple[str, ...] = ("arch", "depth", "optimizer")


def _knob_states(row: pd.Series) -> dict[str, str]:
    """The network's knob states of a randomised run's drawn knobs (its recipe at "ok")."""
    out = {}
    for node, column in (("lr_level", "lr_scale"), ("init_level", "init_scale")):
        sts = KNOB_NODES[node]
        out[node] = sts[level_index(math.log10(float(row[column])) / LEVEL_WIDTH[node],
                                    len(sts), centred=sts[0] != "ok")]
    out["activation"] = str(row["activation"])
    out["normalization"] = str(row["normalization"])
    out["clipping"] = "peaks" if float(row["grad_clip"]) > 0 else "none"
    return out


def _recipe_settings(network_nodes: set[str]) -> dict[str, str]:
    """What the corpus leaves at its recipes' settings: standardised inputs, and no bug in
    the script (every registered cause's trait at its normal state: default biases,
    gradients reset at every step)."""
    out = {"input_level": KNOB_NODES["input_level"][0]}
    for cause in list_root_causes():
        out.update({trait: states[0] for trait, states in cause.traits.items()})
    return {n: v for n, v in out.items() if n in network_nodes}


def _network_adjusted(data: pd.DataFrame, column: str, test: Any, node: str) -> float:
    """The network's do() averaged over the corpus's runs (g-computation).

    The randomised difference compares the arms over *this corpus's* mix of recipes and
    other knobs; the network's own do() (:func:`_network`) averages over its priors, a
    different population: the zoo's, where a run with every knob fine still fails half the
    time from a bug in its code (P(failure | do(lr_level=ok)) is 0.49 on a ReLU MLP). Here
    each run keeps its architecture context (from its trace) and its other drawn knobs, its
    undrawn settings at the recipe's (:func:`_recipe_settings`), and no code bug (the corpus
    has none); the treated node is set in turn to each level the
    treated arm's runs reached (weighted as they occur), then to each of the control arm's,
    and the effect is the mean over runs of P(failure | do(treated), run) - P(failure |
    do(control), run): the adjustment formula with the network as the outcome model.
    """
    model = causal_models.load_default_model()
    classes = list(model.classes_)
    causes = [c for c in model.root_causes_ if c not in set(unmodelled_causes())]
    states = [_knob_states(row) for _, row in data.iterrows()]
    context = []
    for path in data["path"]:
        evidence = model.evidence(load(path))
        context.append({n: evidence[n] for n in _TRACE_CONTEXT if n in evidence})
    arm = data[column].map(test).astype(bool).to_numpy()
    levels = {flag: pd.Series([st[node] for st, a in zip(states, arm, strict=True)
                               if a == flag]).value_counts(normalize=True).to_dict()
              for flag in (True, False)}
    cache: dict[tuple[tuple[str, str], ...], float] = {}

    def p_fail(do: dict[str, str]) -> float:
        # the knobs and context are roots, so do() is conditioning on them; the corpus's
        # runs carry no bug in the training code, so the root cause is kept off those
        key = tuple(sorted(do.items()))
        if key not in cache:
            joint = joint_posterior(model.inference(), do, classes, causes)
            cache[key] = 1.0 - float(joint[classes.index(HEALTHY)].sum() / joint.sum())
        return cache[key]

    recipe = _recipe_settings(set(model.network_.nodes()))
    effects = []
    for st, ctx in zip(states, context, strict=True):
        base = {**recipe, **ctx, **{k: v for k, v in st.items() if k != node}}
        p = {flag: sum(w * p_fail({**base, node: lv}) for lv, w in levels[flag].items())
             for flag in (True, False)}
        effects.append(p[True] - p[False])
    return round(float(np.mean(effects)), 3)


def estimate(data: pd.DataFrame, seed: int = 0) -> list[dict[str, Any]]:
    """One row per treatment: randomised, DoWhy (with refuters), confounded, network."""
    design = _design(data)
    rng = np.random.default_rng(seed)
    rows = []
    for i, (name, (column, test, node, control, treated)) in enumerate(TREATMENTS.items()):
        t = f"t{i}"
        arm1, arm0 = design[design[t] == 1], design[design[t] == 0]
        k1, k0 = int(arm1["failed"].sum()), int(arm0["failed"].sum())
        # An observational subset: the treated runs kept mostly where failure is likelier
        # anyway (sigmoid units; the CNN recipe when the treatment is the activation).
        risky = (design["t2"] == 1) if t != "t2" else (design["recipe_healthy_cnn"] == 1)
        keep = np.where(design[t] == 1, np.where(risky, 0.95, 0.15),
                        np.where(risky, 0.15, 0.95)) > rng.uniform(size=len(design))
        obs = design[keep]
        naive = float(obs.loc[obs[t] == 1, "failed"].mean() - obs.loc[obs[t] == 0, "failed"].mean())
        rows.append({
            "treatment": name, "n_treated": len(arm1), "n_control": len(arm0),
            "randomised": round(k1 / max(len(arm1), 1) - k0 / max(len(arm0), 1), 3),
            "p_fail_treated": [round(k1 / max(len(arm1), 1), 3), _wilson(k1, len(arm1))],
            "p_fail_control": [round(k0 / max(len(arm0), 1), 3), _wilson(k0, len(arm0))],
            "dowhy": _dowhy(design, t, refute=True, seed=seed),
            "confounded": {"n": int(keep.sum()), "naive": round(naive, 3),
                           "adjusted": _dowhy(obs, t, refute=False, seed=seed)["estimate"]},
            "network_do": _network_adjusted(data, column, test, node),
            "network_do_prior": _network(node, control, treated),
        })
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", default="results/runs")
    parser.add_argument("--out", default="results/knob_effects.json")
    args = parser.parse_args(argv)
    data = run_corpus(args.runs, args.seed, Path(args.run_dir))
    rows = estimate(data, args.seed)
    result = {"runs": len(data), "failure_rate": round(float(data["failed"].mean()), 3),
              "by_recipe": data.groupby("recipe")["failed"].mean().round(3).to_dict(),
              "effects": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    print(f"{len(data)} randomised runs, failure rate {result['failure_rate']}")
    head = (f"{'treatment':15s} {'n1/n0':>8s} {'randomised':>10s} {'DoWhy':>6s} {'placebo':>7s} "
            f"{'rand.cc':>7s} {'subset':>6s} {'naive(obs)':>10s} {'adj.(obs)':>9s} "
            f"{'network do':>10s}")
    print(head)
    for r in rows:
        d = r["dowhy"]
        print(f"{r['treatment']:15s} {r['n_treated']:>3d}/{r['n_control']:<4d} "
              f"{r['randomised']:>10.3f} {d['estimate']:>6.3f} {d['placebo']:>7.3f} "
              f"{d['random_common_cause']:>7.3f} {d['data_subset']:>6.3f} "
              f"{r['confounded']['naive']:>10.3f} {r['confounded']['adjusted']:>9.3f} "
              f"{r['network_do']:>10.3f}")
    return result


if __name__ == "__main__":
    main()
