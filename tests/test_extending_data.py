"""A researcher's own data and config, from a folder outside the package: CSV and parquet
corpora in memory and in shards, a file format of their own (docs/extending/'s
my_formats.py), an unknown suffix and a missing column refused before anything is written,
`--config tiny` and a config file that starts from minigpt_jax.configs.tiny (my_config.py).

Every command runs as `python -m minigpt_jax` with the working directory in tmp_path and a
PYTHONPATH that holds the package alone, as a pip install has it: the repository's configs/
is not importable there."""

import csv
import json
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from helpers import extending_files

from minigpt_jax.data import corpus
from minigpt_jax.data.in_memory import prepare_dataset
from minigpt_jax.data.sources import find_sources, load_text
from minigpt_jax.data.tokenizers import TOKENIZERS, load_tokenizer

# The full suite only (`python -m pytest -q`): corpora through the CLI.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# Quotes, commas, a newline inside a cell; csv.writer ends rows with \r\n.
DOCUMENTS = [
    f"row {i}: " + ["plain text", 'a "quoted" word, a comma', "two\nlines", "ends with,"][i % 4]
    for i in range(40)
]
EXPECTED = "\n".join(DOCUMENTS)  # an in-memory corpus joins its documents with "\n"
FAST = [
    "--config.num_steps=2",
    "--config.eval_every=2",
    "--config.checkpoint_every=2",
    "--config.eval_batches=1",
    "--config.model.n_layer=1",
    "--config.model.block_size=8",
    "--progress=false",
]


def doc_file(name: str) -> str:
    """The ```python block of docs/extending/ that opens with `# name`."""
    return extending_files()[name]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    """A PYTHONPATH holding only the package (a link to this checkout's)."""
    folder = tmp_path_factory.mktemp("site")
    (folder / "minigpt_jax").symlink_to(REPO / "minigpt_jax")
    return str(folder)


def cli(cwd: Path, site: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": site}
    return subprocess.run(
        [sys.executable, "-m", "minigpt_jax", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=env,
    )


def train(cwd: Path, site: str, *args: str) -> subprocess.CompletedProcess:
    result = cli(cwd, site, "train", "--workdir", "run", *args, *FAST)  # --config first
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def write_csv(path: Path, documents=DOCUMENTS) -> None:
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)  # lineterminator "\r\n", quotes where a cell needs them
        writer.writerow(["id", "text", "score"])
        for i, text in enumerate(documents):
            writer.writerow([i, text, i / 10])


def write_parquet(path: Path, documents=DOCUMENTS) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"id": list(range(len(documents))), "text": documents})
    pq.write_table(table, path, row_group_size=7)  # several row groups, one stream


def memory_text(workdir: Path) -> tuple[str, str]:
    """(the text of workdir/tokens.npy, the tokenizer's alphabet)."""
    tokenizer = load_tokenizer(workdir / "tokenizer.json")
    return tokenizer.decode(np.load(workdir / "tokens.npy")), tokenizer.chars


def shard_documents(workdir: Path) -> tuple[list[str], str]:
    """(the documents of workdir/shards, split at the end-of-text id; the alphabet)."""
    shards = workdir / "shards"
    manifest = json.loads((shards / "manifest.json").read_text())
    tokenizer = load_tokenizer(shards / "tokenizer.json")
    ids = np.concatenate(
        [np.fromfile(path, manifest["dtype"]) for path in sorted(shards.glob("tokens_*.bin"))]
    )
    ends = np.flatnonzero(ids == tokenizer.eot_id)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [tokenizer.decode(ids[a:b]) for a, b in zip(starts, ends, strict=True)], tokenizer.chars


# ----------------------------------------------------------------------------- through the CLI


def test_csv_corpus_in_memory_with_config_tiny(site, tmp_path):
    """`--config tiny` from a folder outside the repository; every row's cell exactly, no
    quote, \\r or row id the text does not hold."""
    write_csv(tmp_path / "corpus.csv")
    assert b"\r\n" in (tmp_path / "corpus.csv").read_bytes()
    train(
        tmp_path,
        site,
        "--config",
        "tiny",
        "--config.data.corpus=text",
        "--config.data.path=corpus.csv",
    )
    text, alphabet = memory_text(tmp_path / "run")
    assert text == EXPECTED
    assert set(alphabet) == set(EXPECTED) and "\r" not in alphabet
    assert (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_csv_corpus_in_shards_resumes_and_sees_an_edit(site, tmp_path):
    """One document per row in the shards; a second run resumes on the prepared shards, and
    after a row is edited the resume is refused as for any changed data."""
    write_csv(tmp_path / "corpus.csv")
    args = ["--config", "tiny", "--config.data.corpus=text", "--config.data.path=corpus.csv"]
    args += ["--config.data.format=shards"]
    train(tmp_path, site, *args)
    documents, alphabet = shard_documents(tmp_path / "run")
    assert documents == DOCUMENTS
    assert set(alphabet) == set(EXPECTED) and "\r" not in alphabet
    manifest = json.loads((tmp_path / "run" / "shards" / "manifest.json").read_text())
    assert manifest["documents"] == len(DOCUMENTS)

    again = cli(tmp_path, site, "prepare", *args, "--workdir", "run", *FAST)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "shards" / "manifest.json").read_text()) == manifest

    write_csv(tmp_path / "corpus.csv", [d.replace("plain", "plane") for d in DOCUMENTS])
    refused = cli(tmp_path, site, "train", "--workdir", "run", *args, *FAST, "--config.num_steps=4")
    assert refused.returncode != 0
    assert "was trained on other data" in refused.stderr, refused.stderr[-3000:]
    assert "--allow_resume_changes" in refused.stderr


@pytest.mark.parametrize("data_format", ["memory", "shards"])
def test_parquet_corpus(site, tmp_path, data_format):
    write_parquet(tmp_path / "corpus.parquet")
    train(
        tmp_path,
        site,
        "--config",
        "tiny",
        "--config.data.corpus=text",
        "--config.data.path=corpus.parquet",
        f"--config.data.format={data_format}",
    )
    if data_format == "memory":
        assert memory_text(tmp_path / "run")[0] == EXPECTED
    else:
        assert shard_documents(tmp_path / "run")[0] == DOCUMENTS


def test_a_file_format_of_your_own(site, tmp_path):
    """docs' my_formats.py reads .tsv files (module:attr from the working directory), here
    with its own setting data.delimiter overridden; the repository's `--config
    configs/tiny.py` works from this folder too."""
    (tmp_path / "my_formats.py").write_text(doc_file("my_formats.py"))
    rows = ["text;id"] + [f"{d.replace(chr(10), ' ')};{i}" for i, d in enumerate(DOCUMENTS)]
    (tmp_path / "corpus.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    train(
        tmp_path,
        site,
        "--config",
        "configs/tiny.py",
        "--config.data.corpus=text",
        "--config.data.path=corpus.tsv",
        "--config.data.file_format=my_formats:tsv",
        "--config.data.delimiter=;",
    )
    expected = "\n".join(d.replace("\n", " ") for d in DOCUMENTS)
    assert memory_text(tmp_path / "run")[0] == expected


def test_unknown_suffix_is_refused_before_anything_is_written(site, tmp_path):
    (tmp_path / "corpus.tsv").write_text("text\nsome rows\n" * 50)
    result = cli(
        tmp_path,
        site,
        "train",
        "--config",
        "tiny",
        "--workdir",
        "run",
        "--config.data.corpus=text",
        "--config.data.path=corpus.tsv",
    )
    assert result.returncode == 1
    assert "corpus.tsv: no file format reads .tsv" in result.stderr
    assert "known suffixes are .txt, .jsonl, .csv, .parquet" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_missing_column_is_refused_naming_the_columns(site, tmp_path, suffix):
    path = tmp_path / f"corpus{suffix}"
    write_csv(path) if suffix == ".csv" else write_parquet(path)
    result = cli(
        tmp_path,
        site,
        "train",
        "--config",
        "tiny",
        "--workdir",
        "run",
        "--config.data.corpus=text",
        f"--config.data.path=corpus{suffix}",
        "--config.data.text_field=body",
    )
    assert result.returncode == 1
    columns = "'id', 'text', 'score'" if suffix == ".csv" else "'id', 'text'"
    assert f"corpus{suffix} has no column 'body' (its columns: {columns})" in result.stderr
    assert "data.text_field" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_config_file_that_starts_from_the_packaged_tiny(site, tmp_path):
    """docs' my_config.py imports minigpt_jax.configs.tiny where `from configs import tiny`
    cannot be imported."""
    probe = subprocess.run(
        [sys.executable, "-c", "import configs"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": site},
    )
    assert "No module named 'configs'" in probe.stderr
    (tmp_path / "my_config.py").write_text(doc_file("my_config.py"))
    write_csv(tmp_path / "corpus.csv")
    train(tmp_path, site, "--config", "my_config.py")
    assert memory_text(tmp_path / "run")[0] == EXPECTED
    saved = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert saved["step"] == 2


# ----------------------------------------------------------------------------- the reader


def test_csv_details(tmp_path):
    """A UTF-8 BOM, blank lines and a \\r\\n inside a quoted cell (kept: it is the text);
    a short row names its line; invalid UTF-8 names the file."""
    path = tmp_path / "a.csv"
    path.write_bytes(b'\xef\xbb\xbftext,n\r\n"one\r\ntwo",1\r\n\r\nthree,2\r\n')
    assert load_text("text", path) == "one\r\ntwo\nthree"
    path.write_bytes(b"n,text\r\n1,fine\r\n2\r\n")
    with pytest.raises(ValueError, match=r"a.csv, line 3: a row of 1 fields has no 'text'"):
        load_text("text", path)
    path.write_bytes(b"text\r\ncaf\xe9\r\n")
    with pytest.raises(ValueError, match=r"a.csv is not valid UTF-8.*iconv"):
        load_text("text", path)


def test_record_formats_resume_from_a_document_count(tmp_path):
    """A cursor into a .csv file counts its documents: reading from one yields the rest, as
    an interrupted prepare resumes."""
    write_csv(tmp_path / "a.csv")
    sources = find_sources("text", tmp_path / "a.csv")
    pieces = list(corpus.read_pieces(sources, "text"))
    assert [p.text for p in pieces] == DOCUMENTS
    assert pieces[9].cursor == (0, 10) and pieces[-1].cursor == (1, 0)
    rest = list(corpus.read_pieces(sources, "text", pieces[9].cursor))
    assert [p.text for p in rest] == DOCUMENTS[10:]


def test_a_directory_picks_up_every_known_suffix(tmp_path):
    (tmp_path / "a.txt").write_text("one")
    write_csv(tmp_path / "b.csv", ["two", "three"])
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "four"}) + "\n")
    (tmp_path / "notes.md").write_text("not read")
    assert load_text("text", tmp_path) == "one\ntwo\nthree\nfour"
    formats = [s.format.name for s in find_sources("text", tmp_path)]
    assert formats == ["txt", "csv", "jsonl"]


def test_file_format_entries_are_checked():
    """A user entry is a function or a FileFormat; anything else is refused without being
    called, naming the shape."""
    for key, got in (("os:sep", "got str"), ("builtins:input", "got builtin_function")):
        with pytest.raises(
            ValueError,
            match=rf"file_format=.{key}.*must be a function \(path, data\).*{got}.*not called",
        ):
            corpus.FILE_FORMATS.check(key)
    with pytest.raises(ValueError, match=r"not a known file format.*txt, jsonl, csv, parquet"):
        corpus.FILE_FORMATS.check("tsv")


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    write_parquet(tmp_path / "a.parquet")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` now fails
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match=r"a.parquet: reading .parquet files needs pyarrow.*"):
        load_text("text", tmp_path / "a.parquet")
    with pytest.raises(ValueError, match=re.escape("pip install 'minigpt-jax[parquet]'")):
        load_text("text", tmp_path / "a.parquet")


def test_corpus_and_tokenizer_entries_of_your_own(tmp_path, monkeypatch):
    """data.corpus and data.tokenizer take module:attr as the other registries do: a corpus
    is (path, file_format) -> sources, a tokenizer (text, vocab_size, eot) -> Tokenizer."""
    (tmp_path / "my_data.py").write_text(
        "from minigpt_jax.data.corpus import Source\n"
        "from minigpt_jax.data.tokenizers import CharTokenizer\n\n\n"
        "def poem(path, file_format):\n"
        "    return [Source.embedded('poem', 'abcab' * 40)]\n\n\n"
        "def alphabet(text, vocab_size, eot=False):\n"
        "    return CharTokenizer('abcdefgh', eot=eot)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    dataset = prepare_dataset("my_data:poem", None, "my_data:alphabet", 0, 8, tmp_path / "r")
    assert dataset.tokenizer.vocab_size == 8  # the entry's alphabet, not the text's 3 letters
    assert dataset.tokenizer.decode(np.concatenate([dataset.train, dataset.val])) == "abcab" * 40
    again = prepare_dataset("my_data:poem", None, "my_data:alphabet", 0, 8, tmp_path / "r")
    assert again.digest == dataset.digest  # the saved tokenizer is reused on a second start
    with pytest.raises(ValueError, match=r"data.tokenizer='my_data:nothing' names user code"):
        TOKENIZERS.check("my_data:nothing")


def test_a_document_too_long_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    """Issue 40, defect 5: a 256 MB-1 GB CSV row (or .jsonl line) was read whole and encoded,
    driving the process past 7-9 GB. Here with the limit lowered to 1 MiB: a 4 MB row without a
    newline is refused, naming the limit, with no more than about the limit allocated."""
    monkeypatch.setattr(corpus, "MAX_DOCUMENT_BYTES", 1 << 20, raising=False)
    long_text = "word " * 800_000  # 4 MB, no newline
    write_csv(tmp_path / "a.csv", ["short", long_text])
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": long_text}))
    (tmp_path / "c.csv").write_text('text\n"' + "line\n" * 300_000 + '"\n')  # one quoted cell
    for name, what in (
        ("a.csv", "line 3"),
        ("b.jsonl", "the line at byte 0"),
        ("c.csv", "the cell running to line"),
    ):
        tracemalloc.start()
        try:
            with pytest.raises(ValueError, match=rf"{name}: {what}.*longer than 1 MiB.*MAX_DOC"):
                load_text("text", tmp_path / name)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        if name != "c.csv":  # (csv holds a cell's characters 4 bytes each)
            assert peak < 4 << 20, (name, peak)  # the 4 MB document was never held whole


def test_a_dictionary_encoded_parquet_column_is_strings(tmp_path):
    """Issue 40: a categorical (dictionary-encoded) string column was refused as "not strings"."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"text": pa.array(DOCUMENTS).dictionary_encode()})
    pq.write_table(table, tmp_path / "a.parquet")
    assert load_text("text", tmp_path / "a.parquet") == EXPECTED


def test_an_empty_or_truncated_parquet_file_is_named(tmp_path):
    """Issue 40: `ArrowInvalid: Parquet file size is 0 bytes`, in a directory of five files."""
    for i in range(3):
        write_parquet(tmp_path / f"{i}.parquet")
    (tmp_path / "3.parquet").write_bytes(b"")
    whole = (tmp_path / "0.parquet").read_bytes()
    (tmp_path / "4.parquet").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"/3.parquet is not a readable parquet file.*0 bytes"):
        load_text("text", tmp_path)
    (tmp_path / "3.parquet").unlink()
    with pytest.raises(ValueError, match=r"/4.parquet is not a readable parquet file.*truncated"):
        load_text("text", tmp_path)
