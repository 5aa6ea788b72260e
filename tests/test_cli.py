"""The neuraldbg command on real recorded runs: what it says, and how it fails on bad input."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import torch
from torch import nn
from zoo_runs import zoo_trace

import neuraldbg as ndb
from neuraldbg.cli import main


def _record(path, steps: int = 20, *, raise_before_step: bool = False,
            copy_while_running=None) -> None:
    """A small regression run into ``path``; optionally it raises in its first step after
    ``opt.step()`` (an error in the logging), or its directory is copied to
    ``copy_while_running`` before the end, as a reader sees a run killed before its first
    flush."""
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(32, 4)
    with contextlib.suppress(RuntimeError), \
            ndb.NeuralDbg(model, optimizer=opt, out=path, config={"lr": 0.05}) as dbg:
        for _ in range(steps):
            opt.zero_grad()
            loss = (model(x) - x[:, :1]).pow(2).mean()
            loss.backward()
            opt.step()
            if raise_before_step:
                raise RuntimeError("CUDA out of memory (simulated)")
            dbg.step(loss)
        if copy_while_running is not None:
            shutil.copytree(path, copy_while_running)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    _record(root / "healthy")
    _record(root / "zero", steps=0)
    zoo_trace("lr_too_high").save(root / "failing")
    (root / "not_a_trace").mkdir()
    (root / "not_a_trace" / "meta.json").write_text('{"format": "something-else"}')
    # traces whose files parse but hold the wrong content (a new user's damaged copies)
    healthy = root / "healthy"
    for name in ("steps_of_modules", "stats_of_steps", "config_string", "no_stats", "no_steps",
                 "modules_of_steps"):
        shutil.copytree(healthy, root / name)
    shutil.copy(healthy / "modules.parquet", root / "steps_of_modules/steps/part-000000.parquet")
    shutil.copy(healthy / "steps/part-000000.parquet",
                root / "stats_of_steps/stats/part-000000.parquet")
    meta = json.loads((healthy / "meta.json").read_text())
    (root / "config_string/meta.json").write_text(json.dumps({**meta, "config": "x"}))
    shutil.rmtree(root / "no_stats/stats")
    shutil.rmtree(root / "no_steps/steps")
    shutil.copy(healthy / "steps/part-000000.parquet", root / "modules_of_steps/modules.parquet")
    _record(root / "thin", steps=3)
    # a loss column of text; a statistics chunk with three of its columns
    for name in ("loss_strings", "stats_few_columns"):
        shutil.copytree(healthy, root / name)
    steps = pd.read_parquet(healthy / "steps/part-000000.parquet")
    steps.assign(loss="x").to_parquet(root / "loss_strings/steps/part-000000.parquet")
    stats = pd.read_parquet(healthy / "stats/part-000000.parquet")
    stats[["step", "module_name", "act_mean"]].to_parquet(
        root / "stats_few_columns/stats/part-000000.parquet")
    _record(root / "raised_in_first_step", steps=1, raise_before_step=True)
    _record(root / "healthy_again", steps=5, copy_while_running=root / "running")
    return root


def test_show_says_peak_first_nonfinite_and_layer_types(runs, capsys):
    assert main(["show", str(runs / "failing")]) == 0
    out = capsys.readouterr().out
    steps = zoo_trace("lr_too_high").steps
    finite = steps[steps["loss"].map(lambda v: v == v and abs(v) != float("inf"))]
    peak_step = int(finite.loc[finite["loss"].idxmax(), "step"])
    assert f"at step {peak_step}" in out and "peak loss" in out
    first_bad = int(steps.loc[~steps["loss"].isin(finite["loss"]), "step"].min())
    assert f"loss non-finite from step {first_bad}" in out or f"at step {first_bad}" in out
    assert re.search(r"\n  conv1 +Conv2d\n", out) and re.search(r"\n  out +Linear\n", out)
    assert main(["show", "--json", str(runs / "failing")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["loss_peak_step"] == peak_step and data["first_nonfinite"]["step"] <= first_bad


def test_show_reads_the_start_and_end_of_the_loss_over_several_steps(tmp_path, capsys):
    """The last step trains on one odd batch (its loss 25x the run's): the final loss shown
    is the run's, a median of its last losses, not that one minibatch's."""
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(32, 4)
    with ndb.NeuralDbg(model, optimizer=opt, out=tmp_path / "run") as dbg:
        for step in range(200):
            xb = x * 5 if step == 199 else x
            opt.zero_grad()
            loss = (model(xb) - xb[:, :1]).pow(2).mean()
            loss.backward()
            opt.step()
            dbg.step(loss)
    losses = dbg.trace.steps["loss"]
    assert losses.iloc[-1] > 10 * losses.iloc[-11:-1].max()
    assert main(["show", str(tmp_path / "run")]) == 0
    shown = float(re.search(r"last ([0-9.e+-]+)", capsys.readouterr().out).group(1))
    assert shown == pytest.approx(losses.iloc[-10:].median(), rel=0.01)


def test_explain_gives_the_verdict_first_then_a_handful_of_hypotheses(runs, capsys):
    assert main(["explain", str(runs / "failing")]) == 0
    out = capsys.readouterr().out.splitlines()
    top = ndb.explain(zoo_trace("lr_too_high"))[0]
    assert out[0].startswith("The run failed: exploding gradients began in conv1 (Conv2d)")
    numbered = [line for line in out if re.match(r"\d+\. ", line)]
    assert 1 <= len(numbered) <= 5
    assert f"step {top.origin_step}" in numbered[0] and "(Conv2d)" in numbered[0]
    assert "grew 10^" in out[out.index(numbered[0]) + 1]  # the reason, in words
    assert main(["explain", "--all", str(runs / "failing")]) == 0
    everything = capsys.readouterr().out
    assert len(re.findall(r"(?m)^\d+\. ", everything)) == len(
        ndb.explain(zoo_trace("lr_too_high")))
    assert main(["explain", str(runs / "healthy")]) == 0
    assert capsys.readouterr().out.startswith("The run looks healthy")


def test_explain_json_is_parseable_and_matches_the_api(runs, capsys):
    assert main(["explain", "--json", str(runs / "failing")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["failed"] is True
    assert data["hypotheses"][0]["failure_type"] == "exploding_gradients"
    assert len(data["hypotheses"]) == len(ndb.explain(runs / "failing"))


def test_what_if_prints_one_consistent_answer(runs, capsys):
    for knob in (["--lr-scale", "0.1"], ["--lr-scale", "10"], ["--normalization", "batch"]):
        assert main(["what-if", "--json", *knob, str(runs / "failing")]) == 0
        data = json.loads(capsys.readouterr().out)
        after, outcome = data["p_failure"], data["most_likely_outcome"]
        meaning = data["meaning"]
        if after < 0.5:
            assert "most likely have trained healthily" in meaning
        elif outcome == "healthy":  # failure mass split: the sentence must say so
            assert "no single failure dominates" in meaning
        else:
            assert "still fail" in meaning
        assert f"{data['p_failure_factual']:.0%}" in meaning and f"{after:.0%}" in meaning
    assert main(["what-if", "--lr-scale", "0.1", str(runs / "failing")]) == 0
    text = capsys.readouterr().out
    assert "P(failure)" in text and "->" in text


def test_help_lists_the_knobs_and_their_values(capsys):
    with pytest.raises(SystemExit) as done:
        main(["what-if", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for text in ("--lr-scale", "--grad-clip", "leaky_relu", "batch,layer,none",
                 "learning rate multiplied"):
        assert text in out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "Argument parsing only" not in capsys.readouterr().out


BAD = {
    "activation": (["what-if", "--activation", "foo", "{failing}"], "invalid choice: 'foo'"),
    "method": (["explain", "--method", "bayes", "{failing}"], "Unknown diagnosis method"),
    "zero_steps": (["explain", "{zero}"], "holds no recorded step"),
    "zero_steps_report": (["report", "{zero}"], "holds no recorded step"),
    "negative_lr": (["what-if", "--lr-scale", "-1", "{failing}"], "positive multiplier"),
    "infinite_lr": (["what-if", "--lr-scale", "inf", "{failing}"], "positive multiplier"),
    "nan_clip": (["what-if", "--grad-clip", "nan", "{failing}"], "positive threshold"),
    "no_knob": (["what-if", "{failing}"], "at least one knob"),
    "missing_dir": (["show", "{root}/nope"], "No trace directory"),
    "not_a_trace": (["explain", "{not_a_trace}"], "does not describe a NeuralDBG trace"),
    "unknown_command": (["frobnicate", "{failing}"], "invalid choice"),
    "no_run": (["show"], "required: RUN"),
    "steps_chunk_of_another_table": (["show", "{root}/steps_of_modules"],
                                     "has no 'step' or 'loss' column"),
    "stats_chunk_of_another_table": (["explain", "{root}/stats_of_steps"],
                                     "has no 'module_name' column"),
    "config_not_an_object": (["what-if", "--lr-scale", "0.1", "{root}/config_string"],
                             "'config' must be a JSON object"),
    "stats_dir_missing": (["explain", "{root}/no_stats"], "stats is missing"),
    "steps_dir_missing": (["show", "{root}/no_steps"], "holds no step chunks"),
    "module_table_of_another_table": (["explain", "{root}/modules_of_steps"],
                                      "not a NeuralDBG module table"),
    "loss_not_numbers": (["show", "{root}/loss_strings"],
                         "column 'loss' holds values that are not numbers"),
    "raised_in_its_first_step": (["explain", "{root}/raised_in_first_step"],
                                 "No training step of this run finished: it raised "
                                 "RuntimeError: CUDA out of memory"),
    "what_if_raised_in_its_first_step": (["what-if", "--lr-scale", "0.1",
                                          "{root}/raised_in_first_step"],
                                         "before dbg.step(loss) closed the step"),
    "killed_before_its_first_flush": (["explain", "{root}/running"],
                                      "killed before its first write to disk"),
}


def test_a_statistics_chunk_short_of_columns_is_read_as_not_measured(runs, capsys):
    """A chunk that lacks columns (an older writer, a damaged file) loads with a one-line
    warning, its missing statistics not measured, and every command answers."""
    for argv in (["show"], ["explain", "--method", "probabilistic"],
                 ["what-if", "--lr-scale", "0.1"]):
        assert main([*argv, str(runs / "stats_few_columns")]) == 0, argv
        out, err = capsys.readouterr()
        assert err.startswith("neuraldbg: warning: ") and "'param_grad_norm'" in err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_show_says_a_run_marked_running_may_have_been_killed(runs, capsys):
    assert main(["show", str(runs / "running")]) == 0
    assert "status      running, or killed (no clean exit was recorded), 0 steps" in (
        capsys.readouterr().out)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_on_stderr_and_exit_2(runs, capsys, case):
    argv, message = BAD[case]
    paths = {"failing": runs / "failing", "zero": runs / "zero", "root": runs,
             "not_a_trace": runs / "not_a_trace"}
    assert main([a.format(**paths) for a in argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("neuraldbg: error: ") and message in err
    assert "Traceback" not in err


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "neuraldbg.cli", *args], capture_output=True,
                          text=True, env=env, timeout=120, **kw)


def test_the_real_command_fails_in_one_line_and_pipes_into_head_quietly(runs):
    done = _cli("what-if", "--lr-scale", "-1", str(runs / "failing"))
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    piped = subprocess.run(
        f"{sys.executable} -m neuraldbg.cli explain --all {runs / 'failing'} | head -n 1",
        shell=True, capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert piped.stdout.startswith("The run failed")
    assert piped.stderr == "", piped.stderr  # no BrokenPipeError, no traceback


def test_graph_prints_mermaid(runs, capsys):
    assert main(["graph", str(runs / "failing")]) == 0
    assert capsys.readouterr().out.startswith("flowchart TD")


def test_what_if_warns_when_the_run_shows_a_bug_no_knob_names(tmp_path, capsys):
    """SGD with weight_decay=1.0 collapses the weights: the causal model has no knob for
    that, so lowering the rate may not do what it predicts; the answer says so."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=1.0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = (x[:, :3]).argmax(1)
    with ndb.NeuralDbg(model, optimizer=opt, out=tmp_path / "decayed") as dbg:
        for step in range(120):
            i = (step * 32) % 256
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32])
            loss.backward()
            opt.step()
            dbg.step(loss)
    assert main(["what-if", "--lr-scale", "0.1", str(tmp_path / "decayed")]) == 0
    text = capsys.readouterr().out
    assert "Caution: the weights shrank" in text and "weight_decay" in text
    assert main(["what-if", "--json", "--lr-scale", "0.1", str(tmp_path / "decayed")]) == 0
    assert "weight_decay" in json.loads(capsys.readouterr().out)["caveat"]


def test_what_if_says_no_caveat_on_a_run_without_such_a_bug(runs, capsys):
    assert main(["what-if", "--json", "--lr-scale", "0.1", str(runs / "failing")]) == 0
    assert json.loads(capsys.readouterr().out)["caveat"] == ""


def test_what_if_on_a_thin_trace_says_it_is_no_verdict(runs, capsys):
    """3 steps: explain claims nothing, and what-if's numbers come with that caution."""
    assert main(["what-if", "--lr-scale", "0.1", str(runs / "thin")]) == 0
    out = capsys.readouterr().out
    assert "Caution: only 3 finished step(s) recorded" in out and "guess" in out
    assert main(["what-if", "--lr-scale", "0.1", str(runs / "healthy")]) == 0
    assert "Caution" not in capsys.readouterr().out


def test_python_dash_m_neuraldbg_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "neuraldbg", "--help"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0 and done.stdout.startswith("usage: neuraldbg"), done.stderr


def test_what_if_notes_when_explains_default_method_reads_the_run_apart(runs, capsys):
    """``what-if`` answers with the causal model, ``explain`` with the heuristic by default:
    a detached body read as healthy by one and failed (P 1.00) by the other left the user
    with both answers and nothing to reconcile them (a helper's new-user probe)."""
    from neuraldbg.reporting.words import what_if_method_note

    assert "finds no failure at 0.5" in what_if_method_note(0.97, default_failed=False)
    assert "calls the run failed" in what_if_method_note(0.2, default_failed=True)
    assert what_if_method_note(0.97, default_failed=True) == ""
    assert what_if_method_note(0.2, default_failed=False) == ""
    assert main(["what-if", "--json", "--lr-scale", "0.1", str(runs / "failing")]) == 0
    assert json.loads(capsys.readouterr().out)["note"] == ""  # both read it failed
