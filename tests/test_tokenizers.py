"""Tests for minigpt_jax.data.tokenizers: exact round-trips, vocab sizes, errors, save/load."""

import json

import numpy as np
import pytest
from helpers import pydoc_text

from minigpt_jax.data import tokenizers
from minigpt_jax.data.tokenizers import BPETokenizer, CharTokenizer, load_tokenizer, make_tokenizer

TRICKY = "  leading spaces\n\n\tand tabs\r\nünïcödé 日本語 🙂\n   \nend "


@pytest.fixture(scope="module")
def bpe_corpus():

    return pydoc_text(50_000) + TRICKY


@pytest.fixture(scope="module")
def bpe(bpe_corpus):
    return BPETokenizer.train(bpe_corpus, vocab_size=400)


def test_char_round_trip_and_vocab():
    tokenizer = CharTokenizer.from_text(TRICKY)
    ids = tokenizer.encode(TRICKY)
    assert ids.dtype == np.int32 and ids.shape == (len(TRICKY),)
    assert tokenizer.vocab_size == len(set(TRICKY))
    assert tokenizer.chars == "".join(sorted(set(TRICKY)))
    assert ids.min() >= 0 and ids.max() == tokenizer.vocab_size - 1
    assert tokenizer.decode(ids) == TRICKY
    assert tokenizer.decode(ids.tolist()) == TRICKY
    assert tokenizer.encode("").shape == (0,)
    assert tokenizer.decode([]) == ""


def test_char_unknown_character_error_names_it():
    tokenizer = CharTokenizer.from_text("abc ")
    with pytest.raises(ValueError, match=r"'é' at position 3.*built from its training corpus"):
        tokenizer.encode("ab é")
    # a code point above every vocabulary entry must be rejected too, not clipped
    with pytest.raises(ValueError, match="'z' at position 0"):
        tokenizer.encode("z")


def test_char_decode_rejects_out_of_range_ids():
    tokenizer = CharTokenizer.from_text("abc")
    with pytest.raises(ValueError, match="token id 3 at position 1 is outside"):
        tokenizer.decode([0, 3])


def test_char_round_trips_one_megabyte():
    text = ("the quick brown fox ~ jumps over the lazy dog\n" * 23_000)[:1_000_000]
    tokenizer = CharTokenizer.from_text(text)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_bpe_vocab_size_is_exactly_as_configured(bpe):
    assert bpe.vocab_size == 400
    ids = bpe.encode("def function(argument): return argument")
    assert ids.dtype == np.int32 and ids.max() < 400
    assert ids.max() >= 256, "no learned merge was used on in-domain text"


def test_bpe_round_trips_any_text(bpe, bpe_corpus):
    for text in (TRICKY, " x", "\n", "", "\x00\x7f\u200b", "Ω≈ç√∫ 𝕏 \ufeffBOM", bpe_corpus):
        assert bpe.decode(bpe.encode(text)) == text, repr(text[:40])


def test_bpe_chunked_encode_matches_whole_text_encode(bpe, bpe_corpus, monkeypatch):
    # encode splits the text to parallelise; forcing tiny chunks must not change the ids.
    whole = bpe._hf.encode(bpe_corpus).ids
    monkeypatch.setattr(tokenizers, "_BPE_CHUNK_CHARS", 1)
    assert len(tokenizers._bpe_chunks(bpe_corpus)) > 100
    assert bpe.encode(bpe_corpus).tolist() == whole


def test_bpe_too_small_corpus_raises():
    with pytest.raises(ValueError, match=r"vocabulary has 25[6-9] tokens instead of .* 512"):
        BPETokenizer.train("ab ab ab", vocab_size=512)
    with pytest.raises(ValueError, match="at least 256"):
        BPETokenizer.train("hello", vocab_size=100)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_save_load_round_trip(kind, bpe_corpus, tmp_path):
    tokenizer = make_tokenizer(kind, bpe_corpus, vocab_size=300)
    path = tmp_path / "tokenizer.json"
    tokenizer.save(path)
    assert json.loads(path.read_text(encoding="utf-8"))["type"] == kind
    loaded = load_tokenizer(path)
    assert type(loaded) is type(tokenizer)
    assert loaded.vocab_size == tokenizer.vocab_size
    np.testing.assert_array_equal(loaded.encode(bpe_corpus), tokenizer.encode(bpe_corpus))
    assert loaded.decode(loaded.encode(TRICKY)) == TRICKY


def test_make_tokenizer_unknown_kind():
    with pytest.raises(ValueError, match=r"unknown tokenizer kind 'word'.*'char', 'bpe'"):
        make_tokenizer("word", "some text")


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer file"):
        load_tokenizer(tmp_path / "missing.json")
    bad_type = tmp_path / "bad_type.json"
    bad_type.write_text('{"type": "sentencepiece"}')
    with pytest.raises(ValueError, match="unknown type 'sentencepiece'"):
        load_tokenizer(bad_type)
    not_json = tmp_path / "not_json.json"
    not_json.write_text("hello")
    with pytest.raises(ValueError, match="not a saved minigpt_jax tokenizer"):
        load_tokenizer(not_json)
    for text, message in [
        ('{"type": "char"}', "saved 'char' tokenizer lacks its 'chars' field"),
        ('{"type": "bpe", "hf_tokenizer": 3}', "saved 'bpe' tokenizer lacks its 'hf_tokenizer'"),
        (
            '{"type": "bpe", "hf_tokenizer": "{}"}',
            "saved 'bpe' tokenizer's 'hf_tokenizer' field cannot",
        ),
    ]:
        fields = tmp_path / "fields.json"
        fields.write_text(text)
        with pytest.raises(ValueError, match=f"{fields}: {message}"):
            load_tokenizer(fields)
