"""The measured metrics `roofline predict` and validation compare: the result column each is read from, in
which unit, and the lengths a row needs to be evaluated at all."""

from __future__ import annotations

from estimator.evaluation.intervals import PREFILL_METRICS, THROUGHPUT_METRICS

# metric name -> (result column, factor from base units to the metric's unit)
METRICS = {
    "decode_tps_per_seq": ("decode_tps_per_seq", 1.0),
    "decode_tps_total": ("decode_tps_total", 1.0),
    "prefill_tps": ("prefill_tps", 1.0),
    "ttft_ms": ("ttft_s", 1e3),
    "itl_ms": ("itl_s", 1e3),
    "throughput_out_tps": ("throughput_out_tps", 1.0),
    "throughput_out_tps_per_gpu": ("throughput_out_tps_per_gpu", 1.0),
    "e2e_latency_s": ("e2e_latency_s", 1.0),
}
# A latency published as a percentile of a serving benchmark is compared with the same percentile of
# the queueing model (docs/formulas.md §14); a mean, or a statistic the model lacks, with the mean.
PERCENTILE_COLUMNS = {("ttft_ms", "median"): "ttft_p50_s", ("ttft_ms", "p90"): "ttft_p90_s",
                      ("ttft_ms", "p99"): "ttft_p99_s", ("itl_ms", "median"): "itl_p50_s",
                      ("itl_ms", "p90"): "itl_p90_s", ("itl_ms", "p99"): "itl_p99_s",
                      ("e2e_latency_s", "p99"): "e2e_p99_s"}


def result_column(metric: str, statistic: str, engine_sets_batch: bool) -> tuple[str, float]:
    """The result column a measured metric is compared with, and the factor to the metric's unit: a percentile
    where the engine's scheduler runs the requests (under a load, or all sent at once)."""
    column, factor = METRICS[metric]
    return (PERCENTILE_COLUMNS.get((metric, statistic), column) if engine_sets_batch else column), factor


# The lengths a metric cannot be evaluated without: an empty cell is no length. A decode speed is measured after
# whatever prompt the source used, taken as short when unstated; a prompt's speed or time needs its length, and
# a whole request's time or a throughput needs both (an MLPerf summary states neither).
NEEDS_LENGTHS = {**{metric: ("input_len",) for metric in PREFILL_METRICS},
                 **{metric: ("input_len", "output_len") for metric in (*THROUGHPUT_METRICS, "e2e_latency_s")}}
