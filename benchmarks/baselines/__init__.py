"""Peer methods ported as baselines, each registered as a diagnosis method by name.

``autotrainer`` (AutoTrainer's monitor rules), ``deepdiagnosis`` (DeepDiagnosis's symptom
checks), ``sagemaker_debugger`` (Amazon SageMaker Debugger's built-in rules at their
documented defaults) and ``anomaly_rank`` (layers ranked by a robust anomaly score). Each is
written from the published rule descriptions (docs/evaluation.md), with no peer code, and
maps its output onto the contract's :class:`~neuraldbg.records.Hypothesis`, so the harness compares every method
through ``explain(trace) -> list[Hypothesis]``.
"""

from benchmarks.baselines._registry import get_method, list_methods, register_method
from benchmarks.baselines.anomaly_rank import AnomalyRankBaseline
from benchmarks.baselines.autotrainer import AutoTrainerBaseline
from benchmarks.baselines.deepdiagnosis import DeepDiagnosisBaseline
from benchmarks.baselines.sagemaker_debugger import SageMakerDebuggerBaseline

__all__ = ["AutoTrainerBaseline", "DeepDiagnosisBaseline", "SageMakerDebuggerBaseline",
           "AnomalyRankBaseline",
           "BASELINES", "get_method", "list_methods", "register_method"]

#: Registered names of the baselines.
BASELINES: tuple[str, ...] = ("autotrainer", "deepdiagnosis", "sagemaker_debugger",
                               "anomaly_rank")
