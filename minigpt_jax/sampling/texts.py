"""Texts sampled from a model with a tokenizer: from a run directory (`sample_from_workdir`),
whole (`sample_texts`) or streamed as they come (`stream_texts`), never cut inside a character.
`api.generate_stream` samples the ids; this module encodes the prompt and decodes the texts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from minigpt_jax.budget import format_bytes
from minigpt_jax.data.tokenizers import Tokenizer
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.gpt import Params
from minigpt_jax.model_files import load_run
from minigpt_jax.sampling.api import check_request, generate_stream
from minigpt_jax.sampling.decode import time_step_past_block
from minigpt_jax.sampling.loop import CHUNK_SECONDS
from minigpt_jax.sampling.options import SampleSettings, settings_of
from minigpt_jax.sampling.plan import SamplingPlan, plan_sampling, tokens_past_block


def sample_from_workdir(
    workdir: str | Path, prompt: str, *, checkpoint: str = "latest", **options: Any
) -> list[str]:
    """Decoded texts: continuations of `prompt` by a trained run.

    Loads the run's checkpoint ('latest' or 'best') and its tokenizer from `workdir`; `options`
    are `sample_texts`' (max_new_tokens, seed, num_samples, settings or its fields).
    """
    run = load_run(workdir, checkpoint)
    return sample_texts(run.params, run.cfg, run.tokenizer, prompt, **options)


def sample_texts(
    params: Params, cfg: GPTConfig, tokenizer: Tokenizer, prompt: str, **options: Any
) -> list[str]:
    """Decoded texts: `num_samples` independent continuations of `prompt`; sample i draws with
    fold_in(key(seed), i), so the texts do not depend on how they are batched. `options` are
    `stream_texts`' (max_new_tokens, seed=0, num_samples=1, settings or its fields); each batch
    is decoded in one compiled call."""
    texts = {}
    for piece in stream_texts(params, cfg, tokenizer, prompt, chunk_seconds=None, **options):
        texts[piece.index] = texts.get(piece.index, "") + piece.text
    return [texts[i] for i in range(len(texts))]


class SampleText(NamedTuple):
    """New text of sample `index` (its first piece starts with the prompt); `new_tokens` of it
    are sampled so far, and `done` marks its last piece."""

    index: int
    text: str
    new_tokens: int
    done: bool


class TextStream:
    """One sample's text as its tokens come, never cutting a character that spans tokens: the
    pieces join to the decoding of all the tokens at once."""

    def __init__(self, tokenizer: Tokenizer, ids: np.ndarray):
        self.tokenizer, self.pending = tokenizer, ids

    def feed(self, ids: np.ndarray, final: bool) -> str:
        self.pending = np.concatenate([self.pending, ids])
        text = self.tokenizer.decode(self.pending)
        # Byte-level BPE: a character's bytes may still be coming (decoded as U+FFFD for now).
        if text.endswith("\ufffd") and not final:
            return ""
        self.pending = self.pending[:0]
        return text


def stream_texts(
    params: Params,
    cfg: GPTConfig,
    tokenizer: Tokenizer,
    prompt: str,
    *,
    max_new_tokens: int,
    settings: SampleSettings | None = None,
    seed: int = 0,
    num_samples: int = 1,
    chunk_seconds: float | None = CHUNK_SECONDS,
    on_notice: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    **setting_values: Any,
) -> Iterator[SampleText]:
    """`sample_texts`' texts in the order they can be printed: the first sample of each batch
    in pieces as its tokens come (one compiled call of about `chunk_seconds` each; None: one
    call per batch), then the batch's other samples whole once it is done.

    settings (or its fields as keywords, as `generate` takes them) say how tokens are drawn and
    batched. on_notice gets one-line notices: the batches memory asks for, and the cost of the
    tokens past block_size (learned positions have no cache there; the step is timed first).
    When should_stop() turns true between calls, the batch's texts so far come out
    (done=False) and the stream ends.
    """
    settings = settings_of(settings, **setting_values)
    if num_samples < 1:
        raise ValueError(f"num_samples must be at least 1, got {num_samples}.")
    check_request(cfg, max_new_tokens)
    prompt_ids = _encoded(tokenizer, prompt)
    if max_new_tokens == 0:
        for i in range(num_samples):
            yield SampleText(i, tokenizer.decode(prompt_ids), 0, True)
        return
    # Planned once here, so that the notices describe the batches the stream then makes.
    plan = plan_sampling(cfg, num_samples, len(prompt_ids), max_new_tokens, settings)
    stream = generate_stream(
        params, cfg, np.tile(prompt_ids, (num_samples, 1)), max_new_tokens,
        rng=jax.random.key(seed), chunk_seconds=chunk_seconds,
        settings=settings.replace(batch_size=plan.batch_size, memory_bytes=plan.budget),
    )  # fmt: skip
    if on_notice is not None:
        _notify(
            on_notice, params, cfg, plan, len(prompt_ids), max_new_tokens, num_samples, settings
        )
    new_BxG, made, streamed = None, 0, None
    for chunk in stream:
        if chunk.first == 0:  # a new batch
            new_BxG = np.zeros((len(chunk.rows), max_new_tokens), np.int32)
            streamed = TextStream(tokenizer, prompt_ids)
        made = chunk.first + chunk.tokens_BxC.shape[1]
        new_BxG[:, chunk.first : made] = chunk.tokens_BxC
        done = made == max_new_tokens
        stop = not done and should_stop is not None and should_stop()
        text = streamed.feed(chunk.tokens_BxC[0], final=done or stop)
        yield SampleText(chunk.rows[0], text, made, done)
        if done or stop:
            for b, i in enumerate(chunk.rows[1:], start=1):
                ids = np.concatenate([prompt_ids, new_BxG[b, :made]])
                yield SampleText(i, tokenizer.decode(ids), made, done)
        if stop or (done and should_stop is not None and should_stop()):
            return


def _encoded(tokenizer: Tokenizer, prompt: str) -> np.ndarray:
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as error:
        char = ord(prompt[error.start])
        # The command line hands undecodable bytes over as lone surrogates U+DC80..U+DCFF.
        what = f"byte 0x{char - 0xDC00:02x}" if 0xDC80 <= char <= 0xDCFF else f"U+{char:04X}"
        raise ValueError(
            f"the prompt is not valid UTF-8 text ({what} at character {error.start}); pass "
            "UTF-8 (check the terminal's encoding, e.g. LANG=C.UTF-8)."
        ) from None
    prompt_ids = tokenizer.encode(prompt)
    if prompt_ids.size == 0:
        raise ValueError("the prompt is empty: give at least one character, e.g. --prompt='\\n'.")
    return prompt_ids


def _notify(
    on_notice: Callable[[str], None],
    params: Params,
    cfg: GPTConfig,
    plan: SamplingPlan,
    prompt_len: int,
    max_new_tokens: int,
    num_samples: int,
    settings: SampleSettings,
) -> None:
    """The notices of `stream_texts`: batches, then the cost past block_size."""
    if plan.limited_by_memory:
        on_notice(
            f"{num_samples:,} samples need about {format_bytes(num_samples * plan.row_bytes)} "
            f"({format_bytes(plan.row_bytes)} each) but sampling may use "
            f"{format_bytes(plan.budget)} ({plan.budget_source}): sampling them in "
            f"{plan.num_batches:,} batches of {plan.batch_size:,}, each printed when it is done."
        )
    past = tokens_past_block(cfg, prompt_len, max_new_tokens)
    if past:
        step = time_step_past_block(params, cfg, plan, prompt_len, settings)
        each = " of each sample" if num_samples > 1 else ""
        on_notice(
            f"{past:,} of the {max_new_tokens:,} new tokens{each} pass block_size="
            f"{cfg.block_size}, where learned positions have no KV cache: each recomputes the "
            f"last {cfg.block_size} tokens, {_duration(step)} per token (timed), about "
            f"{_duration(step * past * plan.num_batches)} for them in all (a rope or "
            "sinusoidal model keeps its cache)."
        )


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1e3:.2g} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:,.3g} h"
