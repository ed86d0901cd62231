"""Request-length distributions: what a mix of prompt and output lengths changes under load.

A mix is an equally weighted sample of (prompt, output) pairs: the rows of a CSV of observed
requests, or a preset whose prompt and output lengths are independent: lognormals fixed by a
published median and mean, or upper percentile, or the uniform draws of a benchmark client's
random dataset (``length_presets.yaml``). The formulas are in
docs/formulas.md §14, "Request lengths":

- throughput and Little's law use the mean output E[O];
- the prefill queue sees the mean prefill time and its squared coefficient of variation c_s²;
- a decode batch holds each request for its O steps, so its sequences are length-biased: their mean
  context is E[O (P + O/2)] / E[O], and their final lengths have mean μ = E[O (P + O)] / E[O] and a
  spread σ;
- the largest batch that fits is the N with N μ + z √N σ within the KV cache (z = 2.33: the cache
  overflows in 1% of steps), not the N of the mean request.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from statistics import NormalDist

import numpy as np

from estimator.errors import ConfigurationError, DatabaseError, load_yaml, read_text

PRESETS_FILE = "length_presets.yaml"
QUANTILE_POINTS = 24            # per length of a preset: 24 x 24 = 576 (prompt, output) pairs
OVERFLOW_PROBABILITY = 0.01     # the KV cache may overflow in this share of steps (engines then preempt)
MAX_REQUESTS = 1_000_000        # rows of a lengths file
RUN_POSITIONS = 256             # positions representing the requests of an all-at-once run (run_outputs)
SCALED_PRESET = re.compile(r"^(?P<name>[A-Za-z][\w.-]*)@(?P<prompt>\d+(?:\.\d+)?)/(?P<output>\d+(?:\.\d+)?)$")
# bench_serving's random dataset at a range ratio r below 1 (random-r0.8: from int(0.8 L) to L)
RANDOM_AT_RATIO = re.compile(r"^random-r(?P<ratio>0(?:\.\d+)?)$")


@dataclass(frozen=True)
class LengthMix:
    """An equally weighted sample of requests' (prompt, output) token counts."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    @property
    def mean_prompt_tokens(self) -> float:
        return float(self.prompt_tokens.mean())

    @property
    def mean_output_tokens(self) -> float:
        return float(self.output_tokens.mean())

    def _decode_weighted(self, values: np.ndarray) -> float:
        """The mean of ``values`` over the sequences in a decode batch: each request weighs its O steps."""
        return float(self.output_tokens @ values) / float(self.output_tokens.sum())

    def decode_lengths(self) -> tuple[float, float]:
        """(P', O') of a request whose decode context and final length have the batch's means.

        P' + O'/2 = E[O (P + O/2)] / E[O] (mean context) and P' + O' = E[O (P + O)] / E[O] = μ.
        """
        P, O = self.prompt_tokens, self.output_tokens
        final = self._decode_weighted(P + O)
        context = self._decode_weighted(P + O / 2)
        out = 2 * (final - context)
        return final - out, out

    def final_length_spread(self) -> float:
        """σ of the final length P + O over the sequences in a decode batch (length-biased)."""
        final = self.prompt_tokens + self.output_tokens
        mean = self._decode_weighted(final)
        return math.sqrt(max(self._decode_weighted(final ** 2) - mean ** 2, 0.0))

    def current_length_spread(self) -> float:
        """σ of a running sequence's current length P + u O over a decode batch (length-biased, its progress u
        even over its decode): E[(P + u O)²] = E[P² + P O + O²/3]."""
        P, O = self.prompt_tokens, self.output_tokens
        mean = self._decode_weighted(P + O / 2)
        return math.sqrt(max(self._decode_weighted(P ** 2 + P * O + O ** 2 / 3) - mean ** 2, 0.0))


def request_spread(prefill_s, output_tokens) -> dict:
    """Per-request prefill times (the last axis runs over a mix's requests) reduced to what the queue needs.

    ``prefill_s`` is the mean prefill, ``scv`` its c_s²; a request's own prefill and output length
    are at their own quantile, so the p-quantile of TTFT adds ``prefill_pXX_shift_s`` = S_p − E[S] to
    the queue's, and E2E p99 adds ``output_p99_extra`` = O_p99 − E[O] decode steps. Adding quantiles
    of independent parts overstates the quantile of their sum: an upper estimate.
    """
    prefill_s = np.asarray(prefill_s, dtype=float)
    mean = prefill_s.mean(axis=-1)
    out = {"prefill_s": mean, "scv": prefill_s.var(axis=-1) / np.maximum(mean, 1e-300) ** 2,
           "output_p99_extra": float(np.quantile(output_tokens, 0.99) - np.mean(output_tokens))}
    for name, p in (("p50", 0.50), ("p90", 0.90), ("p99", 0.99)):
        out[f"prefill_{name}_shift_s"] = np.quantile(prefill_s, p, axis=-1) - mean
    return out


def run_outputs(mix: LengthMix, requests) -> np.ndarray:
    """The output lengths of a run of n requests drawn from ``mix``, as RUN_POSITIONS equally weighted positions
    (a trailing axis; :func:`~estimator.serving.burst.all_at_once`).

    Position g holds the order statistic i = ⌈(g + 1) n / G⌉ of the n, the mix's quantile at (i − ½) / n: the
    last is the longest of the n, which ends the run, and a mix of exactly the run's own n requests gives them
    back (Hazen's plotting position returns the i-th of n sorted values).

    Examples
    --------
    >>> mix = LengthMix(np.full(4, 100.0), np.array([10.0, 20.0, 30.0, 400.0]))
    >>> out = run_outputs(mix, 4)
    >>> float(out.max()), float(out.mean())
    (400.0, 115.0)
    """
    n = np.maximum(np.asarray(requests, dtype=float), 1.0)[..., None]
    order = np.ceil((np.arange(RUN_POSITIONS) + 1) * n / RUN_POSITIONS)
    ranked = np.sort(mix.output_tokens)
    # Hazen's quantile at q sits at 0-based rank m q − ½ of the m sorted values, linear between them
    return np.interp(ranked.size * (order - 0.5) / n - 0.5, np.arange(ranked.size), ranked)


def batch_that_fits(max_batch_at_mean, final_mean_tokens: float, final_spread_tokens: float):
    """The largest N with N μ + z √N σ ≤ (KV capacity), the capacity being ``max_batch_at_mean`` sequences of μ.

    Examples
    --------
    Without spread the mean request sets the batch; with a spread of one mean length, fewer fit:

    >>> float(batch_that_fits(100.0, 1000.0, 0.0)), float(batch_that_fits(100.0, 1000.0, 1000.0))
    (100.0, 79.0)
    """
    z = NormalDist().inv_cdf(1 - OVERFLOW_PROBABILITY)
    capacity = np.asarray(max_batch_at_mean, dtype=float) * final_mean_tokens
    b = z * final_spread_tokens
    root = (-b + np.sqrt(b * b + 4 * final_mean_tokens * capacity)) / (2 * final_mean_tokens)
    # without a spread, capacity / μ itself (the square of its square root can round below a whole number)
    return np.floor(np.where(b > 0, root ** 2, capacity / final_mean_tokens))


def file_beside(value: str, folder) -> str:
    """A lengths file as the file that names it (a ``predict`` CSV, a plan) means it: a relative ``.csv`` path from
    that file's ``folder``; a preset or an absolute path as it is."""
    if Path(value).suffix != ".csv" or Path(value).is_absolute():
        return value
    return str(Path(folder) / value)


def read_lengths_file(path: str | Path) -> LengthMix:
    """A CSV with columns ``prompt,output`` (tokens per request, one request per row). An output may be 0: a
    request that ended before its first token, as a benchmark's per-request record keeps it."""
    text = read_text(path, "--lengths", ConfigurationError)
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames or not {"prompt", "output"} <= {f.strip() for f in reader.fieldnames}:
        raise ConfigurationError(f"--lengths {path}: expected a CSV with columns prompt,output (tokens per request), "
                                 f"got columns {reader.fieldnames}")
    prompts, outputs = [], []
    for line, row in enumerate(reader, start=2):
        row = {(k or "").strip(): v for k, v in row.items()}
        for key, into, minimum in (("prompt", prompts, 1), ("output", outputs, 0)):
            text = (row.get(key) or "").strip()
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not (math.isfinite(value) and value.is_integer() and minimum <= value <= 1e8):
                raise ConfigurationError(f"--lengths {path}, line {line}: {key} must be a whole number of tokens "
                                         f"from {minimum} to 100,000,000, got {text!r}")
            into.append(value)
        if len(prompts) > MAX_REQUESTS:
            raise ConfigurationError(f"--lengths {path}: more than {MAX_REQUESTS:,} requests; sample them first")
    if not any(outputs):
        raise ConfigurationError(f"--lengths {path}: no request with an output token (expected rows of prompt,output)")
    return LengthMix(np.array(prompts), np.array(outputs))


# A preset's lognormal is fixed by its median and one more published statistic: the mean when it is
# given (it sets throughput), else an upper percentile (exp(σ z_p) = p-quantile / median).
SPREAD_STATISTICS = {"mean": None, "p90": 0.90, "p99": 0.99}


def lognormal_sigma(part: dict) -> float:
    """σ of the lognormal through a preset part's median and its mean (or p90, or p99)."""
    for key, p in SPREAD_STATISTICS.items():
        if key in part:
            ratio = part[key] / part["median"]
            return math.sqrt(2 * math.log(ratio)) if p is None else math.log(ratio) / NormalDist().inv_cdf(p)
    raise KeyError("mean, p90 or p99")


def _is_uniform(part: dict) -> bool:
    """A part drawn uniformly from ``low`` to ``high`` tokens (a benchmark client's random dataset)."""
    return "high" in part


@lru_cache(maxsize=1)
def load_presets() -> dict:
    """The presets' published statistics, checked: a source, and either a median with a larger mean, p90 or p99,
    or the range ``low`` < ``high`` of a uniform draw."""
    doc = load_yaml(resources.files("estimator.serving").joinpath(PRESETS_FILE).read_text())
    for name, entry in doc.items():
        for key in ("prompt", "output"):
            part = entry.get(key) or {}
            spread = next((part[k] for k in SPREAD_STATISTICS if k in part), 0)
            shaped = (0 <= part.get("low", -1) < part["high"]) if _is_uniform(part) else \
                0 < part.get("median", 0) < spread
            if not (part.get("source", "").startswith("http") and shaped):
                raise DatabaseError(f"estimator/serving/{PRESETS_FILE}: {name}.{key} needs a source URL, and a median "
                                    "with a larger mean, p90 or p99, or a range low < high")
    return doc


def _lognormal_points(part: dict) -> np.ndarray:
    """A preset part's lognormal as equally likely points: the mean of each of QUANTILE_POINTS equal-probability
    bins, E[X | bin] = e^{μ+σ²/2} (Φ(z_b − σ) − Φ(z_a − σ)) / P(bin), so the points keep the mean exactly."""
    median, sigma = part["median"], lognormal_sigma(part)
    normal = NormalDist()
    edges = [-math.inf] + [normal.inv_cdf(k / QUANTILE_POINTS) for k in range(1, QUANTILE_POINTS)] + [math.inf]
    mean = median * math.exp(sigma ** 2 / 2)
    points = [mean * (normal.cdf(b - sigma) - normal.cdf(a - sigma)) * QUANTILE_POINTS
              for a, b in zip(edges[:-1], edges[1:])]
    return np.maximum(np.round(points), 1.0)


def _uniform_points(part: dict) -> np.ndarray:
    """A uniform draw from ``low`` to ``high`` tokens as the means of QUANTILE_POINTS equal-probability bins,
    evenly spaced, keeping the mean (low + high) / 2; at least one token (a reply the client sized at 0 tokens
    still streams its first)."""
    low, high = part["low"], part["high"]
    return np.maximum(np.round(low + (high - low) * (np.arange(QUANTILE_POINTS) + 0.5) / QUANTILE_POINTS), 1.0)


def _points(part: dict) -> np.ndarray:
    return _uniform_points(part) if _is_uniform(part) else _lognormal_points(part)


def _entry(name: str) -> dict | None:
    """A preset's parts: a named preset's, or for ``random-rR`` the ``random`` draw at range ratio R, its lengths from
    max(int(R L), 1) (prompts) or int(R L) (outputs) to the set length L, as bench_serving draws them."""
    presets = load_presets()
    if name in presets:
        return presets[name]
    at_ratio = RANDOM_AT_RATIO.match(name)
    if at_ratio is None:
        return None
    ratio, draw = float(at_ratio["ratio"]), presets["random"]
    return {"prompt": {**draw["prompt"], "low": max(int(ratio * draw["prompt"]["high"]), 1)},
            "output": {**draw["output"], "low": int(ratio * draw["output"]["high"])}}


def _preset_names() -> str:
    return ", ".join([*load_presets(), "random-rR (a range ratio R from 0 to below 1)"])


def preset(name: str) -> LengthMix:
    """A preset as a mix: independent prompt and output lengths, each on a quantile grid."""
    entry = _entry(name)
    if entry is None:
        raise ConfigurationError(f"--lengths {name!r}: not a CSV file or a preset; presets: {_preset_names()}")
    prompts, outputs = _points(entry["prompt"]), _points(entry["output"])
    P, O = np.meshgrid(prompts, outputs, indexing="ij")
    return LengthMix(P.ravel(), O.ravel())


def scaled_preset(name: str, prompt_mean: float, output_mean: float) -> LengthMix:
    """A preset's shape at other means (``sharegpt@229/217``): every length scaled by the ratio of the means,
    rounded to whole tokens, at least one. For a benchmark that states a dataset and its mean lengths only."""
    mix = preset(name)
    return LengthMix(np.maximum(np.round(mix.prompt_tokens * prompt_mean / mix.mean_prompt_tokens), 1.0),
                     np.maximum(np.round(mix.output_tokens * output_mean / mix.mean_output_tokens), 1.0))


def preset_at_means(name: str, prompt_mean: float, output_mean: float) -> str:
    """The ``--lengths`` value of preset ``name`` at these means (``sharegpt@229/217``), the name checked."""
    if _entry(name) is None:
        raise ConfigurationError(f"'lengths' must name a length preset ({_preset_names()}), got {name!r}")
    return f"{name}@{prompt_mean:g}/{output_mean:g}"


def _preset_name(value: str) -> tuple[str, re.Match | None]:
    """The preset a ``--lengths`` value names, and the match of its means where it gives them (``sharegpt@229/217``);
    a file's path comes back as it is."""
    scaled = SCALED_PRESET.match(value)
    return (scaled["name"] if scaled else value), scaled


def at_means(value: str, prompt_mean: float, output_mean: float) -> str | None:
    """The length mix ``value`` at other means: its preset, scaled (``sharegpt@458/217``); None for a file of
    requests, which are what they are."""
    name, _ = _preset_name(value)
    return preset_at_means(name, prompt_mean, output_mean) if _entry(name) is not None else None


@dataclass(frozen=True)
class RandomDraw:
    """bench_serving's random-dataset settings: prompts drawn from max(int(R L), 1) to L tokens, outputs from
    int(R O) to O (``--random-range-ratio`` R, ``--random-input-len`` L, ``--random-output-len`` O)."""

    range_ratio: float
    input_len: int
    output_len: int


def random_draw(value: str | None) -> RandomDraw | None:
    """The client settings that draw the mix ``value``: the ``random`` preset or ``random-rR``, as named (their set
    lengths) or at other means (``random@610/421``: set lengths in the ratio of those means to the preset's, which is
    how :func:`scaled_preset` scales the draw); None for any other mix, which no client draws."""
    name, scaled = _preset_name(value or "")
    at_ratio = RANDOM_AT_RATIO.match(name)
    if name != "random" and at_ratio is None:
        return None
    ratio, prompt, output = float(at_ratio["ratio"]) if at_ratio else 0.0, *(_entry(name)[k]["high"]
                                                                           for k in ("prompt", "output"))
    if scaled is None:
        return RandomDraw(ratio, prompt, output)
    mix = preset(name)
    return RandomDraw(ratio, round(prompt * float(scaled["prompt"]) / mix.mean_prompt_tokens),
                      round(output * float(scaled["output"]) / mix.mean_output_tokens))


@lru_cache(maxsize=8)
def length_mix(value: str) -> LengthMix:
    """A preset name, a preset at other means (``NAME@PROMPT/OUTPUT``), or the path of a CSV of requests
    (read once per run)."""
    scaled = SCALED_PRESET.match(value)
    if scaled:
        prompt_mean, output_mean = float(scaled["prompt"]), float(scaled["output"])
        if not (prompt_mean >= 1 and output_mean >= 1):
            raise ConfigurationError(f"--lengths {value}: the mean prompt and output must be at least 1 token")
        return scaled_preset(scaled["name"], prompt_mean, output_mean)
    if _entry(value) is not None:     # before a file: random-r0.8 looks like a name with a suffix
        return preset(value)
    return read_lengths_file(value) if Path(value).suffix or Path(value).exists() else preset(value)
