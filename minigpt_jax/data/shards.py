"""Corpora of any size: stream text into memory-mapped token shards with a JSON manifest.

`prepare_shards` reads a corpus (the inputs data.find_sources names: a file, a directory or a
glob of .txt / .jsonl / .csv / .parquet files or of data.file_format's, the same files an
in-memory corpus reads) through corpus.read_pieces in bounded pieces, encodes them in
multi-threaded batches and appends the tokens, an end-of-text id after every document, to
fixed-size shards of raw little-endian uint16 (uint32 when the vocabulary does not fit). A .txt
file is one document; a .jsonl line, a .csv or .parquet row is one document (its
`text_field`). The stream's first int(n * (1 - val_fraction)) tokens are the train split, the
rest the validation split, as for in-memory corpora (data.split_tokens).

Layout of a shards directory:
  tokenizer.json          the tokenizer, with an end-of-text id
  tokens_000000.bin ...   the token stream, shard_tokens tokens per shard (the last fewer)
  manifest.json           written last: inputs and tokenizer fingerprints, counts, split (with
                          the distinct ids of each split), and each shard's sha256
  verified.json           each shard's stat (size, mtime, inode, ctime) when it was last read in
                          full and found to match the manifest, with its largest id
  progress.json           only while preparing: where to resume after an interruption
  prepare.lock            an OS lock held while preparing: a second prepare is refused

Shards are written as `.part` files and renamed when full; progress is recorded after every
batch, so a killed prepare resumes where it stopped and writes the same shards as an
uninterrupted one. A run that finds its shards prepared checks every shard against the manifest
(`verify_shards`: size, sha256, ids inside the vocabulary) and prepares them again, with a
warning, when one was damaged or edited. A shard is read for that only when its stat differs
from the one verified.json recorded (any write changes its ctime, a replacement its inode), so
a start on unchanged shards reads none of them. `load_shards` maps them read-only
(`TokenStream`); nothing is read into RAM. A run's Dataset carries the digest of the stream
(`stream_sha256` of the shards' digests), which its checkpoints record; a resumed run compares it
before any shard is rewritten (`sharded_dataset`'s check_data).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from minigpt_jax.data.corpus import Piece, Source, read_pieces
from minigpt_jax.data.memory import (
    FILE_FORMATS,
    SPLITS,
    TOKENIZERS,
    DataDigest,
    Dataset,
    _check_reused_tokenizer,
    check_split_length,
    describe_sources,
    find_sources,
    warn_if_degenerate,
)
from minigpt_jax.data.tokenizers import (
    MAX_UINT16_VOCAB,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    _codepoints,
    load_tokenizer,
)
from minigpt_jax.runtime.digests import sha256_file
from minigpt_jax.runtime.locks import lock_file, write_holder
from minigpt_jax.runtime.run_dir import TOKENIZER_FILENAME, RunDir

_log = logging.getLogger(__name__)

FORMAT = "minigpt_jax.data.shards/1"
MANIFEST_FILENAME = "manifest.json"
PROGRESS_FILENAME = "progress.json"
VERIFIED_FILENAME = "verified.json"
VERIFIED_FORMAT = "minigpt_jax.data.shards.verified/1"
LOCK_FILENAME = "prepare.lock"  # held by the one process preparing the directory
_BATCH_CHARS = 1 << 21  # text encoded per tokenizer call: bounds RAM, feeds every core


# ----------------------------------------------------------------------------- inputs


def inputs_fingerprint(sources: list[Source]) -> str:
    """sha256 of every input's path, size and mtime (of the text itself for embedded data),
    and of its file format's name unless it is .txt or .jsonl (as older manifests have it)."""
    digest = hashlib.sha256()
    for source in sources:
        stamp = hashlib.sha256(source.data).hexdigest() if source.data is not None else ""
        if source.format.name not in ("txt", "jsonl"):
            stamp += f"\0{source.format.name}"
        digest.update(f"{source.path}\0{source.size}\0{source.mtime_ns}\0{stamp}\n".encode())
    return digest.hexdigest()


def sample_texts(sources: list[Source], data: Any, sample_bytes: int) -> Iterator[str]:
    """About sample_bytes of text spread over the inputs: the head of each file in proportion
    to its size (for training a BPE tokenizer on a corpus too large to read twice)."""
    total = sum(source.size for source in sources) or 1
    for index, source in enumerate(sources):
        budget = max(1, round(sample_bytes * source.size / total))
        for piece in read_pieces(sources[: index + 1], data, (index, 0)):
            yield piece.text[:budget]
            budget -= len(piece.text.encode())
            if budget <= 0:
                break


# ----------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class ShardSettings:
    """What the shards depend on besides the inputs; any change means preparing again."""

    corpus: str
    tokenizer: str
    vocab_size: int
    text_field: str
    shard_tokens: int
    val_fraction: float
    tokenizer_sample_bytes: int

    @classmethod
    def from_config(cls, data_config: Any) -> ShardSettings:
        settings = cls(**{field.name: data_config[field.name] for field in fields(cls)})
        object.__setattr__(settings, "reading", data_config)  # what file formats read
        TOKENIZERS.check(settings.tokenizer)
        for name in ("shard_tokens", "tokenizer_sample_bytes"):
            value = getattr(settings, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"config.data.{name} must be a positive integer, got {value!r}.")
        if not 0.0 < settings.val_fraction < 1.0:
            raise ValueError(
                f"config.data.val_fraction must be in (0, 1), got {settings.val_fraction}."
            )
        return settings

    def as_dict(self) -> dict:
        return {field.name: getattr(self, field.name) for field in fields(self)}


def shard_name(index: int) -> str:
    return f"tokens_{index:06d}.bin"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2" if vocab_size <= MAX_UINT16_VOCAB else "<u4")


def _write_json(path: Path, value: dict) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(value, indent=1), encoding="utf-8")
    os.replace(tmp, path)  # atomic: a reader sees the old file or the new one


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class _ShardWriter:
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


def _build_tokenizer(sources: list[Source], settings: ShardSettings, progress: bool) -> Tokenizer:
    """char: the alphabet of the whole corpus (one streaming pass); bpe: trained on a sample."""
    if settings.tokenizer != "char":  # bpe, or a user entry: trained on a sample
        sample = sample_texts(sources, settings.reading, settings.tokenizer_sample_bytes)
        if settings.tokenizer == "bpe":
            return BPETokenizer.train(sample, settings.vocab_size, eot=True)
        return TOKENIZERS[settings.tokenizer](list(sample), settings.vocab_size, eot=True)
    seen = np.zeros(0x110000, bool)
    bar = tqdm(
        total=sum(s.size for s in sources),
        unit="B",
        unit_scale=True,
        desc="alphabet",
        disable=not progress,
    )
    with bar:
        for piece in read_pieces(sources, settings.reading):
            seen[_codepoints(piece.text)] = True
            bar.update(len(piece.text.encode("utf-8", errors="surrogatepass")))
    if not seen.any():
        raise ValueError("the corpus holds no text; point data.path at files with text in them.")
    return CharTokenizer("".join(map(chr, np.flatnonzero(seen))), eot=True)


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    return hashlib.sha256(tokenizer.to_json().encode("utf-8", errors="surrogatepass")).hexdigest()


def prepare_shards(
    directory: str | os.PathLike,
    data_config: Any,
    *,
    tokenizer: Tokenizer | None = None,
    progress: bool = True,
) -> dict:
    """Writes (or reuses, or finishes) the shards of config.data in `directory`; returns the
    manifest. `tokenizer` (e.g. a resumed run's) is used instead of building one; it needs an
    end-of-text id."""
    directory = Path(directory)
    settings = ShardSettings.from_config(data_config)
    sources = find_sources(data_config.corpus, data_config.path, data_config.file_format)
    if tokenizer is not None and tokenizer.eot_id is None:
        raise ValueError(
            "sharded corpora put an end-of-text id between documents, but this tokenizer has "
            "none (it was made for an in-memory corpus); use a fresh workdir."
        )
    wanted = _wanted(sources, settings, data_config)
    manifest, check = _prepared(directory, wanted, tokenizer)
    if manifest is not None:
        _write_stamp(directory, check)
        return manifest
    with _prepare_lock(directory):
        return _prepare_locked(directory, sources, settings, wanted, tokenizer, progress)


def _wanted(sources: list[Source], settings: ShardSettings, data_config: Any = None) -> dict:
    """What a manifest must record for its shards to be these inputs' under these settings
    (and, where data.file_format is set, its key and the settings the entry declares: older
    manifests have none)."""
    recorded = settings.as_dict()
    key = data_config.file_format if data_config is not None else ""
    if key:
        recorded["file_format"] = key
        declared = FILE_FORMATS.settings_of(key)
        if declared:
            recorded["file_format_settings"] = {name: data_config[name] for name in declared}
    return {
        "format": FORMAT,
        "inputs_fingerprint": inputs_fingerprint(sources),
        "settings": recorded,
    }


@contextlib.contextmanager
def _prepare_lock(directory: Path) -> Iterator[None]:
    """Holds the directory's prepare lock: a second process preparing it is refused."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_FILENAME, os.O_RDWR | os.O_CREAT, 0o644)
    lock_file(
        fd,
        lambda pid, host: (
            f"{directory} is being prepared by another process (PID {pid} on host {host}, "
            f"holding {directory / LOCK_FILENAME}); wait for it to finish, then rerun: shards "
            "are prepared once and shared."
        ),
    )
    try:
        write_holder(fd)
        yield
    finally:
        os.close(fd)  # releases the lock


def _prepared(
    directory: Path, wanted: dict, tokenizer: Tokenizer | None
) -> tuple[dict | None, ShardCheck | None]:
    """(manifest, its ShardCheck) of `directory` if its manifest describes these inputs and
    settings and every shard matches it; (None, None), with a warning for a damaged shard, if
    the shards need preparing. Reads only."""
    manifest = _read_json(directory / MANIFEST_FILENAME)
    if manifest is None or not _matches(manifest, wanted, tokenizer):
        return None, None
    check = verify_shards(directory, manifest)
    if check.problem is not None:
        _log.warning("%s; preparing the shards of %s again.", check.problem, directory)
        return None, None
    return manifest, check


def _prepare_locked(
    directory: Path,
    sources: list[Source],
    settings: ShardSettings,
    wanted: dict,
    tokenizer: Tokenizer | None,
    progress: bool,
) -> dict:
    (directory / MANIFEST_FILENAME).unlink(missing_ok=True)  # never a manifest over new shards
    (directory / VERIFIED_FILENAME).unlink(missing_ok=True)
    saved = _read_json(directory / PROGRESS_FILENAME)
    tokenizer_path = directory / TOKENIZER_FILENAME
    resume = (
        saved is not None
        and {k: saved.get(k) for k in wanted} == wanted
        and tokenizer_path.exists()
        and saved.get("tokenizer_sha256") == tokenizer_fingerprint(load_tokenizer(tokenizer_path))
        and (tokenizer is None or saved["tokenizer_sha256"] == tokenizer_fingerprint(tokenizer))
    )
    if resume:
        tokenizer = load_tokenizer(tokenizer_path)
        dtype = token_dtype(tokenizer.vocab_size)
        resume = _ShardWriter(directory, dtype, settings.shard_tokens, saved["tokens"]).reopen()
    if not resume:
        (directory / PROGRESS_FILENAME).unlink(missing_ok=True)
        for stale in directory.glob("tokens_*.bin*"):
            stale.unlink()
        if tokenizer is None:
            tokenizer = _build_tokenizer(sources, settings, progress)
        _save_tokenizer(tokenizer, tokenizer_path)
        saved = {
            **wanted,
            "tokenizer_sha256": tokenizer_fingerprint(tokenizer),
            "cursor": [0, 0],
            "tokens": 0,
            "documents": 0,
        }
        _write_json(directory / PROGRESS_FILENAME, saved)
    return _encode_all(directory, sources, settings, tokenizer, saved, progress)


def _save_tokenizer(tokenizer: Tokenizer, path: Path) -> None:
    tmp = path.with_name(path.name + ".part")
    tokenizer.save(tmp)
    os.replace(tmp, path)


def _matches(manifest: dict, wanted: dict, tokenizer: Tokenizer | None) -> bool:
    """Whether a manifest describes these inputs and settings (and `tokenizer`, if given)."""
    if any(manifest.get(k) != v for k, v in wanted.items()):
        return False
    return tokenizer is None or manifest["tokenizer"]["sha256"] == tokenizer_fingerprint(tokenizer)


def _scan_shard(
    path: Path, dtype: np.dtype, on_block: Callable[[np.ndarray, int], None] | None = None
) -> dict:
    """{"stat", "sha256", "largest_id"} of a shard file, in one read of 16 MiB blocks (the stat
    taken first, so a write during the read shows at the next check); on_block(ids, at) sees
    each block's ids and the index of its first one in the shard."""
    stat = _stat(path)
    digest, largest, at = hashlib.sha256(), -1, 0
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 24), b""):
            digest.update(block)
            ids = np.frombuffer(block, dtype)
            if ids.size:
                largest = max(largest, int(ids.max()))
                if on_block is not None:
                    on_block(ids, at)
            at += ids.size
    return {"stat": stat, "sha256": digest.hexdigest(), "largest_id": largest}


def _stat(path: Path) -> list[int]:
    """What any write (ctime, mtime, size) or replacement (inode) of a file changes."""
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns]


@dataclass(frozen=True)
class ShardCheck:
    """What verify_shards found: the problem (None: every shard matches its manifest), the
    shards it read in full, and what verified.json records of each shard checked (its stat,
    sha256 and largest id; a shard's sha256 is known even where an older manifest lacks it)."""

    problem: str | None
    read: list[str]
    entries: dict[str, dict]
    manifest_sha256: str

    @property
    def sha256s(self) -> list[str]:
        return [entry["sha256"] for entry in self.entries.values()]


def verify_shards(directory: str | os.PathLike, manifest: dict) -> ShardCheck:
    """Checks the shards a manifest lists: each is there with its size, its sha256 (manifests
    of older versions have none: not checked) and ids inside the tokenizer's vocabulary. A
    shard is read for the last two only if its stat differs from the one verified.json
    recorded when it was last read and found good. Reads only."""
    directory = Path(directory)
    dtype = np.dtype(manifest["dtype"])
    vocab_size = manifest["tokenizer"]["vocab_size"]
    manifest_sha256 = sha256_file(directory / MANIFEST_FILENAME)
    saved = _read_json(directory / VERIFIED_FILENAME) or {}
    fresh = saved.get("format") == VERIFIED_FORMAT
    vouched = saved.get("shards", {}) if fresh and saved.get("manifest") == manifest_sha256 else {}
    entries, read = {}, []
    for shard in manifest["shards"]:
        path = directory / shard["file"]
        if not path.is_file():
            return ShardCheck(f"shard {path} is missing", read, entries, manifest_sha256)
        size = path.stat().st_size
        if size != shard["tokens"] * dtype.itemsize:
            problem = (
                f"shard {path} holds {size} bytes, not the {shard['tokens'] * dtype.itemsize} "
                f"of its {shard['tokens']} tokens"
            )
            return ShardCheck(problem, read, entries, manifest_sha256)
        entry = vouched.get(shard["file"])
        if entry is None or entry.get("stat") != _stat(path):
            entry = _scan_shard(path, dtype)
            read.append(shard["file"])
        if shard.get("sha256", entry["sha256"]) != entry["sha256"]:
            problem = (
                f"shard {path} does not match its sha256 in {MANIFEST_FILENAME} (damaged or edited)"
            )
            return ShardCheck(problem, read, entries, manifest_sha256)
        if entry["largest_id"] >= vocab_size:
            problem = (
                f"shard {path} holds id {entry['largest_id']}, outside the tokenizer's "
                f"[0, {vocab_size})"
            )
            return ShardCheck(problem, read, entries, manifest_sha256)
        entries[shard["file"]] = entry
    return ShardCheck(None, read, entries, manifest_sha256)


def _write_stamp(directory: Path, check: ShardCheck, *, always: bool = False) -> None:
    """Writes verified.json from a good check when it read a shard (or `always`). Any process
    of a run may: a unique temporary name, then an atomic rename; a folder this process cannot
    write keeps the old stamp (the next start reads the shards again)."""
    if not (check.read or always):
        return
    stamp = {"format": VERIFIED_FORMAT, "manifest": check.manifest_sha256, "shards": check.entries}
    tmp = None
    try:
        with tempfile.NamedTemporaryFile(
            "w", dir=directory, prefix=f".{VERIFIED_FILENAME}.", suffix=".part", delete=False
        ) as tmp:
            json.dump(stamp, tmp, indent=1)
        os.replace(tmp.name, directory / VERIFIED_FILENAME)
    except OSError as error:
        _log.info("could not record the verified shards in %s (%s).", directory, error)
        if tmp is not None:
            Path(tmp.name).unlink(missing_ok=True)


class _EncodingPass:
    """The bookkeeping of one pass over the inputs, from the last progress record to the end:
    the cursor after the last piece written, the documents ended so far, the pieces waiting to
    be encoded (and their characters), and the input bytes done (for the progress bar).
    progress_path None: a pass that records no progress (its writer a _ShardHasher)."""

    def __init__(
        self,
        progress_path: Path | None,
        sources: list[Source],
        tokenizer: Tokenizer,
        writer: _ShardWriter | _ShardHasher,
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
        encoded = self._tokenizer.encode_batch([piece.text for piece in self.batch])
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
            _write_json(
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
        """Encodes and writes every piece, in batches of about _BATCH_CHARS characters."""
        with self.bar:
            for piece in pieces:
                self.add(piece)
                if self.batch_chars >= _BATCH_CHARS:
                    self.flush()
            if self.batch:
                self.flush()


class _ShardHasher:
    """Stands in for _ShardWriter in a pass that writes nothing: the token count and sha256 of
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


def _encode_all(
    directory: Path,
    sources: list[Source],
    settings: ShardSettings,
    tokenizer: Tokenizer,
    saved: dict,
    progress: bool,
) -> dict:
    dtype = token_dtype(tokenizer.vocab_size)
    writer = _ShardWriter(directory, dtype, settings.shard_tokens, saved["tokens"])
    progress_path = directory / PROGRESS_FILENAME
    encoding = _EncodingPass(progress_path, sources, tokenizer, writer, saved, progress)
    start = time.perf_counter()
    try:
        encoding.run(read_pieces(sources, settings.reading, encoding.cursor, tokenizer.safe_cut))
        shard_counts = writer.finish()
    finally:
        writer.close()
    manifest, verified = _manifest(
        directory, sources, settings, tokenizer, saved, dtype, shard_counts
    )
    manifest.update(
        documents=encoding.documents, prepare_seconds=round(time.perf_counter() - start, 3)
    )
    _write_json(directory / MANIFEST_FILENAME, manifest)
    (directory / PROGRESS_FILENAME).unlink(missing_ok=True)
    check = ShardCheck(None, [], verified, sha256_file(directory / MANIFEST_FILENAME))
    _write_stamp(directory, check, always=True)
    return manifest


def _manifest(
    directory: Path,
    sources: list[Source],
    settings: ShardSettings,
    tokenizer: Tokenizer,
    saved: dict,
    dtype: np.dtype,
    shard_counts: list[int],
) -> tuple[dict, dict]:
    """(manifest, verified.json entries) of the finished shards in `directory`, read once: each
    shard's sha256, and the distinct ids of each split; the caller fills in "documents" and
    "prepare_seconds" (None here, in their places)."""
    n_tokens = sum(shard_counts)
    n_train = int(n_tokens * (1.0 - settings.val_fraction))
    split_ids = _SplitIds(tokenizer.vocab_size, n_train)
    verified, first = {}, 0
    for i, n in enumerate(shard_counts):
        verified[shard_name(i)] = _scan_shard(
            directory / shard_name(i),
            dtype,
            lambda ids, at, first=first: split_ids.mark(ids, first + at),
        )
        first += n
    manifest = {
        "format": FORMAT,
        "inputs_fingerprint": saved["inputs_fingerprint"],
        "settings": settings.as_dict(),
        "inputs": _inputs_summary(sources),
        "tokenizer": {
            "file": TOKENIZER_FILENAME,
            "kind": tokenizer.kind,
            "vocab_size": tokenizer.vocab_size,
            "eot_id": tokenizer.eot_id,
            "sha256": saved["tokenizer_sha256"],
        },
        "dtype": dtype.str,
        "tokens": n_tokens,
        "documents": None,
        "shards": [
            {"file": shard_name(i), "tokens": n, "sha256": verified[shard_name(i)]["sha256"]}
            for i, n in enumerate(shard_counts)
        ],
        "split": {
            "val_fraction": settings.val_fraction,
            "train_tokens": n_train,
            "val_tokens": n_tokens - n_train,
            "train_distinct_ids": int(split_ids.train.sum()),
            "val_distinct_ids": int(split_ids.val.sum()),
        },
        "prepare_seconds": None,
    }
    return manifest, verified


def _inputs_summary(sources: list[Source]) -> dict:
    return {
        "files": len(sources),
        "bytes": sum(s.size for s in sources),
        "first": sources[0].path,
        "last": sources[-1].path,
    }


class _SplitIds:
    """Which ids the train split (the stream's first n_train tokens) and the val split hold,
    marked block by block as the stream is read."""

    def __init__(self, vocab_size: int, n_train: int):
        self.n_train = n_train
        self.train = np.zeros(vocab_size, bool)
        self.val = np.zeros(vocab_size, bool)

    def mark(self, ids: np.ndarray, first: int) -> None:
        """ids: the stream's tokens from index `first` on (an id outside the vocabulary, in a
        damaged shard that verify_shards will refuse, is not counted)."""
        if int(ids.max()) >= self.train.size:
            ids = ids[ids < self.train.size]
        cut = min(max(self.n_train - first, 0), ids.size)
        self.train[ids[:cut]] = True
        self.val[ids[cut:]] = True


# ----------------------------------------------------------------------------- the stream's digest


def stream_sha256(dtype: str, shards: list[tuple[int, str]]) -> str:
    """The sha256 of a token stream from its shards' (tokens, sha256), in order: the shards'
    bytes name the stream, so it is known without reading them."""
    digest = hashlib.sha256(f"{dtype}\n".encode())
    for tokens, sha256 in shards:
        digest.update(f"{tokens} {sha256}\n".encode())
    return digest.hexdigest()


def _data_digest(dtype: str, shards: list[tuple[int, str]]) -> DataDigest:
    return DataDigest("shards", sum(tokens for tokens, _ in shards), stream_sha256(dtype, shards))


def _manifest_digest(manifest: dict, check: ShardCheck | None) -> DataDigest:
    """The DataDigest of a manifest's shards (a manifest of an older version, without their
    sha256s, takes those its ShardCheck read)."""
    sha256s = [shard.get("sha256") for shard in manifest["shards"]]
    if None in sha256s:
        sha256s = check.sha256s
    tokens = [shard["tokens"] for shard in manifest["shards"]]
    return _data_digest(manifest["dtype"], list(zip(tokens, sha256s, strict=True)))


def _planned_shards(
    sources: list[Source], settings: ShardSettings, tokenizer: Tokenizer, progress: bool
) -> tuple[list[tuple[int, str]], int]:
    """((tokens, sha256) of every shard, documents) that preparing these inputs would write:
    one encoding pass that writes nothing."""
    hasher = _ShardHasher(token_dtype(tokenizer.vocab_size), settings.shard_tokens)
    start = {"cursor": [0, 0], "tokens": 0, "documents": 0}
    encoding = _EncodingPass(None, sources, tokenizer, hasher, start, progress)
    encoding.run(read_pieces(sources, settings.reading, (0, 0), tokenizer.safe_cut))
    return hasher.finish(), encoding.documents


def _adopt(
    directory: Path,
    sources: list[Source],
    wanted: dict,
    tokenizer: Tokenizer,
    planned: list[tuple[int, str]],
    documents: int,
) -> bool:
    """Writes a new manifest over the shards of the directory's stale one if they hold exactly
    the stream these inputs encode to (`planned`: e.g. the inputs were touched or copied, new
    mtimes over the same text), so nothing is encoded again; False if they do not."""
    old = _read_json(directory / MANIFEST_FILENAME)
    if (
        old is None
        or any(old.get(key) != wanted[key] for key in ("format", "settings"))
        or old["tokenizer"]["sha256"] != tokenizer_fingerprint(tokenizer)
        or [(shard["tokens"], shard.get("sha256")) for shard in old["shards"]] != planned
    ):
        return False
    check = verify_shards(directory, old)
    if check.problem is not None:
        return False
    manifest = {
        **old,
        "inputs_fingerprint": wanted["inputs_fingerprint"],
        "inputs": _inputs_summary(sources),
        "documents": documents,
    }
    with _prepare_lock(directory):
        _write_json(directory / MANIFEST_FILENAME, manifest)
    manifest_sha256 = sha256_file(directory / MANIFEST_FILENAME)
    _write_stamp(directory, ShardCheck(None, [], check.entries, manifest_sha256), always=True)
    return True


# ----------------------------------------------------------------------------- reading


class TokenStream:
    """Tokens [start, stop) of a stream stored in consecutive memory-mapped shards.

    Behaves like the 1-D token array of an in-memory corpus where data.get_batch needs it:
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
    manifest = _read_json(directory / MANIFEST_FILENAME)
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
    data_config: Any,
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
    # At most one token per byte plus an end-of-text id per document (at most one per byte),
    # where a file's size bounds its text (not a compressed .parquet file's).
    most_tokens = 2 * sum(source.size for source in sources)
    most_val = most_tokens - int(most_tokens * (1.0 - data_config.val_fraction))
    if all(source.format.sized for source in sources) and most_val < block_size + 1:
        raise ValueError(
            f"the inputs of data.path hold {most_tokens // 2} bytes, so the 'val' split would "
            f"have at most {most_val} tokens, but one training window needs block_size + 1 = "
            f"{block_size + 1}; use a smaller block_size, a larger val_fraction or more text."
        )
    run_tokenizer_path = run_dir.tokenizer
    saved = load_tokenizer(run_tokenizer_path) if run_tokenizer_path.exists() else None
    if saved is not None and tokenizer is None:
        _check_reused_tokenizer(
            saved, run_tokenizer_path, data_config.tokenizer, data_config.vocab_size
        )
    run_tokenizer = saved or tokenizer  # a pretrained model's for a new run
    if run_tokenizer is not None and run_tokenizer.eot_id is None:
        raise ValueError(
            f"the tokenizer of {workdir} has no end-of-text id (it was made for an in-memory "
            f"corpus), but this run reads shards (data.format='shards'); use a fresh workdir, "
            f"or data.format='memory' as the run that created it."
        )
    wanted = _wanted(sources, settings, data_config)
    manifest, check = _prepared(directory, wanted, run_tokenizer)
    checked = planned = None
    if check_data is not None:
        if manifest is not None:
            checked = _manifest_digest(manifest, check)
        else:
            if run_tokenizer is None:  # a resumed run whose tokenizer.json is gone
                run_tokenizer = _build_tokenizer(sources, settings, progress)
            planned, documents = _planned_shards(sources, settings, run_tokenizer, progress)
            checked = _data_digest(token_dtype(run_tokenizer.vocab_size).str, planned)
        check_data(checked)
    if before_writing is not None:
        before_writing()
    if manifest is not None:
        _write_stamp(directory, check)
    elif planned is None or not _adopt(
        directory, sources, wanted, run_tokenizer, planned, documents
    ):
        with _prepare_lock(directory):
            _prepare_locked(directory, sources, settings, wanted, run_tokenizer, progress)
        check = None
    manifest, tokenizer, train, val = load_shards(directory)
    digest = _manifest_digest(manifest, check)
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
        _save_tokenizer(tokenizer, run_tokenizer_path)
    check_split_length(train, block_size, "train")
    check_split_length(val, block_size, "val")
    return Dataset(tokenizer=tokenizer, train=train, val=val, digest=digest)
