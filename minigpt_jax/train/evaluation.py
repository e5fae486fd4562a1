"""Perplexity and bits per byte of a model on a text, over sliding windows (the GPT-2 recipe)."""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from minigpt_jax import budget
from minigpt_jax.data.tokenizers import Tokenizer
from minigpt_jax.loading import load_model
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.gpt import Params, next_token_losses


@dataclasses.dataclass(frozen=True)
class Perplexity:
    """What `perplexity` measured."""

    tokens: int  # tokens in the text
    tokens_scored: int  # tokens predicted (all but the first, which has no context)
    bytes_scored: int  # UTF-8 bytes those tokens spell
    loss: float  # mean next-token cross-entropy over the scored tokens, nats
    window: int  # model inputs per window
    stride: int  # tokens the window moves each time

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    @property
    def bits_per_byte(self) -> float:
        return self.loss * self.tokens_scored / (math.log(2) * self.bytes_scored)

    def summary(self) -> str:
        return (
            f"tokens seen {self.tokens_scored:,} (of {self.tokens:,}; window {self.window}, "
            f"stride {self.stride}): loss {self.loss:.4f} nats/token, perplexity "
            f"{self.perplexity:.3f}, bits per byte {self.bits_per_byte:.4f}"
        )


def sliding_windows(num_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first_scored) of each window over token ids 0 .. num_tokens-1.

    A window feeds ids [begin, end) and predicts ids [begin+1, end+1) ∩ [0, num_tokens); it
    scores only the targets from `first_scored` on, those no earlier window scored, so every
    target 1 .. num_tokens-1 is scored once, with at least window - stride tokens of context
    after the first window (the Hugging Face perplexity recipe for fixed-length models).
    """
    if not 1 <= stride <= window:
        raise ValueError(f"stride={stride} must be between 1 and the window ({window}).")
    windows, scored_up_to, begin = [], 1, 0  # targets below scored_up_to are done
    while scored_up_to < num_tokens:
        end = min(begin + window, num_tokens - 1)
        windows.append((begin, end, scored_up_to))
        scored_up_to = end + 1
        begin += stride
    return windows


@functools.partial(jax.jit, static_argnames="cfg")
def _window_loss_sum(params: Params, tokens_BxT1, weights_BxT, *, cfg: GPTConfig):
    """Summed next-token cross-entropy (nats) of the targets tokens_BxT1[:, 1:] weighted 1."""
    return jnp.sum(next_token_losses(params, tokens_BxT1, cfg) * weights_BxT)


def perplexity(
    params: Params,
    cfg: GPTConfig,
    tokenizer: Tokenizer,
    text: str,
    *,
    stride: int | None = None,
    batch_size: int = 8,
) -> Perplexity:
    """Perplexity of the model on `text` with windows of cfg.block_size tokens moved by `stride`
    (default: the whole window, no overlap). A smaller stride gives each prediction more context
    and costs window/stride times the compute."""
    ids = np.asarray(tokenizer.encode(text), np.int32)
    if ids.size < 2:
        raise ValueError(
            f"the text encodes to {ids.size} token(s); perplexity needs at least 2 (one to "
            f"condition on, one to predict). Give a longer text."
        )
    window = cfg.block_size
    stride = window if stride is None else stride
    windows = sliding_windows(ids.size, window, stride)
    total = 0.0
    # Every batch is (batch_size, window): one compile whatever the text's length.
    for first in range(0, len(windows), batch_size):
        tokens_BxT1 = np.zeros((batch_size, window + 1), np.int32)
        weights_BxT = np.zeros((batch_size, window), np.float32)
        for row, (begin, end, scored) in enumerate(windows[first : first + batch_size]):
            tokens_BxT1[row, : end + 1 - begin] = ids[begin : end + 1]
            weights_BxT[row, scored - begin - 1 : end - begin] = 1.0
        total += float(_window_loss_sum(params, tokens_BxT1, weights_BxT, cfg=cfg))
    scored = ids.size - 1
    # The first token is context only; its bytes are not among those predicted.
    first_bytes = len(tokenizer.decode(ids[:1]).encode("utf-8", errors="surrogatepass"))
    return Perplexity(
        tokens=int(ids.size),
        tokens_scored=scored,
        bytes_scored=len(text.encode("utf-8", errors="surrogatepass")) - first_bytes,
        loss=total / scored,
        window=window,
        stride=stride,
    )


def perplexity_of(
    model: str | Path,
    text_path: str | Path,
    *,
    stride: int | None = None,
    checkpoint: str = "latest",
    batch_size: int = 8,
) -> Perplexity:
    """`perplexity` of a run directory or a Hugging Face GPT-2 directory on a UTF-8 text file."""
    text_path = Path(text_path)
    if not text_path.is_file():
        raise FileNotFoundError(f"no text file at {text_path}: give a UTF-8 .txt file.")
    cfg, params, tokenizer = load_model(model, checkpoint)
    check_fits_in_memory(text_path, tokenizer.kind)
    try:
        text = text_path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{text_path} is not UTF-8 text ({error}); convert it first.") from None
    return perplexity(params, cfg, tokenizer, text, stride=stride, batch_size=batch_size)


def check_fits_in_memory(text_path: Path, tokenizer_kind: str) -> None:
    """Refuses, before reading it, a text whose in-memory encoding would not fit in RAM (the
    same account as a data.format=memory corpus: budget.text_shortfall)."""
    text_bytes = text_path.stat().st_size
    shortfall = budget.text_shortfall(text_bytes, tokenizer_kind)
    if shortfall is not None:
        needed, available = shortfall
        part = max(budget.text_bytes_that_fit(available, tokenizer_kind) // 2, 1)
        raise ValueError(
            f"{text_path} holds {text_bytes / 2**20:,.0f} MiB of text; reading and encoding it "
            f"at once would need about {needed / 2**30:,.1f} GiB of RAM, but "
            f"{available / 2**30:,.1f} GiB are available; score a part of it, e.g. "
            f"`head -c {part // 2**20 or 1}M {text_path} > part.txt`, then --text part.txt."
        )
