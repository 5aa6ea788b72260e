"""Framework callbacks through the real PyTorch Lightning and Hugging Face trainers.

Each test trains a small model through the framework's own ``Trainer`` with the callback
added, computes the gradient norm each optimizer step received by hand, and trains the same
model (same initial weights, same batches) in a plain loop under ``NeuralDbg``: the recorded
gradient norms must match the hand-computed ones, and the verdicts the plain run's.
Skipped only when the extra is not installed (``make venv`` installs both).
"""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch
from torch import nn

import neuraldbg as ndb

STEPS = 60


def verdicts(trace: ndb.Trace) -> dict[str, list[tuple[str, str]]]:
    out = {}
    for method in ("heuristic", "probabilistic"):
        out[method] = [(h.failure_type, h.root_cause)
                       for h in ndb.explain(trace, method=method) if h.confidence >= 0.5]
    return out


def plain_loop(model: nn.Module, opt: torch.optim.Optimizer, batches, loss_of) -> ndb.Trace:
    with ndb.NeuralDbg(model, optimizer=opt) as dbg:
        for batch in batches:
            opt.zero_grad()
            loss = loss_of(model, batch)
            loss.backward()
            opt.step()
            dbg.step(loss)
    return dbg.trace


# --------------------------------------------------------------------------- Lightning
def test_lightning_trainer_records_the_same_run_as_a_plain_loop(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")
    from neuraldbg.integrations.lightning import NeuralDbgCallback

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32),
                                     nn.Tanh(), nn.Linear(32, 1))
            self.hand: list[float] = []

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return ((self(x) - y) ** 2).mean()

        def on_before_optimizer_step(self, optimizer):
            self.hand.append(torch.cat([p.grad.flatten() for p in self.parameters()])
                             .norm().item())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 16, generator=g)
    y = x[:, :1].sin()
    module = Regressor()
    twin = copy.deepcopy(module)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=128)
    callback = NeuralDbgCallback(out=tmp_path / "run")
    trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[callback],
                         default_root_dir=tmp_path)
    trainer.fit(module, loader)
    trace = ndb.load_trace(tmp_path / "run")
    assert trace.meta["status"] == "complete" and trace.steps["complete"].all()
    assert trace.steps["step"].tolist() == list(range(STEPS))
    np.testing.assert_allclose(trace.steps["grad_norm"], module.hand, rtol=1e-3)
    assert np.isfinite(trace.stat("param_grad_norm")["net.0"]).all()

    plain = plain_loop(twin, torch.optim.SGD(twin.parameters(), lr=0.05), [(x, y)] * STEPS,
                       lambda m, b: ((m(b[0]) - b[1]) ** 2).mean())
    np.testing.assert_allclose(trace.steps["grad_norm"], plain.steps["grad_norm"], rtol=1e-3)
    np.testing.assert_allclose(trace.steps["loss"], plain.steps["loss"], rtol=1e-3)
    assert verdicts(trace) == verdicts(plain) == {"heuristic": [], "probabilistic": []}


def test_lightning_gradient_accumulation_gives_one_step_per_optimizer_step(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")
    from neuraldbg.integrations.lightning import NeuralDbgCallback

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))

        def training_step(self, batch, batch_idx):
            loss = ((self.net(batch[0]) - batch[1]) ** 2).mean()
            returned.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    returned: list[float] = []
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    callback = NeuralDbgCallback()
    pl.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False,
               accumulate_grad_batches=2, callbacks=[callback]).fit(Regressor(), loader)
    steps = callback.dbg.trace.steps
    assert len(steps) == 6 and steps["complete"].all()  # 4 batches / 2 per step x 3 epochs
    assert (callback.dbg.trace.stat("calls")["net.0"] == 2).all()
    # each step's loss is the mean of its two micro-batches' (as training_step returned them)
    np.testing.assert_allclose(steps["loss"], np.reshape(returned, (6, 2)).mean(axis=1),
                               rtol=1e-6)


# --------------------------------------------------------------------------- HF Trainer
def test_hf_trainer_records_the_same_run_as_a_plain_loop(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from neuraldbg.integrations.transformers import NeuralDbgTrainerCallback

    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=16, num_labels=2,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)  # random init, nothing read
    twin = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 40, (64, 8), generator=g)
    labels = (ids[:, 0] < 20).long()  # learnable from the first token

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(ids)

        def __getitem__(self, i):
            return {"input_ids": ids[i], "labels": labels[i]}

    hand: list[float] = []

    class HandNorms(transformers.TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            hand.append(torch.cat([p.grad.flatten() for p in model.parameters()
                                   if p.grad is not None]).norm().item())

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=64, max_steps=STEPS,
        learning_rate=3e-3, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=0.0, use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, seed=0, data_seed=0,
        dataloader_drop_last=False)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    callback = NeuralDbgTrainerCallback(out=tmp_path / "run")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Rows(),
                                   optimizers=(opt, None), callbacks=[HandNorms(), callback])
    trainer.train()
    trace = ndb.load_trace(tmp_path / "run")
    assert trace.meta["status"] == "complete" and trace.steps["complete"].all()
    assert trace.steps["step"].tolist() == list(range(STEPS))
    np.testing.assert_allclose(trace.steps["grad_norm"], hand, rtol=1e-3)
    mods = trace.modules.set_index("module_name")
    listed = [q for cell in mods["parameters"] if cell for q in cell.split(",")]
    assert sorted(listed) == sorted(n for n, _ in model.named_parameters())

    twin_opt = torch.optim.AdamW(twin.parameters(), lr=3e-3, weight_decay=0.0)
    batch = {"input_ids": ids, "labels": labels}
    plain = plain_loop(twin, twin_opt, [batch] * STEPS, lambda m, b: m(**b).loss)
    # one full batch per step: the Trainer's shuffling only reorders its rows
    np.testing.assert_allclose(trace.steps["grad_norm"], plain.steps["grad_norm"], rtol=1e-3)
    np.testing.assert_allclose(trace.steps["loss"], plain.steps["loss"], rtol=1e-3)
    assert trace.steps["loss"].iloc[-1] < 0.5 * trace.steps["loss"].iloc[0]
    assert verdicts(trace) == verdicts(plain) == {"heuristic": [], "probabilistic": []}
    assert os.environ["HF_HUB_OFFLINE"] == "1"
