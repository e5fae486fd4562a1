"""How sampling fits in memory: the static slots of a compiled sampler (prompt and new-token
buckets, the KV cache), the bytes one prompt's row holds, and the batches that fit in the free
memory (`plan_sampling`)."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from minigpt_jax.budget import format_bytes, free_memory
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.positions import POSITION_ENCODINGS
from minigpt_jax.sampling.options import SampleSettings

# Prompt and new-token counts are rounded up to powers of two, at least this, so that a session
# of many calls compiles once per (batch, bucket) pair instead of once per length.
MIN_BUCKET = 8
# The share of the free memory (the device's, or the host's RAM on CPU) a plan may fill: the
# estimate leaves out XLA's smaller buffers, and on a shared host other processes need RAM too.
MEMORY_FRACTION = 0.5
# Positions and slot indices are int32 on the device.
MAX_SLOTS = 2**31 - 1


class Slots(NamedTuple):
    """The static sizes of one compiled sampler: P prompt slots, G new-token slots, the S slots
    of the KV cache, and whether a step can pass block_size (learned positions), where it
    recomputes the window of the last block_size tokens instead of reading the cache."""

    prompt: int
    new: int
    cache: int
    recomputes: bool


def bucket(n: int) -> int:
    """The slot count for n prompt or new tokens: the next power of two, at least MIN_BUCKET."""
    return max(MIN_BUCKET, 1 << (n - 1).bit_length())


def plan_slots(cfg: GPTConfig, longest_prompt: int, max_new_tokens: int) -> Slots:
    """Slots for prompts of up to `longest_prompt` tokens and `max_new_tokens` new ones.

    The prompt is bucketed to its own length for every position scheme. Learned positions once
    padded it to block_size because one function served both the prefill and the window that
    steps past block_size recompute; the two are apart now, so only that window is block_size
    wide. With learned positions the cache stops serving once a context passes block_size (every
    position shifts when nanoGPT crops), so it needs at most block_size slots past the prompt.
    """
    learned = POSITION_ENCODINGS[cfg.pos_encoding].learned
    context = min(longest_prompt, cfg.block_size) if learned else longest_prompt
    prompt = min(bucket(context), cfg.block_size) if learned else bucket(context)
    new = bucket(max_new_tokens)
    cache = prompt + (min(new, cfg.block_size) if learned else new)
    return Slots(prompt, new, cache, recomputes=learned and prompt + new > cfg.block_size)


def first_recomputed_token(cfg: GPTConfig, longest_prompt: int) -> int | None:
    """Index of the first new token whose context passes block_size, so that its step
    recomputes the last block_size tokens (learned positions); None for other schemes."""
    if not POSITION_ENCODINGS[cfg.pos_encoding].learned:
        return None
    return max(1, cfg.block_size - min(longest_prompt, cfg.block_size) + 1)


def tokens_past_block(cfg: GPTConfig, longest_prompt: int, max_new_tokens: int) -> int:
    """How many of the new tokens of each prompt come from a recomputed window (see
    `first_recomputed_token`): each costs a block_size-token forward instead of a one-token one."""
    first = first_recomputed_token(cfg, longest_prompt)
    return 0 if first is None else max(0, max_new_tokens - first)


def row_bytes(cfg: GPTConfig, slots: Slots, return_logits: bool = False) -> dict[str, int]:
    """An upper estimate, from shapes, of the memory one prompt's row takes while it is sampled,
    by part: the KV cache (N × S × (2·G·K + 1 position), twice: input and output of a call; 2·G·K
    is 2D without grouped key/value heads), the
    forward of the prefill or of a recomputed window of W slots (its own cache, twice; one
    layer's activations, W × (8D + 4F) float32; scores, softmax and mask, 3 × H × W × W float32),
    the logits and sampling's sorted copies (8 × V float32), the token buffer (P + G int32,
    twice) and, with return_logits, every step's logits (G × V float32, twice).

    Checked against the peak RSS growth on CPU, for a 4-layer, d=128 model: 2,000 rows of 62
    learned-position tokens took 2.4 GiB through `generate` and 3.2 GiB through `minigpt-jax
    sample` (which also times a step past block_size), 3.9 GiB estimated; with rope, 2,000
    rows of 120 tokens 1.4 GiB (2.4 estimated), 1,000 rows of 1,000 tokens 5.0 GiB (8.1)."""
    act = jnp.dtype(cfg.compute_dtype).itemsize
    per_slot = 2 * cfg.kv_heads * cfg.head_dim * act + 4
    window = max(slots.prompt, cfg.block_size if slots.recomputes else 0)
    activations = window * (8 * cfg.n_embd + 4 * cfg.mlp_dim) * 4
    scores = 3 * cfg.n_head * window * window * 4
    parts = {
        "KV cache": 2 * cfg.n_layer * slots.cache * per_slot,
        "window forward": 2 * cfg.n_layer * window * per_slot + activations + scores,
        "logits": 8 * cfg.padded_vocab_size * 4,
        "token buffer": 2 * (slots.prompt + slots.new) * 4,
    }
    if return_logits:
        parts["logits of every step"] = 2 * slots.new * cfg.vocab_size * 4
    return parts


class SamplingPlan(NamedTuple):
    """How `generate` splits its prompts: `batch_size` rows per compiled batch (the last one is
    padded to it), so that `row_bytes` × batch_size stays within `budget` bytes."""

    slots: Slots
    row_bytes: int
    budget: int | None  # None: the free memory is unknown, one batch
    budget_source: str  # where the budget comes from, for messages
    batch_size: int
    num_batches: int
    limited_by_memory: bool  # whether memory, not the prompts or batch_size, set batch_size


def plan_sampling(
    cfg: GPTConfig,
    num_prompts: int,
    longest_prompt: int,
    max_new_tokens: int,
    settings: SampleSettings | None = None,
    *,
    return_logits: bool = False,
) -> SamplingPlan:
    """Batches of at most `settings.batch_size` rows (default: all) that fit in
    `settings.memory_bytes` (default: MEMORY_FRACTION of `budget.free_memory()`), or a
    ValueError naming the figures when one row does not.
    """
    settings = settings or SampleSettings()
    slots = plan_slots(cfg, longest_prompt, max_new_tokens)
    if slots.prompt + slots.new > MAX_SLOTS:
        raise ValueError(
            f"max_new_tokens={max_new_tokens:,} needs {slots.prompt + slots.new:,} token slots, "
            f"more than the {MAX_SLOTS:,} that int32 positions index: ask for fewer new tokens."
        )
    parts = row_bytes(cfg, slots, return_logits)
    one_row = sum(parts.values())
    if settings.memory_bytes is not None:
        budget, source = settings.memory_bytes, "memory_bytes"
    else:
        free, where = free_memory()
        budget = None if free is None else int(MEMORY_FRACTION * free)
        source = f"{MEMORY_FRACTION:.0%} of the {format_bytes(free or 0)} of free {where}"
    if budget is not None and one_row > budget:
        largest = sorted(parts.items(), key=lambda item: -item[1])[:2]
        detail = ", ".join(f"{name} {format_bytes(size)}" for name, size in largest)
        raise ValueError(
            f"one sample needs about {format_bytes(one_row)} of memory ({detail}; "
            f"{slots.prompt + slots.new:,} token slots, {slots.cache:,} cache slots) but "
            f"sampling may use {format_bytes(budget)} ({source}): ask for fewer new tokens "
            f"(max_new_tokens={max_new_tokens:,}), give a shorter prompt, or use a device with "
            "more memory."
        )
    fits = num_prompts if budget is None else budget // one_row
    wanted = min(num_prompts, settings.batch_size or num_prompts)
    rows = max(1, min(wanted, fits))
    return SamplingPlan(
        slots, one_row, budget, source, rows, -(-num_prompts // rows), fits < wanted
    )
