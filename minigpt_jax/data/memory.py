"""Corpus loading, cached tokenisation, train/val split and deterministic batches (numpy only)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from minigpt_jax import budget
from minigpt_jax.data import corpus as corpus_files
from minigpt_jax.data.corpus import BUILTIN_FORMATS, FileFormat, Source, read_documents
from minigpt_jax.data.tokenizers import BUILDERS, MAX_UINT16_VOCAB, Tokenizer, load_tokenizer
from minigpt_jax.runtime.digests import sha256_file
from minigpt_jax.runtime.run_dir import TOKENIZER_FILENAME as TOKENIZER_FILENAME  # re-exported
from minigpt_jax.runtime.run_dir import TOKENS_FILENAME as TOKENS_FILENAME  # re-exported
from minigpt_jax.runtime.run_dir import RunDir, fingerprint_path
from minigpt_jax.settings.registry import Registry, is_user_key

_log = logging.getLogger(__name__)

SPLITS = ("train", "val")

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


# ---------------------------------------------------------------------------------------------
# Text


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
        FILE_FORMATS data.file_format picks beside the suffixes, "" for none).
    """
    return CORPORA[corpus](path, file_format)


def picked_format(key: str) -> FileFormat | None:
    """The entry data.file_format picks (None for ""): a built-in name reads every file whose
    suffix no built-in claims; a user entry the files of its suffixes (all such, without)."""
    if not key:
        return None
    entry = FILE_FORMATS[key]
    if key in BUILTIN_FORMATS:
        return dataclasses.replace(entry, suffixes=())
    return entry if entry.name else dataclasses.replace(entry, name=key)  # named in manifests


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


# The registries of the data group's choices (the settings in minigpt_jax.settings.groups.Data).
CORPORA = Registry(
    "corpus kind",
    "data.corpus",
    {"pydoc": _pydoc_sources, "shakespeare": _shakespeare_sources, "text": _text_sources},
    arity=2,
    shape="a function (path, file_format) -> list of minigpt_jax.data.corpus.Source",
)
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
TOKENIZERS = Registry(
    "tokenizer",
    "data.tokenizer",
    BUILDERS,
    arity=3,
    shape="a function (text, vocab_size, eot) -> a minigpt_jax.data.tokenizers.CharTokenizer "
    "or BPETokenizer (the types that save and load)",
)


def load_text(
    corpus: str,
    path: str | os.PathLike | None = None,
    text_field: str = "text",
    *,
    file_format: str = "",
    data: Any = None,
) -> str:
    """Returns the text of a corpus (the inputs of find_sources) for an in-memory dataset.

    Each file's documents (a .txt file is one, a .jsonl line one, a .csv or .parquet row one:
    the text in its `text_field`) are joined with DOCUMENT_SEPARATOR ("\\n") in find_sources'
    order, so a corpus of one document (pydoc, Tiny Shakespeare, one .txt file) is its text
    unchanged. data: config.data, what a file format reads (default: text_field alone).
    """
    sources = find_sources(corpus, path, file_format)
    text = DOCUMENT_SEPARATOR.join(read_documents(sources, text_field if data is None else data))
    if not text.strip():
        raise ValueError(
            f"corpus {corpus!r} from {describe_sources(sources, path)} is empty (no "
            f"non-whitespace text); point it at a file with training text."
        )
    return text


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


# ---------------------------------------------------------------------------------------------
# Tokens


def _fingerprint(text: str, tokenizer: Tokenizer) -> str:
    digest = hashlib.sha256()
    for part in (text, tokenizer.to_json()):
        digest.update(hashlib.sha256(part.encode("utf-8", errors="surrogatepass")).digest())
    return digest.hexdigest()


def _encode_uint16(text: str, tokenizer: Tokenizer) -> np.ndarray:
    if tokenizer.vocab_size > MAX_UINT16_VOCAB:
        raise ValueError(
            f"vocab_size {tokenizer.vocab_size} does not fit the uint16 token cache (at most "
            f"{MAX_UINT16_VOCAB} tokens); use a smaller vocab_size."
        )
    return tokenizer.encode(text).astype(np.uint16)


def encode_cached(
    text: str, tokenizer: Tokenizer, cache_path: str | os.PathLike | None
) -> np.ndarray:
    """Returns tokenizer.encode(text) as uint16 of shape (n,), cached as .npy at cache_path.

    A sidecar `<cache_path>.fingerprint` holds sha256(text, tokenizer JSON) and the sha256 of
    the tokens; a cache that is missing, stale, unreadable, altered, or holds an id outside the
    tokenizer's vocabulary is rebuilt (with a warning when it was there but wrong).
    cache_path=None encodes without caching.
    """
    if cache_path is None:
        return _encode_uint16(text, tokenizer)
    tokens = read_cached_tokens(text, tokenizer, cache_path)
    if tokens is None:
        tokens = _encode_uint16(text, tokenizer)
        write_cached_tokens(text, tokenizer, tokens, cache_path)
    return tokens


def read_cached_tokens(
    text: str, tokenizer: Tokenizer, cache_path: str | os.PathLike
) -> np.ndarray | None:
    """The tokens cached at cache_path for (text, tokenizer), None if the cache is missing,
    stale, unreadable, altered or holds an id outside the vocabulary (warning when it was
    there but wrong). Reads only."""
    cache_path = Path(cache_path)
    try:
        saved = fingerprint_path(cache_path).read_text(encoding="ascii").split()
        if saved[:1] == [_fingerprint(text, tokenizer)]:
            tokens = np.load(cache_path, allow_pickle=False)
            problem = _tokens_problem(tokens, saved[1:], tokenizer.vocab_size)
            if problem is None:
                return tokens
            _log.warning("%s %s; encoding the corpus again.", cache_path, problem)
    except (OSError, ValueError, EOFError):
        pass  # missing or corrupt cache: rebuilt by the caller
    return None


def write_cached_tokens(
    text: str, tokenizer: Tokenizer, tokens: np.ndarray, cache_path: str | os.PathLike
) -> None:
    """Writes `tokens` (tokenizer.encode(text) as uint16) and its sidecar to cache_path."""
    cache_path = Path(cache_path)
    sidecar_path = fingerprint_path(cache_path)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    # Invalidate first so a crash between the two writes can never pair new tokens with an
    # old fingerprint.
    sidecar_path.unlink(missing_ok=True)
    _atomic_write(cache_path, lambda file: np.save(file, tokens, allow_pickle=False))
    sidecar = f"{_fingerprint(text, tokenizer)}\n{hashlib.sha256(tokens.tobytes()).hexdigest()}\n"
    _atomic_write(sidecar_path, lambda file: file.write(sidecar.encode("ascii")))


def _tokens_problem(tokens: np.ndarray, saved_digest: list[str], vocab_size: int) -> str | None:
    """What is wrong with cached tokens, or None: dtype, shape, sha256, id range."""
    if tokens.dtype != np.uint16 or tokens.ndim != 1:
        return f"holds {tokens.dtype} of shape {tokens.shape}, not uint16 of shape (n,)"
    if not saved_digest:
        return "has no token sha256 in its .fingerprint file (an older minigpt-jax wrote it)"
    if saved_digest != [hashlib.sha256(tokens.tobytes()).hexdigest()]:
        return "does not match the sha256 in its .fingerprint file (damaged or edited)"
    if tokens.size and int(tokens.max()) >= vocab_size:
        return f"holds id {int(tokens.max())}, outside the tokenizer's [0, {vocab_size})"
    return None


def _atomic_write(path: Path, write) -> None:
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".part", delete=False) as tmp:
        try:
            write(tmp)
        except BaseException:
            tmp.close()
            os.unlink(tmp.name)
            raise
    os.replace(tmp.name, path)


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


# ---------------------------------------------------------------------------------------------
# Batches


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


def check_split_length(tokens: np.ndarray, block_size: int, split: str) -> None:
    """Raises ValueError unless `tokens` holds at least one window of block_size + 1 tokens."""
    if len(tokens) < block_size + 1:
        raise ValueError(
            f"the {split!r} split has {len(tokens)} tokens but one training window needs "
            f"block_size + 1 = {block_size + 1}; use a smaller block_size or more text."
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
    (a 1-D array, or a shards.TokenStream: the same windows of the same stream).

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
    rng = np.random.default_rng([seed, step, SPLITS.index(split)])
    starts = rng.integers(0, len(tokens) - block_size, size=batch_size)
    if isinstance(tokens, np.ndarray):
        return tokens[starts[:, None] + np.arange(block_size + 1)].astype(np.int32)
    return tokens.windows(starts, block_size + 1)  # memory-mapped shards (shards.TokenStream)


# ---------------------------------------------------------------------------------------------
# Dataset


@dataclass(frozen=True)
class DataDigest:
    """What a run trains on, recorded in its checkpoints so a resume can tell when the data
    changed: the format, the length of the token stream and its sha256 (memory: of the uint16
    tokens; shards: shards.stream_sha256 of the shards' digests, in order)."""

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
    in memory, or shards.TokenStream views of memory-mapped shards) and their digest."""

    tokenizer: Tokenizer
    train: Any
    val: Any
    digest: DataDigest | None = None

    def split(self, name: str) -> np.ndarray:
        """Returns the token array of split `name` ("train" or "val")."""
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; choose one of {list(SPLITS)}.")
        return self.train if name == "train" else self.val


def prepare_dataset(
    corpus: str,
    path: str | os.PathLike | None,
    tokenizer_kind: str,
    vocab_size: int,
    block_size: int,
    workdir: str | os.PathLike | None,
    val_fraction: float = 0.1,
    tokenizer: Tokenizer | None = None,
    text_field: str = "text",
    *,
    file_format: str = "",
    data: Any = None,
    before_writing: Callable[[], None] | None = None,
    check_data: Callable[[DataDigest], None] | None = None,
) -> Dataset:
    """Loads, tokenises and splits a corpus; checks each split holds one window.

    With a workdir, an existing workdir/tokenizer.json is reused (a resumed run keeps its
    vocabulary), else the new tokenizer is saved there; tokens are cached in
    workdir/tokens.npy. workdir=None writes nothing. A given `tokenizer` (a pretrained model's)
    replaces tokenizer_kind and vocab_size. text_field: the field (.jsonl) or column (.csv,
    .parquet) of the text; file_format: data.file_format's key; data: config.data, what a file
    format reads (default: text_field alone).
    Everything that can fail happens in memory first: nothing is written (and before_writing,
    e.g. taking the run lock, is not called) unless the dataset is good and check_data(digest)
    (a resumed run's comparison with its checkpoint) has returned.
    """
    split_tokens(np.zeros(2, np.uint16), val_fraction)  # a bad fraction fails before reading
    run_dir = RunDir(workdir) if workdir is not None else None
    if run_dir is None or not run_dir.tokens.exists():
        _check_fits_in_memory(
            find_sources(corpus, path, file_format), tokenizer_kind if tokenizer is None else "bpe"
        )
    text = load_text(corpus, path, text_field, file_format=file_format, data=data)
    tokenizer_path = run_dir.tokenizer if run_dir is not None else None
    new_tokenizer = tokenizer_path is None or not tokenizer_path.exists()
    if not new_tokenizer:
        saved = load_tokenizer(tokenizer_path)
        if tokenizer is None:
            _check_reused_tokenizer(saved, tokenizer_path, tokenizer_kind, vocab_size)
        elif saved.to_json() != tokenizer.to_json():
            raise ValueError(
                f"{tokenizer_path} holds another tokenizer than the pretrained model's; "
                "use a fresh workdir."
            )
        tokenizer = saved
    else:
        tokenizer = tokenizer or TOKENIZERS[tokenizer_kind](text, vocab_size, eot=False)
    cache_path = run_dir.tokens if run_dir is not None else None
    tokens = None
    if cache_path is not None and not new_tokenizer:
        tokens = read_cached_tokens(text, tokenizer, cache_path)
    write_cache = cache_path is not None and tokens is None
    if tokens is None:
        tokens = _encode_uint16(text, tokenizer)
    train, val = split_tokens(tokens, val_fraction)
    check_split_length(train, block_size, "train")
    check_split_length(val, block_size, "val")
    # One id only: min == max, two passes and no temporary (a full count would cost a sort).
    single = {name: 1 for name, t in (("train", train), ("val", val)) if t.min() == t.max()}
    digest = tokens_digest(tokens)
    if check_data is not None:
        check_data(digest)
    if single:
        where = describe_sources(find_sources(corpus, path, file_format), path)
        warn_if_degenerate(where, single, tokenizer.vocab_size)
    if before_writing is not None and (new_tokenizer or write_cache):
        before_writing()
    if tokenizer_path is not None and new_tokenizer:
        tokenizer_path.parent.mkdir(parents=True, exist_ok=True)
        tokenizer.save(tokenizer_path)
    if write_cache:
        write_cached_tokens(text, tokenizer, tokens, cache_path)
    return Dataset(tokenizer=tokenizer, train=train, val=val, digest=digest)


def _check_fits_in_memory(sources: list[Source], tokenizer_kind: str) -> None:
    """Refuses, before reading it, a corpus whose in-memory encoding would not fit in RAM."""
    text_bytes = sum(source.size for source in sources)
    shortfall = budget.text_shortfall(text_bytes, tokenizer_kind)
    if shortfall is not None:
        needed, available = shortfall
        raise ValueError(
            f"the corpus holds {text_bytes / 2**20:,.0f} MiB of text; data.format='memory' "
            f"would need about {needed / 2**30:,.1f} GiB of RAM to encode it in one call, but "
            f"{available / 2**30:,.1f} GiB are available; use --config.data.format=shards "
            "(streamed into token shards in bounded memory)."
        )


def _check_reused_tokenizer(
    tokenizer: Tokenizer, path: Path, tokenizer_kind: str, vocab_size: int
) -> None:
    if is_user_key(tokenizer_kind):
        return  # a user entry's tokenizer saves as one of the built-in types
    if tokenizer.kind != tokenizer_kind or (
        tokenizer_kind == "bpe" and tokenizer.vocab_size != vocab_size
    ):
        raise ValueError(
            f"{path} holds a {tokenizer.kind!r} tokenizer with {tokenizer.vocab_size} tokens, but "
            f"this run asks for {tokenizer_kind!r}"
            + (f" with vocab_size {vocab_size}" if tokenizer_kind == "bpe" else "")
            + "; use a fresh workdir, or match the settings of the run that created it."
        )
