"""Peer methods ported as baselines, each registered as a diagnosis method by name.

``autotrainer`` (AutoTrainer's monitor rules), ``deepdiagnosis`` (DeepDiagnosis's symptom
checks), ``sagemaker_debugger`` (Amazon SageMaker Debugger's built-in rules at their
documented defaults) and ``anomaly_rank`` (layers ranked by a robust anomaly score). Each is
written from the published rule descriptions (docs/evaluation.md), with no peer code, and
maps its output onto the contract's :class:`~neuraldbg.records.Hypothesis`, so the harness
compares every method through ``explain(trace) -> list[Hypothesis]``. They register in NeuralDBG's one method
registry (:data:`neuraldbg.methods.METHODS`): ``neuraldbg.methods.get_method(name)`` returns
any of them once this package is imported.
"""

from benchmarks.baselines._common import BaselineMethod
from benchmarks.baselines.anomaly_rank import AnomalyRankBaseline
from benchmarks.baselines.autotrainer import AutoTrainerBaseline
from benchmarks.baselines.deepdiagnosis import DeepDiagnosisBaseline
from benchmarks.baselines.sagemaker_debugger import SageMakerDebuggerBaseline

__all__ = ["AutoTrainerBaseline", "DeepDiagnosisBaseline", "SageMakerDebuggerBaseline",
           "AnomalyRankBaseline", "BaselineMethod", "BASELINES"]

#: Registered names of the baselines.
BASELINES: tuple[str, ...] = ("autotrainer", "deepdiagnosis", "sagemaker_debugger",
                               "anomaly_rank")
