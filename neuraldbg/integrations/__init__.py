"""Framework callbacks that record a NeuralDBG trace: one line to add to a trainer.

- :class:`neuraldbg.integrations.lightning.NeuralDbgCallback` for PyTorch Lightning
  (``pip install neuraldbg[lightning]``)::

      trainer = pl.Trainer(callbacks=[NeuralDbgCallback(out="runs/my-run")])

- :class:`neuraldbg.integrations.transformers.NeuralDbgTrainerCallback` for the Hugging Face
  ``Trainer`` (``pip install neuraldbg[transformers]``)::

      trainer = Trainer(..., callbacks=[NeuralDbgTrainerCallback(out="runs/my-run")])

Each submodule imports its framework; importing this package imports neither.
"""

__all__ = ["lightning", "transformers"]
