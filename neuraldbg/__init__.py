"""NeuralDBG: explains why a PyTorch training run failed.

Capture compact statistics at module boundaries with :class:`NeuralDbg`, save and load the
run as a :class:`Trace`, and explain the failure afterwards.
"""

from neuraldbg.capture import CaptureConfig
from neuraldbg.debugger import NeuralDbg, what_if
from neuraldbg.errors import (
    CaptureError,
    MissingDependencyError,
    NeuralDbgError,
    NeuralDbgWarning,
    NotFittedError,
    SchemaVersionError,
    TraceFormatError,
    TraceLockedError,
)
from neuraldbg.methods import (
    DiagnosisMethod,
    HeuristicReasoner,
    detect_coupled_failures,
    explain,
    export_mermaid_causal_graph,
    get_method,
    get_root_causes,
    register_method,
)
from neuraldbg.records import FAILURE_TYPES, HEALTHY, ROOT_CAUSES, Event, Hypothesis
from neuraldbg.reporting import write_report
from neuraldbg.trace import SCHEMA_VERSION, Trace, load_trace
from neuraldbg.version import __version__

__all__ = [
    "NeuralDbg",
    "__version__",
    "DiagnosisMethod",
    "what_if",
    "explain",
    "get_root_causes",
    "detect_coupled_failures",
    "export_mermaid_causal_graph",
    "write_report",
    "HeuristicReasoner",
    "register_method",
    "get_method",
    "CaptureConfig",
    "Trace",
    "load_trace",
    "Hypothesis",
    "Event",
    "FAILURE_TYPES",
    "ROOT_CAUSES",
    "HEALTHY",
    "SCHEMA_VERSION",
    "NeuralDbgError",
    "TraceFormatError",
    "TraceLockedError",
    "SchemaVersionError",
    "CaptureError",
    "NotFittedError",
    "MissingDependencyError",
    "NeuralDbgWarning",
]
