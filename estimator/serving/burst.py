"""An all-at-once run: n requests sent together to an engine that holds them all (a finite offline benchmark).

``vllm bench serve`` without a rate (its default), SGLang's bench_serving with ``--request-rate inf`` and
an offline batch job all send every request at once. No steady state forms; the run has two phases
(docs/formulas.md §14, "All-at-once runs"):

- **Prompts.** The engine works through the n · P prompt tokens in steps of at most K tokens (its chunk
  or per-step budget): ⌈n P / K⌉ steps of s = T_pf / steps each, T_pf the whole batch's prefill. A
  request's first token comes with the step that finishes its prompt; over the admission order x ∈ [0, 1]
  that is TTFT(x) = (⌊x · steps⌋ + 1) · s, a mean of about T_pf / 2, not the one prompt's prefill that a
  steady state pays.
- **Mixed steps.** An engine that mixes decode tokens into prefill steps (vLLM V1, TensorRT-LLM's in-flight
  batching, llama.cpp's server) gives every admitted request one token per step while prompts remain, each
  step lasting s; an engine whose prefill steps run alone (SGLang's default) decodes nothing until the
  last prompt is in. Either way a request's early tokens come at prefill pace, so its time per output
  token (TPOT, the mean of (E2E − TTFT) / (O − 1) that serving benchmarks print) is well above a bare
  decode step.
- **Decode.** After T_pf the requests left decode together, the batch shrinking as they finish (early
  admissions finish first when steps were mixed). A decode step of n' sequences is taken as affine in
  n' between the step at one sequence and at all n: weights stream once per step, KV reads and
  per-sequence costs grow with the batch.

The run's output throughput is n · O over its duration, the last request's E2E. Requests are represented
by a grid of G admission positions (each n / G requests), so every input may be an array (a sweep).
"""

from __future__ import annotations

import numpy as np

POSITIONS = 64   # admission positions x = (g + 1/2) / G representing the n requests


def all_at_once(requests, prefill_s, prompt_tokens, output_tokens, step_tokens, step_one_s, step_all_s,
                mixed) -> dict[str, np.ndarray]:
    """Mean TTFT, TPOT and E2E, duration and output throughput of n requests sent at once (per replica).

    Parameters
    ----------
    requests : array
        n, the requests of the run, all running at once (at most the engine's running-batch limit).
    prefill_s : array
        T_pf, the prefill of all n prompts as one batch.
    prompt_tokens, output_tokens : array
        P (tokens computed per prompt) and O per request.
    step_tokens : array
        K, the most prompt tokens one step takes (the engine's chunk or per-step budget; at least P).
    step_one_s, step_all_s : array
        A decode step at one sequence and at n.
    mixed : array of bool
        Decode tokens ride along in prefill steps (else prefill steps run alone).

    Examples
    --------
    100 prompts of 1,000 tokens in steps of 10,000 (10 steps of 0.2 s, T_pf = 2 s), 11 output tokens, a
    decode step of 10 ms at one sequence and 30 ms at 100. With steps run alone every first token waits
    for its step (mean TTFT 1.1 s) and the decode starts for all at 2 s: TPOT = 30 ms + the wait from a
    request's first token to the end of the prompts, over 10 tokens.

    >>> r = all_at_once(100, 2.0, 1000, 11, 10_000, 0.010, 0.030, False)
    >>> round(float(r["ttft_s"]), 3), round(float(r["tpot_s"]), 4), round(float(r["duration_s"]), 2)
    (1.1, 0.12, 2.3)

    Mixed, the first prompts' requests take their tokens at prefill pace (0.2 s a step) and finish before
    the last prompt is in, the last ones decode in a batch that has shrunk:

    >>> r = all_at_once(100, 2.0, 1000, 11, 10_000, 0.010, 0.030, True)
    >>> round(float(r["ttft_s"]), 3), round(float(r["tpot_s"]), 4), round(float(r["duration_s"]), 2)
    (1.1, 0.1032, 2.21)
    """
    n, T_pf, P, O, K, d1, dn, mixed = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (
        requests, prefill_s, prompt_tokens, output_tokens, step_tokens, step_one_s, step_all_s, mixed)))
    mixed = mixed > 0
    steps = np.maximum(np.ceil(n * P / np.maximum(K, 1.0)), 1.0)
    # a mixed step also carries the decode of the admitted requests: at least a decode step of about half
    # of them (the mean over the prompt phase)
    slope = np.where(n > 1, (dn - d1) / np.maximum(n - 1, 1.0), 0.0)
    step_s = np.where(mixed, np.maximum(T_pf / steps, d1 + slope * (n / 2 - 1).clip(0)), T_pf / steps)
    prompts_end_s = steps * step_s

    x = (np.arange(POSITIONS) + 0.5) / POSITIONS
    first_step = np.floor(x * steps[..., None]) + 1                        # the step that ends its prompt
    ttft = first_step * step_s[..., None]
    tokens_left = np.maximum(O - 1, 0.0)[..., None]
    in_prompt_phase = np.where(mixed[..., None], np.minimum(steps[..., None] - first_step, tokens_left), 0.0)
    # the positions in order of the decode-phase tokens they have left (only means and the maximum are reported,
    # so the order of positions does not matter)
    order = np.argsort(tokens_left - in_prompt_phase, axis=-1)
    ttft, in_prompt_phase = (np.take_along_axis(a, order, axis=-1) for a in (ttft, in_prompt_phase))
    remaining = tokens_left - in_prompt_phase                              # ascending
    # decode phase: step k of it runs the positions with more than k tokens left; with G positions of n / G
    # requests, the steps a position takes cost r (d1 − slope) + slope (n / G) Σ_h min(r_h, r), and for the
    # ascending r that sum is the positions before plus r for it and every one after
    overlap = np.cumsum(remaining, axis=-1) - remaining + remaining * (POSITIONS - np.arange(POSITIONS))
    decode_s = remaining * (d1 - slope)[..., None] + (slope * n / POSITIONS)[..., None] * overlap
    e2e = np.where(remaining > 0, prompts_end_s[..., None] + decode_s, ttft + in_prompt_phase * step_s[..., None])
    # with a single output token there is no gap to time: the decode step at n stands for it, as at a fixed batch
    tpot = np.where(tokens_left > 0, (e2e - ttft) / np.maximum(tokens_left, 1.0), dn[..., None])
    duration = e2e.max(axis=-1)
    out = {"ttft_s": ttft.mean(axis=-1), "tpot_s": tpot.mean(axis=-1), "e2e_latency_s": e2e.mean(axis=-1),
           "duration_s": duration, "throughput_out_tps": n * O / duration, "prefill_phase_s": prompts_end_s}
    out.update({f"ttft_{q}_s": np.quantile(ttft, p, axis=-1) for q, p in QUANTILES.items()})
    out["e2e_p99_s"] = np.quantile(e2e, 0.99, axis=-1)
    # the gaps between tokens: those in the prompt phase (a step each), the first after it (from a request's
    # last token to the end of the prompts, plus a decode step) and the rest at the position's mean decode step
    decode_gap = np.where(remaining > 0, decode_s / np.maximum(remaining, 1.0), dn[..., None])
    last_prompt_token_s = ttft + in_prompt_phase * step_s[..., None]
    gaps = np.concatenate([step_s[..., None] + 0 * ttft, prompts_end_s[..., None] - last_prompt_token_s + decode_gap,
                           decode_gap], axis=-1)
    counts = np.concatenate([in_prompt_phase, np.minimum(remaining, 1.0), np.maximum(remaining - 1, 0.0)], axis=-1)
    out.update({f"itl_{q}_s": _weighted_quantile(gaps, counts, p, dn) for q, p in QUANTILES.items()})
    return out


QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def _weighted_quantile(values, weights, q, empty):
    """The q-quantile of ``values`` each counted ``weights`` times along the last axis (``empty`` where no weight)."""
    order = np.argsort(values, axis=-1)
    values, weights = np.take_along_axis(values, order, axis=-1), np.take_along_axis(weights, order, axis=-1)
    cumulative = np.cumsum(weights, axis=-1)
    total = cumulative[..., -1:]
    first = np.argmax(cumulative >= q * total, axis=-1)[..., None]
    return np.where(total[..., 0] > 0, np.take_along_axis(values, first, axis=-1)[..., 0], empty)
