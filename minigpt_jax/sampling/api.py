"""The public entry points of sampling: `generate` (the prompts and their new tokens) and
`generate_stream` (the new tokens as they come), with the checks of what they are given."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import chex
import numpy as np

from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.embeddings import check_token_ids
from minigpt_jax.model.gpt import Params
from minigpt_jax.model.positions import POSITION_ENCODINGS
from minigpt_jax.sampling.loop import CHUNK_SECONDS, NewTokens, decoded_batches
from minigpt_jax.sampling.options import SampleSettings, settings_of
from minigpt_jax.sampling.plan import plan_sampling

_log = logging.getLogger(__name__)
Array = chex.Array
Prompts = np.ndarray | Array | Sequence[np.ndarray | Sequence[int]]


def generate(
    params: Params,
    cfg: GPTConfig,
    prompt_ids: Prompts,
    max_new_tokens: int,
    *,
    rng: Array,
    settings: SampleSettings | None = None,
    max_len: int | None = None,
    return_logits: bool = False,
    **setting_values: Any,
):
    """The prompts followed by `max_new_tokens` sampled tokens each.

    Args:
      prompt_ids: a (B, T0) integer array, or a list of B 1-D prompts whose lengths may differ
        (they are left-padded internally; padding gets no position and is never attended to).
      max_new_tokens: tokens to add to every prompt (>= 0).
      rng: the key; new token j of prompt i uses `fold_in(fold_in(rng, i), j)`, so a fixed key
        reproduces the output, however the prompts are batched.
      settings, setting_values: how tokens are drawn and prompts batched: a `SampleSettings`
        (default: its defaults, temperature 1.0 and no filters), with any of its fields given
        as keywords in place (`temperature=0` is greedy; `top_k=`, `top_p=` filter, top-k
        first; `batch_size=`, `memory_bytes=` bound the batches, see `plan_sampling`).
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

    One prefill pass over the prompts fills a KV cache, then one compiled loop per batch adds a
    token per step. It compiles once per batch size, max_new_tokens bucket (a power of two >=
    MIN_BUCKET), prompt-length bucket (likewise, at most block_size for learned positions), and
    choice of which filters are on; temperature, top_k and top_p values are traced.
    """
    settings = settings_of(settings, **setting_values)
    prompts, as_array, chunks = _checked_then_decoded(
        params, cfg, prompt_ids, max_new_tokens, rng, settings, max_len, None, return_logits
    )
    return _assembled(prompts, as_array, chunks, max_new_tokens, cfg.vocab_size, return_logits)


def generate_stream(
    params: Params,
    cfg: GPTConfig,
    prompt_ids: Prompts,
    max_new_tokens: int,
    *,
    rng: Array,
    settings: SampleSettings | None = None,
    max_len: int | None = None,
    chunk_seconds: float | None = CHUNK_SECONDS,
    **setting_values: Any,
) -> Iterator[NewTokens]:
    """`generate`'s new tokens as they come: for each batch of prompts in order, `NewTokens`
    chunks of consecutive tokens, one compiled call each, sized to about `chunk_seconds` (None:
    one call per batch). The tokens equal `generate`'s for the same arguments, however they are
    chunked. Bad input raises here, not on iteration.
    """
    settings = settings_of(settings, **setting_values)
    _, _, chunks = _checked_then_decoded(
        params, cfg, prompt_ids, max_new_tokens, rng, settings, max_len, chunk_seconds, False
    )
    return (chunk for chunk, _ in chunks)


def _checked_then_decoded(
    params: Params,
    cfg: GPTConfig,
    prompt_ids: Prompts,
    max_new_tokens: int,
    rng: Array,
    settings: SampleSettings,
    max_len: int | None,
    chunk_seconds: float | None,
    return_logits: bool,
) -> tuple[list[np.ndarray], bool, Iterator[tuple[NewTokens, np.ndarray | None]]]:
    """generate and generate_stream: the checks, eagerly, then the prompts (1-D int32), whether
    an array came in, and the batches, decoded as they are iterated."""
    prompts, as_array = _validated_prompts(prompt_ids, cfg)
    check_request(cfg, max_new_tokens)
    _warn_if_crossing_documents(prompts, cfg)
    longest = max(len(p) for p in prompts)
    if POSITION_ENCODINGS[cfg.pos_encoding].learned and max_len is not None:
        raise ValueError(
            "max_len applies to sinusoidal, rope or no positions; learned positions keep the "
            f"last block_size={cfg.block_size} tokens instead. Drop max_len."
        )
    if max_len is not None and longest + max_new_tokens > max_len:
        raise ValueError(
            f"the longest prompt ({longest} tokens) plus max_new_tokens={max_new_tokens} exceeds "
            f"max_len={max_len}: shorten the prompt, ask for fewer tokens or raise max_len."
        )
    chunks = iter(())
    if max_new_tokens > 0:
        plan = plan_sampling(
            cfg, len(prompts), longest, max_new_tokens, settings, return_logits=return_logits
        )
        chunks = decoded_batches(
            params, cfg, prompts, max_new_tokens, rng, settings, plan, chunk_seconds, return_logits
        )
    return prompts, as_array, chunks


def _warn_if_crossing_documents(prompts: list[np.ndarray], cfg: GPTConfig) -> None:
    """Warns (one line) when a model trained on packed documents is given a prompt holding an
    end-of-text id: the KV cache continues one document, so the tokens after it would attend
    across the boundary, which training never showed the model."""
    if not cfg.parts.mask.documents:
        return
    eot = cfg.vocab_size - 1
    crossing = [i for i, prompt in enumerate(prompts) if np.any(prompt == eot)]
    if crossing:
        which = (
            "the prompt holds"
            if len(prompts) == 1
            else f"{len(crossing)} of {len(prompts)} prompts (the first: {crossing[0]}) hold"
        )
        _log.warning(
            "%s the end-of-text id %d, but sampling continues one document: the tokens after "
            "it attend across the boundary, which model.attention_mask=%r never showed the "
            "model in training; give only the text after the last end-of-text as the prompt.",
            which,
            eot,
            cfg.attention_mask,
        )


def check_request(cfg: GPTConfig, max_new_tokens: int) -> None:
    """The checks of the model and the token count that every entry point makes (host side,
    one-line errors); the settings check themselves (`SampleSettings`)."""
    if not cfg.causal:
        raise ValueError("generate needs a causal model; this GPTConfig has causal=False.")
    if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool):
        raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r}.")
    if max_new_tokens < 0:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} is negative: ask for 0 or more new tokens."
        )


def _assembled(prompts, as_array, chunks, max_new_tokens, vocab, return_logits):
    """generate's result from its one chunk per batch."""
    new_NxG = np.zeros((len(prompts), max_new_tokens), np.int32)
    logits_NxGxV = np.zeros((len(prompts), max_new_tokens, vocab), np.float32)
    for chunk, logits_BxCxV in chunks:
        rows = slice(chunk.rows.start, chunk.rows.stop)
        columns = slice(chunk.first, chunk.first + chunk.tokens_BxC.shape[1])
        new_NxG[rows, columns] = chunk.tokens_BxC
        if return_logits:
            logits_NxGxV[rows, columns] = logits_BxCxV
    if as_array:
        out = np.concatenate([np.stack(prompts), new_NxG], axis=1)
    else:
        out = [np.concatenate([p, new]) for p, new in zip(prompts, new_NxG, strict=True)]
    return (out, logits_NxGxV) if return_logits else out


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
    for p in prompts[:1] if as_array else prompts:
        if not np.issubdtype(p.dtype, np.integer):
            raise TypeError(
                f"prompt ids must have an integer dtype, got {p.dtype}: encode the text with "
                f"the tokenizer, or cast the ids with .astype(np.int32)."
            )
    if as_array:  # one check for all rows: a million-sample array stays fast
        check_token_ids(array, cfg.vocab_size)
    for i, p in enumerate([] if as_array else prompts):
        try:
            check_token_ids(p, cfg.vocab_size)
        except ValueError as err:
            raise ValueError(f"prompt {i}: {err}") from None
    return [p.astype(np.int32) for p in prompts], as_array
