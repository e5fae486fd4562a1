"""Models on disk: sampling from a run directory's checkpoint and tokenizer, or from a Hugging
Face GPT-2 directory, as texts or as the streamed output of `minigpt-jax sample`.

The I/O side of `minigpt-jax sample`, kept out of `sampling` (which works on params and ids)
and out of `cli` (which only parses flags).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple, TextIO

import jax
import numpy as np

from minigpt_jax.budget import format_bytes
from minigpt_jax.data.tokenizers import Tokenizer
from minigpt_jax.loading import LoadedModel, load_model, load_run
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.gpt import Params
from minigpt_jax.runtime.signals import StopRequest
from minigpt_jax.sampling.api import (
    CHUNK_SECONDS,
    check_settings,
    generate_stream,
    plan_sampling,
    time_step_past_block,
    tokens_past_block,
)

COMMAND = "minigpt-jax sample"


def sample_from_workdir(
    workdir: str | Path, prompt: str, *, checkpoint: str = "latest", **settings
) -> list[str]:
    """Decoded texts: continuations of `prompt` by a trained run.

    Loads the run's checkpoint ('latest' or 'best') and its tokenizer from `workdir`; `settings`
    are those of `sample_texts` (max_new_tokens, temperature, top_k, top_p, seed, num_samples,
    samples_per_batch).
    """
    run = load_run(workdir, checkpoint)
    return sample_texts(run.params, run.cfg, run.tokenizer, prompt, **settings)


def sample_from_pretrained(path: str | Path, prompt: str, **settings) -> list[str]:
    """`sample_from_workdir` for a Hugging Face GPT-2 directory (weights and tokenizer)."""
    model = load_model(path)
    return sample_texts(model.params, model.cfg, model.tokenizer, prompt, **settings)


def sample_texts(params: Params, cfg: GPTConfig, tokenizer: Tokenizer, prompt: str, **settings):
    """Decoded texts: `num_samples` independent continuations of `prompt`; sample i draws with
    fold_in(key(seed), i), so the texts do not depend on how they are batched. `settings` are
    `stream_texts`' (max_new_tokens=500, temperature=0.8, top_k, top_p, seed=0, num_samples=1,
    samples_per_batch, memory_bytes); each batch is decoded in one compiled call."""
    texts = {}
    for piece in stream_texts(params, cfg, tokenizer, prompt, chunk_seconds=None, **settings):
        texts[piece.index] = texts.get(piece.index, "") + piece.text
    return [texts[i] for i in range(len(texts))]


# ----------------------------------------------------------------------------- streamed texts


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
    max_new_tokens: int = 500,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    num_samples: int = 1,
    samples_per_batch: int | None = None,
    memory_bytes: int | None = None,
    chunk_seconds: float | None = CHUNK_SECONDS,
    on_notice: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Iterator[SampleText]:
    """`sample_texts`' texts in the order they can be printed: the first sample of each batch
    in pieces as its tokens come (one compiled call of about `chunk_seconds` each; None: one
    call per batch), then the batch's other samples whole once it is done.

    on_notice gets one-line notices: the batches memory asks for, and the cost of the tokens
    past block_size (learned positions have no cache there; the step is timed first). When
    should_stop() turns true between calls, the batch's texts so far come out (done=False) and
    the stream ends.
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be at least 1, got {num_samples}.")
    check_settings(cfg, max_new_tokens, temperature, top_k, top_p)
    prompt_ids = _encoded(tokenizer, prompt)
    if max_new_tokens == 0:
        for i in range(num_samples):
            yield SampleText(i, tokenizer.decode(prompt_ids), 0, True)
        return
    # Planned once here, so that the notices describe the batches the stream then makes.
    plan = plan_sampling(
        cfg, num_samples, len(prompt_ids), max_new_tokens, batch_size=samples_per_batch,
        memory_bytes=memory_bytes,
    )  # fmt: skip
    stream = generate_stream(
        params, cfg, np.tile(prompt_ids, (num_samples, 1)), max_new_tokens,
        rng=jax.random.key(seed), temperature=temperature, top_k=top_k, top_p=top_p,
        batch_size=plan.batch_size, memory_bytes=plan.budget, chunk_seconds=chunk_seconds,
    )  # fmt: skip
    if on_notice is not None:
        knobs = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        _notify(on_notice, params, cfg, plan, len(prompt_ids), max_new_tokens, num_samples, knobs)
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


def _notify(on_notice, params, cfg, plan, prompt_len, max_new_tokens, num_samples, knobs):
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
        step = time_step_past_block(params, cfg, plan, prompt_len, **knobs)
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


# ----------------------------------------------------------------------------- the command


class _StopRequest(StopRequest):
    """SIGINT and SIGTERM as a flag that sampling reads between compiled calls; a second signal
    raises KeyboardInterrupt at once."""

    def raises_on(self, sig: signal.Signals) -> bool:
        return self.signal_name is not None

    def on_signal(self, sig: signal.Signals) -> None:
        if self.signal_name is not None:
            raise KeyboardInterrupt
        super().on_signal(sig)


def print_samples(
    *,
    workdir: str | Path | None = None,
    pretrained: str | Path | None = None,
    checkpoint: str = "latest",
    prompt: str,
    num_samples: int = 1,
    max_new_tokens: int = 500,
    out: TextIO | None = None,
    err: TextIO | None = None,
    **settings,
) -> int:
    """`minigpt-jax sample`: the samples of a run (or of a GPT-2 directory) on `out` as they
    come, each under a `---------- sample i/N` line when N > 1, and notices on `err`.

    SIGINT or SIGTERM stops it between compiled calls: what was sampled is printed, then one
    line on `err`. Returns the exit status: 0, or 128 + the signal's number when stopped.
    """
    out, err = out or sys.stdout, err or sys.stderr
    model: LoadedModel = load_model(pretrained) if pretrained else load_run(workdir, checkpoint)
    say = lambda line: print(f"{COMMAND}: {line}", file=err, flush=True)  # noqa: E731
    last, complete = None, 0
    with _StopRequest() as stop:
        try:
            for piece in stream_texts(
                model.params, model.cfg, model.tokenizer, prompt, num_samples=num_samples,
                max_new_tokens=max_new_tokens, on_notice=say, should_stop=stop.requested,
                **settings,
            ):  # fmt: skip
                if last is None or piece.index != last.index:
                    if last is not None and not last.done:  # a sample cut off by a signal
                        out.write("\n")
                    if num_samples > 1:
                        out.write(f"---------- sample {piece.index + 1}/{num_samples}\n")
                out.write(piece.text + ("\n" if piece.done else ""))
                out.flush()
                last, complete = piece, complete + piece.done
        except KeyboardInterrupt:  # a second signal: stop now
            pass
        if not stop.requested() or complete == num_samples:
            return 0
        if last is not None and not last.done:
            out.write("\n")
            out.flush()
        progress = _progress(last, complete, num_samples, max_new_tokens)
        say(f"stopped by {stop.signal_name}{progress}")
        return 128 + stop.signal_number


def _progress(last: SampleText | None, complete: int, num_samples: int, max_new: int) -> str:
    """How far an interrupted `print_samples` got, for its last line."""
    cut = 0 if last is None else last.index + 1 - complete
    made = f"{last.new_tokens:,} of {max_new:,} new tokens" if cut else ""
    if num_samples == 1:
        return f" after {made or 'no new tokens'}; the text above is all that was sampled."
    cut_off = f", {cut:,} cut off at {made}" if cut else ""
    return (
        f": {complete:,} of {num_samples:,} samples complete{cut_off}; the text above is all "
        "that was sampled."
    )
