"""llm-roofline: how fast will this LLM run on that GPU, and what does it need?

Public API
----------
estimate(model, gpu, ...)            one configuration: TTFT, decode speed, memory fit, bounds, intervals
sweep(models, gpus, ...)             the cartesian product of lists, vectorized; ``.to_pandas()``
plan(PlanSpec) / load_plan(path)     the hardware, count, layout and format that meet targets, by cost
write_report(plan_path, out)         a self-contained procurement report
load_database()                      the built-in (and user) hardware and model databases
load_dataset()                       the published measurements shipped with the package
validate_published()                 the cross-validated error of the estimator on those measurements
estimator.reporting.plots                      matplotlib helpers (take an ``ax``, return the artists)
"""

from importlib import import_module

from estimator.evaluation.api import Estimate, ResultTable, estimate, speculative_speedup_grid, sweep
from estimator.planning.search import plan
from estimator.planning.spec import PlanSpec, load_plan
from estimator.reporting.procurement import write_report
from estimator.specs.database import load_database
from estimator.validation.dataset import load_dataset
from estimator.validation.published import run as validate_published

__all__ = ["Estimate", "ResultTable", "estimate", "sweep", "speculative_speedup_grid", "plan", "PlanSpec",
           "load_plan", "write_report", "load_database", "load_dataset", "validate_published", "plots"]


def __getattr__(name: str):
    # `estimator.plots` stays public without importing matplotlib for every estimate.
    if name == "plots":
        return import_module("estimator.reporting.plots")
    raise AttributeError(f"module 'estimator' has no attribute {name!r}")
