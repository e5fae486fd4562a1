"""Tests for minigpt_jax.data.sources, in_memory and dataset: corpus loading, token cache, split
and deterministic batches.

No test touches the network: every path that could download replaces sources._download.
"""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from minigpt_jax.data import sources
from minigpt_jax.data.dataset import get_batch, split_tokens
from minigpt_jax.data.in_memory import encode_cached, prepare_dataset
from minigpt_jax.data.sources import (
    DATA_DIR_ENV,
    DOCUMENT_SEPARATOR,
    SHAKESPEARE_FILENAME,
    SHAKESPEARE_URL,
    find_sources,
    load_text,
)
from minigpt_jax.data.tokenizers import CharTokenizer, load_tokenizer

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
REAL_SHAKESPEARE = SHARED_DATA / SHAKESPEARE_FILENAME


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """Isolates env and cache dir, and makes any download attempt fail like being offline."""

    def fail_download(url, dest):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(sources, "_download", fail_download)
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg_cache"))


# ---------------------------------------------------------------------------------------------
# load_text


def test_pydoc_is_offline_and_large():
    text = load_text("pydoc")
    assert len(text) > 300_000
    assert text.startswith('The "assert" statement')
    assert text == load_text("pydoc"), "pydoc text must be deterministic"


@pytest.mark.skipif(not REAL_SHAKESPEARE.is_file(), reason=f"{REAL_SHAKESPEARE} not present")
def test_shakespeare_found_via_env_var(monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, str(SHARED_DATA))
    text = load_text("shakespeare")
    assert len(text) == 1_115_394
    assert text.startswith("First Citizen:")
    tokenizer = CharTokenizer.from_text(text)
    assert tokenizer.vocab_size == 65
    train, val = split_tokens(tokenizer.encode(text))
    assert (len(train), len(val)) == (1_003_854, 111_540)


def _fake_shakespeare(monkeypatch, content: bytes) -> None:
    """Makes `content` the canonical Tiny Shakespeare as far as the checksum goes."""
    monkeypatch.setattr(sources, "SHAKESPEARE_SHA256", hashlib.sha256(content).hexdigest())


def test_shakespeare_lookup_order(monkeypatch, tmp_path):
    content = b"To be, or not to be\n"
    _fake_shakespeare(monkeypatch, content)
    explicit_file = tmp_path / "explicit.txt"
    explicit_file.write_bytes(content)
    assert load_text("shakespeare", explicit_file) == content.decode()
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    (env_dir / SHAKESPEARE_FILENAME).write_bytes(content)
    monkeypatch.setenv(DATA_DIR_ENV, str(env_dir))
    assert load_text("shakespeare") == content.decode()
    # a path that does not hold the file falls through to the next location
    assert load_text("shakespeare", tmp_path / "nowhere") == content.decode()


def test_shakespeare_download_goes_to_cache_atomically(monkeypatch, tmp_path):
    content = b"Now is the winter of our discontent\n"
    _fake_shakespeare(monkeypatch, content)
    calls = []

    def fake_download(url, dest):
        calls.append(url)
        assert dest.parent == tmp_path / "xdg_cache" / "minigpt_jax"
        assert dest.name != SHAKESPEARE_FILENAME, "must download to a temporary file"
        dest.write_bytes(content)

    monkeypatch.setattr(sources, "_download", fake_download)
    assert load_text("shakespeare") == content.decode()
    assert load_text("shakespeare") == content.decode()
    assert calls == [SHAKESPEARE_URL], "second load must use the cache"
    assert [p.name for p in (tmp_path / "xdg_cache" / "minigpt_jax").iterdir()] == [
        SHAKESPEARE_FILENAME
    ]


def test_shakespeare_corrupt_download_is_not_cached(monkeypatch, tmp_path):
    monkeypatch.setattr(sources, "_download", lambda url, dest: dest.write_bytes(b"<html>"))
    with pytest.raises(ValueError, match="not the canonical Tiny Shakespeare"):
        load_text("shakespeare")
    assert list((tmp_path / "xdg_cache" / "minigpt_jax").iterdir()) == []


def test_shakespeare_missing_offline_says_where_to_put_it(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        load_text("shakespeare", tmp_path / "nowhere")
    message = str(error.value)
    assert DATA_DIR_ENV in message
    assert str(tmp_path / "nowhere") in message
    assert str(tmp_path / "xdg_cache" / "minigpt_jax" / SHAKESPEARE_FILENAME) in message
    assert "network disabled in tests" in message


def test_shakespeare_checksum_mismatch(monkeypatch, tmp_path):
    (tmp_path / SHAKESPEARE_FILENAME).write_text("Not Shakespeare at all\n")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(ValueError, match=r"sha256 [0-9a-f]{64}, expected 86c4e6aa"):
        load_text("shakespeare")


def test_text_file_and_directory(tmp_path):
    (tmp_path / "b.txt").write_text("second\n", encoding="utf-8")
    (tmp_path / "a.txt").write_text("first ünïcode", encoding="utf-8")
    (tmp_path / "ignored.md").write_text("not text")
    assert load_text("text", tmp_path / "a.txt") == "first ünïcode"
    assert load_text("text", tmp_path) == "first ünïcode\nsecond\n"
    with pytest.raises(ValueError, match=r"ignored.md: no file format reads .md; the known suffix"):
        load_text("text", tmp_path / "ignored.md")  # never read as raw text (issue 26)
    assert load_text("text", tmp_path / "ignored.md", file_format="txt") == "not text"
    in_path_order = "first ünïcode\nsecond\n\nnot text"
    assert load_text("text", tmp_path, file_format="txt") == in_path_order


def test_directory_reads_nested_txt_and_jsonl_documents_in_path_order(tmp_path):
    """Every .txt/.jsonl below the directory, sorted by path; a .jsonl line is one document
    (blank lines skipped); documents joined with DOCUMENT_SEPARATOR."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("one", encoding="utf-8")
    (tmp_path / "b.jsonl").write_text(
        json.dumps({"body": "two", "id": 0}) + "\n\n" + json.dumps({"body": "three"}) + "\n",
        encoding="utf-8",
    )
    (tmp_path / "sub" / "c.txt").write_text("four", encoding="utf-8")
    assert DOCUMENT_SEPARATOR == "\n"
    assert load_text("text", tmp_path, "body") == "one\ntwo\nthree\nfour"
    assert load_text("text", str(tmp_path / "*.jsonl"), "body") == "two\nthree"
    with pytest.raises(ValueError, match=r"b.jsonl.*'text' field.*data.text_field"):
        load_text("text", tmp_path)


def test_a_directory_named_like_a_glob_is_that_directory(tmp_path):
    """runs[1] exists, so it is read as a path; runs[0-9]/*.txt, which does not, is a
    pattern (matching runs1/decoy.txt)."""
    (tmp_path / "runs[1]").mkdir()
    (tmp_path / "runs[1]" / "mine.txt").write_text("mine", encoding="utf-8")
    (tmp_path / "runs1").mkdir()  # what the pattern "runs[1]" would match
    (tmp_path / "runs1" / "decoy.txt").write_text("decoy", encoding="utf-8")
    assert load_text("text", tmp_path / "runs[1]") == "mine"
    assert load_text("text", tmp_path / "runs[1]" / "mine.txt") == "mine"
    assert load_text("text", tmp_path / "runs[0-9]" / "*.txt") == "decoy"
    found = find_sources("text", tmp_path / "runs[1]")
    assert [Path(s.path).name for s in found] == ["mine.txt"]


def test_text_errors(tmp_path):
    with pytest.raises(ValueError, match="needs a path"):
        load_text("text")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_text("text", tmp_path / "missing.txt")
    with pytest.raises(ValueError, match=r"names no .txt, .jsonl, .csv, .parquet files"):
        load_text("text", tmp_path)
    with pytest.raises(ValueError, match=r"names no .txt, .jsonl, .csv, .parquet files"):
        load_text("text", str(tmp_path / "*.txt"))
    (tmp_path / "notes.md").write_text("a note")
    with pytest.raises(ValueError, match=r"notes.md: no file format reads .md.*data.file_format"):
        load_text("text", str(tmp_path / "notes.*"))


def test_non_utf8_file_names_file_and_offset(tmp_path):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café au lait".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.txt is not valid UTF-8 .*offset 3.*convert"):
        load_text("text", latin1)


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty"):
        load_text("text", empty)


def test_unknown_corpus_and_pydoc_with_path():
    unknown = r"data.corpus='wiki' is not a known corpus kind.*pydoc, shakespeare, text"
    with pytest.raises(ValueError, match=unknown):
        load_text("wiki")
    with pytest.raises(ValueError, match="takes no path"):
        load_text("pydoc", "some/file.txt")


# ---------------------------------------------------------------------------------------------
# encode_cached


def test_encode_cache_reuses_and_rebuilds(tmp_path, monkeypatch):
    text = "hello world, hello cache"
    tokenizer = CharTokenizer.from_text(text + "!")
    cache = tmp_path / "cache" / "tokens.npy"
    first = encode_cached(text, tokenizer, cache)
    assert first.dtype == np.uint16
    np.testing.assert_array_equal(first, tokenizer.encode(text))
    assert cache.is_file()

    real_encode = tokenizer.encode

    def must_not_encode(_):
        raise AssertionError("cache hit expected")

    monkeypatch.setattr(tokenizer, "encode", must_not_encode)
    np.testing.assert_array_equal(encode_cached(text, tokenizer, cache), first)

    monkeypatch.setattr(tokenizer, "encode", real_encode)
    changed = encode_cached(text + "!", tokenizer, cache)
    np.testing.assert_array_equal(changed, tokenizer.encode(text + "!"))
    np.testing.assert_array_equal(np.load(cache), changed)


def test_encode_cache_rebuilds_for_a_different_tokenizer_or_corrupt_file(tmp_path):
    text = "abcabc"
    cache = tmp_path / "tokens.npy"
    encode_cached(text, CharTokenizer.from_text(text), cache)
    other = CharTokenizer.from_text(text + "0")  # shifts every id by one
    np.testing.assert_array_equal(encode_cached(text, other, cache), other.encode(text))
    cache.write_bytes(b"garbage")
    np.testing.assert_array_equal(encode_cached(text, other, cache), other.encode(text))


def test_encode_cache_rejects_vocab_beyond_uint16():
    class HugeVocab:
        vocab_size = 70_000

    with pytest.raises(ValueError, match="does not fit the uint16"):
        encode_cached("text", HugeVocab(), None)


# ---------------------------------------------------------------------------------------------
# split_tokens and get_batch


def test_split_is_contiguous_first_train_then_val():
    train, val = split_tokens(np.arange(100), val_fraction=0.1)
    np.testing.assert_array_equal(train, np.arange(90))
    np.testing.assert_array_equal(val, np.arange(90, 100))
    with pytest.raises(ValueError, match="val_fraction"):
        split_tokens(np.arange(10), val_fraction=1.0)


def test_batches_are_deterministic_in_seed_step_and_split():
    tokens = np.arange(1000, dtype=np.uint16)
    batch = get_batch(tokens, 8, 16, seed=0, step=5)
    assert batch.shape == (8, 17) and batch.dtype == np.int32
    np.testing.assert_array_equal(batch, get_batch(tokens, 8, 16, seed=0, step=5))
    for other in (
        get_batch(tokens, 8, 16, seed=0, step=6),
        get_batch(tokens, 8, 16, seed=1, step=5),
        get_batch(tokens, 8, 16, seed=0, step=5, split="val"),
    ):
        assert not np.array_equal(batch, other)


def test_windows_stay_inside_their_split_and_targets_shift_by_one():
    train, val = split_tokens(np.arange(500, dtype=np.uint16))
    for split, tokens, (low, high) in (("train", train, (0, 450)), ("val", val, (450, 500))):
        for step in range(20):
            batch = get_batch(tokens, 16, 24, seed=3, step=step, split=split)
            # tokens are their own positions, so a contiguous window is an arithmetic run
            np.testing.assert_array_equal(np.diff(batch, axis=1), 1)
            assert batch.min() >= low and batch.max() < high
            inputs, targets = batch[:, :-1], batch[:, 1:]
            np.testing.assert_array_equal(targets, inputs + 1)
    # a split exactly one window long can only yield that window
    exact = get_batch(np.arange(10), 4, 9, seed=0, step=0)
    np.testing.assert_array_equal(exact, np.tile(np.arange(10), (4, 1)))


def test_batch_argument_errors():
    tokens = np.arange(50)
    with pytest.raises(ValueError, match=r"'val' split has 50 tokens .* 65.*smaller block_size"):
        get_batch(tokens, 2, 64, seed=0, step=0, split="val")
    with pytest.raises(ValueError, match="unknown split 'test'"):
        get_batch(tokens, 2, 8, seed=0, step=0, split="test")
    with pytest.raises(ValueError, match="step must be an integer >= 0"):
        get_batch(tokens, 2, 8, seed=0, step=-1)


# ---------------------------------------------------------------------------------------------
# prepare_dataset


def _write_corpus(tmp_path, text: str) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    return path


def test_prepare_dataset_writes_and_reuses_workdir(tmp_path):
    corpus = _write_corpus(tmp_path, "the cat sat on the mat. " * 40)
    workdir = tmp_path / "run"
    dataset = prepare_dataset("text", corpus, "char", 512, 8, workdir)
    assert (workdir / "tokenizer.json").is_file() and (workdir / "tokens.npy").is_file()
    assert len(dataset.train) + len(dataset.val) == 960
    assert dataset.train.dtype == np.uint16
    assert dataset.tokenizer.decode(dataset.train[:8]) == "the cat "

    # a resumed run keeps the saved vocabulary even if the corpus has grown new characters
    corpus.write_text(corpus.read_text() + "the cat sat.", encoding="utf-8")
    resumed = prepare_dataset("text", corpus, "char", 512, 8, workdir)
    assert resumed.tokenizer.chars == dataset.tokenizer.chars
    assert resumed.tokenizer.chars == load_tokenizer(workdir / "tokenizer.json").chars

    with pytest.raises(ValueError, match="holds a 'char' tokenizer.*fresh workdir"):
        prepare_dataset("text", corpus, "bpe", 300, 8, workdir)


def test_prepare_dataset_without_workdir_writes_nothing(tmp_path):
    corpus = _write_corpus(tmp_path, "abcdefgh" * 50)
    dataset = prepare_dataset("text", corpus, "char", 512, 16, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]
    assert get_batch(dataset.val, 2, 16, seed=0, step=0, split="val").shape == (2, 17)


def test_prepare_dataset_corpus_too_short_for_one_batch(tmp_path):
    corpus = _write_corpus(tmp_path, "a short corpus of a few dozen characters")
    with pytest.raises(ValueError, match=r"'val' split has 4 tokens .*smaller block_size"):
        prepare_dataset("text", corpus, "char", 512, 16, None)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_a_split_of_one_token_id_warns_naming_the_corpus(tmp_path, caplog):
    """One repeated character trains a model to a loss of 0 that means nothing (issue 22: no
    warning); a val split of one id (the text ends in a long run of one character) warns for
    that split alone; real text does not warn."""
    repeated = _write_corpus(tmp_path, "a" * 4000)
    with caplog.at_level("WARNING"):
        prepare_dataset("text", repeated, "char", 512, 8, None)
    [warning] = _warnings(caplog)
    assert warning.startswith(f"{repeated.resolve()}: the train split holds 1 distinct token id,")
    assert "the val split holds 1 distinct token id (of a vocabulary of 1)" in warning
    assert "check that data.path names the corpus you mean" in warning

    caplog.clear()
    ending = _write_corpus(tmp_path, "the cat sat on the mat. " * 40 + "z" * 200)
    with caplog.at_level("WARNING"):
        prepare_dataset("text", ending, "char", 512, 8, None)
    [warning] = _warnings(caplog)
    assert ": the val split holds 1 distinct token id (of a vocabulary of 12)" in warning
    assert "train split" not in warning

    caplog.clear()
    with caplog.at_level("WARNING"):
        prepare_dataset("text", _write_corpus(tmp_path, "the cat sat. " * 90), "char", 0, 8, None)
    assert _warnings(caplog) == []
