"""Corpora by name (`CORPORA`, the registry data.corpus picks from): the inputs each one names
(`find_sources`: pydoc's bundled docs, Tiny Shakespeare found or downloaded into the cache
folder, or the files of data.path), and their text for an in-memory corpus (`load_text`)."""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from minigpt_jax.data import corpus as corpus_files
from minigpt_jax.data.corpus import Source, picked_format, read_documents
from minigpt_jax.runtime.digests import sha256_file
from minigpt_jax.settings.registry import Registry

SHAKESPEARE_FILENAME = "tinyshakespeare.txt"
SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
DATA_DIR_ENV = "MINIGPT_JAX_DATA"
_DOWNLOAD_TIMEOUT_S = 20
# Between the documents of an in-memory corpus of many (the files of a directory or a glob, the
# lines of a .jsonl file); a single-document corpus (pydoc, Tiny Shakespeare, one .txt file) is
# its text unchanged. Sharded corpora put an end-of-text id there instead.
DOCUMENT_SEPARATOR = "\n"


def find_sources(
    corpus: str, path: str | os.PathLike | None, file_format: str = ""
) -> list[Source]:
    """The inputs of a corpus, in a fixed order: the same for data.format "memory" and "shards".

    corpus (a key of CORPORA, or module:attr of a function (path, file_format) -> list of
    corpus.Source):
      "pydoc": CPython's bundled English docs (pydoc_data.topics); no path, no download.
      "shakespeare": Tiny Shakespeare, found at `path` (file or directory), in
        $MINIGPT_JAX_DATA, or in the cache dir, else downloaded into the cache dir.
      "text": `path` is a file, a directory (every file below it of a known suffix) or a glob,
        as corpus.sources resolves it, each file read by its format (file_format: the key of
        corpus.FILE_FORMATS data.file_format picks beside the suffixes, "" for none).
    """
    return CORPORA[corpus](path, file_format)


def _pydoc_sources(path: str | os.PathLike | None, file_format: str) -> list[Source]:
    del file_format
    if path is not None:
        raise ValueError(
            f"corpus 'pydoc' is built in and takes no path (got {str(path)!r}); drop the "
            f"path, or use corpus 'text' to train on your own files."
        )
    return [Source.embedded("pydoc_data.topics", _pydoc_text())]


def _shakespeare_sources(path: str | os.PathLike | None, file_format: str) -> list[Source]:
    del file_format
    return [Source.of_file(_find_or_download_shakespeare(path))]


def _text_sources(path: str | os.PathLike | None, file_format: str) -> list[Source]:
    if path is None:
        raise ValueError(
            "corpus 'text' needs a path: a file (.txt, .jsonl, .csv, .parquet), a directory or "
            "a glob of them."
        )
    return corpus_files.sources(path, picked_format(file_format))


# The registry of data.corpus (a setting of minigpt_jax.settings.groups.Data).
CORPORA = Registry(
    "corpus kind",
    "data.corpus",
    {"pydoc": _pydoc_sources, "shakespeare": _shakespeare_sources, "text": _text_sources},
    arity=2,
    shape="a function (path, file_format) -> list of minigpt_jax.data.corpus.Source",
)


def load_text(
    corpus: str, path: str | os.PathLike | None = None, text_field: str = "text", **options: Any
) -> str:
    """Returns the text of a corpus (the inputs of find_sources) for an in-memory dataset.

    Each file's documents (a .txt file is one, a .jsonl line one, a .csv or .parquet row one:
    the text in its `text_field`) are joined with DOCUMENT_SEPARATOR ("\\n") in find_sources'
    order, so a corpus of one document (pydoc, Tiny Shakespeare, one .txt file) is its text
    unchanged. options: file_format and data, as `load_documents` takes them (data: config.data,
    what a file format reads; default: text_field alone).
    """
    return DOCUMENT_SEPARATOR.join(load_documents(corpus, path, text_field, **options))


def load_documents(
    corpus: str,
    path: str | os.PathLike | None = None,
    text_field: str = "text",
    *,
    file_format: str = "",
    data: Any = None,
) -> list[str]:
    """The documents of a corpus, in `load_text`'s order (raises ValueError when they hold no
    non-whitespace text)."""
    sources = find_sources(corpus, path, file_format)
    docs = list(read_documents(sources, text_field if data is None else data))
    if not any(doc.strip() for doc in docs):
        raise ValueError(
            f"corpus {corpus!r} from {describe_sources(sources, path)} is empty (no "
            f"non-whitespace text); point it at a file with training text."
        )
    return docs


def describe_sources(sources: list[Source], path: str | os.PathLike | None) -> str:
    """The inputs of a corpus for a message: the one file's path, or data.path and the count."""
    if len(sources) == 1:
        return sources[0].path
    return f"{os.fspath(path)} ({len(sources)} files)"


def _pydoc_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "minigpt_jax"


def _check_shakespeare(path: Path) -> Path:
    actual = sha256_file(path)
    if actual != SHAKESPEARE_SHA256:
        raise ValueError(
            f"{path} is not the canonical Tiny Shakespeare (sha256 {actual}, expected "
            f"{SHAKESPEARE_SHA256}); replace it with a fresh copy of {SHAKESPEARE_URL}, or use "
            f"corpus 'text' to train on a modified file."
        )
    return path


def _download(url: str, dest: Path) -> None:
    """Writes the bytes at `url` to `dest` (tests replace this to stay offline)."""
    with (
        urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as response,
        dest.open("wb") as file,
    ):
        shutil.copyfileobj(response, file)


def _find_or_download_shakespeare(path: str | os.PathLike | None) -> Path:
    """Returns a verified local Tiny Shakespeare file, downloading it if no copy is found."""
    cached = _cache_dir() / SHAKESPEARE_FILENAME
    candidates = []
    if path is not None:
        candidates.append(Path(path))
    if os.environ.get(DATA_DIR_ENV):
        candidates.append(Path(os.environ[DATA_DIR_ENV]))
    candidates.append(cached)
    searched = [c / SHAKESPEARE_FILENAME if c.is_dir() else c for c in candidates]
    for candidate in searched:
        if candidate.is_file():
            return _check_shakespeare(candidate)

    tmp_path = None
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cached.parent, suffix=".part", delete=False) as tmp:
            tmp_path = Path(tmp.name)
        _download(SHAKESPEARE_URL, tmp_path)
        _check_shakespeare(tmp_path)
        os.replace(tmp_path, cached)  # atomic: readers never see a partial file
        return cached
    except OSError as error:  # includes urllib's URLError and socket timeouts
        searched_list = "\n  ".join(str(p) for p in searched)
        raise FileNotFoundError(
            f"Tiny Shakespeare not found and the download from {SHAKESPEARE_URL} failed "
            f"({error}). Searched:\n  {searched_list}\nDownload that file yourself and put it "
            f"at one of these paths as {SHAKESPEARE_FILENAME}, e.g. in a directory named by "
            f"${DATA_DIR_ENV}, or pass its path (--config.data.path=...)."
        ) from error
    finally:
        if tmp_path is not None and tmp_path.exists():
            tmp_path.unlink()
