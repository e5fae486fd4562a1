"""Reading shards for a run: `sharded_dataset` (what data.format "shards" gives a run: the shards
brought up to date, then mapped), `load_shards` and `TokenStream` (read-only memory maps of the
stream; nothing is read into RAM until a window is)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from minigpt_jax.data.dataset import (
    SPLITS,
    DataDigest,
    Dataset,
    check_split_length,
    warn_if_degenerate,
)
from minigpt_jax.data.shards.digest import manifest_digest
from minigpt_jax.data.shards.layout import FORMAT, MANIFEST_FILENAME, read_json
from minigpt_jax.data.shards.prepare import ShardSettings, save_tokenizer, update_shards
from minigpt_jax.data.sources import describe_sources, find_sources
from minigpt_jax.data.tokenizers import Tokenizer, check_saved_tokenizer, load_tokenizer
from minigpt_jax.runtime.run_dir import RunDir

if TYPE_CHECKING:  # the group's type only
    from minigpt_jax.settings.groups import Data


class TokenStream:
    """Tokens [start, stop) of a stream stored in consecutive memory-mapped shards.

    Behaves like the 1-D token array of an in-memory corpus where dataset.get_batch needs it:
    len() and windows(); nothing is read until a window is.
    """

    def __init__(self, shards: list[np.ndarray], start: int = 0, stop: int | None = None):
        self._shards = shards
        self._offsets = np.cumsum([0] + [len(s) for s in shards])
        self.start = start
        self.stop = int(self._offsets[-1]) if stop is None else stop

    def __len__(self) -> int:
        return self.stop - self.start

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """int32 rows tokens[s : s + length] for every s in starts, shape (len(starts), length)."""
        out = np.empty((len(starts), length), np.int32)
        for row, start in enumerate(np.asarray(starts) + self.start):
            filled = 0
            while filled < length:
                at = start + filled
                shard = int(np.searchsorted(self._offsets, at, side="right")) - 1
                local = at - self._offsets[shard]
                chunk = self._shards[shard][local : local + length - filled]
                out[row, filled : filled + len(chunk)] = chunk
                filled += len(chunk)
        return out

    def __array__(self, dtype=None, copy=None):
        """The whole range as one array (reads it all: for small corpora and tests)."""
        whole = self.windows(np.zeros(1, np.int64), len(self))[0]
        return whole if dtype is None else whole.astype(dtype)


def load_shards(directory: str | os.PathLike) -> tuple[dict, Tokenizer, TokenStream, TokenStream]:
    """(manifest, tokenizer, train stream, val stream) of a prepared shards directory."""
    directory = Path(directory)
    manifest = read_json(directory / MANIFEST_FILENAME)
    if manifest is None or manifest.get("format") != FORMAT:
        raise FileNotFoundError(
            f"{directory} holds no prepared shards (no valid {MANIFEST_FILENAME}); run "
            f"`minigpt-jax prepare` with the run's config, or train with data.format='shards'."
        )
    tokenizer = load_tokenizer(directory / manifest["tokenizer"]["file"])
    shards = [
        np.memmap(directory / shard["file"], dtype=manifest["dtype"], mode="r")
        for shard in manifest["shards"]
    ]
    n_train = manifest["split"]["train_tokens"]
    return (
        manifest,
        tokenizer,
        TokenStream(shards, 0, n_train),
        TokenStream(shards, n_train, manifest["tokens"]),
    )


def sharded_dataset(
    data_config: Data,
    block_size: int,
    workdir: str | os.PathLike,
    *,
    tokenizer: Tokenizer | None = None,
    progress: bool = True,
    before_writing: Callable[[], None] | None = None,
    check_data: Callable[[DataDigest], None] | None = None,
) -> Dataset:
    """The Dataset of config.data with format "shards": prepared (or brought up to date) in
    data.shards_dir, default workdir/shards, then memory-mapped.

    The run keeps a copy of the tokenizer as workdir/tokenizer.json; a resumed run's copy is
    the tokenizer the shards are (re)encoded with, so its vocabulary never changes. A given
    `tokenizer` (a pretrained model's) encodes a new run's shards instead of a trained one.
    The settings, the inputs and the run's tokenizer are checked before anything is written
    (before_writing, e.g. taking the run lock, is called then), and so is check_data(digest),
    a resumed run's comparison of the stream with its checkpoint's: when the shards are stale
    (an input changed), the new stream's digest comes from an encoding pass that writes
    nothing, and shards that still hold that stream (inputs touched, not edited) are kept.
    """
    run_dir = RunDir(workdir)
    directory = Path(data_config.shards_dir or run_dir.shards)
    settings = ShardSettings.from_config(data_config)
    sources = find_sources(data_config.corpus, data_config.path, data_config.file_format)
    _check_val_holds_a_window(sources, data_config, block_size)
    saved = load_tokenizer(run_dir.tokenizer) if run_dir.tokenizer.exists() else None
    run_tokenizer = _run_tokenizer(saved, tokenizer, data_config, run_dir, workdir)
    _, check, checked = update_shards(
        directory,
        sources,
        settings,
        run_tokenizer,
        progress=progress,
        before_writing=before_writing,
        check_data=check_data,
    )
    manifest, tokenizer, train, val = load_shards(directory)
    digest = manifest_digest(manifest, check)
    if checked is not None and digest != checked:
        raise ValueError(
            f"the inputs of data.path changed while {directory} was prepared from them; "
            "leave them as they are and rerun."
        )
    split = manifest["split"]  # manifests of older versions hold no counts: nothing to warn
    distinct_ids = {
        name: split[f"{name}_distinct_ids"] for name in SPLITS if f"{name}_distinct_ids" in split
    }
    warn_if_degenerate(
        describe_sources(sources, data_config.path), distinct_ids, tokenizer.vocab_size
    )
    if saved is None:
        run_dir.root.mkdir(parents=True, exist_ok=True)
        save_tokenizer(tokenizer, run_dir.tokenizer)
    check_split_length(train, block_size, "train")
    check_split_length(val, block_size, "val")
    return Dataset(tokenizer=tokenizer, train=train, val=val, digest=digest)


def _check_val_holds_a_window(sources: list, data_config: Data, block_size: int) -> None:
    """Refuses, before anything is encoded, inputs whose 'val' split cannot hold one window of
    block_size + 1 tokens: at most one token per byte plus an end-of-text id per document (at
    most one per byte), where a file's size bounds its text (not a compressed .parquet's)."""
    most_tokens = 2 * sum(source.size for source in sources)
    most_val = most_tokens - int(most_tokens * (1.0 - data_config.val_fraction))
    if all(source.format.sized for source in sources) and most_val < block_size + 1:
        raise ValueError(
            f"the inputs of data.path hold {most_tokens // 2} bytes, so the 'val' split would "
            f"have at most {most_val} tokens, but one training window needs block_size + 1 = "
            f"{block_size + 1}; use a smaller block_size, a larger val_fraction or more text."
        )


def _run_tokenizer(
    saved: Tokenizer | None,
    given: Tokenizer | None,
    data_config: Data,
    run_dir: RunDir,
    workdir: str | os.PathLike,
) -> Tokenizer | None:
    """The tokenizer the shards are encoded with: the run's saved copy (checked against the
    config's kind and size unless a pretrained one is `given`), else the given one, else None
    (a new run trains its own); refuses one without an end-of-text id."""
    if saved is not None and given is None:
        check_saved_tokenizer(
            saved, run_dir.tokenizer, data_config.tokenizer, data_config.vocab_size
        )
    run_tokenizer = saved or given  # a pretrained model's for a new run
    if run_tokenizer is not None and run_tokenizer.eot_id is None:
        raise ValueError(
            f"the tokenizer of {workdir} has no end-of-text id (it was made for an in-memory "
            f"corpus), but this run reads shards (data.format='shards'); use a fresh workdir, "
            f"or data.format='memory' as the run that created it."
        )
    return run_tokenizer
