"""Preparing shards: a corpus (the inputs data.find_sources names: a file, a directory or a
glob of .txt / .jsonl / .csv / .parquet files or of data.file_format's, the same files an
in-memory corpus reads) streamed through corpus.read_pieces in bounded pieces, encoded in
multi-threaded batches (`encoding`) and appended, an end-of-text id after every document, to
fixed-size shards (`layout`). A .txt file is one document; a .jsonl line, a .csv or .parquet row
is one document (its `text_field`). The stream's first int(n * (1 - val_fraction)) tokens are the
train split, the rest the validation split, as for in-memory corpora (dataset.split_tokens).

Shards are written as `.part` files and renamed when full; progress is recorded after every
batch, so a killed prepare resumes where it stopped and writes the same shards as an
uninterrupted one. The manifest is written last; one process prepares a directory at a time
(its prepare lock). Shards found prepared are checked (`verify.verify_shards`) and prepared
again, with a warning, when one was damaged or edited; shards whose manifest is stale only
because the inputs were touched (new mtimes over the same text) are kept (`update_shards`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from minigpt_jax.data.corpus import FILE_FORMATS, Source, read_pieces
from minigpt_jax.data.dataset import DataDigest
from minigpt_jax.data.shards.digest import manifest_digest, stream_digest
from minigpt_jax.data.shards.encoding import EncodingPass, ShardHasher, ShardWriter
from minigpt_jax.data.shards.layout import (
    FORMAT,
    LOCK_FILENAME,
    MANIFEST_FILENAME,
    PROGRESS_FILENAME,
    VERIFIED_FILENAME,
    read_json,
    shard_name,
    token_dtype,
    write_json,
)
from minigpt_jax.data.shards.verify import ShardCheck, scan_shard, verify_shards, write_stamp
from minigpt_jax.data.sources import find_sources
from minigpt_jax.data.tokenizers import (
    TOKENIZERS,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    build_tokenizer,
    check_end_of_text,
    codepoints,
    load_tokenizer,
)
from minigpt_jax.runtime.digests import sha256_file
from minigpt_jax.runtime.locks import lock_file, write_holder
from minigpt_jax.runtime.run_dir import TOKENIZER_FILENAME

if TYPE_CHECKING:  # the group's type only
    from minigpt_jax.settings.groups import Data

_log = logging.getLogger(__name__)
# The most shard files one corpus may take (data.shard_tokens is refused below it).
MAX_SHARD_FILES = 10_000


def inputs_fingerprint(sources: list[Source]) -> str:
    """sha256 of every input's path, size, mtime, inode and change time (of the text itself
    for embedded data), and of its file format's name unless it is .txt or .jsonl. The change
    time moves with any write, even one that keeps the size and puts the mtime back: shards
    whose inputs' fingerprint changed are checked by content (the stream the inputs encode to;
    update_shards) before they are used again."""
    digest = hashlib.sha256()
    for source in sources:
        stamp = hashlib.sha256(source.data).hexdigest() if source.data is not None else ""
        if source.data is None:
            stat = os.stat(source.path)
            stamp += f"\0{stat.st_ino}\0{stat.st_ctime_ns}"
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


@dataclass(frozen=True)
class ShardSettings:
    """What the shards depend on besides the inputs; any change means preparing again. One
    built by from_config also carries `reading`: the config.data file formats read (its
    text_field and the settings a picked entry declares)."""

    corpus: str
    tokenizer: str
    vocab_size: int
    text_field: str
    shard_tokens: int
    val_fraction: float
    tokenizer_sample_bytes: int

    @classmethod
    def from_config(cls, data_config: Data) -> ShardSettings:
        settings = cls(**{field.name: getattr(data_config, field.name) for field in fields(cls)})
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


def _build_tokenizer(sources: list[Source], settings: ShardSettings, progress: bool) -> Tokenizer:
    """char: the alphabet of the whole corpus (one streaming pass); bpe: trained on a sample."""
    if settings.tokenizer != "char":  # bpe, or a user entry: trained on a sample
        sample = sample_texts(sources, settings.reading, settings.tokenizer_sample_bytes)
        if settings.tokenizer == "bpe":
            return BPETokenizer.train(sample, settings.vocab_size, eot=True)
        made = build_tokenizer(
            settings.tokenizer, list(sample), settings.vocab_size, True, settings.reading
        )
        needs = "sharded corpora (data.format='shards') put it after every document"
        return check_end_of_text(made, settings.tokenizer, needs)
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
            seen[codepoints(piece.text)] = True
            bar.update(len(piece.text.encode("utf-8", errors="surrogatepass")))
    if not seen.any():
        raise ValueError("the corpus holds no text; point data.path at files with text in them.")
    return CharTokenizer("".join(map(chr, np.flatnonzero(seen))), eot=True)


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    return hashlib.sha256(tokenizer.to_json().encode("utf-8", errors="surrogatepass")).hexdigest()


def prepare_shards(
    directory: str | os.PathLike,
    data_config: Data,
    *,
    tokenizer: Tokenizer | None = None,
    progress: bool = True,
) -> dict:
    """Writes (or reuses, or finishes) the shards of config.data in `directory`; returns the
    manifest. `tokenizer` (e.g. a resumed run's) is used instead of building one; it needs an
    end-of-text id."""
    settings = ShardSettings.from_config(data_config)
    sources = find_sources(data_config.corpus, data_config.path, data_config.file_format)
    if tokenizer is not None and tokenizer.eot_id is None:
        raise ValueError(
            "sharded corpora put an end-of-text id between documents, but this tokenizer has "
            "none (it was made for an in-memory corpus); use a fresh workdir."
        )
    manifest, _, _ = update_shards(Path(directory), sources, settings, tokenizer, progress=progress)
    return manifest


def update_shards(
    directory: Path,
    sources: list[Source],
    settings: ShardSettings,
    tokenizer: Tokenizer | None,
    *,
    progress: bool,
    before_writing: Callable[[], None] | None = None,
    check_data: Callable[[DataDigest], None] | None = None,
) -> tuple[dict, ShardCheck | None, DataDigest | None]:
    """Brings the shards of `sources` under `settings` in `directory` up to date: reused when
    prepared and good, kept under a new manifest when they still hold the stream the inputs
    encode to (inputs touched, not edited: known only with check_data), else prepared (or an
    interrupted prepare finished) with `tokenizer` (None: one built from the inputs).

    check_data(digest) sees the digest of the stream the shards will hold before anything is
    written (for stale shards, from an encoding pass that writes nothing), then before_writing()
    is called. Returns (manifest, the ShardCheck of shards found prepared or None, the digest
    check_data saw or None).
    """
    check_shard_files(sources, settings)
    wanted = _wanted(sources, settings)
    manifest, check = _prepared(directory, wanted, tokenizer)
    checked = planned = None
    if check_data is not None:
        if manifest is not None:
            checked = manifest_digest(manifest, check)
        else:
            if tokenizer is None:  # a resumed run whose tokenizer.json is gone
                tokenizer = _build_tokenizer(sources, settings, progress)
            planned, documents = _planned_shards(sources, settings, tokenizer, progress)
            checked = stream_digest(token_dtype(tokenizer.vocab_size).str, planned)
        check_data(checked)
    if before_writing is not None:
        before_writing()
    if manifest is not None:
        write_stamp(directory, check)
        return manifest, check, checked
    if planned is not None:
        manifest = _adopt(directory, sources, wanted, tokenizer, planned, documents)
    if manifest is None:
        with _prepare_lock(directory):
            manifest = _prepare_locked(directory, sources, settings, wanted, tokenizer, progress)
    return manifest, None, checked


def check_shard_files(sources: list[Source], settings: ShardSettings) -> None:
    """Refuses data.shard_tokens so small that the shards of these inputs could pass
    MAX_SHARD_FILES files (a token per byte at most: the byte-level and char tokenizers), before
    anything is written: each file costs an inode, a descriptor while read and a digest."""
    total = sum(source.size for source in sources)
    files = -(-total // settings.shard_tokens)
    if files > MAX_SHARD_FILES:
        enough = -(-total // MAX_SHARD_FILES)
        raise ValueError(
            f"config.data.shard_tokens={settings.shard_tokens:,} would write up to {files:,} "
            f"shard files for the {total:,} bytes of input; the bound is {MAX_SHARD_FILES:,} "
            f"files: raise data.shard_tokens to at least {enough:,} (the default is 2**27)."
        )


def _wanted(sources: list[Source], settings: ShardSettings) -> dict:
    """What a manifest must record for its shards to be these inputs' under these settings
    (and, where data.file_format is set, its key and the settings the entry declares: older
    manifests have none)."""
    recorded = settings.as_dict()
    data_config = settings.reading
    key = data_config.file_format
    if key:
        recorded["file_format"] = key
        declared = FILE_FORMATS.settings_of(key)
        if declared:
            recorded["file_format_settings"] = {
                name: getattr(data_config, name) for name in declared
            }
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
    manifest = read_json(directory / MANIFEST_FILENAME)
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
    saved = read_json(directory / PROGRESS_FILENAME)
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
        resume = ShardWriter(directory, dtype, settings.shard_tokens, saved["tokens"]).reopen()
    if not resume:
        (directory / PROGRESS_FILENAME).unlink(missing_ok=True)
        for stale in directory.glob("tokens_*.bin*"):
            stale.unlink()
        if tokenizer is None:
            tokenizer = _build_tokenizer(sources, settings, progress)
        save_tokenizer(tokenizer, tokenizer_path)
        saved = {
            **wanted,
            "tokenizer_sha256": tokenizer_fingerprint(tokenizer),
            "cursor": [0, 0],
            "tokens": 0,
            "documents": 0,
        }
        write_json(directory / PROGRESS_FILENAME, saved)
    return _encode_all(directory, sources, settings, tokenizer, saved, progress)


def save_tokenizer(tokenizer: Tokenizer, path: Path) -> None:
    """Writes `tokenizer` to `path` atomically: a reader sees the old file or the new one."""
    tmp = path.with_name(path.name + ".part")
    tokenizer.save(tmp)
    os.replace(tmp, path)


def _matches(manifest: dict, wanted: dict, tokenizer: Tokenizer | None) -> bool:
    """Whether a manifest describes these inputs and settings (and `tokenizer`, if given)."""
    if any(manifest.get(k) != v for k, v in wanted.items()):
        return False
    return tokenizer is None or manifest["tokenizer"]["sha256"] == tokenizer_fingerprint(tokenizer)


def _encode_all(
    directory: Path,
    sources: list[Source],
    settings: ShardSettings,
    tokenizer: Tokenizer,
    saved: dict,
    progress: bool,
) -> dict:
    dtype = token_dtype(tokenizer.vocab_size)
    writer = ShardWriter(directory, dtype, settings.shard_tokens, saved["tokens"])
    progress_path = directory / PROGRESS_FILENAME
    encoding = EncodingPass(progress_path, sources, tokenizer, writer, saved, progress)
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
    write_json(directory / MANIFEST_FILENAME, manifest)
    (directory / PROGRESS_FILENAME).unlink(missing_ok=True)
    check = ShardCheck(None, [], verified, sha256_file(directory / MANIFEST_FILENAME))
    write_stamp(directory, check, always=True)
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
        verified[shard_name(i)] = scan_shard(
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


def _planned_shards(
    sources: list[Source], settings: ShardSettings, tokenizer: Tokenizer, progress: bool
) -> tuple[list[tuple[int, str]], int]:
    """((tokens, sha256) of every shard, documents) that preparing these inputs would write:
    one encoding pass that writes nothing."""
    hasher = ShardHasher(token_dtype(tokenizer.vocab_size), settings.shard_tokens)
    start = {"cursor": [0, 0], "tokens": 0, "documents": 0}
    encoding = EncodingPass(None, sources, tokenizer, hasher, start, progress)
    encoding.run(read_pieces(sources, settings.reading, (0, 0), tokenizer.safe_cut))
    return hasher.finish(), encoding.documents


def _adopt(
    directory: Path,
    sources: list[Source],
    wanted: dict,
    tokenizer: Tokenizer,
    planned: list[tuple[int, str]],
    documents: int,
) -> dict | None:
    """Writes a new manifest over the shards of the directory's stale one if they hold exactly
    the stream these inputs encode to (`planned`: e.g. the inputs were touched or copied, new
    mtimes over the same text), so nothing is encoded again; returns it, None if they do not."""
    old = read_json(directory / MANIFEST_FILENAME)
    if (
        old is None
        or any(old.get(key) != wanted[key] for key in ("format", "settings"))
        or old["tokenizer"]["sha256"] != tokenizer_fingerprint(tokenizer)
        or [(shard["tokens"], shard.get("sha256")) for shard in old["shards"]] != planned
    ):
        return None
    check = verify_shards(directory, old)
    if check.problem is not None:
        return None
    manifest = {
        **old,
        "inputs_fingerprint": wanted["inputs_fingerprint"],
        "inputs": _inputs_summary(sources),
        "documents": documents,
    }
    with _prepare_lock(directory):
        write_json(directory / MANIFEST_FILENAME, manifest)
    manifest_sha256 = sha256_file(directory / MANIFEST_FILENAME)
    write_stamp(directory, ShardCheck(None, [], check.entries, manifest_sha256), always=True)
    return manifest
