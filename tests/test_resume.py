"""Resuming on other data: a checkpoint records the digest of the token stream it trained on; a
resume on another stream is refused before any file changes, in memory and in shards; a restored
or touched input resumes (shards kept, not encoded again); --allow_resume_changes continues on
the new stream with the best val loss started afresh."""

import math
import random
from pathlib import Path

import pytest
from helpers import pydoc_text, snapshot, tiny_config

from minigpt_jax.runtime.checkpoint import load_params
from minigpt_jax.train.loop import train_and_evaluate
from minigpt_jax.train.metrics import read_metrics
from minigpt_jax.train.resume import check_resume_data
from minigpt_jax.typed_config import build_experiment

# The full suite only (`python -m pytest -q`): whole runs resumed on other data.
pytestmark = pytest.mark.slow

TEXT = pydoc_text(20_000)


def _config(corpus: Path, data_format: str, num_steps: int):
    return tiny_config(
        corpus,
        num_steps=num_steps,
        eval_every=4,
        checkpoint_every=4,
        **{"data.format": data_format, "data.shard_tokens": 3000},
    )


def _train(corpus, data_format, workdir, num_steps, **kwargs):
    config = _config(corpus, data_format, num_steps)
    return train_and_evaluate(build_experiment(config), workdir, progress=False, **kwargs)


def _shard_inodes(workdir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in (workdir / "shards").glob("tokens_*.bin")}


@pytest.mark.parametrize("data_format", ["memory", "shards"])
def test_a_resume_on_other_data_is_refused_and_changes_nothing(tmp_path, caplog, data_format):
    """Issue 22: text appended after a checkpoint re-encoded the tokens (or rebuilt the shards)
    and the run resumed silently on the new stream, keeping the old split's best val loss."""
    corpus, workdir = tmp_path / "corpus.txt", tmp_path / "run"
    corpus.write_text(TEXT, encoding="utf-8")
    _train(corpus, data_format, workdir, 8)
    inodes = _shard_inodes(workdir)
    # Characters of the same alphabet drawn uniformly: no model's loss on them is below
    # log(alphabet size), above the old best (so a best carried over would stay the best).
    alphabet = sorted(set(TEXT))
    noise = "".join(random.Random(0).choices(alphabet, k=len(TEXT)))
    corpus.write_text(TEXT + noise, encoding="utf-8")

    before = snapshot(workdir)
    with pytest.raises(ValueError) as refused:
        _train(corpus, data_format, workdir, 12)
    message = str(refused.value)
    assert message.startswith(
        f"{workdir / 'checkpoints' / '8'} was trained on other data (the token stream of "
        f"data.path={corpus}: "
    )
    eot = int(data_format == "shards")  # char ids, and shards end a document with end-of-text
    assert f": {len(TEXT) + eot:,} tokens, sha256 " in message
    assert f" -> {2 * len(TEXT) + eot:,} tokens, sha256 " in message
    assert "Restore the input, use a fresh --workdir, or pass --allow_resume_changes" in message
    assert snapshot(workdir) == before

    corpus.write_text(TEXT, encoding="utf-8")  # restored: the same text, a new mtime
    restored = _train(corpus, data_format, workdir, 12)
    assert restored.resumed_from == 8 and restored.step == 12
    assert _shard_inodes(workdir) == inodes  # shards kept, not encoded again

    corpus.write_text(TEXT + noise, encoding="utf-8")
    with caplog.at_level("WARNING"):
        changed = _train(corpus, data_format, workdir, 16, allow_resume_changes=True)
    assert "resuming step 12 on other data (the token stream of data.path=" in caplog.text
    assert "the best val loss so far" in caplog.text and "starts afresh" in caplog.text
    [new_val] = [
        r["val_loss"] for r in read_metrics(workdir) if r["step"] == 16 and "val_loss" in r
    ]
    assert new_val > math.log(len(alphabet)) - 0.05 > restored.best_val_loss
    assert changed.best_val_loss == new_val
    _, best_meta = load_params(workdir, "best")
    assert best_meta["val_loss"] == new_val
    # The new checkpoints record the new stream: the next resume needs no permission.
    assert _train(corpus, data_format, workdir, 20).resumed_from == 16


def test_a_checkpoint_without_a_data_digest_is_not_compared():
    """Checkpoints written before digests were recorded resume (tests/test_old_runs.py runs
    one); the same digest passes; another is refused, or returned when allowed."""
    now = {"format": "memory", "tokens": 40, "sha256": "ab" * 32}
    assert check_resume_data(None, now, "ckpt", where="data.path=x") is None
    assert check_resume_data(dict(now), now, "ckpt", where="data.path=x") is None
    before = {**now, "tokens": 30, "sha256": "cd" * 32}
    with pytest.raises(ValueError, match=r"ckpt was trained on other data \(the token stream of "):
        check_resume_data(before, now, "ckpt", where="data.path=x")
    change = check_resume_data(before, now, "ckpt", where="data.path=x", allow_changes=True)
    assert change == (
        "the token stream of data.path=x: 30 tokens, sha256 cdcdcdcdcdcd -> 40 tokens, "
        "sha256 abababababab"
    )


def test_a_resume_checks_its_settings_and_memory_once(corpus_file, tmp_path, monkeypatch):
    """Issue 49, item 4: a resume checked its settings twice (with the saved vocabulary before
    the data was read, then with the data's) and the memory twice (a placeholder vocabulary,
    then the real one). Now the saved vocabulary is the one checked first and, the data's
    being the same, each check runs once and the model config is the one checked."""
    from minigpt_jax.train import setup

    workdir = tmp_path / "run"
    train_and_evaluate(
        build_experiment(tiny_config(corpus_file, num_steps=2, eval_every=2)), workdir
    )
    calls = {"_check_resume": [], "_check_memory": []}
    for name, seen in calls.items():
        real = getattr(setup, name)
        monkeypatch.setattr(
            setup, name, lambda *args, real=real, seen=seen: seen.append(args) or real(*args)
        )
    train_and_evaluate(
        build_experiment(tiny_config(corpus_file, num_steps=4, eval_every=2)), workdir
    )
    assert read_metrics(workdir)[-1]["step"] == 4
    (resume_args,) = calls["_check_resume"]
    (memory_args,) = calls["_check_memory"]
    assert resume_args[1].vocab_size == memory_args[3].vocab_size > 1  # the saved vocabulary
