"""Sampling: filters (top-k, top-p), a prefill pass over the prompts, then KV-cached decoding in
compiled calls of any number of steps, in batches planned to fit the device's memory (`generate`,
and `generate_stream` for tokens as they come). Loading a trained run to sample from is `runs`'
job."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from minigpt_jax.budget import format_bytes, free_memory
from minigpt_jax.model.attention import KVCache
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.embeddings import check_token_ids, read_out
from minigpt_jax.model.gpt import GPT, Params, head_weight, init_cache
from minigpt_jax.model.positions import POSITION_ENCODINGS

Array = chex.Array

# Prompt and new-token counts are rounded up to powers of two, at least this, so that a session
# of many calls compiles once per (batch, bucket) pair instead of once per length.
MIN_BUCKET = 8
# The share of the free memory (the device's, or the host's RAM on CPU) a plan may fill: the
# estimate leaves out XLA's smaller buffers, and on a shared host other processes need RAM too.
MEMORY_FRACTION = 0.5
# `generate_stream` sizes each compiled call to about this much decoding, so text shows up
# within a second and Ctrl-C is answered as soon.
CHUNK_SECONDS = 0.5
# Positions and slot indices are int32 on the device.
MAX_SLOTS = 2**31 - 1


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


def row_keys(rng: Array, rows: Sequence[int] | np.ndarray) -> Array:
    """rngs_B: prompt i's key is fold_in(rng, i), so a row's draws do not depend on its batch."""
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(rng, np.asarray(rows, np.uint32))


# ----------------------------------------------------------------------------- slots and memory


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
    by part: the KV cache (N × S × (2D + 1 position), twice: input and output of a call), the
    forward of the prefill or of a recomputed window of W slots (its own cache, twice; one
    layer's activations, W × (8D + 4F) float32; scores, softmax and mask, 3 × H × W × W float32),
    the logits and sampling's sorted copies (8 × V float32), the token buffer (P + G int32,
    twice) and, with return_logits, every step's logits (G × V float32, twice).

    Checked against the peak RSS growth on CPU, for a 4-layer, d=128 model: 2,000 rows of 62
    learned-position tokens took 2.4 GiB through `generate` and 3.2 GiB through `minigpt-jax
    sample` (which also times a step past block_size), 3.9 GiB estimated; with rope, 2,000
    rows of 120 tokens 1.4 GiB (2.4 estimated), 1,000 rows of 1,000 tokens 5.0 GiB (8.1)."""
    act = jnp.dtype(cfg.compute_dtype).itemsize
    per_slot = 2 * cfg.n_embd * act + 4
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
    *,
    batch_size: int | None = None,
    memory_bytes: int | None = None,
    return_logits: bool = False,
) -> SamplingPlan:
    """Batches of at most `batch_size` rows (default: all) that fit in `memory_bytes` (default:
    MEMORY_FRACTION of `budget.free_memory()`), or a ValueError naming the figures when one
    row does not.
    """
    if batch_size is not None and (not isinstance(batch_size, (int, np.integer)) or batch_size < 1):
        raise ValueError(f"batch_size={batch_size!r} must be a positive int, or None for all.")
    slots = plan_slots(cfg, longest_prompt, max_new_tokens)
    if slots.prompt + slots.new > MAX_SLOTS:
        raise ValueError(
            f"max_new_tokens={max_new_tokens:,} needs {slots.prompt + slots.new:,} token slots, "
            f"more than the {MAX_SLOTS:,} that int32 positions index: ask for fewer new tokens."
        )
    parts = row_bytes(cfg, slots, return_logits)
    one_row = sum(parts.values())
    if memory_bytes is not None:
        budget, source = memory_bytes, "memory_bytes"
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
    wanted = min(num_prompts, batch_size or num_prompts)
    rows = max(1, min(wanted, fits))
    return SamplingPlan(
        slots, one_row, budget, source, rows, -(-num_prompts // rows), fits < wanted
    )


# ----------------------------------------------------------------------------- compiled calls


class DecodeState(NamedTuple):
    """What decoding carries from one compiled call to the next (donated to each call)."""

    tokens_BxL: Array  # right-aligned prompts in slots [0, P), new token j at slot P + j
    next_logits_BxV: Array  # the logits the next new token is drawn from
    cache: list[KVCache]
    logits_BxGxV: Array | None  # each step's logits, when asked for


def _last_logits(params, tokens_BxW, positions_BxW, cache, cfg):
    """(logits_BxV, cache) of the last slot only: reading out one position instead of W keeps
    the prefill from holding W × V float32 logits."""
    h_BxWxD, cache = GPT(cfg).apply(
        {"params": params}, tokens_BxW, positions_BxW, cache=cache, method=GPT.hidden
    )
    logits_BxY = read_out(h_BxWxD[:, -1], head_weight(params, cfg), cfg)
    return logits_BxY[:, : cfg.vocab_size], cache


@functools.partial(jax.jit, static_argnames=("cfg", "slots", "return_logits"))
def prefill(
    params: Params,
    prompt_BxP: Array,
    lengths_B: Array,
    *,
    cfg: GPTConfig,
    slots: Slots,
    return_logits: bool,
) -> DecodeState:
    """The state before new token 0: the prompts (right-aligned in prompt_BxP, row b's
    lengths_B[b] tokens ending at slot P-1; padding gets no position and is never attended to)
    run once through a P-slot cache, which is then given its S - P empty decoding slots."""
    batch, prompt_slots = prompt_BxP.shape
    chex.assert_equal(prompt_slots, slots.prompt)
    positions_BxP = jnp.arange(prompt_slots)[None, :] - (prompt_slots - lengths_B)[:, None]
    logits_BxV, cache = _last_logits(
        params, prompt_BxP, positions_BxP, init_cache(cfg, batch, prompt_slots), cfg
    )
    new_BxG = jnp.zeros((batch, slots.new), jnp.int32)
    return DecodeState(
        jnp.concatenate([prompt_BxP, new_BxG], axis=1),
        logits_BxV,
        [c.extended(slots.cache) for c in cache],
        jnp.zeros((batch, slots.new, cfg.vocab_size), jnp.float32) if return_logits else None,
    )


@functools.partial(jax.jit, static_argnames=("cfg", "slots"), donate_argnames=("state",))
def decode(
    params: Params,
    state: DecodeState,
    lengths_B: Array,
    rngs_B: Array,
    first: Array,
    stop: Array,
    num_new: Array,
    temperature: Array,
    top_k: Array | None,
    top_p: Array | None,
    *,
    cfg: GPTConfig,
    slots: Slots,
) -> DecodeState:
    """Samples new tokens first .. stop-1 (of num_new) into `state`: token j of row b is drawn
    with fold_in(rngs_B[b], j), so splitting the steps over calls changes nothing.

    Learned positions reproduce nanoGPT's crop: token j sees lengths_B + j tokens, cropped to
    the last block_size. Cropping shifts every position, so no cached key stays valid and each
    step past block_size recomputes that window.
    """
    batch, block = lengths_B.shape[0], cfg.block_size

    def keep(j, tokens_BxL, cache, logits_BxV):
        """After the last token: nothing more to compute."""
        del j, tokens_BxL
        return logits_BxV, cache

    def feed_one(j, tokens_BxL, cache, logits_BxV):
        """The logits of token j: token j-1 through the cache."""
        del logits_BxV
        token_Bx1 = jax.lax.dynamic_slice_in_dim(tokens_BxL, slots.prompt + j - 1, 1, axis=1)
        positions_Bx1 = (lengths_B + j - 1)[:, None]
        return _last_logits(params, token_Bx1, positions_Bx1, cache, cfg)

    def recompute(j, tokens_BxL, cache, logits_BxV):
        """The logits of token j from the last block_size tokens, through a fresh cache; the
        decoding cache is not read again, since every later step recomputes too."""
        del logits_BxV
        window_BxW = jax.lax.dynamic_slice_in_dim(tokens_BxL, slots.prompt + j - block, block, 1)
        pad_B = block - jnp.minimum(lengths_B + j, block)
        positions_BxW = jnp.arange(block)[None, :] - pad_B[:, None]
        fresh = init_cache(cfg, batch, block)
        logits_BxV, _ = _last_logits(params, window_BxW, positions_BxW, fresh, cfg)
        return logits_BxV, cache

    branches = [keep, feed_one] + ([recompute] if slots.recomputes else [])
    draw = functools.partial(sample_token, temperature=temperature, top_k=top_k, top_p=top_p)

    def step(j, state):
        tokens_BxL, logits_BxV, cache, logits_BxGxV = state
        keys_B = jax.vmap(jax.random.fold_in, in_axes=(0, None))(rngs_B, j)
        token_B = jax.vmap(lambda logits_V, key: draw(logits_V[None], key)[0])(logits_BxV, keys_B)
        tokens_BxL = jax.lax.dynamic_update_slice_in_dim(
            tokens_BxL, token_B[:, None], slots.prompt + j, axis=1
        )
        if logits_BxGxV is not None:
            logits_BxGxV = jax.lax.dynamic_update_slice_in_dim(
                logits_BxGxV, logits_BxV[:, None], j, axis=1
            )
        nxt = j + 1
        which = jnp.where(nxt >= num_new, 0, 1)
        if slots.recomputes:
            which = jnp.where((which == 1) & (jnp.max(lengths_B) + nxt > block), 2, which)
        logits_BxV, cache = jax.lax.switch(which, branches, nxt, tokens_BxL, cache, logits_BxV)
        return DecodeState(tokens_BxL, logits_BxV, cache, logits_BxGxV)

    return jax.lax.fori_loop(first, stop, step, state)


def time_step_past_block(
    params: Params,
    cfg: GPTConfig,
    plan: SamplingPlan,
    longest_prompt: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> float:
    """Seconds of one decoding step past block_size for a batch of `plan` (learned positions),
    through the compiled prefill and decode that the sampling itself then reuses: a call of k
    steps less a call of none (a call's own cost, which chunked decoding spreads thin), over k,
    with k raised until the steps take 50 ms (tiny models); one step, timed once, when it takes
    a second or more (a big batch or model), else the round is repeated (a first is slower)."""
    first = first_recomputed_token(cfg, longest_prompt)
    slots, batch = plan.slots, plan.batch_size
    prompt_BxP = np.zeros((batch, slots.prompt), np.int32)
    lengths_B = np.full((batch,), min(longest_prompt, cfg.block_size), np.int32)
    rngs_B = row_keys(jax.random.key(0), range(batch))
    knobs = _knobs(cfg, temperature, top_k, top_p)
    state = prefill(params, prompt_BxP, lengths_B, cfg=cfg, slots=slots, return_logits=False)

    def timed(state: DecodeState, steps: int) -> tuple[DecodeState, float]:
        # Steps from `first` on sample, then recompute the window for the next token.
        bounds = (np.int32(first), np.int32(first + steps), np.int32(first + steps + 1))
        start = time.perf_counter()
        state = decode(params, state, lengths_B, rngs_B, *bounds, *knobs, cfg=cfg, slots=slots)
        jax.block_until_ready(state)
        return state, time.perf_counter() - start

    most = max(1, slots.new - first - 1)  # steps that fit in the token buffer
    state, _ = timed(state, 0)  # compiles
    steps, rounds = 1, 0
    while True:
        state, idle = timed(state, 0)
        state, busy = timed(state, steps)
        rounds += 1
        # A first round of steps runs slower by a few ms: repeated unless a step is long.
        if (busy - idle >= 0.05 and (rounds > 1 or busy >= 1.0)) or steps == most:
            return max(busy - idle, 0.0) / steps
        if busy - idle < 0.05:
            steps = min(4 * steps, most)


def _knobs(cfg: GPTConfig, temperature, top_k, top_p) -> tuple:
    """The traced sampling settings, typed as every call passes them (one compile)."""
    return (
        np.float32(temperature),
        None if top_k is None else np.int32(min(top_k, cfg.vocab_size)),
        None if top_p is None else np.float32(top_p),
    )


# ----------------------------------------------------------------------------- host loop


class NewTokens(NamedTuple):
    """New tokens first .. first + C - 1 of the prompts `rows` (one compiled call's worth)."""

    rows: range
    first: int
    tokens_BxC: np.ndarray


class _ChunkSizer:
    """How many steps each compiled call decodes: all of them without a target (seconds=None);
    else about `seconds` of work, starting with one step and at most doubling, and never across
    `boundary` (from there each step recomputes a window and costs more, so it starts over)."""

    def __init__(self, seconds: float | None, total: int, boundary: int | None):
        self.seconds, self.total = seconds, total
        self.boundary = total if boundary is None else boundary
        self.size = 1

    def stop_after(self, first: int) -> int:
        if self.seconds is None:
            return self.total
        stop = min(first + self.size, self.total)
        return self.boundary if first < self.boundary < stop else stop

    def record(self, steps: int, seconds: float, stop: int) -> None:
        if self.seconds is None:
            return
        if stop == self.boundary:
            self.size = 1
        else:
            per_step = max(seconds, 1e-9) / steps
            self.size = max(1, min(2 * steps, int(self.seconds / per_step)))


def _decoded_batches(
    params, cfg, prompts, max_new_tokens, rng, knobs, plan, chunk_seconds, return_logits
) -> Iterator[tuple[NewTokens, np.ndarray | None]]:
    """Each batch of the plan: the prefill, then compiled calls of the sizer's steps."""
    lengths_N = np.array([len(p) for p in prompts], np.int64)
    learned = POSITION_ENCODINGS[cfg.pos_encoding].learned
    slots, batch = plan.slots, plan.batch_size
    for start in range(0, len(prompts), batch):
        rows = range(start, min(start + batch, len(prompts)))
        # The last batch is padded with copies of its first row: one shape, one compile.
        padded = list(rows) + [rows[0]] * (batch - len(rows))
        contexts = [prompts[i][-cfg.block_size :] if learned else prompts[i] for i in padded]
        lengths_B = np.array([len(c) for c in contexts], np.int32)
        prompt_BxP = np.zeros((batch, slots.prompt), np.int32)
        for b, context in enumerate(contexts):
            prompt_BxP[b, slots.prompt - len(context) :] = context
        rngs_B = row_keys(rng, padded)
        state = prefill(
            params, prompt_BxP, lengths_B, cfg=cfg, slots=slots, return_logits=return_logits
        )
        longest = int(lengths_N[list(rows)].max())
        sizer = _ChunkSizer(chunk_seconds, max_new_tokens, first_recomputed_token(cfg, longest))
        first = 0
        while first < max_new_tokens:
            stop = sizer.stop_after(first)
            clock = time.perf_counter()
            state = decode(
                params, state, lengths_B, rngs_B, np.int32(first), np.int32(stop),
                np.int32(max_new_tokens), *knobs, cfg=cfg, slots=slots,
            )  # fmt: skip
            # A copy: the next call is given (donated) the device buffer.
            tokens_BxL = np.array(state.tokens_BxL)
            sizer.record(stop - first, time.perf_counter() - clock, stop)
            new_BxC = tokens_BxL[: len(rows), slots.prompt + first : slots.prompt + stop]
            logits_BxCxV = (
                np.array(state.logits_BxGxV)[: len(rows), first:stop] if return_logits else None
            )
            yield NewTokens(rows, first, new_BxC), logits_BxCxV
            first = stop


# ----------------------------------------------------------------------------- public entry points


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
    batch_size: int | None = None,
    memory_bytes: int | None = None,
    return_logits: bool = False,
):
    """The prompts followed by `max_new_tokens` sampled tokens each.

    Args:
      prompt_ids: a (B, T0) integer array, or a list of B 1-D prompts whose lengths may differ
        (they are left-padded internally; padding gets no position and is never attended to).
      max_new_tokens: tokens to add to every prompt (>= 0).
      rng: the key; new token j of prompt i uses `fold_in(fold_in(rng, i), j)`, so a fixed key
        reproduces the output, however the prompts are batched.
      temperature: 0 takes the argmax (greedy); otherwise logits are divided by it.
      top_k, top_p: optional top-k, then nucleus, filters (`top_k_filter`, `top_p_filter`);
        top_k above V keeps every token.
      max_len: sinusoidal, rope or no positions only: the longest sequence allowed (prompt plus
        new tokens); past it `generate` refuses. Default: no limit beyond the model's scheme.
        These schemes never crop: the cache grows with the sequence, past block_size too.
        Learned positions instead reproduce nanoGPT's crop-and-recompute loop exactly: a prompt
        is cropped to its last block_size tokens, the cache serves while the context fits, and
        each later step recomputes the last block_size tokens (as slow as no cache).
      batch_size, memory_bytes: at most this many prompts per compiled batch, and the memory
        the batches may fill (default MEMORY_FRACTION of the free memory; `plan_sampling`).
      return_logits: also return each step's logits (B, max_new_tokens, V), float32.

    Returns:
      For an array: an int32 array (B, T0 + max_new_tokens); for a list: a list of 1-D int32
      arrays. With return_logits, a pair (that, logits). numpy on the host.

    One prefill pass over the prompts fills a KV cache, then one compiled loop per batch adds a
    token per step. It compiles once per batch size, max_new_tokens bucket (a power of two >=
    MIN_BUCKET), prompt-length bucket (likewise, at most block_size for learned positions), and
    choice of which filters are on; temperature, top_k and top_p values are traced.
    """
    return _generate(**locals(), chunk_seconds=None, assemble=True)


def generate_stream(
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
    batch_size: int | None = None,
    memory_bytes: int | None = None,
    chunk_seconds: float | None = CHUNK_SECONDS,
) -> Iterator[NewTokens]:
    """`generate`'s new tokens as they come: for each batch of prompts in order, `NewTokens`
    chunks of consecutive tokens, one compiled call each, sized to about `chunk_seconds` (None:
    one call per batch). The tokens equal `generate`'s for the same arguments, however they are
    chunked. Bad input raises here, not on iteration.
    """
    chunks = _generate(**locals(), return_logits=False, assemble=False)
    return (chunk for chunk, _ in chunks)


def _generate(
    params, cfg, prompt_ids, max_new_tokens, *, rng, temperature, top_k, top_p, max_len,
    batch_size, memory_bytes, return_logits, chunk_seconds, assemble,
):  # fmt: skip
    """generate (assembled) and generate_stream: the checks, eagerly, then the loop."""
    prompts, as_array = _validated_prompts(prompt_ids, cfg)
    check_settings(cfg, max_new_tokens, temperature, top_k, top_p)
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
    knobs = _knobs(cfg, temperature, top_k, top_p)
    chunks = iter(())
    if max_new_tokens > 0:
        plan = plan_sampling(
            cfg, len(prompts), longest, max_new_tokens, batch_size=batch_size,
            memory_bytes=memory_bytes, return_logits=return_logits,
        )  # fmt: skip
        chunks = _decoded_batches(
            params, cfg, prompts, max_new_tokens, rng, knobs, plan, chunk_seconds, return_logits
        )
    if not assemble:
        return chunks
    return _assembled(prompts, as_array, chunks, max_new_tokens, cfg.vocab_size, return_logits)


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


def check_settings(cfg, max_new_tokens, temperature, top_k, top_p) -> None:
    """`generate`'s checks of the model and the sampling settings (host side, one-line errors)."""
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
