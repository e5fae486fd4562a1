"""data.format "memory": a corpus read into one string, encoded in one call and held in RAM
(`prepare_dataset`), its tokens cached in the run directory (workdir/tokens.npy, with a
fingerprint sidecar) so a resumed or re-read run does not encode it again."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from minigpt_jax import budget
from minigpt_jax.data.corpus import Source
from minigpt_jax.data.dataset import (
    DataDigest,
    Dataset,
    check_split_length,
    split_tokens,
    tokens_digest,
    warn_if_degenerate,
)
from minigpt_jax.data.sources import (
    DOCUMENT_SEPARATOR,
    describe_sources,
    find_sources,
    load_documents,
)
from minigpt_jax.data.tokenizers import (
    MAX_UINT16_VOCAB,
    Tokenizer,
    build_tokenizer,
    check_end_of_text,
    check_saved_tokenizer,
    encode_data,
    load_tokenizer,
)
from minigpt_jax.runtime.run_dir import RunDir, fingerprint_path

_log = logging.getLogger(__name__)


def _fingerprint(text: str, tokenizer: Tokenizer) -> str:
    digest = hashlib.sha256()
    for part in (text, tokenizer.to_json()):
        digest.update(hashlib.sha256(part.encode("utf-8", errors="surrogatepass")).digest())
    return digest.hexdigest()


def _encode_uint16(text: str, tokenizer: Tokenizer) -> np.ndarray:
    _check_uint16(tokenizer)
    return encode_data(tokenizer, [text])[0].astype(np.uint16)


DOCUMENTS_KEY = "documents, each followed by end-of-text:\n"


def _encode_documents(docs: list[str], tokenizer: Tokenizer) -> np.ndarray:
    """uint16 (n,): each document's ids, then the end-of-text id, in order."""
    _check_uint16(tokenizer)
    eot = np.asarray([tokenizer.eot_id], np.int32)
    pieces = [piece for ids in encode_data(tokenizer, docs) for piece in (ids, eot)]
    return np.concatenate(pieces).astype(np.uint16)


def _check_uint16(tokenizer: Tokenizer) -> None:
    if tokenizer.vocab_size > MAX_UINT16_VOCAB:
        raise ValueError(
            f"vocab_size {tokenizer.vocab_size} does not fit the uint16 token cache (at most "
            f"{MAX_UINT16_VOCAB} tokens); use a smaller vocab_size."
        )


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
    documents: bool = False,
    before_writing: Callable[[], None] | None = None,
    check_data: Callable[[DataDigest], None] | None = None,
) -> Dataset:
    """Loads, tokenises and splits a corpus; checks each split holds one window.

    With a workdir, an existing workdir/tokenizer.json is reused (a resumed run keeps its
    vocabulary), else the new tokenizer is saved there; tokens are cached in
    workdir/tokens.npy. workdir=None writes nothing. A given `tokenizer` (a pretrained model's)
    replaces tokenizer_kind and vocab_size. text_field: the field (.jsonl) or column (.csv,
    .parquet) of the text; file_format: data.file_format's key; data: config.data, what a file
    format reads (default: text_field alone). documents: each document is encoded on its own and
    followed by the tokenizer's end-of-text id (the last id), as shards always are, for a model
    that packs documents; else the documents are joined with a newline and encoded as one text.
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
    docs = load_documents(corpus, path, text_field, file_format=file_format, data=data)
    text = DOCUMENT_SEPARATOR.join(docs)
    # The cache is keyed by what is encoded and how: the documents apart, or one text.
    cache_key = DOCUMENTS_KEY + text if documents else text
    tokenizer_path = run_dir.tokenizer if run_dir is not None else None
    new_tokenizer = tokenizer_path is None or not tokenizer_path.exists()
    if new_tokenizer and tokenizer is None:
        tokenizer = build_tokenizer(tokenizer_kind, text, vocab_size, documents, data)
        if documents:
            needs = "packing documents (model.attention_mask) puts it after every document"
            check_end_of_text(tokenizer, tokenizer_kind, needs)
    elif not new_tokenizer:
        tokenizer = _saved_tokenizer(tokenizer_path, tokenizer, tokenizer_kind, vocab_size)
    if documents and tokenizer.eot_id is None:
        where = (
            "the given tokenizer (a pretrained model's) has none: use "
            if new_tokenizer
            else f"{tokenizer_path} has none (this workdir's run was made by data.tokenizer="
            f"{tokenizer_kind!r} without packing documents): use a fresh workdir or "
        )
        raise ValueError(
            f"packing documents (model.attention_mask) needs a tokenizer with an end-of-text "
            f"id; {where}model.attention_mask=causal."
        )
    cache_path = run_dir.tokens if run_dir is not None else None
    tokens = None
    if cache_path is not None and not new_tokenizer:
        tokens = read_cached_tokens(cache_key, tokenizer, cache_path)
    write_cache = cache_path is not None and tokens is None
    if tokens is None:
        encoded = _encode_documents(docs, tokenizer) if documents else None
        tokens = encoded if encoded is not None else _encode_uint16(text, tokenizer)
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
        write_cached_tokens(cache_key, tokenizer, tokens, cache_path)
    return Dataset(tokenizer=tokenizer, train=train, val=val, digest=digest)


def _saved_tokenizer(
    path: Path, given: Tokenizer | None, tokenizer_kind: str, vocab_size: int
) -> Tokenizer:
    """The tokenizer a workdir saved at `path`, checked against the config's kind and size, or
    (a pretrained model's tokenizer `given`) refused when it is another."""
    saved = load_tokenizer(path)
    if given is None:
        check_saved_tokenizer(saved, path, tokenizer_kind, vocab_size)
    elif saved.to_json() != given.to_json():
        raise ValueError(
            f"{path} holds another tokenizer than the pretrained model's; use a fresh workdir."
        )
    return saved


def _check_fits_in_memory(sources: list[Source], tokenizer_kind: str) -> None:
    """Refuses, before reading it, a corpus whose in-memory encoding would not fit in RAM."""
    text_bytes = sum(source.size for source in sources)
    shortfall = budget.text_shortfall(text_bytes, tokenizer_kind)
    if shortfall is not None:
        needed, available = shortfall
        raise ValueError(
            f"the corpus holds {text_bytes / 2**20:,.0f} MiB of text; data.format='memory' "
            f"would need about {needed / 2**30:,.1f} GiB of RAM to encode it in one call, but "
            f"{available / 2**30:,.1f} GiB are available ({budget.host_memory()[1]}); use "
            "--config.data.format=shards "
            "(streamed into token shards in bounded memory)."
        )
