"""A finite closed loop starts with every client at once.

``vllm bench serve`` and SGLang's bench_serving with ``--max-concurrency C`` and ``--num-prompts N`` issue all N
requests together and let C of them run: the first C start at once, and each later one when a running one ends
(docs/formulas.md §14, "Finite closed loops"). The run has three parts:

- **the first wave**, C requests sent at once (:func:`~estimator.serving.burst.all_at_once`), a share w = C/N of
  the run: each waits for the prompts admitted before its own;
- **the steady state** of C clients whose lengths vary, so that they desynchronise
  (:mod:`estimator.serving.continuous_batching`), for the other N − C;
- **the end**: the N-th request starts once N − C have ended, and the run lasts until the longest reply then
  running ends, in a thinning batch (:func:`~estimator.serving.run_end.finite_run_s`). Each client's requests
  follow one another, a renewal process started afresh at t = 0, so by time t it has ended t/μ + (c² − 1)/2 of
  them on average, μ = C/X a request's time in the system and c² its squared coefficient of variation (the
  renewal function's asymptote): the N-th starts at (N − C)/X + (1 − c²)/2 · C/X, half a request's time later
  than in the steady state when every request is alike, none when their times are exponential.

A benchmark's mean TTFT is then w T_wave + (1 − w) T_steady, and its quantiles are those of the pooled requests:
the wave's at their admission positions and the steady state's through its median, p90 and p99, linear in p
between them and from its lowest value, one prompt's own prefill, at p = 0. With equal lengths on an engine
whose prefill steps run alone the clients never desynchronise, and every cycle is a wave
(``_in_lockstep`` in :mod:`estimator.evaluation.compute`).
"""

from __future__ import annotations

import numpy as np

from estimator.serving.mixed_steps import weighted_quantile
from estimator.serving.percentiles import PERCENTILES

STEADY_POINTS = 200   # equally likely points standing for the steady state's TTFT distribution
_LEVELS = np.array([0.0, *PERCENTILES.values()])                 # the lowest TTFT, then p50, p90, p99
_POINTS = (np.arange(STEADY_POINTS) + 0.5) / STEADY_POINTS
# each point's segment between two known levels and its place along it (past p99: flat at p99)
STEADY_SEGMENT = np.clip(np.searchsorted(_LEVELS, _POINTS, side="right") - 1, 0, _LEVELS.size - 2)
STEADY_FRACTION = np.clip((_POINTS - _LEVELS[STEADY_SEGMENT]) / np.diff(_LEVELS)[STEADY_SEGMENT], 0.0, 1.0)


def first_wave_ttft(share, wave: dict, steady: dict, lowest_s) -> dict[str, np.ndarray]:
    """Mean TTFT and its quantiles (``ttft_s``, ``ttft_p50_s`` …) of a run whose first ``share`` w of requests
    came as the all-at-once ``wave`` (its per-position TTFTs, ``ttft_each_s``, on a trailing axis) and the rest
    in the ``steady`` state (its mean and quantiles); ``lowest_s``: the steady state's least TTFT, one prompt's
    prefill alone.

    Examples
    --------
    A fifth of the requests in a wave whose first tokens come at 1, 2, 3 and 4 s, the rest at a steady 0.1 s
    (median 0.1 s, p90 0.15 s, p99 0.2 s): the mean is 0.58 s; the median stays in the steady state, the p90 is
    the wave's median and the p99 its last position.

    >>> wave = {"ttft_s": np.array(2.5), "ttft_each_s": np.array([1.0, 2.0, 3.0, 4.0])}
    >>> steady = {"ttft_s": np.array(0.1), "ttft_p50_s": np.array(0.1), "ttft_p90_s": np.array(0.15),
    ...           "ttft_p99_s": np.array(0.2)}
    >>> r = first_wave_ttft(0.2, wave, steady, 0.05)
    >>> [round(float(r[k]), 3) for k in ("ttft_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s")]
    [0.58, 0.115, 2.0, 4.0]
    """
    w = np.clip(np.asarray(share, dtype=float), 0.0, 1.0)
    each = np.asarray(wave["ttft_each_s"], dtype=float)
    # the steady state's quantile function: through (0, lowest), (0.5, p50), (0.9, p90), (0.99, p99), flat beyond
    median = np.asarray(steady["ttft_p50_s"], dtype=float)
    known = np.stack(np.broadcast_arrays(np.minimum(lowest_s, median),   # a mix's median may be a short prompt's
                                         *(np.asarray(steady[f"ttft_{q}_s"], dtype=float) for q in PERCENTILES)),
                     axis=-1)
    known = np.maximum.accumulate(known, axis=-1)                  # a quantile function does not decrease
    steady_points = known[..., STEADY_SEGMENT] + STEADY_FRACTION * (known[..., STEADY_SEGMENT + 1]
                                                                    - known[..., STEADY_SEGMENT])
    shape = np.broadcast_shapes(w.shape, each.shape[:-1], steady_points.shape[:-1])
    values = np.concatenate([np.broadcast_to(each, shape + each.shape[-1:]),
                             np.broadcast_to(steady_points, shape + (STEADY_POINTS,))], axis=-1)
    weights = np.concatenate([np.broadcast_to((w / each.shape[-1])[..., None], shape + each.shape[-1:]),
                              np.broadcast_to(((1 - w) / STEADY_POINTS)[..., None], shape + (STEADY_POINTS,))],
                             axis=-1)
    out = {"ttft_s": w * wave["ttft_s"] + (1 - w) * steady["ttft_s"]}
    out.update({f"ttft_{q}_s": weighted_quantile(values, weights, level, np.nan) for q, level in PERCENTILES.items()})
    return out


def last_start_s(requests, clients, request_rate, time_scv):
    """When the last of ``requests`` N starts through ``clients`` C served at ``request_rate`` X, each request's
    time in the system having the squared coefficient of variation ``time_scv`` c²: (N − C)/X + (1 − c²)/2 · C/X.

    Examples
    --------
    320 requests through 64 clients at 4 requests/s, every request alike: 64 s of renewals, 8 s behind the
    steady state's pace (half of a request's 16 s).

    >>> float(last_start_s(320, 64, 4.0, 0.0))
    72.0
    """
    X = np.maximum(np.asarray(request_rate, dtype=float), 1e-300)
    C = np.asarray(clients, dtype=float)
    return np.maximum(np.asarray(requests, dtype=float) - C, 0.0) / X + (1 - np.asarray(time_scv)) / 2 * C / X
