"""Corpora of any size: stream text into memory-mapped token shards with a JSON manifest.

`prepare_shards` reads a corpus (a file, a directory or a glob of .txt / .jsonl files) in
bounded pieces, encodes them in multi-threaded batches and appends the tokens, an end-of-text id
after every document, to fixed-size shards of raw little-endian uint16 (uint32 when the
vocabulary does not fit). A .txt file is one document; a .jsonl line is one document (its
`text_field`). The stream's first int(n * (1 - val_fraction)) tokens are the train split, the
rest the validation split, as for in-memory corpora (data.split_tokens).

Layout of a shards directory:
  tokenizer.json          the tokenizer, with an end-of-text id
  tokens_000000.bin ...   the token stream, shard_tokens tokens per shard (the last fewer)
  manifest.json           written last: inputs and tokenizer fingerprints, counts, split
  progress.json           only while preparing: where to resume after an interruption

Shards are written as `.part` files and renamed when full; progress is recorded after every
batch, so a killed prepare resumes where it stopped and writes the same shards as an
uninterrupted one. `load_shards` maps them read-only (`TokenStream`); nothing is read into RAM.
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import io
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from minigpt_jax import data
from minigpt_jax.data import Dataset, _check_reused_tokenizer, check_split_length
from minigpt_jax.tokenizers import (
    TOKENIZER_KINDS,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    _codepoints,
    load_tokenizer,
)

FORMAT = "minigpt_jax.shards/1"
MANIFEST_FILENAME = "manifest.json"
PROGRESS_FILENAME = "progress.json"
TOKENIZER_FILENAME = "tokenizer.json"
SHARDS_DIRNAME = "shards"  # under the workdir, unless data.shards_dir names a folder
INPUT_SUFFIXES = (".txt", ".jsonl")
_MAX_UINT16_VOCAB = 1 << 16
_READ_BYTES = 1 << 20  # one read of a .txt file
_BATCH_CHARS = 1 << 21  # text encoded per tokenizer call: bounds RAM, feeds every core
_MAX_CARRY_CHARS = 1 << 24  # a .txt stretch with no safe BPE cut is cut here anyway


# ----------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Source:
    """One input file (or the embedded pydoc text, `data` set and `path` a label)."""

    path: str
    size: int
    mtime_ns: int
    data: bytes | None = None

    @property
    def is_jsonl(self) -> bool:
        return self.path.endswith(".jsonl")

    def open(self):
        return io.BytesIO(self.data) if self.data is not None else open(self.path, "rb")


def find_sources(corpus: str, path: str | os.PathLike | None) -> list[Source]:
    """The input files of a corpus, in a fixed order.

    corpus "text": `path` is a .txt/.jsonl file, a directory (every .txt/.jsonl below it,
    sorted by relative path) or a glob pattern (sorted); "shakespeare" and "pydoc" as in
    data.load_text.
    """
    if corpus == "pydoc":
        text = data.load_text("pydoc")
        return [Source("pydoc_data.topics", len(text.encode()), 0, text.encode())]
    if corpus == "shakespeare":
        return [_source(data._find_or_download_shakespeare(path))]
    if corpus != "text":
        raise ValueError(f"unknown corpus {corpus!r}; choose one of {list(data.CORPORA)}.")
    if path is None:
        raise ValueError(
            "corpus 'text' needs a path: a .txt/.jsonl file, a directory or a glob of them."
        )
    path_str = os.fspath(path)
    if Path(path_str).is_file():
        files = [Path(path_str)]
    elif Path(path_str).is_dir():
        files = sorted(p for p in Path(path_str).rglob("*") if p.suffix in INPUT_SUFFIXES)
    else:
        files = sorted(Path(p) for p in glob.glob(path_str, recursive=True))
        if not files and not glob.has_magic(path_str):
            raise FileNotFoundError(
                f"corpus 'text': {path_str} does not exist; pass a .txt/.jsonl file, a "
                f"directory or a glob such as 'data/*.jsonl'."
            )
    files = [f for f in files if f.is_file()]
    bad = [f for f in files if f.suffix not in INPUT_SUFFIXES]
    if bad:
        raise ValueError(
            f"{bad[0]} is neither .txt nor .jsonl; rename it or narrow the path or glob."
        )
    if not files:
        raise ValueError(
            f"{path_str} names no .txt or .jsonl files; point data.path at your corpus."
        )
    return [_source(f) for f in files]


def _source(path: Path) -> Source:
    stat = path.stat()
    return Source(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def inputs_fingerprint(sources: list[Source]) -> str:
    """sha256 of every input's path, size and mtime (of the text itself for embedded data)."""
    digest = hashlib.sha256()
    for source in sources:
        stamp = hashlib.sha256(source.data).hexdigest() if source.data is not None else ""
        digest.update(f"{source.path}\0{source.size}\0{source.mtime_ns}\0{stamp}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Piece:
    """A stretch of one document; the cursor (source index, byte offset) just after it."""

    text: str
    ends_document: bool
    cursor: tuple[int, int]


def read_pieces(
    sources: list[Source],
    text_field: str,
    cursor: tuple[int, int] = (0, 0),
    safe_cut=len,
) -> Iterator[Piece]:
    """Streams the documents of `sources` from `cursor` in pieces of at most ~1 MB (a .jsonl
    line is one piece). safe_cut(text) is where a .txt stretch may be cut without changing its
    tokens (Tokenizer.safe_cut); the rest is carried into the next piece."""
    first_source, offset = cursor
    for index in range(first_source, len(sources)):
        source = sources[index]
        start = offset if index == first_source else 0
        reader = _jsonl_pieces if source.is_jsonl else _txt_pieces
        with source.open() as file:
            file.seek(start)
            yield from reader(file, source, index, start, text_field, safe_cut)


def _txt_pieces(file, source, index, offset, text_field, safe_cut) -> Iterator[Piece]:
    del text_field
    decoder = codecs.getincrementaldecoder("utf-8")()
    carry = ""
    while True:
        block = file.read(_READ_BYTES)
        try:
            text = carry + decoder.decode(block, final=not block)
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{source.path} is not valid UTF-8 (near byte {offset + error.start}); convert "
                f"it, e.g. `iconv -f LATIN1 -t UTF-8 in.txt > out.txt`."
            ) from None
        offset += len(block)
        if not block:
            yield Piece(text, True, (index + 1, 0))
            return
        cut = safe_cut(text)
        if cut == 0 and len(text) > _MAX_CARRY_CHARS:
            cut = len(text)  # no safe cut in 16 M characters: bound memory, cut anyway
        if cut:
            carry = text[cut:]
            pending = len(decoder.getstate()[0])
            yield Piece(text[:cut], False, (index, offset - pending - len(carry.encode())))
        else:
            carry = text


def _jsonl_pieces(file, source, index, offset, text_field, safe_cut) -> Iterator[Piece]:
    del safe_cut
    for line in iter(file.readline, b""):
        line_start, offset = offset, offset + len(line)
        if not line.strip():
            continue
        try:
            text = json.loads(line)[text_field]
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(
                f"{source.path}, the line at byte {line_start}: not a JSON object with a "
                f"{text_field!r} field ({type(error).__name__}: {error}); fix the line or set "
                f"data.text_field to the field that holds the text."
            ) from None
        if not isinstance(text, str):
            raise ValueError(
                f"{source.path}, the line at byte {line_start}: field {text_field!r} is "
                f"{type(text).__name__}, not a string; set data.text_field to the text field."
            )
        at_end = offset >= source.size
        yield Piece(text, True, (index + 1, 0) if at_end else (index, offset))
    # A file whose last lines are blank ends here, after its last document.


def sample_texts(sources: list[Source], text_field: str, sample_bytes: int) -> Iterator[str]:
    """About sample_bytes of text spread over the inputs: the head of each file in proportion
    to its size (for training a BPE tokenizer on a corpus too large to read twice)."""
    total = sum(source.size for source in sources) or 1
    for index, source in enumerate(sources):
        budget = max(1, round(sample_bytes * source.size / total))
        for piece in read_pieces(sources[: index + 1], text_field, (index, 0)):
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
        if settings.tokenizer not in TOKENIZER_KINDS:
            raise ValueError(
                f"config.data.tokenizer={settings.tokenizer!r} is unknown; choose one of "
                f"{list(TOKENIZER_KINDS)}."
            )
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
        return dict(self.__dict__)


def shard_name(index: int) -> str:
    return f"tokens_{index:06d}.bin"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2" if vocab_size <= _MAX_UINT16_VOCAB else "<u4")


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
    if settings.tokenizer == "bpe":
        sample = sample_texts(sources, settings.text_field, settings.tokenizer_sample_bytes)
        return BPETokenizer.train(sample, settings.vocab_size, eot=True)
    seen = np.zeros(0x110000, bool)
    bar = tqdm(
        total=sum(s.size for s in sources),
        unit="B",
        unit_scale=True,
        desc="alphabet",
        disable=not progress,
    )
    with bar:
        for piece in read_pieces(sources, settings.text_field):
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
    sources = find_sources(data_config.corpus, data_config.path)
    if tokenizer is not None and tokenizer.eot_id is None:
        raise ValueError(
            "sharded corpora put an end-of-text id between documents, but this tokenizer has "
            "none (it was made for an in-memory corpus); use a fresh workdir."
        )
    fingerprint = inputs_fingerprint(sources)
    wanted = {"format": FORMAT, "inputs_fingerprint": fingerprint, "settings": settings.as_dict()}
    manifest = _read_json(directory / MANIFEST_FILENAME)
    if manifest is not None and _matches(manifest, wanted, tokenizer, directory):
        return manifest

    directory.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST_FILENAME).unlink(missing_ok=True)  # never a manifest over new shards
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


def _matches(manifest: dict, wanted: dict, tokenizer: Tokenizer | None, directory: Path) -> bool:
    """Whether a manifest describes these inputs and settings and its shards are all there."""
    if any(manifest.get(k) != v for k, v in wanted.items()):
        return False
    if tokenizer is not None and manifest["tokenizer"]["sha256"] != tokenizer_fingerprint(
        tokenizer
    ):
        return False
    itemsize = np.dtype(manifest["dtype"]).itemsize
    return all(
        (directory / shard["file"]).is_file()
        and (directory / shard["file"]).stat().st_size == shard["tokens"] * itemsize
        for shard in manifest["shards"]
    )


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
    cursor, documents = tuple(saved["cursor"]), saved["documents"]
    total_bytes = sum(s.size for s in sources)
    done_bytes = sum(s.size for s in sources[: cursor[0]]) + cursor[1]
    eot = np.asarray([tokenizer.eot_id], np.int32)
    start = time.perf_counter()
    bar = tqdm(
        total=total_bytes,
        initial=done_bytes,
        unit="B",
        unit_scale=True,
        desc="prepare",
        disable=not progress,
    )
    batch: list[Piece] = []
    batch_chars = 0

    def flush_batch() -> None:
        nonlocal cursor, documents, batch, batch_chars, done_bytes
        encoded = tokenizer.encode_batch([piece.text for piece in batch])
        parts = []
        for piece, ids in zip(batch, encoded, strict=True):
            parts.append(ids)
            if piece.ends_document:
                parts.append(eot)
                documents += 1
        writer.write(np.concatenate(parts))
        writer.flush()
        cursor = batch[-1].cursor
        new_done = sum(s.size for s in sources[: cursor[0]]) + cursor[1]
        bar.update(new_done - done_bytes)
        done_bytes = new_done
        bar.set_postfix(tokens=f"{writer.written:,}", refresh=False)
        # Recorded after the tokens are in the file: a rerun resumes from here.
        _write_json(
            directory / PROGRESS_FILENAME,
            {**saved, "cursor": list(cursor), "tokens": writer.written, "documents": documents},
        )
        batch, batch_chars = [], 0

    try:
        with bar:
            for piece in read_pieces(sources, settings.text_field, cursor, tokenizer.safe_cut):
                batch.append(piece)
                batch_chars += len(piece.text)
                if batch_chars >= _BATCH_CHARS:
                    flush_batch()
            if batch:
                flush_batch()
        shard_counts = writer.finish()
    finally:
        writer.close()

    n_tokens = writer.written
    n_train = int(n_tokens * (1.0 - settings.val_fraction))
    manifest = {
        "format": FORMAT,
        "inputs_fingerprint": saved["inputs_fingerprint"],
        "settings": settings.as_dict(),
        "inputs": {
            "files": len(sources),
            "bytes": total_bytes,
            "first": sources[0].path,
            "last": sources[-1].path,
        },
        "tokenizer": {
            "file": TOKENIZER_FILENAME,
            "kind": tokenizer.kind,
            "vocab_size": tokenizer.vocab_size,
            "eot_id": tokenizer.eot_id,
            "sha256": saved["tokenizer_sha256"],
        },
        "dtype": dtype.str,
        "tokens": n_tokens,
        "documents": documents,
        "shards": [{"file": shard_name(i), "tokens": n} for i, n in enumerate(shard_counts)],
        "split": {
            "val_fraction": settings.val_fraction,
            "train_tokens": n_train,
            "val_tokens": n_tokens - n_train,
        },
        "prepare_seconds": round(time.perf_counter() - start, 3),
    }
    _write_json(directory / MANIFEST_FILENAME, manifest)
    (directory / PROGRESS_FILENAME).unlink(missing_ok=True)
    return manifest


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
) -> Dataset:
    """The Dataset of config.data with format "shards": prepared (or brought up to date) in
    data.shards_dir, default workdir/shards, then memory-mapped.

    The run keeps a copy of the tokenizer as workdir/tokenizer.json; a resumed run's copy is
    the tokenizer the shards are (re)encoded with, so its vocabulary never changes. A given
    `tokenizer` (a pretrained model's) encodes a new run's shards instead of a trained one.
    """
    workdir = Path(workdir)
    directory = Path(data_config.shards_dir or workdir / SHARDS_DIRNAME)
    run_tokenizer_path = workdir / TOKENIZER_FILENAME
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
    prepare_shards(directory, data_config, tokenizer=run_tokenizer, progress=progress)
    _, tokenizer, train, val = load_shards(directory)
    if saved is None:
        workdir.mkdir(parents=True, exist_ok=True)
        _save_tokenizer(tokenizer, run_tokenizer_path)
    check_split_length(train, block_size, "train")
    check_split_length(val, block_size, "val")
    return Dataset(tokenizer=tokenizer, train=train, val=val)
