"""llm-roofline: roofline estimates of LLM inference speed and memory fit.

The public API is :func:`estimate` (one configuration) and :func:`sweep` (the
cartesian product of lists), plus :func:`load_database` for the built-in and
user databases.
"""

from estimator.api import Estimate, ResultTable, estimate, sweep
from estimator.db import load_database

__all__ = ["Estimate", "ResultTable", "estimate", "sweep", "load_database"]
