"""Sharded corpora: streamed prepare equals one-call encoding, killed prepares resume to the
same shards, stale shards are rebuilt, memory-mapped batches equal in-memory ones, and a run
on shards resumes bit-exactly."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import pydoc_text

from configs import tiny
from minigpt_jax.data import corpus
from minigpt_jax.data.dataset import get_batch
from minigpt_jax.data.shards import encoding, layout, prepare, read, verify
from minigpt_jax.data.sources import DOCUMENT_SEPARATOR, find_sources, load_text
from minigpt_jax.data.tokenizers import GPT2_EOT, BPETokenizer, CharTokenizer, load_tokenizer
from minigpt_jax.train.loop import train_and_evaluate
from minigpt_jax.train.metrics import read_metrics
from minigpt_jax.typed_config import build_experiment

REPO = Path(__file__).resolve().parents[1]
_TEXT = pydoc_text(None)


def _documents():
    """Twelve documents of real text with non-ASCII characters (multi-byte UTF-8)."""
    docs = [_TEXT[i * 3000 : (i + 1) * 3000] for i in range(12)]
    docs[3] = "naïve café — 東京 🙂\n" + docs[3]
    docs[7] = ""  # an empty document still ends with an end-of-text id
    return docs


@pytest.fixture
def corpus_dir(tmp_path):
    """Docs 0-5 as .txt files (a nested folder too), docs 6-11 as the lines of two .jsonl files."""
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    docs = _documents()
    for i in range(4):
        (root / f"a{i}.txt").write_text(docs[i], encoding="utf-8")
    for i in (4, 5):
        (root / "sub" / f"b{i}.txt").write_text(docs[i], encoding="utf-8")
    for name, lines in (("c.jsonl", docs[6:9]), ("d.jsonl", docs[9:])):
        body = "".join(json.dumps({"body": doc, "id": j}) + "\n" for j, doc in enumerate(lines))
        (root / name).write_text(body + "\n", encoding="utf-8")  # a trailing blank line
    return root


def _data_config(path, tokenizer="char", **overrides):
    config = tiny.get_config().data
    config.corpus, config.path, config.format = "text", str(path), "shards"
    config.tokenizer, config.vocab_size, config.text_field = tokenizer, 300, "body"
    config.shard_tokens = 5000
    for key, value in overrides.items():
        config[key] = value
    return config


@pytest.fixture
def small_pieces(monkeypatch):
    """Reads and batches far smaller than a document, so pieces and shards cut mid-document."""
    monkeypatch.setattr(corpus, "_READ_BYTES", 700)
    monkeypatch.setattr(encoding, "BATCH_CHARS", 2500)


def _stream(directory):
    manifest, _, train, val = read.load_shards(directory)
    return manifest, np.concatenate([np.asarray(train), np.asarray(val)])


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_many_files_and_documents_equal_encoding_the_concatenation(
    corpus_dir, tmp_path, small_pieces, kind
):
    manifest = prepare.prepare_shards(tmp_path / "shards", _data_config(corpus_dir, kind))
    tokenizer = load_tokenizer(tmp_path / "shards" / "tokenizer.json")
    docs = _documents()  # in the files' sorted order: a0-a3, c.jsonl, d.jsonl, sub/b4, sub/b5
    ordered = docs[:4] + docs[6:12] + docs[4:6]
    if kind == "bpe":  # BPE encodes the end-of-text text as its id
        expected = tokenizer.encode("".join(doc + GPT2_EOT for doc in ordered))
    else:
        eot = [tokenizer.eot_id]
        expected = np.concatenate([np.append(tokenizer.encode(doc), eot) for doc in ordered])
    _, stream = _stream(tmp_path / "shards")
    np.testing.assert_array_equal(stream, expected)
    assert tokenizer.eot_id == tokenizer.vocab_size - 1
    assert manifest["documents"] == 12 and manifest["tokens"] == len(expected)
    assert manifest["dtype"] == "<u2"
    sizes = [s["tokens"] for s in manifest["shards"]]
    assert sizes[:-1] == [5000] * (len(sizes) - 1) and 0 < sizes[-1] <= 5000
    assert manifest["split"]["train_tokens"] == int(len(expected) * 0.9)
    assert not (tmp_path / "shards" / layout.PROGRESS_FILENAME).exists()


def test_memory_and_shards_read_the_same_documents_of_a_directory(corpus_dir, tmp_path):
    """One reader: data.path=DIR names the same files (nested .txt and .jsonl) in the same order
    and the same documents for data.format "memory" and "shards"; memory joins them with
    DOCUMENT_SEPARATOR where shards put an end-of-text id."""
    (corpus_dir / "notes.md").write_text("neither format reads this", encoding="utf-8")
    manifest = prepare.prepare_shards(tmp_path / "s", _data_config(corpus_dir))
    sources = find_sources("text", corpus_dir)
    assert manifest["inputs"]["files"] == len(sources) == 8
    assert [manifest["inputs"]["first"], manifest["inputs"]["last"]] == [
        sources[0].path,
        sources[-1].path,
    ]
    assert manifest["inputs_fingerprint"] == prepare.inputs_fingerprint(sources)
    _, stream = _stream(tmp_path / "s")
    documents = load_tokenizer(tmp_path / "s" / "tokenizer.json").decode(stream).split(GPT2_EOT)
    assert documents[-1] == "" and len(documents) - 1 == manifest["documents"] == 12
    memory = load_text("text", corpus_dir, "body")
    assert memory == DOCUMENT_SEPARATOR.join(documents[:-1])
    ordered = _documents()[:4] + _documents()[6:12] + _documents()[4:6]
    assert memory == "\n".join(ordered)


def test_bpe_tokenizer_is_trained_on_a_sample(corpus_dir, tmp_path):
    """A 20 kB sample of a 36 kB corpus: the vocabulary differs from training on all of it."""
    config = _data_config(corpus_dir, "bpe", tokenizer_sample_bytes=20_000)
    prepare.prepare_shards(tmp_path / "sampled", config)
    sampled = load_tokenizer(tmp_path / "sampled" / "tokenizer.json")
    whole = BPETokenizer.train("".join(_documents()), 300, eot=True)
    assert sampled.vocab_size == whole.vocab_size == 300
    assert sampled.to_json() != whole.to_json()


def test_token_stream_windows_equal_the_array_across_shard_boundaries():
    tokens = np.random.default_rng(0).integers(0, 60_000, 1000).astype(np.uint16)
    stream = read.TokenStream([tokens[:300], tokens[300:310], tokens[310:]], 5, 990)
    assert len(stream) == 985
    for step in range(5):
        np.testing.assert_array_equal(
            get_batch(stream, 64, 40, seed=1, step=step),
            get_batch(tokens[5:990], 64, 40, seed=1, step=step),
        )


def test_unchanged_inputs_reuse_the_shards_and_changed_ones_rebuild_them(corpus_dir, tmp_path):
    config = _data_config(corpus_dir)
    first = prepare.prepare_shards(tmp_path / "s", config)
    inode = (tmp_path / "s" / "tokens_000000.bin").stat().st_ino
    assert prepare.prepare_shards(tmp_path / "s", config) == first
    assert (tmp_path / "s" / "tokens_000000.bin").stat().st_ino == inode
    (corpus_dir / "a0.txt").write_text("A new first document.", encoding="utf-8")
    second = prepare.prepare_shards(tmp_path / "s", config)
    assert second["inputs_fingerprint"] != first["inputs_fingerprint"]
    assert second["tokens"] < first["tokens"]
    _, stream = _stream(tmp_path / "s")
    tokenizer = load_tokenizer(tmp_path / "s" / "tokenizer.json")
    assert tokenizer.decode(stream[:22]) == "A new first document." + GPT2_EOT


def test_a_start_reads_only_the_shards_whose_stat_changed(corpus_dir, tmp_path):
    """Shards verified once (by the prepare that wrote them, or a start that read them) are not
    read again while their size, mtime, inode and ctime stay as verified.json recorded them; a
    touched shard or one replaced by a copy of itself is read in full (and found good)."""
    directory, config = tmp_path / "s", _data_config(corpus_dir)
    manifest = prepare.prepare_shards(directory, config)
    names = [shard["file"] for shard in manifest["shards"]]
    assert len(names) > 2
    check = verify.verify_shards(directory, manifest)
    assert check.problem is None and check.read == []
    assert check.sha256s == [shard["sha256"] for shard in manifest["shards"]]
    second = directory / names[1]
    os.utime(second, ns=(second.stat().st_atime_ns, second.stat().st_mtime_ns + 10**9))
    check = verify.verify_shards(directory, manifest)
    assert check.problem is None and check.read == [names[1]]
    assert prepare.prepare_shards(directory, config) == manifest  # records the new stat
    assert verify.verify_shards(directory, manifest).read == []
    copy = directory / "copy.bin"
    shutil.copy2(second, copy)  # the same bytes and mtime, another inode
    os.replace(copy, second)
    assert verify.verify_shards(directory, manifest).read == [names[1]]
    stamp = json.loads((directory / layout.VERIFIED_FILENAME).read_text())
    assert sorted(stamp["shards"]) == names
    assert [stamp["shards"][n]["sha256"] for n in names] == [
        s["sha256"] for s in manifest["shards"]
    ]


def test_manifest_counts_the_ids_of_each_split_and_one_id_warns(corpus_dir, tmp_path, caplog):
    """prepare counts the distinct ids of the train and val splits once (manifest.json), and a
    start warns, naming the corpus, when a split holds one id: a text of newlines only trains
    to a loss near 0 that means nothing (issue 22: no warning)."""
    with caplog.at_level("WARNING"):
        dataset = read.sharded_dataset(_data_config(corpus_dir), 16, tmp_path / "a")
    assert "distinct token id" not in caplog.text
    manifest = json.loads((tmp_path / "a" / "shards" / layout.MANIFEST_FILENAME).read_text())
    train, val = np.asarray(dataset.train), np.asarray(dataset.val)
    assert manifest["split"]["train_distinct_ids"] == np.unique(train).size > 60
    assert manifest["split"]["val_distinct_ids"] == np.unique(val).size > 30

    newlines = tmp_path / "newlines.txt"
    newlines.write_text("\n" * 4000, encoding="utf-8")
    with caplog.at_level("WARNING"):
        read.sharded_dataset(_data_config(newlines), 16, tmp_path / "b")
    manifest = json.loads((tmp_path / "b" / "shards" / layout.MANIFEST_FILENAME).read_text())
    assert manifest["split"]["train_distinct_ids"] == 1  # "\n"; val also ends with end-of-text
    assert manifest["split"]["val_distinct_ids"] == 2
    [warning] = [r.getMessage() for r in caplog.records if "distinct token id" in r.getMessage()]
    assert warning.startswith(f"{newlines}: the train split holds 1 distinct token id (of a ")
    assert "vocabulary of 2)" in warning and "check that data.path" in warning


def test_bad_inputs_are_named(corpus_dir, tmp_path):
    (corpus_dir / "c.jsonl").write_text('{"text": "no body field"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"c.jsonl.*'body' field.*data.text_field"):
        prepare.prepare_shards(tmp_path / "s", _data_config(corpus_dir))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prepare.prepare_shards(tmp_path / "s", _data_config(tmp_path / "missing.txt"))
    (tmp_path / "bad.txt").write_bytes(b"ok \xff bad")
    with pytest.raises(ValueError, match="not valid UTF-8"):
        prepare.prepare_shards(tmp_path / "s", _data_config(tmp_path / "bad.txt"))


_KILLER = """
import os, signal, sys
sys.path[:0] = [{repo!r}, {repo!r} + '/tests']
from minigpt_jax.data import corpus
from minigpt_jax.data.shards import encoding, prepare
from tests.test_shards import _data_config
corpus._READ_BYTES, encoding.BATCH_CHARS = 700, 2500
original = encoding.ShardWriter.{hook}
def hooked(self, *args):
    result = original(self, *args)
    if self.written > {after}:
        os.kill(os.getpid(), signal.SIGKILL)  # as abrupt as a power cut: no cleanup runs
    return result
encoding.ShardWriter.{hook} = hooked
prepare.prepare_shards({out!r}, _data_config({corpus!r}, {kind!r}), progress=False)
"""


@pytest.mark.parametrize(
    "kind, hook, after",
    [
        ("char", "_close_shard", 0),  # a shard renamed, its progress not yet recorded
        ("char", "write", 12_000),  # mid-batch, tokens in a .part file past the record
        ("bpe", "write", 7000),
    ],
)
def test_killed_prepare_resumes_to_identical_shards(
    corpus_dir, tmp_path, small_pieces, kind, hook, after
):
    killed = tmp_path / "killed"
    script = textwrap.dedent(_KILLER).format(
        repo=str(REPO), hook=hook, after=after, out=str(killed), corpus=str(corpus_dir), kind=kind
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert not (killed / layout.MANIFEST_FILENAME).exists(), "a manifest over partial shards"
    progress = json.loads((killed / layout.PROGRESS_FILENAME).read_text())
    assert progress["tokens"] > 0
    done = sorted(killed.glob("tokens_*.bin"))
    inodes = {p.name: p.stat().st_ino for p in done if p.stat().st_size == 10_000}

    resumed = prepare.prepare_shards(killed, _data_config(corpus_dir, kind), progress=False)
    fresh = prepare.prepare_shards(tmp_path / "fresh", _data_config(corpus_dir, kind))
    for manifest in (resumed, fresh):
        manifest.pop("prepare_seconds")
    assert resumed == fresh
    for shard in fresh["shards"]:
        name = shard["file"]
        assert (killed / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes()
    for name, inode in inodes.items():  # resumed, not restarted: finished shards were kept
        assert (killed / name).stat().st_ino == inode
    assert sorted(p.name for p in killed.iterdir()) == sorted(
        p.name for p in (tmp_path / "fresh").iterdir()
    )


def test_char_tokenizer_end_of_text_round_trips(tmp_path):
    tokenizer = CharTokenizer.from_text("abc", eot=True)
    assert (tokenizer.vocab_size, tokenizer.eot_id) == (4, 3)
    assert tokenizer.decode([0, 3, 2, 3]) == "a" + GPT2_EOT + "c" + GPT2_EOT
    tokenizer.save(tmp_path / "t.json")
    assert load_tokenizer(tmp_path / "t.json").eot_id == 3
    assert CharTokenizer.from_text("abc").eot_id is None
    assert '"eot"' not in CharTokenizer.from_text("abc").to_json()  # old files unchanged


# ----------------------------------------------------------------------------- training


def _run_config(corpus_dir, **overrides):
    config = tiny.get_config()
    config.data = _data_config(corpus_dir, shard_tokens=3000)
    config.num_steps, config.eval_every, config.checkpoint_every = 20, 10, 10
    for key, value in overrides.items():
        config[key] = value
    return config


@pytest.mark.slow
def test_run_on_shards_resumes_bit_exactly(corpus_dir, tmp_path):
    full = train_and_evaluate(
        build_experiment(_run_config(corpus_dir)), tmp_path / "full", progress=False
    )
    train_and_evaluate(
        build_experiment(_run_config(corpus_dir)), tmp_path / "resumed", progress=False, stop_at=10
    )
    resumed = train_and_evaluate(
        build_experiment(_run_config(corpus_dir)), tmp_path / "resumed", progress=False
    )
    assert resumed.resumed_from == 10
    assert (tmp_path / "full" / "shards" / layout.MANIFEST_FILENAME).exists()
    losses = [
        [r["train_loss"] for r in read_metrics(tmp_path / run) if "train_loss" in r]
        for run in ("full", "resumed")
    ]
    assert len(losses[0]) == 20 and losses[0] == losses[1]
    assert resumed.val_loss == full.val_loss
    assert load_tokenizer(tmp_path / "full" / "tokenizer.json").eot_id is not None


def test_memory_format_workdir_is_refused_by_a_shards_run(corpus_dir, tmp_path):
    config = _run_config(corpus_dir)
    CharTokenizer.from_text(_TEXT).save(tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match="no end-of-text id.*fresh workdir"):
        train_and_evaluate(build_experiment(config), tmp_path, progress=False)


def test_prepare_command_writes_the_shards(corpus_dir, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-m", "minigpt_jax", "prepare", "--config", str(REPO / "configs/tiny.py")]
        + [f"--workdir={tmp_path / 'run'}", "--config.data.corpus=text", "--progress=false"]
        + [f"--config.data.path={corpus_dir}/*.txt", "--config.data.format=shards"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    manifest = json.loads((tmp_path / "run" / "shards" / "manifest.json").read_text())
    assert manifest["inputs"]["files"] == 4 and manifest["documents"] == 4
    assert f"{manifest['tokens']:,} tokens" in result.stdout


# ----------------------------------------------------------------------------- damage, two writers


def _flip(path: Path, start: int, new: bytes) -> None:
    """Overwrites bytes of `path` from `start`, keeping its size and mtime."""
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[start : start + len(new)] = new
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.mark.parametrize(
    "damage, problem",
    [
        ("flipped", "does not match its sha256 in manifest.json"),
        ("valid ids", "does not match its sha256 in manifest.json"),
        ("out of range", "does not match its sha256 in manifest.json"),
        ("out of range, no digest", "holds id 65535, outside the tokenizer's"),
    ],
)
def test_damaged_shard_is_caught_before_training(corpus_dir, tmp_path, caplog, damage, problem):
    """A shard with flipped bytes, or overwritten with other valid ids or with ids beyond the
    vocabulary (same size, same mtime), is found when a run starts and prepared again (issue:
    trained on silently, or NaN with "lower optim.lr")."""
    config, workdir = _data_config(corpus_dir), tmp_path / "run"
    good = np.asarray(read.sharded_dataset(config, 16, workdir, progress=False).train)
    vocab_size = load_tokenizer(workdir / "tokenizer.json").vocab_size
    directory = workdir / "shards"
    assert (directory / layout.VERIFIED_FILENAME).exists()  # caught although recorded verified
    manifest = json.loads((directory / layout.MANIFEST_FILENAME).read_text())
    shard = directory / manifest["shards"][1]["file"]
    original = shard.read_bytes()
    rng = np.random.default_rng(0)
    if damage == "flipped":
        _flip(shard, 100, bytes(b ^ 0xFF for b in original[100:164]))
    elif damage == "valid ids":
        ids = rng.integers(0, vocab_size, len(original) // 2).astype("<u2")
        _flip(shard, 0, ids.tobytes())
    else:
        _flip(shard, 200, np.full(8, 65535, "<u2").tobytes())
        if damage.endswith("no digest"):  # a manifest of an older version
            for entry in manifest["shards"]:
                del entry["sha256"]
            (directory / layout.MANIFEST_FILENAME).write_text(json.dumps(manifest))
    with caplog.at_level("WARNING"):
        again = read.sharded_dataset(config, 16, workdir, progress=False)
    assert problem in caplog.text and "preparing the shards of" in caplog.text
    assert shard.read_bytes() == original
    np.testing.assert_array_equal(np.asarray(again.train), good)


_SLOW_PREPARE = """
import sys, time
sys.path[:0] = [{repo!r}, {repo!r} + '/tests']
from minigpt_jax.data.shards import encoding, prepare
from tests.test_shards import _data_config
encoding.BATCH_CHARS = 2500
flush = encoding.EncodingPass.flush
def slow_flush(self):
    flush(self)
    time.sleep(0.05)
encoding.EncodingPass.flush = slow_flush
prepare.prepare_shards({out!r}, _data_config({corpus!r}), progress=False)
print("prepared")
"""


def test_second_prepare_of_a_directory_is_refused(corpus_dir, tmp_path):
    """Two prepares in one shards directory (issue: a manifest over shards of the wrong sizes):
    the second, here `minigpt-jax prepare` while the first is mid-way, is refused naming the
    first; the first finishes, and its shards equal those of a prepare on its own."""
    directory = tmp_path / "run" / "shards"
    script = _SLOW_PREPARE.format(repo=str(REPO), out=str(directory), corpus=str(corpus_dir))
    first = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        while not (directory / layout.PROGRESS_FILENAME).exists():
            assert first.poll() is None, first.communicate()
        first.send_signal(signal.SIGSTOP)  # mid-way, holding the lock
        second = subprocess.run(
            [sys.executable, "-m", "minigpt_jax", "prepare", "--progress=false"]
            + ["--config", str(REPO / "configs/tiny.py"), f"--workdir={tmp_path / 'run'}"]
            + ["--config.data.corpus=text", f"--config.data.path={corpus_dir}"]
            + ["--config.data.format=shards", "--config.data.text_field=body"]
            + ["--config.data.vocab_size=300", "--config.data.shard_tokens=5000"],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
    finally:
        first.send_signal(signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 0 and stdout.strip() == "prepared", stderr[-2000:]
    assert second.returncode == 1
    assert second.stderr.strip().splitlines() == [
        f"minigpt-jax prepare: error: {directory} is being prepared by another process (PID "
        f"{first.pid} on host {os.uname().nodename}, holding {directory / 'prepare.lock'}); "
        "wait for it to finish, then rerun: shards are prepared once and shared."
    ]
    fresh = prepare.prepare_shards(tmp_path / "fresh", _data_config(corpus_dir), progress=False)
    for entry in fresh["shards"]:
        name = entry["file"]
        assert (directory / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes()
    rerun = prepare.prepare_shards(directory, _data_config(corpus_dir), progress=False)
    assert rerun["shards"] == fresh["shards"]
