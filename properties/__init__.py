"""Safety, no-progress, livelock and fairness properties, named once and used everywhere."""

from .evaluate import VERDICTS, Evaluation, evaluate
from .registry import REGISTRY, Property, Violation

__all__ = ["REGISTRY", "Property", "Violation", "Evaluation", "evaluate", "VERDICTS"]
