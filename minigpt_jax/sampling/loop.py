"""The host loop of sampling: each batch of a plan decoded in compiled calls sized to a time
target (`decoded_batches`), whose new tokens come out as `NewTokens` chunks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import NamedTuple

import chex
import numpy as np

from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.gpt import Params
from minigpt_jax.model.positions import POSITION_ENCODINGS
from minigpt_jax.sampling.decode import decode, prefill, traced_settings
from minigpt_jax.sampling.filters import row_keys
from minigpt_jax.sampling.options import SampleSettings
from minigpt_jax.sampling.plan import SamplingPlan, first_recomputed_token

Array = chex.Array

# `generate_stream` sizes each compiled call to about this much decoding, so text shows up
# within a second and Ctrl-C is answered as soon.
CHUNK_SECONDS = 0.5


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


def decoded_batches(
    params: Params,
    cfg: GPTConfig,
    prompts: list[np.ndarray],
    max_new_tokens: int,
    rng: Array,
    settings: SampleSettings,
    plan: SamplingPlan,
    chunk_seconds: float | None,
    return_logits: bool,
) -> Iterator[tuple[NewTokens, np.ndarray | None]]:
    """Each batch of `plan` in order: the prefill, then compiled calls of about `chunk_seconds`
    of steps each (None: one call), each giving its new tokens and, with return_logits, their
    logits (numpy on the host). The prompts are checked 1-D int32 arrays (`api.generate`)."""
    traced = traced_settings(settings, cfg)
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
                np.int32(max_new_tokens), *traced, cfg=cfg, slots=slots,
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
