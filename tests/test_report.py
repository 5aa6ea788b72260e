"""Run reports of real zoo runs, looked at in a real headless Chromium."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import torch
from headless_chromium import find_chromium, view_page
from PIL import Image
from torch import nn
from zoo_runs import zoo_trace

import neuraldbg as ndb
from neuraldbg.reporting import collect, report_html, summarize_run, verdict
from neuraldbg.reporting.words import TraceEvidence, evidence_sentence
from neuraldbg.reporting.summary import module_types

needs_chromium = pytest.mark.skipif(find_chromium() is None, reason=(
    "no chromium on PATH: apt-get install chromium (.ci/run installs it)"))
_FIGURES = {"fig-loss", "fig-health", "fig-out_grad_norm", "fig-update_ratio", "fig-graph"}


def _ink(png: bytes, box: dict) -> float:
    """Share of non-white pixels inside a figure's box on the screenshot."""
    img = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.int16)
    x0, y0 = int(box["x"]), int(box["y"])
    crop = img[y0:y0 + int(box["height"]), x0:x0 + int(box["width"])]
    return float((crop < 235).mean()) if crop.size else 0.0


def _static_checks(html: str) -> None:
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html, re.I)
    assert "url(http" not in html and "@import" not in html


@needs_chromium
@pytest.mark.parametrize("family", ["lr_too_high", "healthy_mlp"])
def test_report_renders_in_chromium_offline(family, tmp_path):
    trace = zoo_trace(family)
    path = ndb.write_report(trace, tmp_path / "report.html")
    html = path.read_text()
    _static_checks(html)
    view = view_page(path)
    assert view.console_errors == []
    assert view.requests == []
    sentence = verdict(ndb.explain(trace), module_types(trace)).sentence
    assert sentence in view.text
    expect_failed = trace.ground_truth["failure_type"] != "healthy"
    assert sentence.startswith("The run failed" if expect_failed else "The run looks healthy")
    shown = {f["id"]: f for f in view.figures}
    has_graph = collect(trace, interventions=[]).graph.number_of_nodes() > 0
    assert _FIGURES - ({"fig-graph"} if not has_graph else set()) <= set(shown)
    assert ("fig-graph" in shown) == has_graph
    if not has_graph:
        assert "no causal graph to draw" in view.text
    for fid, box in shown.items():
        assert box["natural_width"] > 0 and box["width"] > 200 and box["height"] > 100, fid
        assert _ink(view.screenshot, box) > 0.02, f"{fid} is blank on the page"
    # the page body itself is not blank either, and the what-if table made it to the page
    assert "What if" in view.text and "P(failure)" in view.text


@needs_chromium
def test_chromium_check_catches_network_requests_and_errors(tmp_path):
    # a negative control: the same checks must fail on a page that breaks the rules
    page = tmp_path / "bad.html"
    page.write_text("<html><body><p>x</p><figure id=f><img src='http://example.com/a.png' "
                    "width=300 height=200></figure><script>console.error('boom');"
                    "undefinedFunction()</script></body></html>")
    view = view_page(page)
    assert any("example.com" in url for url in view.requests)
    assert any("boom" in e for e in view.console_errors)
    assert len(view.console_errors) >= 2  # the uncaught ReferenceError too
    assert view.figures[0]["natural_width"] == 0


def test_report_sections_on_a_users_own_run(tmp_path):
    # a run recorded the way a user writes it: no ground truth anywhere
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=8.0)
    x, y = torch.randn(128, 8), torch.randint(0, 3, (128,))
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(60):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dbg.step(loss)
    path = dbg.report(tmp_path / "r.html")
    html = path.read_text()
    text = re.sub(r"<[^>]+>", " ", re.sub(r'src="data:[^"]+"', "", html))
    assert "None" not in text  # no ground truth printed as "None" on a user's run
    assert "Ground truth" not in text
    hyps = ndb.explain(dbg.trace)
    v = verdict(hyps, module_types(dbg.trace))
    assert v.failed and v.sentence.split(" (")[0] in text
    for h in hyps[:3]:  # every listed hypothesis has its evidence in words, with numbers
        assert re.search(r"step \d+", text)
        assert h.failure_type.replace("_", " ").split()[0] in text
    png = dbg.report(tmp_path / "r.png")
    img = Image.open(png)
    assert img.format == "PNG" and img.size[1] > img.size[0]  # one portrait page


def test_report_copes_with_missing_methods_and_failing_what_if(monkeypatch):
    trace = zoo_trace("lr_too_high")
    data = collect(trace, methods=("heuristic", "no_such_method"),
                   interventions=[{"lr_scale": 0.1}, {"activation": "swish"}])
    assert "no_such_method" in data.failures and "Unknown diagnosis method" in (
        data.failures["no_such_method"])
    assert data.what_if[0].p_after is not None
    assert data.what_if[1].p_after is None and "not computed" in data.what_if[1].meaning

    def broken(*args, **kwargs):
        raise RuntimeError("the causal model is being redesigned")

    monkeypatch.setattr("neuraldbg.reporting.data.what_if", broken)
    html = report_html(trace, methods=("heuristic",))
    assert "The what-if table could not be computed" in html
    assert "the causal model is being redesigned" in html
    assert "The run failed" in html


def test_methods_side_by_side_say_why_they_disagree():
    trace = zoo_trace("lr_too_high")
    data = collect(trace, interventions=[])
    from neuraldbg.reporting.words import disagreement

    if set(data.hypotheses) != {"heuristic", "probabilistic"}:
        pytest.skip(f"probabilistic method unavailable: {data.failures}")
    heur, prob = data.hypotheses["heuristic"][0], data.hypotheses["probabilistic"][0]
    why = disagreement(data.evidence, data.hypotheses)
    same = (heur.failure_type, heur.root_cause, heur.origin_layer) == (
        prob.failure_type, prob.root_cause, prob.origin_layer)
    assert bool(why) != same
    if why:
        assert prob.origin_layer in why[0] or prob.failure_type.split("_")[0] in why[0]



def test_a_loss_that_peaks_at_its_first_step_is_not_said_to_start_lower():
    """A regression whose first prediction is far off (output bias 8): the loss is ~60 at
    step 0 and small from a few steps on. The evidence sentence said the loss 'started at'
    the median of its first steps, far below the peak it named at step 0."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    with torch.no_grad():
        model[2].bias.fill_(8.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(400):
            idx = torch.randint(0, 512, (32,), generator=g)
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x[idx]), x[idx, :1])
            loss.backward()
            opt.step()
            dbg.step(loss)
    trace = dbg.trace
    summary = summarize_run(trace)
    assert summary.loss_peak_step == 0 and summary.loss_peak > 10 * summary.loss_first
    h = ndb.Hypothesis("exploding_gradients", "unknown", "0", 0, 0.2)
    text = evidence_sentence(TraceEvidence(trace, summary), h)
    assert "peaked at" in text and "started at" not in text, text
    assert "median of its first steps" in text, text


def test_a_nan_record_out_of_a_converged_loss_is_told_as_it_happened():
    """A NaN record at step 60 of a healthy run. The sentences said "the loss rose from 2.3
    to 2.32 (step 0)" (a blip at the start), "the output of 0" (a bare module name), and
    for the second hypothesis a gradient that "grew 1.03x between steps 3 and 1" (the
    largest value taken before the low point)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(80):
            idx = torch.randint(0, 512, (64,), generator=g)
            xb = x[idx].clone()
            if step == 60:
                xb[3, 5] = float("nan")
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), y[idx])
            loss.backward()
            opt.step()
            dbg.step(loss)
    trace = dbg.trace
    summary = summarize_run(trace)
    ev = TraceEvidence(trace, summary)
    div = evidence_sentence(ev, ndb.Hypothesis("loss_divergence", "data_problem", "0", 60, 1.0))
    assert "rose" not in div and "at step 59" in div, div
    assert "output of layer 0 (Linear)" in div, div
    for layer in ("0", "2", "4"):
        text = evidence_sentence(ev, ndb.Hypothesis("exploding_gradients", "unknown", layer,
                                                    0, 0.4))
        said = re.search(r"between steps (\d+) and (\d+)", text)
        assert said is None or int(said[1]) <= int(said[2]), text
        assert "grew" not in text or "10^" in text or re.search(r"grew \d{2,}", text), text


class _RowReader(nn.Module):
    """A tanh RNN reading a digit's 8 rows, its last state classified."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.rnn = nn.RNN(8, 64, batch_first=True)
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x.view(-1, 8, 8))
        return self.fc(out[:, -1])


def test_a_gradient_that_vanishes_inside_a_layer_is_told_so() -> None:
    """SGD at lr 1.5 saturates the RNN's tanh units: its parameters get exactly zero gradient
    while a gradient of about 7 reaches its output, and the head's logits blow the loss up.
    The vanishing sentence compared the output gradient with the largest in the network and
    said "1x the largest gradient", against its own claim (a helper's new-user probe)."""
    from sklearn.datasets import load_digits

    data, target = load_digits(return_X_y=True)
    x, y = torch.tensor(data, dtype=torch.float32) / 16.0, torch.tensor(target)
    model = _RowReader()
    opt = torch.optim.SGD(model.parameters(), lr=1.5, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(150):
            idx = torch.randint(0, len(x), (32,), generator=g)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            dbg.step(loss)
    trace = dbg.trace
    own = trace.stats.loc[trace.stats["module_name"] == "rnn", "param_grad_norm"].to_numpy()
    assert (own[-50:] == 0).all()  # the premise: the RNN's parameters are cut off
    text = evidence_sentence(TraceEvidence(trace, summarize_run(trace)),
                             ndb.Hypothesis("vanishing_gradients", "unknown", "rnn", 20, 0.9))
    assert "the parameters of rnn (RNN) received no gradient" in text, text
    assert "the largest gradient" not in text, text
