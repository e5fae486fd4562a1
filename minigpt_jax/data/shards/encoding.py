"""The encoding pass of preparing shards: pieces of the inputs encoded in multi-threaded batches
(`EncodingPass`), an end-of-text id after every document, appended to shard files
(`ShardWriter`: `.part` files renamed when full) or only hashed (`ShardHasher`: the shards a pass
would write, for a pass that writes nothing). The progress is recorded after every batch, so an
interrupted prepare resumes where it stopped and writes the same shards as an uninterrupted one."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from minigpt_jax.data.corpus import Piece, Source
from minigpt_jax.data.shards.layout import shard_name, write_json
from minigpt_jax.data.tokenizers import Tokenizer, encode_data

BATCH_CHARS = 1 << 21  # text encoded per tokenizer call: bounds RAM, feeds every core


class ShardWriter:
    """Appends tokens to `.part` files, renaming each to its final name when it is full."""

    def __init__(self, directory: Path, dtype: np.dtype, shard_tokens: int, written: int):
        self.directory, self.dtype, self.shard_tokens = directory, dtype, shard_tokens
        self.written = written
        self._file = None

    def _part_path(self, index: int) -> Path:
        return self.directory / (shard_name(index) + ".part")

    def reopen(self) -> bool:
        """Brings the directory back to exactly `written` tokens after an interruption; False
        if the shards written before it are not all there."""
        index, in_part = divmod(self.written, self.shard_tokens)
        final, part = self.directory / shard_name(index), self._part_path(index)
        if in_part and not part.exists() and final.exists():
            os.replace(final, part)  # filled and renamed after the last progress record
        for path in self.directory.glob("tokens_*.bin*"):
            number = int(path.name[len("tokens_") :].split(".")[0])
            if number > index or (number == index and not (in_part and path == part)):
                path.unlink()  # written after the last progress record
        shard_bytes = self.shard_tokens * self.dtype.itemsize
        for number in range(index):
            path = self.directory / shard_name(number)
            if not path.is_file() or path.stat().st_size != shard_bytes:
                return False
        if in_part:
            if not part.is_file() or part.stat().st_size < in_part * self.dtype.itemsize:
                return False
            with part.open("r+b") as file:
                file.truncate(in_part * self.dtype.itemsize)
        return True

    def write(self, tokens: np.ndarray) -> None:
        tokens = tokens.astype(self.dtype, copy=False)
        while tokens.size:
            index, in_part = divmod(self.written, self.shard_tokens)
            if self._file is None:
                self._file = self._part_path(index).open("ab")
            take = tokens[: self.shard_tokens - in_part]
            self._file.write(take.tobytes())
            self.written += take.size
            tokens = tokens[take.size :]
            if self.written % self.shard_tokens == 0:
                self._close_shard(index)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def _close_shard(self, index: int) -> None:
        self._file.close()
        self._file = None
        os.replace(self._part_path(index), self.directory / shard_name(index))

    def finish(self) -> list[int]:
        """Closes the last shard; returns the token count of every shard."""
        if self._file is not None:
            self._close_shard(self.written // self.shard_tokens)
        full, rest = divmod(self.written, self.shard_tokens)
        return [self.shard_tokens] * full + ([rest] if rest else [])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class EncodingPass:
    """The bookkeeping of one pass over the inputs, from the last progress record to the end:
    the cursor after the last piece written, the documents ended so far, the pieces waiting to
    be encoded (and their characters), and the input bytes done (for the progress bar).
    progress_path None: a pass that records no progress (its writer a ShardHasher)."""

    def __init__(
        self,
        progress_path: Path | None,
        sources: list[Source],
        tokenizer: Tokenizer,
        writer: ShardWriter | ShardHasher,
        saved: dict,
        progress: bool,
    ):
        self._progress_path = progress_path
        self._sources, self._tokenizer, self._writer = sources, tokenizer, writer
        self._saved = saved  # the progress record this pass started from
        self._eot = np.asarray([tokenizer.eot_id], np.int32)
        self.cursor: tuple[int, int] = tuple(saved["cursor"])
        self.documents: int = saved["documents"]
        self.batch: list[Piece] = []
        self.batch_chars = 0
        self.done_bytes = self._bytes_before(self.cursor)
        self.bar = tqdm(
            total=sum(s.size for s in sources),
            initial=self.done_bytes,
            unit="B",
            unit_scale=True,
            desc="prepare",
            disable=not progress,
        )

    def _bytes_before(self, cursor: tuple[int, int]) -> int:
        index, offset = cursor
        within = index < len(self._sources) and self._sources[index].format.pieces is not None
        # A cursor into a file read by documents (.csv, .parquet, ...) counts documents.
        return sum(s.size for s in self._sources[:index]) + (offset if within else 0)

    def add(self, piece: Piece) -> None:
        self.batch.append(piece)
        self.batch_chars += len(piece.text)

    def flush(self) -> None:
        """Encodes the batch, appends its tokens (an end-of-text id after each document's last
        piece), then records the progress: a rerun resumes from there."""
        encoded = encode_data(self._tokenizer, [piece.text for piece in self.batch])
        parts = []
        for piece, ids in zip(self.batch, encoded, strict=True):
            parts.append(ids)
            if piece.ends_document:
                parts.append(self._eot)
                self.documents += 1
        self._writer.write(np.concatenate(parts))
        self._writer.flush()
        self.cursor = self.batch[-1].cursor
        done_bytes = self._bytes_before(self.cursor)
        self.bar.update(done_bytes - self.done_bytes)
        self.done_bytes = done_bytes
        self.bar.set_postfix(tokens=f"{self._writer.written:,}", refresh=False)
        if self._progress_path is not None:  # recorded after the tokens are in the file
            write_json(
                self._progress_path,
                {
                    **self._saved,
                    "cursor": list(self.cursor),
                    "tokens": self._writer.written,
                    "documents": self.documents,
                },
            )
        self.batch, self.batch_chars = [], 0

    def run(self, pieces: Iterator[Piece]) -> None:
        """Encodes and writes every piece, in batches of about BATCH_CHARS characters."""
        with self.bar:
            for piece in pieces:
                self.add(piece)
                if self.batch_chars >= BATCH_CHARS:
                    self.flush()
            if self.batch:
                self.flush()


class ShardHasher:
    """Stands in for ShardWriter in a pass that writes nothing: the token count and sha256 of
    every shard the pass would write."""

    def __init__(self, dtype: np.dtype, shard_tokens: int):
        self.dtype, self.shard_tokens = dtype, shard_tokens
        self.written = 0
        self.shards: list[tuple[int, str]] = []
        self._digest, self._in_shard = hashlib.sha256(), 0

    def write(self, tokens: np.ndarray) -> None:
        tokens = tokens.astype(self.dtype, copy=False)
        while tokens.size:
            take = tokens[: self.shard_tokens - self._in_shard]
            self._digest.update(take.tobytes())
            self._in_shard += take.size
            self.written += take.size
            tokens = tokens[take.size :]
            if self._in_shard == self.shard_tokens:
                self._end_shard()

    def flush(self) -> None:
        pass

    def _end_shard(self) -> None:
        self.shards.append((self._in_shard, self._digest.hexdigest()))
        self._digest, self._in_shard = hashlib.sha256(), 0

    def finish(self) -> list[tuple[int, str]]:
        """(tokens, sha256) of every shard."""
        if self._in_shard:
            self._end_shard()
        return self.shards
