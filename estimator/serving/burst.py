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

import math

import numpy as np

from estimator.serving.mixed_steps import MixedSteps, weighted_quantile
from estimator.serving.percentiles import PERCENTILES

POSITIONS = 64   # admission positions x = (g + 1/2) / G representing the n requests


def all_at_once(requests, prefill_s, prompt_tokens, output_tokens, step_tokens, step_one_s, step_all_s,
                mixed, outputs=None) -> dict[str, np.ndarray]:
    """Mean TTFT, TPOT and E2E, duration and output throughput of n requests sent at once (per replica), and
    the TTFT at each admission position (``ttft_each_s``, a trailing axis).

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
    outputs : array, optional
        The output lengths of the run's requests as G equally weighted positions (a trailing axis; a length
        mix's order statistics, :func:`run_outputs`), admitted in an order unrelated to their lengths. The
        run then lasts until its longest request ends, its batch thinning to the stragglers; its throughput
        is their total over that. Without it every request has ``output_tokens``.

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
    if outputs is None:
        G = POSITIONS
        each = np.broadcast_to(O[..., None], O.shape + (G,))
    else:   # a stride through the lengths, coprime with G, so admission order says nothing of length
        G = np.shape(outputs)[-1]
        stride = next(k for k in range(G // 2 + 1, G + 1) if math.gcd(k, G) == 1)
        each = np.broadcast_to(np.asarray(outputs, dtype=float), O.shape + (G,))[..., (np.arange(G) * stride) % G]
    steps = np.maximum(np.ceil(n * P / np.maximum(K, 1.0)), 1.0)
    # a mixed step also carries the decode of the admitted requests: at least a decode step of about half
    # of them (the mean over the prompt phase)
    slope = np.where(n > 1, (dn - d1) / np.maximum(n - 1, 1.0), 0.0)
    step_s = np.where(mixed, np.maximum(T_pf / steps, d1 + slope * (n / 2 - 1).clip(0)), T_pf / steps)
    prompts_end_s = steps * step_s

    x = (np.arange(G) + 0.5) / G
    first_step = np.floor(x * steps[..., None]) + 1                        # the step that ends its prompt
    ttft = first_step * step_s[..., None]
    tokens_left = np.maximum(each - 1, 0.0)
    in_prompt_phase = np.where(mixed[..., None], np.minimum(steps[..., None] - first_step, tokens_left), 0.0)
    # the positions in order of the decode-phase tokens they have left (only means and the maximum are reported,
    # so the order of positions does not matter)
    order = np.argsort(tokens_left - in_prompt_phase, axis=-1)
    ttft, in_prompt_phase, tokens_left = (np.take_along_axis(np.broadcast_to(a, order.shape), order, axis=-1)
                                          for a in (ttft, in_prompt_phase, tokens_left))
    remaining = tokens_left - in_prompt_phase                              # ascending
    # decode phase: step k of it runs the positions with more than k tokens left; with G positions of n / G
    # requests, the steps a position takes cost r (d1 − slope) + slope (n / G) Σ_h min(r_h, r), and for the
    # ascending r that sum is the positions before plus r for it and every one after
    overlap = np.cumsum(remaining, axis=-1) - remaining + remaining * (G - np.arange(G))
    decode_s = remaining * (d1 - slope)[..., None] + (slope * n / G)[..., None] * overlap
    e2e = np.where(remaining > 0, prompts_end_s[..., None] + decode_s, ttft + in_prompt_phase * step_s[..., None])
    # with a single output token there is no gap to time: the decode step at n stands for it, as at a fixed batch
    tpot = np.where(tokens_left > 0, (e2e - ttft) / np.maximum(tokens_left, 1.0), dn[..., None])
    duration = e2e.max(axis=-1)
    out = {"ttft_s": ttft.mean(axis=-1), "tpot_s": tpot.mean(axis=-1), "e2e_latency_s": e2e.mean(axis=-1),
           "duration_s": duration, "throughput_out_tps": n * each.mean(axis=-1) / duration,
           "prefill_phase_s": prompts_end_s, "ttft_each_s": ttft}
    out.update({f"ttft_{q}_s": np.quantile(ttft, p, axis=-1) for q, p in PERCENTILES.items()})
    out["e2e_p99_s"] = np.quantile(e2e, 0.99, axis=-1)
    # the gaps between tokens: those in the prompt phase (a step each), the first after it (from a request's
    # last token to the end of the prompts, plus a decode step) and the rest at the position's mean decode step
    decode_gap = np.where(remaining > 0, decode_s / np.maximum(remaining, 1.0), dn[..., None])
    last_prompt_token_s = ttft + in_prompt_phase * step_s[..., None]
    gaps = np.concatenate([step_s[..., None] + 0 * ttft, prompts_end_s[..., None] - last_prompt_token_s + decode_gap,
                           decode_gap], axis=-1)
    counts = np.concatenate([in_prompt_phase, np.minimum(remaining, 1.0), np.maximum(remaining - 1, 0.0)], axis=-1)
    out.update({f"itl_{q}_s": weighted_quantile(gaps, counts, p, dn) for q, p in PERCENTILES.items()})
    # the mean gap over every token (vllm bench serve's mean ITL): the requests' mean TPOT when all have one length,
    # while with unequal lengths the many tokens of the long requests, decoded as the batch thins, weigh more
    total = counts.sum(axis=-1)
    out["itl_mean_s"] = np.where(total > 0, (gaps * counts).sum(axis=-1) / np.maximum(total, 1.0), dn)
    return out


def backlog(requests, slots, prefill_s, prefill_linear_s, prompt_tokens, output_tokens, step_tokens, decode_s,
            decode_linear_s, mixed) -> dict[str, np.ndarray]:
    """Mean and percentile latencies of n requests sent at once to an engine that runs only S of them.

    The engine refills each freed slot from the waiting requests, so after a short ramp it runs a steady
    backlog (docs/formulas.md §14, "All-at-once runs beyond the running limit"). Each step admits a
    requests on average, whose prompts ride in it with the n = a (O − 1) sequences decoding. Two limits
    bound a: the step's token budget K (n + a P ≤ K, vLLM's max_num_batched_tokens) and the slots, each held
    for the ⌈P / (K − n)⌉ steps of its prompt and O − 1 more: a = min(K / (P + O − 1),
    S / (⌈P / (K − n)⌉ + O − 1)).

    A decode step of n costs d(n), affine between one sequence and S; the prompts a step carries (a Poisson
    count of mean a) add their prefill at T_pf / (S P) a token, less the decode's linear layers that hide
    under them where decode tokens ride in prefill steps (:mod:`estimator.serving.mixed_steps`). Where
    prefill steps run alone, nothing hides.

    Requests complete at X = a / t̄ a second (t̄ the mean step): request i has its first token at
    (i + 1) / X, so TTFT's mean is (n + 1) / (2X) and its q-quantile q n / X; the last prompt is in at n / X
    and the run lasts n / X + (O − 1) t̄. A request's own prompt is never in its decode window, so the steps
    it decodes through take the prompts of the other S − 1 slots, a (S − 1) / S a step: their mean is its
    TPOT, and the quantiles of their times are the ITL percentiles.

    Parameters
    ----------
    requests, slots : array
        n, and S < n, the sequences the engine runs at once.
    prefill_s, prefill_linear_s : array
        T_pf, the prefill of S prompts as one batch, and its linear layers' part.
    prompt_tokens, output_tokens, step_tokens, mixed : array
        As for :func:`all_at_once`.
    decode_s, decode_linear_s : tuple of arrays
        A decode step at one sequence and at S, and the linear layers' part of each.

    Examples
    --------
    1,000 prompts of 1,000 tokens and 11 output tokens, 100 slots, a budget of 2,000 tokens a step, prefill at
    0.1 ms a token (all of it linear layers), decode 10 ms at one sequence and 30 ms at 100 (8 ms and 10 ms
    of it linear layers). The budget, not the slots, binds: each step admits 2,000 / 1,010 ≈ 2 requests and
    runs about 20 decodes; the decode's linear layers hide under the prompt tokens' 0.2 s, except in the
    steps that happen to carry no prompt.

    >>> r = backlog(1000, 100, 10.0, 10.0, 1000, 11, 2000, (0.010, 0.030), (0.008, 0.010), True)
    >>> round(float(r["tpot_s"]), 4), round(float(r["ttft_s"]), 1), round(float(r["throughput_out_tps"]), 1)
    (0.2026, 51.7, 104.4)
    """
    n, S, T_pf, T_lin, P, O, K, d1, dS, l1, lS, mixed = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (
        requests, slots, prefill_s, prefill_linear_s, prompt_tokens, output_tokens, step_tokens, *decode_s,
        *decode_linear_s, mixed)))
    steps_decoding = np.maximum(O - 1, 0.0)
    admitted = np.minimum(K / (P + steps_decoding), S / (np.ceil(P / K) + steps_decoding))
    for _ in range(2):   # a slot is held for the prompt's steps (at most K − n tokens a step) and O − 1 more
        prompt_steps = np.ceil(P / np.maximum(K - admitted * steps_decoding, 1.0))
        admitted = np.minimum(K / (P + steps_decoding), S / (prompt_steps + steps_decoding))
    running = np.maximum(admitted * steps_decoding, 1.0)

    # the decode step of the running batch: affine between one sequence and S; a step's prompts priced as
    # in :mod:`estimator.serving.mixed_steps` (nothing hides when prefill steps run alone)
    decode_step_s = d1 + np.where(S > 1, (dS - d1) / np.maximum(S - 1, 1.0), 0.0) * (running - 1)
    linear = (np.where(mixed > 0, l1, 0.0), np.where(mixed > 0, lS, 0.0))
    steps = MixedSteps(token_s=T_pf / np.maximum(S * P, 1.0), token_linear_s=T_lin / np.maximum(S * P, 1.0),
                       decode_linear_s=linear, slots=S, step_tokens=K)
    step_s = steps.mean_step_s(decode_step_s, admitted, P, running)
    completions_per_s = admitted / step_s
    # a request's own prompt is never in its decode window: the prompts of the other S − 1 slots are
    others = admitted * (S - 1) / S
    out = {"ttft_s": (n + 1) / (2 * completions_per_s), "prefill_phase_s": n / completions_per_s,
           "tpot_s": steps.mean_step_s(decode_step_s, others, P, running),
           "duration_s": n / completions_per_s + steps_decoding * step_s}
    out["e2e_latency_s"] = out["ttft_s"] + steps_decoding * out["tpot_s"]
    out["itl_mean_s"] = out["tpot_s"]   # a steady backlog: every request decodes through the same steps
    out["throughput_out_tps"] = n * O / out["duration_s"]
    out.update({f"ttft_{q}_s": np.maximum(p * n, 1.0) / completions_per_s for q, p in PERCENTILES.items()})
    # a gap between two tokens is one step; its time grows with the prompt tokens the step carries
    out.update({f"itl_{q}_s": steps.gap_quantile_s(decode_step_s, others, P, running, p)
                for q, p in PERCENTILES.items()})
    out["e2e_p99_s"] = out["ttft_p99_s"] + steps_decoding * out["tpot_s"]
    return out
