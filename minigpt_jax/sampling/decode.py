"""The compiled calls of sampling: `prefill` runs the prompts once through a KV cache, `decode`
samples new tokens from there in calls of any number of steps; and the measured time of a step
past block_size (`time_step_past_block`)."""

from __future__ import annotations

import functools
import time
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from minigpt_jax.model.attention import KVCache
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.embeddings import read_out
from minigpt_jax.model.gpt import GPT, Params, head_weight, init_cache
from minigpt_jax.sampling.filters import row_keys, sample_token
from minigpt_jax.sampling.options import SampleSettings
from minigpt_jax.sampling.plan import SamplingPlan, Slots, first_recomputed_token

Array = chex.Array


class DecodeState(NamedTuple):
    """What decoding carries from one compiled call to the next (donated to each call)."""

    tokens_BxL: Array  # right-aligned prompts in slots [0, P), new token j at slot P + j
    next_logits_BxV: Array  # the logits the next new token is drawn from
    cache: list[KVCache]
    logits_BxGxV: Array | None  # each step's logits, when asked for


def _last_logits(
    params: Params,
    tokens_BxW: Array,
    positions_BxW: Array,
    cache: list[KVCache],
    cfg: GPTConfig,
) -> tuple[Array, list[KVCache]]:
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
    settings: SampleSettings,
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
    traced = traced_settings(settings, cfg)
    state = prefill(params, prompt_BxP, lengths_B, cfg=cfg, slots=slots, return_logits=False)

    def timed(state: DecodeState, steps: int) -> tuple[DecodeState, float]:
        # Steps from `first` on sample, then recompute the window for the next token.
        bounds = (np.int32(first), np.int32(first + steps), np.int32(first + steps + 1))
        start = time.perf_counter()
        state = decode(params, state, lengths_B, rngs_B, *bounds, *traced, cfg=cfg, slots=slots)
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


def traced_settings(settings: SampleSettings, cfg: GPTConfig) -> tuple:
    """`decode`'s temperature, top_k and top_p arguments, typed as every call passes them (one
    compile for all values; a filter that is off is None, which compiles apart)."""
    return (
        np.float32(settings.temperature),
        None if settings.top_k is None else np.int32(min(settings.top_k, cfg.vocab_size)),
        None if settings.top_p is None else np.float32(settings.top_p),
    )
