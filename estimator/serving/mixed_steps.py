"""Prompts riding in decode steps: what a step that carries prompt tokens costs (docs/formulas.md §14,
"Mixed steps").

An engine that runs prompts inside its decode steps (vLLM V1, TensorRT-LLM's in-flight batching,
llama.cpp's server) pays, for a step of N decodes carrying T prompt tokens,

    t(T) = ITL(N) + T · t_tok − min(d_linear(N), T · t_tok,linear)

- t_tok, a prompt token's prefill in a full step, T_pf(S) / (S P): the step's fixed costs and its weight
  streaming are paid once for the step, not per prompt;
- the decode's linear layers run in the same GEMMs as the prompt tokens, so the shorter of the two
  linear-layer times (the decode's weight streaming, as a rule) hides under the longer (SARATHI's
  piggybacked decodes); attention, overheads and communication add. An engine whose prefill steps run
  alone hides nothing: give it no linear-layer time;
- once request lengths vary, slots free at random, so the prompts a step takes are a Poisson count, each of
  P tokens and all within the step's room K − N; a prompt longer than the room fills whole rooms in a share
  of the steps.

The backlog of an all-at-once run (:func:`estimator.serving.burst.backlog`) and the steady state under a
load (:func:`estimator.serving.continuous_batching.steady_state`) both price their steps here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LUMPS = 48   # prompt counts 0 … LUMPS − 1 per step: a Poisson law of mean ≤ 16 has < 1e-8 of its mass beyond
MAX_UTILISATION = 0.999


@dataclass(frozen=True)
class MixedSteps:
    """The steps of an engine whose decode steps carry prompt tokens.

    ``token_s`` and ``token_linear_s``: a prompt token's prefill in a full step and its linear layers' part;
    ``decode_linear_s``: the linear layers' part of a decode step at one sequence and at S (``slots``),
    affine in between (zero on an engine whose prefill steps run alone); ``step_tokens``: K, the most
    tokens a step takes.
    """

    token_s: np.ndarray
    token_linear_s: np.ndarray
    decode_linear_s: tuple
    slots: np.ndarray
    step_tokens: np.ndarray

    def _decode_linear(self, N):
        one, full = self.decode_linear_s
        return one + np.where(self.slots > 1, (full - one) / np.maximum(self.slots - 1, 1.0), 0.0) * (N - 1)

    def step_with(self, itl, tokens, N):
        """A step of N decodes (``itl`` long alone) that carries ``tokens`` prompt tokens."""
        return itl + tokens * self.token_s - np.minimum(self._decode_linear(N), tokens * self.token_linear_s)

    def lumps(self, prompts, prompt_tokens, N):
        """The prompt tokens a step carries (trailing axis) and their chances, for ``prompts`` a step on average."""
        return prompt_lumps(prompts, prompt_tokens, np.maximum(self.step_tokens - N, 1.0))

    def hidden_s(self, prompts, prompt_tokens, N):
        """The decode's linear-layer time hidden under the prompts of a step, on average over the steps."""
        lumps, chances = self.lumps(prompts, prompt_tokens, N)
        hidden = np.minimum(np.asarray(self._decode_linear(N))[..., None],
                            lumps * np.asarray(self.token_linear_s)[..., None])
        return np.sum(chances * hidden, axis=-1)

    def mean_step_s(self, itl, prompts, prompt_tokens, N):
        """The mean step carrying ``prompts`` a step: every prompt token is computed once."""
        return itl + prompts * prompt_tokens * self.token_s - self.hidden_s(prompts, prompt_tokens, N)

    def gap_quantile_s(self, itl, prompts, prompt_tokens, N, quantile):
        """The ``quantile`` of the steps' times: a gap between two tokens is one step."""
        lumps, chances = self.lumps(prompts, prompt_tokens, N)
        return self.step_with(itl, weighted_quantile(lumps, chances, quantile, 0.0), N)

    def steady_step_s(self, itl, X, prompt_tokens, N, previous_step_s):
        """The mean step of N decodes while prompts arrive at X a second: it carries the X t of them that
        arrived during the one before, so t = ITL(N) + X t P t_tok − hidden, t = (ITL(N) − hidden) /
        (1 − X P t_tok); inf when prompts cannot keep up. ``previous_step_s`` sets the hidden part."""
        hidden = self.hidden_s(X * previous_step_s, prompt_tokens, N)
        load = X * prompt_tokens * self.token_s
        return np.where(load < MAX_UTILISATION, (itl - hidden) / (1 - np.minimum(load, MAX_UTILISATION)), np.inf)

    def capacity(self, itl_at_max, prompt_tokens, output_tokens):
        """The request rate at which the decode batch reaches S: from S = X (O − 1) t and the mean step above,
        X = S / ((O − 1)(ITL(S) − hidden) + S P t_tok), a step then carrying S / (O − 1) prompts."""
        steps = np.maximum(np.asarray(output_tokens, dtype=float) - 1, 1.0)
        hidden = self.hidden_s(self.slots / steps, prompt_tokens, self.slots)
        return self.slots / (steps * (itl_at_max - hidden) + self.slots * prompt_tokens * self.token_s)


def prompt_lumps(prompts, prompt_tokens, room):
    """The prompt tokens a step carries (trailing axis) and their chances, for ``prompts`` a step on average.

    A Poisson count of mean a, each of P tokens and all within the step's room K − n. A prompt longer than
    the room spreads over several steps: then a share a P / (K − n) of the steps carries a full room. Past a
    mean of 16 prompts a step the count is taken as its mean, the Poisson law's spread being small beside it.
    """
    a, P, room = (np.asarray(v, dtype=float)[..., None] for v in np.broadcast_arrays(prompts, prompt_tokens, room))
    k = np.arange(LUMPS, dtype=float)
    log_factorial = np.concatenate([[0.0], np.cumsum(np.log(k[1:]))])
    poisson = np.exp(k * np.log(np.maximum(a, 1e-300)) - a - log_factorial)
    crowded = a > LUMPS / 3   # many prompts a step: one lump of their mean count
    chances = np.where(crowded, np.where(k == 0, 1.0, 0.0), poisson)
    lumps = np.minimum(np.where(crowded & (k == 0), a, k) * P, room)
    long = P >= room
    share = np.minimum(a * P / room, 1.0)
    chances = np.where(long, np.where(k == 0, 1 - share, np.where(k == 1, share, 0.0)), chances)
    return np.broadcast_to(lumps, chances.shape), chances


def weighted_quantile(values, weights, q, empty):
    """The q-quantile of ``values`` each counted ``weights`` times along the last axis (``empty`` where no weight)."""
    order = np.argsort(values, axis=-1)
    values, weights = np.take_along_axis(values, order, axis=-1), np.take_along_axis(weights, order, axis=-1)
    cumulative = np.cumsum(weights, axis=-1)
    total = cumulative[..., -1:]
    first = np.argmax(cumulative >= q * total, axis=-1)[..., None]
    return np.where(total[..., 0] > 0, np.take_along_axis(values, first, axis=-1)[..., 0], empty)
