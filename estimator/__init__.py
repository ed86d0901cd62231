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
estimator.plots                      matplotlib helpers (take an ``ax``, return the artists)
"""

from estimator.api import Estimate, ResultTable, estimate, speculative_speedup_grid, sweep
from estimator.dataset import load_dataset
from estimator.db import load_database
from estimator.plan import PlanSpec, load_plan
from estimator.planner import plan
from estimator.procurement import write_report
from estimator.validate import run as validate_published

__all__ = ["Estimate", "ResultTable", "estimate", "sweep", "speculative_speedup_grid", "plan", "PlanSpec",
           "load_plan", "write_report", "load_database", "load_dataset", "validate_published"]
