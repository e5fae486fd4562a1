"""Sampling: filters (top-k, top-p), one prefill pass over the prompts, then KV-cached decoding
inside one compiled loop (`generate`). Loading a trained run to sample from is `runs`' job."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.embeddings import check_token_ids
from minigpt_jax.model.gpt import Params, forward_with_cache, init_cache
from minigpt_jax.model.positions import POSITION_ENCODINGS

Array = chex.Array

# Prompt and new-token counts are rounded up to powers of two, at least this, so that a session
# of many calls compiles once per (batch, bucket) pair instead of once per length.
MIN_BUCKET = 8


# ----------------------------------------------------------------------------- sampling filters


def top_k_filter(logits_BxV: Array, k: int | Array) -> Array:
    """Logits with all but the k largest of each row set to -inf (ties with the k-th are kept).

    k (1 <= k <= V) may be traced, so changing it does not recompile.
    """
    sorted_BxV = jnp.sort(logits_BxV, axis=-1)
    kth_Bx1 = jax.lax.dynamic_slice_in_dim(sorted_BxV, logits_BxV.shape[-1] - k, 1, axis=-1)
    return jnp.where(logits_BxV >= kth_Bx1, logits_BxV, -jnp.inf)


def top_p_filter(logits_BxV: Array, p: float | Array) -> Array:
    """Nucleus filter (Holtzman et al. 2019, arXiv:1904.09751): keep the fewest most-likely
    tokens whose probability reaches p (0 < p <= 1; the most likely token always stays), -inf
    elsewhere. p may be traced."""
    sorted_BxV = jnp.flip(jnp.sort(logits_BxV, axis=-1), axis=-1)
    probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
    mass_before_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV
    num_kept_Bx1 = jnp.sum(mass_before_BxV < p, axis=-1, keepdims=True)
    threshold_Bx1 = jnp.take_along_axis(sorted_BxV, num_kept_Bx1 - 1, axis=-1)
    return jnp.where(logits_BxV >= threshold_Bx1, logits_BxV, -jnp.inf)


def sample_token(
    logits_BxV: Array,
    rng: Array,
    temperature: float | Array = 1.0,
    top_k: int | Array | None = None,
    top_p: float | Array | None = None,
) -> Array:
    """ids_B: argmax where temperature == 0, else a draw from softmax(logits / temperature)
    after the optional top-k, then top-p, filter (the order of nanoGPT and HF transformers)."""
    chex.assert_rank(logits_BxV, 2)
    greedy_B = jnp.argmax(logits_BxV, axis=-1)
    logits_BxV = logits_BxV / jnp.where(temperature > 0, temperature, 1.0)
    if top_k is not None:
        logits_BxV = top_k_filter(logits_BxV, top_k)
    if top_p is not None:
        logits_BxV = top_p_filter(logits_BxV, top_p)
    sampled_B = jax.random.categorical(rng, logits_BxV, axis=-1)
    return jnp.where(temperature > 0, sampled_B, greedy_B).astype(jnp.int32)


# ----------------------------------------------------------------------------- compiled loop


@functools.partial(jax.jit, static_argnames=("cfg", "num_slots", "return_logits"))
def generate_padded(
    params: Params,
    prompt_BxP: Array,
    lengths_B: Array,
    num_new: Array,
    rng: Array,
    temperature: Array,
    top_k: Array | None,
    top_p: Array | None,
    *,
    cfg: GPTConfig,
    num_slots: int,
    return_logits: bool,
) -> tuple[Array, Array | None]:
    """new_BxG and, with return_logits, each step's logits_BxGxV (G = num_slots >= num_new;
    slots from num_new on are zeros).

    Prompts are right-aligned in prompt_BxP: row b's lengths_B[b] tokens end at slot P-1, so all
    rows take new token j at slot P + j. With learned positions P must be block_size.
    """
    (batch, window), vocab = prompt_BxP.shape, cfg.vocab_size
    learned = POSITION_ENCODINGS[cfg.pos_encoding].learned
    # With learned positions the cache stops serving before any context outgrows the window.
    cache_len = window + (min(num_slots, window) if learned else num_slots)
    tokens_BxL = jnp.concatenate([prompt_BxP, jnp.zeros((batch, num_slots), jnp.int32)], axis=1)
    logits_BxGxV = jnp.zeros((batch, num_slots, vocab), jnp.float32) if return_logits else None

    def recompute(j, tokens_BxL, cache):
        """Runs the last `window` slots through a fresh cache: the prefill at j = 0."""
        del cache
        window_BxW = jax.lax.dynamic_slice_in_dim(tokens_BxL, j, window, axis=1)
        # Row b's context has lengths_B[b] + j tokens; longer ones keep their last `window`.
        pad_B = window - jnp.minimum(lengths_B + j, window)
        positions_BxW = jnp.arange(window)[None, :] - pad_B[:, None]
        # A window-sized cache keeps attention at W x W; empty slots are added afterwards.
        logits_BxWxV, cache = forward_with_cache(
            params, window_BxW, positions_BxW, init_cache(cfg, batch, window), cfg
        )
        return logits_BxWxV[:, -1], [c.extended(cache_len) for c in cache]

    def feed_one(j, tokens_BxL, cache):
        """Feeds token j-1 through the cache."""
        token_Bx1 = jax.lax.dynamic_slice_in_dim(tokens_BxL, window + j - 1, 1, axis=1)
        positions_Bx1 = (lengths_B + j - 1)[:, None]
        logits_Bx1xV, cache = forward_with_cache(params, token_Bx1, positions_Bx1, cache, cfg)
        return logits_Bx1xV[:, 0], cache

    def step(j, carry):
        """Samples new token j (rng folded with j) and stores it and its logits."""
        tokens_BxL, logits_BxGxV, cache = carry
        # Learned positions: token j sees lengths_B + j tokens and nanoGPT crops that context to
        # the last block_size. Cropping shifts every position, so no cached key stays valid and
        # each such step recomputes the window.
        full = j == 0
        if learned:
            full = full | (j > window - jnp.max(lengths_B))
        logits_BxV, cache = jax.lax.cond(full, recompute, feed_one, j, tokens_BxL, cache)
        token_B = sample_token(logits_BxV, jax.random.fold_in(rng, j), temperature, top_k, top_p)
        tokens_BxL = jax.lax.dynamic_update_slice_in_dim(
            tokens_BxL, token_B[:, None], window + j, axis=1
        )
        if return_logits:
            logits_BxGxV = jax.lax.dynamic_update_slice_in_dim(
                logits_BxGxV, logits_BxV[:, None], j, axis=1
            )
        return tokens_BxL, logits_BxGxV, cache

    cache = init_cache(cfg, batch, cache_len)
    tokens_BxL, logits_BxGxV, _ = jax.lax.fori_loop(
        0, num_new, step, (tokens_BxL, logits_BxGxV, cache)
    )
    return tokens_BxL[:, window:], logits_BxGxV


# ----------------------------------------------------------------------------- public entry point


def generate(
    params: Params,
    cfg: GPTConfig,
    prompt_ids: np.ndarray | Array | Sequence[np.ndarray | Sequence[int]],
    max_new_tokens: int,
    *,
    rng: Array,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    max_len: int | None = None,
    return_logits: bool = False,
):
    """The prompts followed by `max_new_tokens` sampled tokens each.

    Args:
      prompt_ids: a (B, T0) integer array, or a list of B 1-D prompts whose lengths may differ
        (they are left-padded internally; padding gets no position and is never attended to).
      max_new_tokens: tokens to add to every prompt (>= 0).
      rng: the key; new token j uses `fold_in(rng, j)`, so a fixed key reproduces the output.
      temperature: 0 takes the argmax (greedy); otherwise logits are divided by it.
      top_k, top_p: optional top-k, then nucleus, filters (`top_k_filter`, `top_p_filter`);
        top_k above V keeps every token.
      max_len: sinusoidal, rope or no positions only: the longest sequence allowed (prompt plus
        new tokens); past it `generate` refuses. Default: no limit beyond the model's scheme.
        These schemes never crop: the cache grows with the sequence, past block_size too.
        Learned positions instead reproduce nanoGPT's crop-and-recompute loop exactly: a prompt
        is cropped to its last block_size tokens, the cache serves while the context fits, and
        each later step recomputes the last block_size tokens (as slow as no cache).
      return_logits: also return each step's logits (B, max_new_tokens, V), float32.

    Returns:
      For an array: an int32 array (B, T0 + max_new_tokens); for a list: a list of 1-D int32
      arrays. With return_logits, a pair (that, logits). numpy on the host.

    One prefill pass over the prompts fills a KV cache, then one compiled while loop adds a token
    per step. It compiles once per batch size, max_new_tokens bucket (a power of two >=
    MIN_BUCKET), prompt-length bucket (likewise; learned positions always pad to block_size),
    and choice of which filters are on; temperature, top_k and top_p values are traced.
    """
    prompts, as_array = _validated_prompts(prompt_ids, cfg)
    _check_settings(cfg, max_new_tokens, temperature, top_k, top_p)
    learned = POSITION_ENCODINGS[cfg.pos_encoding].learned
    longest = max(len(p) for p in prompts)
    if learned and max_len is not None:
        raise ValueError(
            "max_len applies to sinusoidal, rope or no positions; learned positions keep the "
            f"last block_size={cfg.block_size} tokens instead. Drop max_len."
        )
    if max_len is not None and longest + max_new_tokens > max_len:
        raise ValueError(
            f"the longest prompt ({longest} tokens) plus max_new_tokens={max_new_tokens} exceeds "
            f"max_len={max_len}: shorten the prompt, ask for fewer tokens or raise max_len."
        )

    batch, vocab = len(prompts), cfg.vocab_size
    new_BxG = np.zeros((batch, 0), np.int32)
    logits_BxGxV = np.zeros((batch, 0, vocab), np.float32)
    if max_new_tokens > 0:
        contexts = [p[-cfg.block_size :] for p in prompts] if learned else prompts
        lengths_B = np.array([len(c) for c in contexts], np.int32)
        prompt_slots = cfg.block_size if learned else bucket(int(lengths_B.max()))
        prompt_BxP = np.zeros((batch, prompt_slots), np.int32)
        for b, context in enumerate(contexts):
            prompt_BxP[b, prompt_slots - len(context) :] = context
        new_BxG, logits_BxGxV = generate_padded(
            params,
            prompt_BxP,
            lengths_B,
            np.int32(max_new_tokens),
            rng,
            np.float32(temperature),
            None if top_k is None else np.int32(min(top_k, vocab)),
            None if top_p is None else np.float32(top_p),
            cfg=cfg,
            num_slots=bucket(max_new_tokens),
            return_logits=return_logits,
        )
        # Cropped on the host: a device slice would compile once per max_new_tokens.
        new_BxG = np.asarray(new_BxG)[:, :max_new_tokens]
        if return_logits:
            logits_BxGxV = np.asarray(logits_BxGxV)[:, :max_new_tokens]

    if as_array:
        out = np.concatenate([np.stack(prompts), new_BxG], axis=1)
    else:
        out = [np.concatenate([p, new]) for p, new in zip(prompts, new_BxG, strict=True)]
    return (out, logits_BxGxV) if return_logits else out


def bucket(n: int) -> int:
    """The slot count for n prompt or new tokens: the next power of two, at least MIN_BUCKET."""
    return max(MIN_BUCKET, 1 << (n - 1).bit_length())


def _validated_prompts(prompt_ids, cfg: GPTConfig) -> tuple[list[np.ndarray], bool]:
    """Host-side checks; returns the prompts as 1-D int32 arrays and whether an array came in."""
    as_array = not isinstance(prompt_ids, (list, tuple))
    if as_array:
        array = np.asarray(prompt_ids)
        if array.ndim != 2:
            raise ValueError(
                f"prompt_ids must be a (B, T0) array or a list of 1-D prompts, got an array of "
                f"shape {array.shape}; for a single prompt pass prompt_ids[None, :] or [ids]."
            )
        prompts = list(array)
    else:
        prompts = [np.asarray(p) for p in prompt_ids]
        for i, p in enumerate(prompts):
            if p.ndim != 1:
                raise ValueError(
                    f"prompt {i} has shape {p.shape}; a list must hold 1-D prompts: "
                    f"pass [ids] for a single prompt."
                )
    if not prompts or any(p.size == 0 for p in prompts):
        raise ValueError(
            "empty prompt: generation needs at least one token of context per prompt; start "
            "from a token such as the tokenizer's newline or BOS id."
        )
    for p in prompts:
        if not np.issubdtype(p.dtype, np.integer):
            raise TypeError(
                f"prompt ids must have an integer dtype, got {p.dtype}: encode the text with "
                f"the tokenizer, or cast the ids with .astype(np.int32)."
            )
    for i, p in enumerate(prompts):
        try:
            check_token_ids(p, cfg.vocab_size)
        except ValueError as err:
            raise ValueError(f"prompt {i}: {err}") from None
    return [p.astype(np.int32) for p in prompts], as_array


def _check_settings(cfg, max_new_tokens, temperature, top_k, top_p) -> None:
    if not cfg.causal:
        raise ValueError("generate needs a causal model; this GPTConfig has causal=False.")
    if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool):
        raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r}.")
    if max_new_tokens < 0:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} is negative: ask for 0 or more new tokens."
        )
    if not (np.isfinite(temperature) and temperature >= 0):
        raise ValueError(
            f"temperature={temperature!r} must be finite and >= 0 (0 means greedy argmax)."
        )
    if top_k is not None and (not isinstance(top_k, (int, np.integer)) or top_k < 1):
        raise ValueError(f"top_k={top_k!r} must be a positive int, or None to keep all tokens.")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p={top_p!r} must be in (0, 1], or None to keep all tokens.")
