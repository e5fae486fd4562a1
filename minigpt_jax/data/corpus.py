"""The one reader of corpus files, for in-memory corpora (data) and sharded ones (shards) alike.

Each file is read by a file format (`FileFormat`, an entry of the registry `FILE_FORMATS`,
config key data.file_format), picked by its suffix:
  .txt      one document, UTF-8 text;
  .jsonl    one document per non-blank line, the string in its `data.text_field`;
  .csv      one document per row, the cell of column `data.text_field` (the csv module:
            quoted fields, embedded newlines, \\r\\n rows; a header row names the columns);
  .parquet  one document per row of column `data.text_field`, read in record batches
            (pyarrow: the `parquet` extra).
A file of another suffix is refused, never read as raw text, unless data.file_format picks a
format for it (`format_of`). `sources(path, picked)` resolves data.path to its input files:
  - a file: that file;
  - a directory: every file below it of a known suffix, nested folders too, sorted by path;
  - anything else is a glob pattern (`**` included), sorted. A path that exists is never read as
    a pattern, so a folder named `runs[1]` is that folder.
`read_pieces` streams documents in bounded pieces (for shards), `read_documents` yields them
whole (for in-memory corpora). It imports only the registry type of the package.
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import glob
import io
import json
import os
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minigpt_jax.settings.registry import Registry

_READ_BYTES = 1 << 20  # one read of a .txt file
_MAX_CARRY_CHARS = 1 << 24  # a .txt stretch with no safe BPE cut is cut here anyway
_PARQUET_BATCH_ROWS = 1024  # rows of a parquet record batch: bounds RAM on any file size
# The longest document (a .jsonl line, a .csv row, a .parquet or user format's document) read:
# each is encoded whole, at up to ~95 bytes of RAM a byte (budget.TEXT_BYTES_PER_BYTE), so a
# longer one is refused, a .jsonl line or .csv row before it is read whole. A .txt file is
# cut into pieces instead (shards) or is held whole under the memory budget (data.format memory).
MAX_DOCUMENT_BYTES = 1 << 24


def _too_long(where: str, what: str) -> ValueError:
    return ValueError(
        f"{where}: {what} is longer than {MAX_DOCUMENT_BYTES / 2**20:,.0f} MiB, the longest "
        "document a corpus may hold (corpus.MAX_DOCUMENT_BYTES; each document is encoded "
        "whole, at up to ~95 bytes of RAM a byte): split it into several documents (rows or "
        "lines), or put it in a .txt file of its own, which is read in pieces."
    )


@dataclass(frozen=True)
class FileFormat:
    """An entry of the file-format registry: how a file becomes documents.

    read(path, data) -> iterable of document strings, in order; `data` is config.data (its
    text_field, and any setting the entry declares). suffixes: the file suffixes it claims
    (".tsv"); an entry with none, picked by data.file_format, reads every file whose suffix no
    built-in format claims. sized: a file's size bounds its text's UTF-8 bytes (checked
    before reading). A built-in's `pieces` streams a file in bounded pieces with byte cursors;
    any other entry resumes by counting the documents read.
    """

    read: Callable[[str, Any], Iterable[str]]
    suffixes: tuple[str, ...] = ()
    name: str = ""
    sized: bool = False
    pieces: Callable[..., Iterator[Piece]] | None = None

    def __post_init__(self):
        # FileFormat(fn) of a bare function (the registry's coercion) takes fn.suffixes.
        suffixes = self.suffixes or getattr(self.read, "suffixes", ())
        suffixes = (suffixes,) if isinstance(suffixes, str) else tuple(suffixes)
        if not all(isinstance(s, str) and s.startswith(".") for s in suffixes):
            raise TypeError(f"a file format's suffixes are strings like '.tsv', not {suffixes!r}.")
        object.__setattr__(self, "suffixes", suffixes)


@dataclass(frozen=True)
class Piece:
    """A stretch of one document; the cursor (source index, byte offset) just after it."""

    text: str
    ends_document: bool
    cursor: tuple[int, int]


def read_pieces(
    sources: list[Source],
    data: Any,
    cursor: tuple[int, int] = (0, 0),
    safe_cut=len,
) -> Iterator[Piece]:
    """Streams the documents of `sources` from `cursor` in pieces; `data` is config.data (or
    its text_field as a string). A .txt file comes in pieces of at most ~1 MB, cut where
    safe_cut(text) says a stretch may be cut without changing its tokens (Tokenizer.safe_cut;
    the rest is carried into the next piece), and the cursor is a byte offset, as for .jsonl
    (a line is one piece); the documents of any other format are one piece each, the cursor
    the count of documents read from the file."""
    data = _as_data(data)
    first_source, offset = cursor
    for index in range(first_source, len(sources)):
        source = sources[index]
        start = offset if index == first_source else 0
        if source.format.pieces is None:
            yield from _record_pieces(source, index, start, data)
            continue
        with source.open() as file:
            file.seek(start)
            yield from source.format.pieces(file, source, index, start, data, safe_cut)


def read_documents(sources: list[Source], data: Any) -> Iterator[str]:
    """The documents of `sources` in order, each whole: the pieces of read_pieces joined."""
    parts = []
    for piece in read_pieces(sources, data):
        parts.append(piece.text)
        if piece.ends_document:
            yield "".join(parts)
            parts = []


_END = object()


def _record_pieces(source: Source, index: int, skip: int, data: Any) -> Iterator[Piece]:
    """The documents of a file read by its format's `read`, one piece each, after the first
    `skip`; the cursor after each is (index, documents read), (index + 1, 0) after the last."""
    documents = iter(source.format.read(source.path, data))
    for _ in range(skip):
        if next(documents, _END) is _END:
            break
    read, text = skip, next(documents, _END)
    while text is not _END:
        if not isinstance(text, str):
            raise ValueError(
                f"{source.path}: file format {source.format.name or source.format.read!r} "
                f"yielded {type(text).__name__}, not a document string; its read(path, data) "
                f"must yield str."
            )
        if len(text) > MAX_DOCUMENT_BYTES:
            raise _too_long(source.path, f"document {read + 1}")
        following = next(documents, _END)
        read += 1
        yield Piece(text, True, (index + 1, 0) if following is _END else (index, read))
        text = following


def _txt_pieces(file, source, index, offset, data, safe_cut) -> Iterator[Piece]:
    del data
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


def _jsonl_pieces(file, source, index, offset, data, safe_cut) -> Iterator[Piece]:
    del safe_cut
    text_field = data.text_field
    for line in iter(lambda: file.readline(MAX_DOCUMENT_BYTES + 1), b""):
        if len(line) > MAX_DOCUMENT_BYTES:
            raise _too_long(source.path, f"the line at byte {offset}")
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


def _as_data(data: Any) -> Any:
    """What readers get as `data`: config.data, or just a text_field given as a string."""
    return types.SimpleNamespace(text_field=data) if isinstance(data, str) else data


def _read_txt(path: str, data: Any) -> Iterator[str]:
    yield from read_documents([Source.of_file(Path(path))], data)


def _read_jsonl(path: str, data: Any) -> Iterator[str]:
    yield from read_documents([Source.of_file(Path(path), JSONL)], data)


def _missing_column(path: str, field: str, columns: list[str]) -> ValueError:
    return ValueError(
        f"{path} has no column {field!r} (its columns: {', '.join(map(repr, columns))}); set "
        f"data.text_field to the column that holds the text."
    )


def _read_csv(path: str, data: Any) -> Iterator[str]:
    """The cells of column data.text_field, one document per row (a header row first)."""
    field = data.text_field
    csv.field_size_limit(MAX_DOCUMENT_BYTES)  # a document may be longer than its 128 KiB
    try:
        with open(path, newline="", encoding="utf-8-sig") as file:
            reader = csv.reader(_bounded_lines(file, path))
            header = next(reader, None)
            if header is None:
                return
            if field not in header:
                raise _missing_column(path, field, header)
            column = header.index(field)
            for row in reader:
                if not row:
                    continue  # a blank line
                if column >= len(row):
                    raise ValueError(
                        f"{path}, line {reader.line_num}: a row of {len(row)} fields has no "
                        f"{field!r} cell (column {column + 1} of the header); fix the row."
                    )
                yield row[column]
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not valid UTF-8 ({error.reason} at byte {error.start} of a read); "
            f"convert it to UTF-8, e.g. `iconv -f LATIN1 -t UTF-8 {path} > converted.csv`."
        ) from None
    except csv.Error as error:
        if "field larger than field limit" in str(error):
            raise _too_long(path, f"the cell running to line {reader.line_num}") from None
        raise ValueError(f"{path} is not a readable CSV file ({error}); fix the file.") from None


def _bounded_lines(file, path: str) -> Iterator[str]:
    """The lines of a text file, refusing one longer than MAX_DOCUMENT_BYTES characters before
    it is read whole (iterating the file would read a row without newlines at once)."""
    for number, line in enumerate(iter(lambda: file.readline(MAX_DOCUMENT_BYTES + 1), ""), 1):
        if len(line) > MAX_DOCUMENT_BYTES:
            raise _too_long(path, f"line {number}")
        yield line


def _read_parquet(path: str, data: Any) -> Iterator[str]:
    """The strings of column data.text_field, row by row, in record batches."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(
            f"{path}: reading .parquet files needs pyarrow; install the extra: "
            "pip install 'minigpt-jax[parquet]'."
        ) from None
    field = data.text_field
    try:
        file = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as error:
        raise _not_parquet(path, error) from None
    schema = file.schema_arrow
    if field not in schema.names:
        raise _missing_column(path, field, schema.names)
    kind = schema.field(field).type
    if pa.types.is_dictionary(kind):  # dictionary-encoded strings (a categorical) are strings
        kind = kind.value_type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ValueError(
            f"{path}: column {field!r} holds {kind}, not strings; set data.text_field to the "
            f"column that holds the text."
        )
    row = 0
    batches = file.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=[field])
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as error:  # a damaged row group, read late
            raise _not_parquet(path, error) from None
        if batch is None:
            return
        for text in batch.column(0).to_pylist():
            if text is None:
                raise ValueError(
                    f"{path}: row {row} of column {field!r} is null; drop the rows without "
                    f"text (or fill them) before training."
                )
            row += 1
            yield text


def _not_parquet(path: str, error: Exception) -> ValueError:
    return ValueError(
        f"{path} is not a readable parquet file ({type(error).__name__}: {str(error).rstrip('.')}; "
        "empty, truncated or damaged): write it again, or move it out of data.path."
    )


TXT = FileFormat(_read_txt, (".txt",), "txt", sized=True, pieces=_txt_pieces)
JSONL = FileFormat(_read_jsonl, (".jsonl",), "jsonl", sized=True, pieces=_jsonl_pieces)
CSV = FileFormat(_read_csv, (".csv",), "csv", sized=True)
PARQUET = FileFormat(_read_parquet, (".parquet",), "parquet")
# The built-in file formats by name: FILE_FORMATS' table.
BUILTIN_FORMATS = {entry.name: entry for entry in (TXT, JSONL, CSV, PARQUET)}
_BY_SUFFIX = {suffix: entry for entry in BUILTIN_FORMATS.values() for suffix in entry.suffixes}

# The registry of data.file_format (a setting of minigpt_jax.settings.groups.Data).
FILE_FORMATS = Registry(
    "file format",
    "data.file_format",
    BUILTIN_FORMATS,
    entry_class=FileFormat,
    arity=2,
    shape="a function (path, data) -> iterable of document strings (its `suffixes` such as "
    "('.tsv',) an attribute) or a minigpt_jax.data.corpus.FileFormat",
    split=lambda value: [value] if value else [],  # "": no format beside the suffixes' own
)


def picked_format(key: str) -> FileFormat | None:
    """The entry data.file_format picks (None for ""): a built-in name reads every file whose
    suffix no built-in claims; a user entry the files of its suffixes (all such, without)."""
    if not key:
        return None
    entry = FILE_FORMATS[key]
    if key in BUILTIN_FORMATS:
        return dataclasses.replace(entry, suffixes=())
    return entry if entry.name else dataclasses.replace(entry, name=key)  # named in manifests


@dataclass(frozen=True)
class Source:
    """One input file and its format (or an embedded text such as pydoc's, `data` set and
    `path` a label)."""

    path: str
    size: int
    mtime_ns: int
    data: bytes | None = None
    format: FileFormat = TXT

    @classmethod
    def of_file(cls, path: Path, file_format: FileFormat = TXT) -> Source:
        stat = path.stat()
        return cls(str(path.resolve()), stat.st_size, stat.st_mtime_ns, format=file_format)

    @classmethod
    def embedded(cls, label: str, text: str) -> Source:
        data = text.encode()
        return cls(label, len(data), 0, data)

    def open(self):
        return io.BytesIO(self.data) if self.data is not None else open(self.path, "rb")


def format_of(file: Path, picked: FileFormat | None = None) -> FileFormat | None:
    """The format that reads `file`: the picked entry for its own suffixes, else the built-in
    one for the suffix, else the picked entry when it claims no suffixes; None: no reader."""
    if picked is not None and file.suffix in picked.suffixes:
        return picked
    if file.suffix in _BY_SUFFIX:
        return _BY_SUFFIX[file.suffix]
    if picked is not None and not picked.suffixes:
        return picked
    return None


def known_suffixes(picked: FileFormat | None = None) -> list[str]:
    return [*_BY_SUFFIX, *(s for s in (picked.suffixes if picked else ()) if s not in _BY_SUFFIX)]


def sources(path: str | os.PathLike, picked: FileFormat | None = None) -> list[Source]:
    """The input files of corpus "text" at data.path `path`, each with the format that reads
    it (see the module docstring); `picked` is data.file_format's entry, if any."""
    path_str = os.fspath(path)
    given = Path(path_str)
    known = known_suffixes(picked)
    if given.is_file():
        files = [given]
    elif given.is_dir():
        files = sorted(
            p
            for p in given.rglob("*")
            if format_of(p, picked) is not None and not p.name.startswith(".")
        )
    elif glob.has_magic(path_str):
        files = sorted(Path(p) for p in glob.glob(path_str, recursive=True))
    else:
        raise FileNotFoundError(
            f"corpus 'text': {path_str} does not exist; pass a {'/'.join(known)} file, a "
            f"directory or a glob such as 'data/*.jsonl'."
        )
    files = [f for f in files if f.is_file()]
    for file in files:
        if format_of(file, picked) is None:
            raise ValueError(
                f"{file}: no file format reads {file.suffix or 'files without a suffix'}; the "
                f"known suffixes are {', '.join(known)}. Rename the file, narrow data.path, or "
                f"set data.file_format to a format that reads it (txt, jsonl, csv, parquet, or "
                f"module:attr of your own, docs/extending/data.md)."
            )
    if not files:
        raise ValueError(
            f"{path_str} names no {', '.join(known)} files (nested folders searched too); add "
            f"some, or point data.path at a file of the corpus."
        )
    return [Source.of_file(file, format_of(file, picked)) for file in files]
