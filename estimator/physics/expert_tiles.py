"""Tile padding of a MoE grouped GEMM whose tile width follows the pass, not the expert (docs/formulas.md §9).

llama.cpp's quantized MoE matmul on CUDA and ROCm (MMQ with expert ids, since ggml-org/llama.cpp PR #13199)
launches one grid for all of a layer's experts. It picks the tile's token width once for the launch, against the
pass's token count (``ne12``), not the few tokens each expert receives: the narrowest multiple of the granularity
(8, or 16 from 48 on) that covers the pass, at most its widest tile. Each touched expert then computes whole
tiles of that width, skipping only tiles with none of its tokens. So a decode step of B sequences pads each of
its experts' one or two tokens out to a tile of about B tokens, and a 512-token micro-batch pads them to 128,
whatever the expert got.
"""

from __future__ import annotations

import numpy as np

NARROW_GRANULARITY = 8     # mmq_x steps of 8 tokens below 48 ...
WIDE_GRANULARITY = 16      # ... and of 16 from 48 on (the MMA path's granularity)
WIDE_FROM_TOKENS = 48


def pass_tile_width(pass_tokens, max_width):
    """The token width of the tile a launch picks: the pass's tokens rounded up to the granularity, at most
    ``max_width``.

    Examples
    --------
    >>> [int(pass_tile_width(t, 128)) for t in (1, 5, 32, 33, 47, 50, 100, 512)]
    [8, 8, 32, 40, 48, 64, 112, 128]
    """
    tokens = np.asarray(pass_tokens, dtype=float)
    narrow = np.ceil(tokens / NARROW_GRANULARITY) * NARROW_GRANULARITY
    wide = np.ceil(tokens / WIDE_GRANULARITY) * WIDE_GRANULARITY
    return np.minimum(np.where(narrow < WIDE_FROM_TOKENS, narrow, wide), max_width)


def pass_tile_padding(pass_tokens, experts_per_token, touched, max_width):
    """Tokens' worth of FLOPs each of the ``touched`` experts computes beyond its own M_e = T · k / touched (the
    mean a touched expert receives) when the tile width w follows the pass of T tokens: w · ⌈M_e / w⌉ − M_e; none
    where ``max_width`` is 0.

    Examples
    --------
    A decode step of 32 sequences on gpt-oss-120b (128 experts, 4 a token; about 82 touched, 1.6 tokens each)
    pads each expert to a 32-token tile; a 512-token micro-batch over all 128 gives each 16 tokens in a 128-wide one:

    >>> round(float(pass_tile_padding(32, 4, 81.7, 128)), 1), float(pass_tile_padding(512, 4, 128, 128))
    (30.4, 112.0)
    """
    width = pass_tile_width(pass_tokens, np.maximum(max_width, 1))
    expert_tokens = np.asarray(pass_tokens, dtype=float) * experts_per_token / np.maximum(touched, 1e-300)
    return np.where(np.asarray(max_width) > 0, width * np.ceil(expert_tokens / width) - expert_tokens, 0.0)
