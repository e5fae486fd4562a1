"""The one reader of corpus files, for in-memory corpora (data) and sharded ones (shards) alike.

`text_files(path)` resolves data.path of corpus "text" to its input files:
  - a file: that file (a .jsonl one is read as JSON lines, any other as UTF-8 text);
  - a directory: every .txt and .jsonl file below it, nested folders too, sorted by path;
  - anything else is a glob pattern (`**` included), sorted. A path that exists is never read as
    a pattern, so a folder named `runs[1]` is that folder.
A .txt file is one document; each non-blank line of a .jsonl file is one document, the string in
its `text_field`. `read_pieces` streams documents in bounded pieces (for shards),
`read_documents` yields them whole (for in-memory corpora). A leaf module: it imports nothing of
the package.
"""

from __future__ import annotations

import codecs
import glob
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

INPUT_SUFFIXES = (".txt", ".jsonl")
_READ_BYTES = 1 << 20  # one read of a .txt file
_MAX_CARRY_CHARS = 1 << 24  # a .txt stretch with no safe BPE cut is cut here anyway


@dataclass(frozen=True)
class Source:
    """One input file (or an embedded text such as pydoc's, `data` set and `path` a label)."""

    path: str
    size: int
    mtime_ns: int
    data: bytes | None = None

    @classmethod
    def of_file(cls, path: Path) -> Source:
        stat = path.stat()
        return cls(str(path.resolve()), stat.st_size, stat.st_mtime_ns)

    @classmethod
    def embedded(cls, label: str, text: str) -> Source:
        data = text.encode()
        return cls(label, len(data), 0, data)

    @property
    def is_jsonl(self) -> bool:
        return self.path.endswith(".jsonl")

    def open(self):
        return io.BytesIO(self.data) if self.data is not None else open(self.path, "rb")


def text_files(path: str | os.PathLike) -> list[Path]:
    """The input files of corpus "text" at data.path `path` (see the module docstring)."""
    path_str = os.fspath(path)
    given = Path(path_str)
    if given.is_file():
        return [given]
    if given.is_dir():
        files = sorted(p for p in given.rglob("*") if p.suffix in INPUT_SUFFIXES)
    elif glob.has_magic(path_str):
        files = sorted(Path(p) for p in glob.glob(path_str, recursive=True))
    else:
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
            f"{path_str} names no .txt or .jsonl files (nested folders searched too); add "
            f"some, or point data.path at a text file."
        )
    return files


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


def read_documents(sources: list[Source], text_field: str) -> Iterator[str]:
    """The documents of `sources` in order, each whole: the pieces of read_pieces joined."""
    parts = []
    for piece in read_pieces(sources, text_field):
        parts.append(piece.text)
        if piece.ends_document:
            yield "".join(parts)
            parts = []


def _txt_pieces(file, source, index, offset, text_field, safe_cut) -> Iterator[Piece]:
    del text_field
    decoder = codecs.getincrementaldecoder("utf-8")()
    carry = ""
    while True:
        block = file.read(_READ_BYTES)
        pending = len(decoder.getstate()[0])  # bytes of a character cut by the last read
        try:
            text = carry + decoder.decode(block, final=not block)
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{source.path} is not valid UTF-8 (invalid byte at offset "
                f"{offset - pending + error.start}); convert it to UTF-8, e.g. "
                f"`iconv -f LATIN1 -t UTF-8 {source.path} > converted.txt`."
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
