"""What every data format gives a run: a `Dataset` (tokenizer, train/val token streams, their
`DataDigest`), the contiguous split, and deterministic batches (`get_batch`), for token arrays in
memory and memory-mapped shards alike (numpy only)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from minigpt_jax.data.tokenizers import Tokenizer
from minigpt_jax.settings.shape_schedule import ShapeSchedule

_log = logging.getLogger(__name__)

SPLITS = ("train", "val")


@dataclass(frozen=True)
class DataDigest:
    """What a run trains on, recorded in its checkpoints so a resume can tell when the data
    changed: the format, the length of the token stream and its sha256 (memory: of the uint16
    tokens; shards: shards.digest.stream_sha256 of the shards' digests, in order)."""

    format: str
    tokens: int
    sha256: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def tokens_digest(tokens: np.ndarray) -> DataDigest:
    """The DataDigest of an in-memory token stream (uint16, shape (n,))."""
    return DataDigest("memory", len(tokens), hashlib.sha256(tokens.tobytes()).hexdigest())


@dataclass(frozen=True)
class Dataset:
    """A tokenised corpus: its tokenizer, contiguous train/val token streams (uint16 arrays
    in memory, or shards.read.TokenStream views of memory-mapped shards) and their digest."""

    tokenizer: Tokenizer
    train: Any
    val: Any
    digest: DataDigest | None = None


def split_tokens(tokens: np.ndarray, val_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Splits tokens of shape (n,) into contiguous (train, val): the first
    int(n * (1 - val_fraction)) tokens, then the rest (nanoGPT's split). Returns views."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}; e.g. use 0.1.")
    if tokens.ndim != 1:
        raise ValueError(
            f"tokens must be 1-D, got shape {tokens.shape}; pass one concatenated token stream."
        )
    n_train = int(len(tokens) * (1.0 - val_fraction))
    return tokens[:n_train], tokens[n_train:]


def check_split_length(tokens: np.ndarray, block_size: int, split: str) -> None:
    """Raises ValueError unless `tokens` holds at least one window of block_size + 1 tokens."""
    if len(tokens) < block_size + 1:
        raise ValueError(
            f"the {split!r} split has {len(tokens)} tokens but one training window needs "
            f"block_size + 1 = {block_size + 1}; use a smaller block_size or more text."
        )


def warn_if_degenerate(where: str, distinct_ids: dict[str, int], vocab_size: int) -> None:
    """Logs one warning naming `where` (the corpus) when a split holds fewer than 2 distinct
    ids (distinct_ids: {split: count} of the splits counted), e.g. a text of one repeated
    character, which trains a model that only repeats it to a loss of 0."""
    few = {split: n for split, n in distinct_ids.items() if n < 2}
    if not few:
        return
    counts = ", ".join(
        f"the {split} split holds {n} distinct token id" + ("" if n == 1 else "s")
        for split, n in few.items()
    )
    _log.warning(
        "%s: %s (of a vocabulary of %d), so a model trained on it learns only to repeat that "
        "id and its losses say nothing; check that data.path names the corpus you mean and "
        "that its text is not one repeated character or only newlines.",
        where,
        counts,
        vocab_size,
    )


def get_batch(
    tokens: np.ndarray,
    batch_size: int,
    block_size: int,
    *,
    seed: int,
    step: int,
    split: str = "train",
) -> np.ndarray:
    """Returns int32 windows of shape (batch_size, block_size + 1) from one split's tokens
    (a 1-D array, or a shards.read.TokenStream: the same windows of the same stream).

    inputs = batch[:, :-1], targets = batch[:, 1:]. Window starts are uniform over the split
    and a pure function of (seed, step, split), so a resumed run replays the same batches.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {list(SPLITS)}.")
    for name, value, minimum in (
        ("batch_size", batch_size, 1),
        ("block_size", block_size, 1),
        ("seed", seed, 0),
        ("step", step, 0),
    ):
        if not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    check_split_length(tokens, block_size, split)
    return draw_batch(tokens, batch_size, block_size, seed=seed, step=step, split=split)


def draw_batch(
    tokens: np.ndarray, batch_size: int, block_size: int, *, seed: int, step: int, split: str
) -> np.ndarray:
    """get_batch without its checks, for arguments checked once: the training loop's (the
    typed config checks the sizes and the seed, loading a split checks its length)."""
    rng = np.random.default_rng([seed, step, SPLITS.index(split)])
    starts = rng.integers(0, len(tokens) - block_size, size=batch_size)
    if isinstance(tokens, np.ndarray):
        return tokens[starts[:, None] + np.arange(block_size + 1)].astype(np.int32)
    return tokens.windows(starts, block_size + 1)  # memory-mapped shards (shards.read.TokenStream)


def train_batches(
    tokens: Any, shapes: ShapeSchedule, *, seed: int, steps_per_call: int, batch_sharding: Any
) -> Callable[[int], jax.Array]:
    """first_step -> the global batches (C, B, T + 1) of steps [first_step, first_step + C) of
    the train split `tokens` (C = steps_per_call), the same on every process, placed by
    `batch_sharding`; (B, T) is the shape schedule's at first_step (one shape per chunk)."""
    fixed_shape = shapes.fixed  # (B, T) of every step, or None: the schedule's at first_step

    def batches(first_step: int) -> jax.Array:
        batch_size, seq_len = fixed_shape or shapes.at(first_step)
        steps = range(first_step, first_step + steps_per_call)
        batches_CxBxT1 = np.stack(
            [
                draw_batch(tokens, batch_size, seq_len, seed=seed, step=step, split="train")
                for step in steps
            ]
        )
        # Every process holds the whole batch; each device takes its own rows.
        return jax.make_array_from_callback(
            batches_CxBxT1.shape, batch_sharding, batches_CxBxT1.__getitem__
        )

    return batches
