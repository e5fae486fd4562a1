"""Text <-> token-id tokenizers: character-level and byte-level BPE, saved as JSON, and the
registry data.tokenizer picks from (`TOKENIZERS`).

Every tokenizer maps a str to a 1-D int32 array of ids in [0, vocab_size) and back. A tokenizer
built with `eot=True` also holds an end-of-text token, the last id (GPT-2's <|endoftext|> is
50256 of 50257): the sharded corpora of minigpt_jax.data.shards put it after every document.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from minigpt_jax.settings.registry import Registry, is_user_key

# The largest vocabulary whose ids fit uint16: token caches and shards store ids as uint16 up to
# it (shards switch to uint32 beyond it; the in-memory cache refuses a larger vocabulary).
MAX_UINT16_VOCAB = 1 << 16
_BYTE_ALPHABET_SIZE = 256
# GPT-2's one special token: it separates documents and is the model's BOS and EOS.
GPT2_EOT = "<|endoftext|>"

# GPT-2's pre-tokenizer regex never joins a newline that follows a non-space character with
# the non-space character after it, so cutting the text there encodes each chunk exactly as
# the whole text would be encoded; encode_batch then uses all cores.
_BPE_SAFE_CUT = re.compile(r"(?<=\S\n)(?=\S)")
_BPE_CHUNK_CHARS = 1 << 16


class Tokenizer(Protocol):
    """What the data pipeline and the model need from a tokenizer."""

    kind: str  # "char" or "bpe": the "type" field of its JSON (the types that save and load)

    @property
    def vocab_size(self) -> int: ...

    @property
    def eot_id(self) -> int | None: ...  # the end-of-text id, or None without one

    def encode(self, text: str) -> np.ndarray: ...

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]: ...

    def safe_cut(self, text: str) -> int: ...

    def decode(self, ids: np.ndarray | list[int]) -> str: ...

    def to_json(self) -> str: ...

    def save(self, path: str | Path) -> None: ...


def _check_ids(ids: np.ndarray | list[int], vocab_size: int) -> np.ndarray:
    """Returns ids as a 1-D int64 array, or raises if any id is outside [0, vocab_size)."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
        raise ValueError(
            f"decode expects a 1-D sequence of integer ids, got shape {ids.shape} and dtype "
            f"{ids.dtype}; decode one sequence at a time (e.g. decode(batch[i]))."
        )
    ids = ids.astype(np.int64)
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if bad.size:
        raise ValueError(
            f"token id {ids[bad[0]]} at position {bad[0]} is outside the vocabulary "
            f"[0, {vocab_size}); decode only ids produced by this tokenizer (check that the "
            f"model's vocab_size matches the tokenizer's)."
        )
    return ids


class CharTokenizer:
    """Character-level tokenizer; the vocabulary is the sorted set of a corpus's characters."""

    kind = "char"

    def __init__(self, chars: str, eot: bool = False):
        if not chars:
            raise ValueError(
                "CharTokenizer needs at least one character; build it from a non-empty corpus."
            )
        if len(set(chars)) != len(chars) or "".join(sorted(chars)) != chars:
            raise ValueError(
                "CharTokenizer vocabulary must be sorted distinct characters; "
                "use CharTokenizer.from_text(corpus) to build one."
            )
        self.chars = chars
        self.eot = bool(eot)
        # Sorted code points, so encode is a vectorised binary search.
        self._codepoints = codepoints(chars)

    @classmethod
    def from_text(cls, text: str, eot: bool = False) -> CharTokenizer:
        """Builds the vocabulary from every distinct character of `text` (+ end-of-text)."""
        if not text:
            raise ValueError("cannot build a CharTokenizer from empty text; pass the corpus.")
        return cls("".join(sorted(set(text))), eot=eot)

    @property
    def vocab_size(self) -> int:
        return len(self.chars) + self.eot

    @property
    def eot_id(self) -> int | None:
        """len(chars): after every character; encode never yields it, decode shows GPT2_EOT."""
        return len(self.chars) if self.eot else None

    def encode(self, text: str) -> np.ndarray:
        """Returns int32 ids of shape (len(text),)."""
        points = codepoints(text)
        ids = np.searchsorted(self._codepoints, points)
        clipped = np.minimum(ids, len(self.chars) - 1)
        unknown = np.flatnonzero(self._codepoints[clipped] != points)
        if unknown.size:
            position = int(unknown[0])
            raise ValueError(
                f"character {text[position]!r} at position {position} is not in the "
                f"CharTokenizer vocabulary: this run's tokenizer was built from its training "
                f"corpus, which does not contain it. Encode only text from that corpus's "
                f"alphabet, rebuild the tokenizer (a fresh workdir) from a corpus that contains "
                f"it, or use the 'bpe' tokenizer, which encodes any text."
            )
        return ids.astype(np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """[encode(text) for text in texts]."""
        return [self.encode(text) for text in texts]

    def safe_cut(self, text: str) -> int:
        """Any cut is safe: characters are encoded one by one."""
        return len(text)

    def decode(self, ids: np.ndarray | list[int]) -> str:
        """Inverse of encode: ids of shape (n,) -> str of length n (end-of-text: GPT2_EOT)."""
        ids = _check_ids(ids, self.vocab_size)
        if self.eot:
            parts = np.split(ids, np.flatnonzero(ids == self.eot_id))
            return GPT2_EOT.join(self._decode_chars(part[part != self.eot_id]) for part in parts)
        return self._decode_chars(ids)

    def _decode_chars(self, ids: np.ndarray) -> str:
        return self._codepoints[ids].tobytes().decode("utf-32-le", errors="surrogatepass")

    def to_json(self) -> str:
        # "eot" only when set, so tokenizers saved before it existed read back unchanged.
        spec = {"type": self.kind, "chars": self.chars} | ({"eot": True} if self.eot else {})
        return json.dumps(spec, ensure_ascii=False)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")


def codepoints(text: str) -> np.ndarray:
    """Returns the code points of `text` as a uint32 array of shape (len(text),)."""
    return np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)


class BPETokenizer:
    """Byte-level BPE (GPT-2 style): 256 byte tokens plus learned merges; encodes any text."""

    kind = "bpe"

    def __init__(self, hf_tokenizer: HFTokenizer):
        self._hf = hf_tokenizer
        self._hf_text: HFTokenizer | None = None  # a copy that reads special tokens as text

    @classmethod
    def train(
        cls, text: str | Iterable[str], vocab_size: int = 512, eot: bool = False
    ) -> BPETokenizer:
        """Learns vocab_size - 256 merges (- 1 with eot) from `text` (a str, or an iterable of
        strs such as a sample of a large corpus); the result has exactly vocab_size tokens, the
        end-of-text token last.

        Raises ValueError if the corpus is too small to learn that many merges.
        """
        if vocab_size < _BYTE_ALPHABET_SIZE:
            raise ValueError(
                f"BPE vocab_size must be at least {_BYTE_ALPHABET_SIZE} (one token per byte), "
                f"got {vocab_size}; raise vocab_size or use the 'char' tokenizer."
            )
        texts = [text] if isinstance(text, str) else list(text)
        n_chars = sum(len(t) for t in texts)
        if not n_chars:
            raise ValueError("cannot train a BPE tokenizer on empty text; pass the corpus.")
        hf = HFTokenizer(models.BPE())
        # add_prefix_space=False keeps decode(encode(s)) == s, leading spaces included.
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size - eot,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=[],
            show_progress=False,
        )
        hf.train_from_iterator(texts, trainer=trainer)
        if eot:
            hf.add_special_tokens([AddedToken(GPT2_EOT, special=True)])
        learned = hf.get_vocab_size()
        if learned != vocab_size:
            raise ValueError(
                f"the corpus ({n_chars} characters) only supports {learned - 256 - eot} BPE "
                f"merges, so the vocabulary has {learned} tokens instead of the requested "
                f"{vocab_size}; use vocab_size <= {learned} or a larger corpus (sample)."
            )
        return cls(hf)

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size()

    def encode(self, text: str) -> np.ndarray:
        """Returns int32 ids of shape (n,); never fails (every byte is in the vocabulary)."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str], special_tokens: bool = True) -> list[np.ndarray]:
        """[encode(text) for text in texts], all chunks of all texts in one multi-threaded call.
        special_tokens=False: the string of a special token ("<|endoftext|>") is encoded as the
        text it is, never as its id (training data: `encode_data`)."""
        hf = self._hf
        if not special_tokens:
            if self._hf_text is None:
                self._hf_text = HFTokenizer.from_str(self._hf.to_str())
                self._hf_text.encode_special_tokens = True
            hf = self._hf_text
        chunks = [_bpe_chunks(text) for text in texts]
        encodings = iter(hf.encode_batch([c for text_chunks in chunks for c in text_chunks]))
        return [
            np.concatenate(
                [np.asarray(next(encodings).ids, np.int32) for _ in text_chunks]
                or [np.zeros(0, np.int32)]
            )
            for text_chunks in chunks
        ]

    def safe_cut(self, text: str) -> int:
        """The last index i where the pre-tokenizer's rule guarantees encode(text) ==
        encode(text[:i]) + encode(text[i:]): after a newline that follows a non-space, before a
        non-space (0 when text holds no such place)."""
        cut = 0
        for start in (max(0, len(text) - _BPE_CHUNK_CHARS), 0):  # the tail first: cheap
            for match in _BPE_SAFE_CUT.finditer(text, start):
                cut = match.start()
            if cut:
                break
        return cut

    def decode(self, ids: np.ndarray | list[int]) -> str:
        """Inverse of encode: decode(encode(s)) == s for every str s."""
        # Special tokens are text too: "<|endoftext|>" decodes to itself, as in transformers.
        return self._hf.decode(_check_ids(ids, self.vocab_size).tolist(), skip_special_tokens=False)

    @property
    def eot_id(self) -> int | None:
        """The id of GPT-2's <|endoftext|>, or None when the vocabulary lacks it (a tokenizer
        trained with eot=True has it last; the text "<|endoftext|>" itself encodes to it, except
        in training data: `encode_data`)."""
        return self._hf.token_to_id(GPT2_EOT)

    def save_gpt2_files(self, directory: str | Path, model_max_length: int | None = None) -> None:
        """Writes the Hugging Face files of a GPT-2 tokenizer: tokenizer.json, vocab.json,
        merges.txt and tokenizer_config.json, which `transformers.AutoTokenizer` opens."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._hf.save(str(directory / "tokenizer.json"))
        self._hf.model.save(str(directory))
        special = (
            {}
            if self.eot_id is None
            else {"bos_token": GPT2_EOT, "eos_token": GPT2_EOT, "unk_token": GPT2_EOT}
        )
        config = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False, **special}
        if model_max_length is not None:
            config["model_max_length"] = model_max_length
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    def to_json(self) -> str:
        return json.dumps(
            {"type": self.kind, "hf_tokenizer": self._hf.to_str()}, ensure_ascii=False
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")


def _bpe_chunks(text: str) -> list[str]:
    """Splits text at safe cuts into pieces of about _BPE_CHUNK_CHARS characters."""
    chunks, current, current_chars = [], [], 0
    for piece in _BPE_SAFE_CUT.split(text):
        current.append(piece)
        current_chars += len(piece)
        if current_chars >= _BPE_CHUNK_CHARS:
            chunks.append("".join(current))
            current, current_chars = [], 0
    if current:
        chunks.append("".join(current))
    return chunks


def has_gpt2_tokenizer_files(directory: str | Path) -> bool:
    """Whether `directory` holds tokenizer.json, or vocab.json + merges.txt."""
    directory = Path(directory)
    return (directory / "tokenizer.json").is_file() or (
        (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file()
    )


def _add_prefix_space(directory: Path) -> bool | None:
    """tokenizer_config.json's add_prefix_space, None when it does not say."""
    try:
        value = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    setting = value.get("add_prefix_space") if isinstance(value, dict) else None
    return setting if isinstance(setting, bool) else None


def load_gpt2_tokenizer(directory: str | Path) -> BPETokenizer:
    """GPT-2's byte-level BPE from a Hugging Face directory: tokenizer.json if present, else
    vocab.json + merges.txt (the pre-tokenizer and decoder GPT-2 uses, <|endoftext|> special).

    Encodes and decodes as `transformers.GPT2TokenizerFast` on the same files, whose
    tokenizer_config.json may set add_prefix_space (a space before the text, as inside it).
    """
    directory = Path(directory)
    prefix_space = _add_prefix_space(directory)
    if (directory / "tokenizer.json").is_file():
        try:
            hf = HFTokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as error:  # the Rust library raises a bare Exception
            raise ValueError(
                f"{directory / 'tokenizer.json'} is not a Hugging Face tokenizer file ({error})."
            ) from error
        if prefix_space is not None and hf.pre_tokenizer is not None:
            # What transformers does: the config's add_prefix_space overrides the file's.
            state = json.loads(hf.pre_tokenizer.__getstate__())
            if state.get("add_prefix_space", prefix_space) != prefix_space:
                kind = getattr(pre_tokenizers, state.pop("type"))
                hf.pre_tokenizer = kind(**{**state, "add_prefix_space": prefix_space})
        return BPETokenizer(hf)
    vocab, merges = directory / "vocab.json", directory / "merges.txt"
    if not (vocab.is_file() and merges.is_file()):
        raise FileNotFoundError(
            f"{directory} has no GPT-2 tokenizer: it needs tokenizer.json, or vocab.json and "
            f"merges.txt, from the same model as the weights."
        )
    try:
        hf = HFTokenizer(models.BPE.from_file(str(vocab), str(merges)))
    except Exception as error:
        raise ValueError(
            f"{vocab} and {merges} are not a GPT-2 BPE vocabulary ({error})."
        ) from error
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=bool(prefix_space))
    hf.decoder = decoders.ByteLevel()
    if hf.token_to_id(GPT2_EOT) is not None:
        hf.add_special_tokens([AddedToken(GPT2_EOT, special=True)])
    return BPETokenizer(hf)


def _char(text: str | Iterable[str], vocab_size: int, eot: bool = False) -> Tokenizer:
    del vocab_size  # the alphabet decides it
    return CharTokenizer.from_text(text if isinstance(text, str) else "".join(text), eot=eot)


# The registry of data.tokenizer (a setting of minigpt_jax.settings.groups.Data): the built-in
# tokenizers by name, each a function (text, vocab_size, eot) -> Tokenizer; an entry that
# declares settings of its own (registry.declares) is also given data=config.data to read them.
TOKENIZERS = Registry(
    "tokenizer",
    "data.tokenizer",
    {"char": _char, "bpe": BPETokenizer.train},
    arity=3,
    shape="a function (text, vocab_size, eot[, data]) -> a minigpt_jax.data.tokenizers."
    "CharTokenizer or BPETokenizer (the types that save and load)",
)


def build_tokenizer(
    key: str, text: str | Iterable[str], vocab_size: int, eot: bool, data: Any = None
) -> Tokenizer:
    """TOKENIZERS[key](text, vocab_size, eot=eot), and data=config.data (where the settings
    an entry declares live: `data.<name>`) for an entry that declares any."""
    extra = {"data": data} if data is not None and TOKENIZERS.settings_of(key) else {}
    return TOKENIZERS[key](text, vocab_size, eot=eot, **extra)


def encode_data(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    """The ids of training texts (documents, or pieces of them): a special token's string inside
    one, GPT-2's "<|endoftext|>" included, is encoded as the text it is, never as the
    end-of-text id, so only the data path's own end-of-text (after each document) ends a
    document for model.attention_mask=document. Prompts still read it as the token."""
    if isinstance(tokenizer, BPETokenizer):
        return tokenizer.encode_batch(texts, special_tokens=False)
    return tokenizer.encode_batch(texts)  # char: its end-of-text has no text of its own


def check_end_of_text(tokenizer: Tokenizer, key: str, needs: str) -> Tokenizer:
    """`tokenizer`, built by the entry `key` of data.tokenizer with eot=True; raises naming the
    setting when it has no end-of-text id all the same (`needs`: what needs one)."""
    if tokenizer.eot_id is None:
        raise ValueError(
            f"data.tokenizer={key!r} made a tokenizer without an end-of-text id, though it was "
            f"asked for one (eot=True): {needs}. Make the entry honour eot=True (the end-of-text "
            "id last, as the built-in char and bpe tokenizers do), or pick one of those."
        )
    return tokenizer


def make_tokenizer(kind: str, text: str, vocab_size: int = 512, eot: bool = False) -> Tokenizer:
    """Builds a built-in tokenizer of `kind` from `text`; vocab_size is used by 'bpe' only."""
    if kind not in TOKENIZERS.names():
        raise ValueError(f"unknown tokenizer kind {kind!r}; choose one of {TOKENIZERS.names()}.")
    return TOKENIZERS[kind](text, vocab_size, eot=eot)


def check_saved_tokenizer(
    tokenizer: Tokenizer, path: Path, tokenizer_kind: str, vocab_size: int
) -> None:
    """Raises ValueError unless a run's saved tokenizer (read from `path`) is what its
    data.tokenizer and data.vocab_size ask for (a user entry's tokenizer saves as a built-in
    type: not compared)."""
    if is_user_key(tokenizer_kind):
        return
    if tokenizer.kind != tokenizer_kind or (
        tokenizer_kind == "bpe" and tokenizer.vocab_size != vocab_size
    ):
        raise ValueError(
            f"{path} holds a {tokenizer.kind!r} tokenizer with {tokenizer.vocab_size} tokens, but "
            f"this run asks for {tokenizer_kind!r}"
            + (f" with vocab_size {vocab_size}" if tokenizer_kind == "bpe" else "")
            + "; use a fresh workdir, or match the settings of the run that created it."
        )


# The types a saved tokenizer may have (its JSON "type"), each with the field it needs and that
# field's JSON type.
_FIELDS = {"char": ("chars", str), "bpe": ("hf_tokenizer", str)}


def tokenizer_from_json(serialized: str) -> Tokenizer:
    """Inverse of Tokenizer.to_json."""
    try:
        spec = json.loads(serialized)
        kind = spec["type"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(
            "not a saved minigpt_jax tokenizer (expected a JSON object with a 'type' field); "
            "create one with tokenizer.save(path)."
        ) from error
    if kind not in _FIELDS:
        raise ValueError(
            f"saved tokenizer has unknown type {kind!r}; expected one of {list(_FIELDS)}. "
            f"Recreate it with make_tokenizer(...).save(path)."
        )
    field, field_type = _FIELDS[kind]
    if not isinstance(spec.get(field), field_type):
        raise ValueError(
            f"saved {kind!r} tokenizer lacks its {field!r} field (a {field_type.__name__}); "
            "the file is damaged or hand-edited. Restore it, or train in a fresh workdir."
        )
    if kind == "char":
        return CharTokenizer(spec["chars"], eot=spec.get("eot", False))
    try:
        return BPETokenizer(HFTokenizer.from_str(spec["hf_tokenizer"]))
    except Exception as error:  # the Rust library raises its own Exception type
        raise ValueError(
            f"saved 'bpe' tokenizer's 'hf_tokenizer' field cannot be read ({error}); the file "
            "is damaged or hand-edited. Restore it, or train in a fresh workdir."
        ) from None


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Loads a tokenizer written by .save(path), returning the matching class."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no tokenizer file at {path}; create one with make_tokenizer(...).save({str(path)!r})."
        )
    try:
        return tokenizer_from_json(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from error
