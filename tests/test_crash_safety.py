"""Crash safety: runs killed at any moment resume bit-identically; damage is found, never trusted.

The fault-injection tests run `python -m minigpt_jax train` in subprocesses and SIGKILL them at
chosen and random moments (inside orbax saves among them); the others recreate each crash window
and each kind of damage in a copy of one uninterrupted run and check its error or fallback.
"""

import errno
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import chex
import jax
import numpy as np
import pytest
from helpers import (
    REPO,
    crash_config,
    crash_train_args,
    largest_file,
    resume,
    run,
    snapshot,
    steps,
    train_args,
    trajectory,
)

from minigpt_jax.data import in_memory
from minigpt_jax.data.tokenizers import CharTokenizer
from minigpt_jax.runtime.checkpoint import CheckpointError, load_params
from minigpt_jax.runtime.locks import RunDirectoryInUse, RunLock
from minigpt_jax.train.loop import train_and_evaluate
from minigpt_jax.train.metrics import read_metrics
from minigpt_jax.train.resume import check_resume
from minigpt_jax.typed_config import build_experiment

# The full suite only (`python -m pytest -q`): runs killed and signalled in subprocesses.
pytestmark = pytest.mark.slow

# The corpus_file, reference and copy_of fixtures: conftest.py.


# ----------------------------------------------------------------------------- fault injection


def _saving(directory: Path) -> bool:
    """Whether orbax is writing a step there (its temporary directory exists)."""
    return directory.is_dir() and any("tmp" in p.name for p in os.scandir(directory))


def _kill_when(args, trigger, deadline_s=240.0) -> bool:
    """Starts `args` and SIGKILLs it as soon as trigger() holds; False if it finished first."""
    process = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    deadline = time.monotonic() + deadline_s
    while process.poll() is None and time.monotonic() < deadline:
        if trigger():
            process.send_signal(signal.SIGKILL)
            process.wait()
            return True
        time.sleep(0.001)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    return False


@pytest.mark.slow
def test_random_sigkills_resume_bit_identically(reference, corpus_file, tmp_path):
    """Killed inside a save of checkpoints/ or best/, and at random moments, again and again:
    every rerun of the same command resumes, and the finished run's metrics equal those of
    the uninterrupted one bit for bit."""
    workdir = tmp_path / "run"
    args = crash_train_args(workdir, corpus_file)
    rng = random.Random(0)

    def after_a_new_checkpoint(delay_s):
        """Fires delay_s after the first checkpoint that this run itself completes."""
        seen = {"before": None, "at": None}

        def trigger():
            done = set((workdir / "checkpoints").glob("*/sha256sums.txt"))
            if seen["before"] is None:
                seen["before"] = done
            elif seen["at"] is None and done - seen["before"]:
                seen["at"] = time.monotonic()
            return seen["at"] is not None and time.monotonic() - seen["at"] >= delay_s

        return trigger

    kills = [
        lambda: _saving(workdir / "checkpoints"),  # inside the first save
        lambda: _saving(workdir / "best"),
        lambda: _saving(workdir / "checkpoints") or _saving(workdir / "best"),
        after_a_new_checkpoint(rng.uniform(0.0, 0.3)),
        after_a_new_checkpoint(rng.uniform(0.0, 0.3)),
    ]
    killed = sum(_kill_when(args, trigger) for trigger in kills)
    assert killed >= 3, f"only {killed} of {len(kills)} kills landed before the run finished"
    result = run(args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith("step 40:")
    assert trajectory(workdir) == trajectory(reference)


@pytest.mark.slow
def test_second_trainer_fails_at_once_naming_the_holder(corpus_file, tmp_path):
    """The run directory lock: a live holder is named; a SIGKILLed one leaves no stale lock."""
    workdir = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from minigpt_jax.runtime.locks import RunLock\n"
            "with RunLock(sys.argv[1]):\n    print('locked', flush=True); time.sleep(600)",
            str(workdir),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert holder.stdout.readline().strip() == "locked"
    result = run(crash_train_args(workdir, corpus_file))
    assert result.returncode != 0
    assert f"in use by another trainer (PID {holder.pid} on host" in result.stderr
    assert not (workdir / "metrics.jsonl").exists()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with RunLock(workdir):  # the OS released it with the process
        pass


def test_lock_refuses_a_second_holder_in_the_same_process(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunDirectoryInUse, match=rf"PID {os.getpid()} on host"):
            with RunLock(tmp_path):
                pass
    with RunLock(tmp_path):
        pass


# ----------------------------------------------------------------------------- signals

# The CLI with a signal sent to itself at a chosen moment: while the eval step's `at`-th batch
# is computed (the handler runs when it returns, as for a signal from outside), or while XLA
# compiles the train chunk.
_SIGNALLER = """
import os, signal, sys
import jax
from minigpt_jax.train import evaluation

SIG, AT, COUNT, WHERE = signal.{sig}, {at}, {count}, {where!r}
if WHERE == "evaluation":
    evaluate, calls = evaluation.evaluate, [0]

    def signalled_evaluate(eval_fn, *args, **kwargs):
        def fn(params, batch):
            calls[0] += 1
            if calls[0] == AT:
                for _ in range(COUNT):
                    os.kill(os.getpid(), SIG)
            return eval_fn(params, batch)
        return evaluate(fn, *args, **kwargs)

    evaluation.evaluate = signalled_evaluate
else:
    compile_ = jax.stages.Lowered.compile

    def signalled_compile(self, *args, **kwargs):
        for _ in range(COUNT):
            os.kill(os.getpid(), SIG)
        return compile_(self, *args, **kwargs)

    jax.stages.Lowered.compile = signalled_compile
from minigpt_jax.cli import main
sys.argv = ["minigpt-jax", *sys.argv[1:]]
main()
"""

# An evaluation at step 6, where no checkpoint is due (checkpoints at 4, 8, ...).
SIGNAL_SETTINGS = ("--config.eval_every=6", "--config.eval_batches=4")


def _signalled(args, sig, where, at=1, count=1):
    script = _SIGNALLER.format(sig=sig, at=at, count=count, where=where)
    return run([sys.executable, "-c", script, *args[3:]])


@pytest.mark.parametrize(
    "sig, count", [("SIGTERM", 1), pytest.param("SIGINT", 2, marks=pytest.mark.slow)]
)
def test_signal_during_evaluation_saves_what_it_says(corpus_file, tmp_path, sig, count):
    """A signal during the step-6 evaluation (issue: "checkpoint saved at step 10" with none
    saved; a double SIGINT said 40, the rerun resumed from 30): the evaluation stops between
    batches, step 6 is saved, the message says so, and the rerun does the evaluation first and
    ends with the metrics of an uninterrupted run."""
    workdir = tmp_path / "run"
    args = crash_train_args(workdir, corpus_file) + list(SIGNAL_SETTINGS)
    result = _signalled(args, sig, "evaluation", at=2, count=count)  # the 2nd val batch
    assert result.returncode == 128 + getattr(signal, sig), result.stderr  # 143, 130
    assert result.stderr.strip().splitlines() == [
        f"{sig} received: checkpoint saved at step 6 (its evaluation was stopped; it runs "
        "first when the run resumes); rerun the same command to resume."
    ]
    (line,) = result.stdout.strip().splitlines()
    assert line.startswith("step 6: train loss n/a") and line.endswith(f"by {sig}")
    assert steps(workdir / "checkpoints") == [4, 6] and steps(workdir / "best") == []
    assert "Traceback" not in result.stderr
    rerun = run(args)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.splitlines()[0].startswith("step 6: train loss")  # the evaluation
    assert "resumed from step 6" in rerun.stdout.splitlines()[-1]
    uninterrupted = tmp_path / "uninterrupted"
    assert run(crash_train_args(uninterrupted, corpus_file) + list(SIGNAL_SETTINGS)).returncode == 0
    assert trajectory(workdir) == trajectory(uninterrupted)


@pytest.mark.parametrize("sig", ["SIGTERM", pytest.param("SIGINT", marks=pytest.mark.slow)])
def test_signal_during_compile_is_one_true_line(reference, copy_of, corpus_file, sig):
    """A signal while XLA compiles (issue: SIGTERM died with rc -15 and no message, SIGINT
    printed a 26-line KeyboardInterrupt traceback): one line saying where the run stood, rc
    128 + the signal, nothing changed, and the rerun resumes. Here in a resumed run (from step
    40 of 44)."""
    args = crash_train_args(copy_of, corpus_file) + ["--config.num_steps=44"]
    before = snapshot(copy_of / "checkpoints")
    result = _signalled(args, sig, "compile")
    assert result.returncode == 128 + getattr(signal, sig), result.stderr
    changed, stopped = result.stderr.splitlines()  # the resume's warning, then the one line
    assert "resuming step 40 with changed settings: config.num_steps: 40 -> 44" in changed
    assert stopped == (
        f"{sig} received while compiling, before training step 41: nothing new to save "
        "(checkpoint 40 is unchanged); rerun the same command to resume."
    )
    assert result.stdout == ""
    assert snapshot(copy_of / "checkpoints") == before
    rerun = run(args)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.splitlines()[-1].startswith("step 44:")
    assert "resumed from step 40" in rerun.stdout


# ----------------------------------------------------------------------------- readers


@pytest.mark.slow
# An unraisable error (orbax's unfinished sibling reads of a read that failed printed 84
# "Exception ignored in: <coroutine ...>" reports here) fails the test.
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_readers_beside_a_trainer_never_fail(corpus_file, tmp_path, caplog):
    """load_params (latest and best), perplexity (`minigpt-jax eval`) and sampling in a loop
    while a trainer saves, and rotates away, a checkpoint every step (issue: 26 of 352 reads
    failed with "written by a different version", eval with [Errno 2]): every read succeeds,
    with no warning and no report on stderr."""
    from minigpt_jax.sampling.texts import sample_from_workdir
    from minigpt_jax.train.evaluation import perplexity_of

    workdir = tmp_path / "run"
    # Far more steps than the reads need: the trainer is stopped once every reader has read
    # enough (a fixed 200 steps could end first on loaded cores).
    args = train_args(workdir, corpus_file, "--config.num_steps=100000", "--config.eval_every=2")
    args += ["--config.checkpoint_every=1", "--config.keep_checkpoints=1"]
    trainer = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reads = {"latest": 0, "best": 0, "eval": 0, "sample": 0}
    try:
        while not all(
            (workdir / name).is_dir() and steps(workdir / name) for name in ("best", "checkpoints")
        ):
            assert trainer.poll() is None, trainer.communicate()
            time.sleep(0.01)
        with caplog.at_level(logging.WARNING):
            while trainer.poll() is None and min(reads.values()) < 6:
                for which in ("latest", "best"):
                    params, meta = load_params(workdir, which)
                    assert jax.tree.leaves(params) and meta["gpt_config"]
                    reads[which] += 1
                perplexity_of(workdir, corpus_file)
                reads["eval"] += 1
                sample_from_workdir(workdir, "The", max_new_tokens=4)
                reads["sample"] += 1
        trainer.send_signal(signal.SIGTERM)  # it checkpoints and ends with the signal's status
    finally:
        if trainer.poll() is None:
            try:
                trainer.wait(timeout=120)
            except subprocess.TimeoutExpired:
                trainer.kill()
        _, stderr = trainer.communicate()
    assert trainer.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr, stderr
    assert min(reads.values()) >= 6, reads
    # Also asyncio's "Future exception was never retrieved" ERRORs of orbax's reads of a step
    # deleted under them (58 here before), and any "step without a digest: using it
    # unverified" of a step caught mid-deletion (its digest goes first).
    shown = [r for r in caplog.records if r.name.startswith(("minigpt_jax", "asyncio"))]
    assert [r.getMessage()[:300] for r in shown if r.levelno >= logging.WARNING] == []


# ----------------------------------------------------------------------------- crash windows


def test_crash_between_best_and_checkpoint_saves_resumes(reference, copy_of, corpus_file):
    """best/40 written, checkpoints/40 not (issue: every rerun failed with
    StepAlreadyExistsError): the rerun resumes from 36 and rewrites best/40."""
    assert (copy_of / "best" / "40").is_dir()
    shutil.rmtree(copy_of / "checkpoints" / "40")
    summary = resume(copy_of, corpus_file)
    assert summary.resumed_from == 36 and summary.step == 40
    assert trajectory(copy_of) == trajectory(reference)
    assert steps(copy_of / "checkpoints") == [36, 40] and steps(copy_of / "best") == [40]
    chex.assert_trees_all_equal(load_params(copy_of, "best")[0], load_params(reference, "best")[0])


def test_checkpoint_without_digest_is_used_unverified(reference, copy_of, corpus_file, caplog):
    """Killed after orbax renamed checkpoints/36 into place but before its digest was written:
    the save itself is complete, so the rerun resumes from it (with a warning)."""
    shutil.rmtree(copy_of / "checkpoints" / "40")
    shutil.rmtree(copy_of / "best" / "40")
    (copy_of / "checkpoints" / "36" / "sha256sums.txt").unlink()
    with caplog.at_level(logging.WARNING):
        summary = resume(copy_of, corpus_file)
    assert "checkpoints/36 has no sha256sums.txt" in caplog.text
    assert summary.resumed_from == 36
    assert (copy_of / "checkpoints" / "40" / "sha256sums.txt").is_file()
    assert trajectory(copy_of) == trajectory(reference)


def test_run_directory_from_before_digests_still_resumes(reference, copy_of, corpus_file):
    """A run directory written before checkpoints had digests resumes from its newest step
    instead of starting again (and deleting it)."""
    for digest in copy_of.glob("*/*/sha256sums.txt"):
        digest.unlink()
    shutil.rmtree(copy_of / "checkpoints" / "40")
    shutil.rmtree(copy_of / "best" / "40")
    summary = resume(copy_of, corpus_file)
    assert summary.resumed_from == 36 and summary.step == 40
    assert trajectory(copy_of) == trajectory(reference)


def test_torn_metrics_line_is_dropped_on_resume(reference, copy_of, corpus_file):
    """Killed while appending the step-38 record, after checkpoint 36 (issue: the resume
    stopped with a bare JSON error)."""
    path = copy_of / "metrics.jsonl"
    text = path.read_text()
    torn = text.index('{"step": 38')
    path.write_text(text[: torn + 20])
    shutil.rmtree(copy_of / "checkpoints" / "40")
    summary = resume(copy_of, corpus_file)
    assert summary.resumed_from == 36
    assert trajectory(copy_of) == trajectory(reference)


def test_metrics_reader_names_the_file_for_a_bad_middle_line(reference, tmp_path):
    lines = (reference / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[3] = lines[3][:10] + "\n"
    (tmp_path / "metrics.jsonl").write_text("".join(lines))
    with pytest.raises(ValueError, match=r"metrics\.jsonl, line 4, is not a metrics record"):
        read_metrics(tmp_path)
    assert [r["step"] for r in read_metrics(reference, upto_step=3)] == [1, 2, 3]


# ----------------------------------------------------------------------------- damage


def test_flipped_bytes_fall_back_to_the_newest_intact_checkpoint(
    reference, copy_of, corpus_file, caplog
):
    """4 KB XOR-ed in checkpoints/40 (issue: loaded silently, NaN two steps later)."""
    path = largest_file(copy_of / "checkpoints" / "40")
    damaged = bytearray(path.read_bytes())
    for i in range(min(4096, len(damaged))):
        damaged[i] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with caplog.at_level(logging.WARNING):
        summary = resume(copy_of, corpus_file)
    assert "does not match its sha256" in caplog.text and "using step 36" in caplog.text
    assert summary.resumed_from == 36
    assert trajectory(copy_of) == trajectory(reference)


def test_a_checkpoint_restored_with_non_finite_tensors_is_skipped(
    reference, copy_of, corpus_file, caplog, monkeypatch
):
    """Issue 54: bytes flipped in checkpoint 40 with its sha256sums.txt written again restored
    silently; the run then said "the last good checkpoint, step 40, is kept" (40 was the
    damaged one, 36 intact). A restored float tensor that is not finite (no run saves one)
    marks the checkpoint damaged: the previous intact one is used."""
    from minigpt_jax.runtime import checkpoint

    real_restore = checkpoint._restore

    def restore_damaged_40(manager, step, args):
        restored = real_restore(manager, step, args)
        if step == 40 and "state" in restored.keys():
            params = jax.tree.map(lambda x: x * np.nan, restored.state.params)
            restored = type(restored)(
                **{**dict(restored), "state": restored.state.replace(params=params)}
            )
        return restored

    monkeypatch.setattr(checkpoint, "_restore", restore_damaged_40)
    with caplog.at_level(logging.WARNING):
        summary = resume(copy_of, corpus_file)
    assert "holds non-finite values in .params" in caplog.text, caplog.text
    assert "using step 36, the newest intact checkpoint before it" in caplog.text
    assert summary.resumed_from == 36
    assert trajectory(copy_of) == trajectory(reference)


def _restoring_negative_nu(monkeypatch, damaged_steps):
    """checkpoint._restore handing back, for each step in damaged_steps, Adam's second moments
    negated: finite tensors (so the restore passes) whose first update is NaN, as 32 bytes
    flipped in a checkpoint's array data with its sha256sums.txt written again give."""
    from minigpt_jax.runtime import checkpoint

    real_restore = checkpoint._restore

    def restore(manager, step, args):
        restored = real_restore(manager, step, args)
        if step in damaged_steps and "state" in restored.keys():
            state = restored.state
            opt_state = jax.tree_util.tree_map_with_path(
                lambda path, x: -x if "nu" in jax.tree_util.keystr(path) else x, state.opt_state
            )
            restored = type(restored)(
                **{**dict(restored), "state": state.replace(opt_state=opt_state)}
            )
        return restored

    monkeypatch.setattr(checkpoint, "_restore", restore)


def test_a_checkpoint_that_diverges_at_once_is_skipped_for_the_intact_one(
    reference, copy_of, corpus_file, caplog, monkeypatch
):
    """Issue 54: 32 bytes flipped in checkpoint 40 with its sha256sums.txt written again ended
    "non-finite loss at step 42 ... the last good checkpoint, step 40, is kept" (40 was the
    damaged one, 36 intact). The run now trains again from 36, saying so, and ends well."""
    _restoring_negative_nu(monkeypatch, {40})
    with caplog.at_level(logging.WARNING):
        summary = resume(copy_of, corpus_file, num_steps=48)
    assert re.search(
        r"non-finite training loss nan .* at step 4[12], only [12] steps after resuming from "
        r"checkpoint 40: .*checkpoints/40 is taken as damaged .*; skipping it for step 36, the "
        r"newest intact checkpoint before it",
        caplog.text,
    ), caplog.text
    assert summary.resumed_from == 36 and summary.step == 48
    assert np.isfinite(summary.val_loss)
    assert [r["step"] for r in read_metrics(copy_of) if "train_loss" in r] == list(range(1, 49))
    assert trajectory(copy_of, upto_step=36) == trajectory(reference, upto_step=36)
    params, _ = load_params(copy_of)
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(params))


def test_a_run_that_diverges_again_after_the_fall_back_says_so(
    reference, copy_of, corpus_file, caplog, monkeypatch
):
    """The fall-back happens once: a run diverging again from the older checkpoint is its own
    divergence, reported with both checkpoints (the one set aside is what a rerun resumes
    from), never either as "last good"."""
    _restoring_negative_nu(monkeypatch, {36, 40})
    with caplog.at_level(logging.WARNING), pytest.raises(FloatingPointError) as error:
        resume(copy_of, corpus_file, num_steps=48)
    assert "skipping it for step 36" in caplog.text
    message = str(error.value)
    assert re.match(r"non-finite training loss nan .* at step 3[78]; ", message), message
    assert "set checkpoint 40 aside as perhaps damaged and trained again from step 36" in message
    assert "resume from step 40 (move it aside to resume from step 36)" in message
    assert "last good" not in message


def test_truncated_checkpoint_is_skipped_and_all_damaged_is_an_error(
    reference, copy_of, corpus_file
):
    for step in ("36", "40"):
        path = largest_file(copy_of / "checkpoints" / step)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"every checkpoint in .*checkpoints is damaged"):
        resume(copy_of, corpus_file)
    with pytest.raises(CheckpointError, match="every checkpoint"):
        load_params(copy_of)


def test_sampling_falls_back_past_a_damaged_checkpoint(reference, copy_of, caplog):
    (largest_file(copy_of / "checkpoints" / "40")).write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        params, meta = load_params(copy_of)
    assert "using step 36" in caplog.text
    assert jax.tree.leaves(params)


def test_tampered_token_cache_is_rebuilt(tmp_path, caplog):
    """tokens.npy rewritten with other in-range ids, or with ids beyond the vocabulary (even
    with a matching digest): found on load and encoded again (issue: trained on silently)."""
    text = "to be or not to be, that is the question\n" * 20
    tokenizer = CharTokenizer.from_text(text)
    cache = tmp_path / "tokens.npy"
    original = in_memory.encode_cached(text, tokenizer, cache)
    rng = np.random.default_rng(0)
    np.save(cache, rng.integers(0, tokenizer.vocab_size, original.shape).astype(np.uint16))
    with caplog.at_level(logging.WARNING):
        np.testing.assert_array_equal(in_memory.encode_cached(text, tokenizer, cache), original)
    assert "does not match the sha256" in caplog.text
    np.testing.assert_array_equal(np.load(cache), original)

    out_of_range = original.copy()
    out_of_range[::50] = tokenizer.vocab_size + 5
    np.save(cache, out_of_range)
    sidecar = tmp_path / "tokens.npy.fingerprint"
    fingerprint = sidecar.read_text().split()[0]
    import hashlib

    sidecar.write_text(f"{fingerprint}\n{hashlib.sha256(out_of_range.tobytes()).hexdigest()}\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        np.testing.assert_array_equal(in_memory.encode_cached(text, tokenizer, cache), original)
    assert f"outside the tokenizer's [0, {tokenizer.vocab_size})" in caplog.text


def test_diverged_run_saves_nothing_non_finite(corpus_file, tmp_path):
    """lr=99, near its bound (issue: a NaN-val-loss checkpoint was saved and announced as
    good): the run stops naming the last good step, and every saved checkpoint holds finite
    params."""
    workdir = tmp_path / "run"
    config = crash_config(corpus_file, **{"optim.lr": 99.0, "optim.warmup_steps": 0})
    with pytest.raises(FloatingPointError, match=r"non-finite .* at step \d+") as error:
        train_and_evaluate(build_experiment(config), workdir, progress=False)
    saved = steps(workdir / "checkpoints") if workdir.exists() else []
    if saved:
        assert f"last good checkpoint, step {saved[-1]}" in str(error.value)
        params, _ = load_params(workdir)
        assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(params))
    else:  # a fresh run that saved nothing leaves its workdir as it found it
        assert "No checkpoint was saved yet" in str(error.value) and not workdir.exists()


# ----------------------------------------------------------------------------- resume settings


def test_a_num_steps_that_reshapes_the_schedule_is_named(reference, copy_of, corpus_file, caplog):
    """Issue 54: a 2000-step run resumed with num_steps=400 recomputed its cosine schedule from
    step 200 silently (val 2.4727 at 400 against 2.3225 uninterrupted)."""
    with caplog.at_level(logging.WARNING):
        summary = resume(copy_of, corpus_file, num_steps=44)
    assert summary.step == 44
    assert "config.num_steps: 40 -> 44, which reshapes the cosine learning-rate schedule" in (
        caplog.text
    )


def test_a_shards_input_edited_with_its_size_and_mtime_kept_is_found(corpus_file, tmp_path):
    """Issue 54: a shards input edited in place with its size and mtime put back resumed on
    the old shards silently. Its change time moved: the shards are checked by content (the
    stream the inputs encode to), and the resume is refused naming the data."""
    corpus = tmp_path / "corpus.txt"
    shutil.copy(corpus_file, corpus)
    workdir = tmp_path / "run"
    overrides = {"data.format": "shards", "data.shard_tokens": 3000}
    train_and_evaluate(
        build_experiment(crash_config(corpus, num_steps=8, **overrides)), workdir, progress=False
    )
    stat = corpus.stat()
    text = corpus.read_bytes()
    corpus.write_bytes(text.replace(b"the", b"THE"))  # the same size
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (corpus.stat().st_size, corpus.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    with pytest.raises(ValueError, match=r"was trained on other data \(the token stream of"):
        train_and_evaluate(
            build_experiment(crash_config(corpus, num_steps=12, **overrides)),
            workdir,
            progress=False,
        )


def test_another_model_is_refused_naming_the_keys(reference, copy_of, corpus_file):
    with pytest.raises(ValueError, match=r"different model .*n_embd: 32 -> 64"):
        resume(copy_of, corpus_file, **{"model.n_embd": 64})


def test_trajectory_change_needs_explicit_permission(reference, copy_of, corpus_file):
    with pytest.raises(ValueError, match=r"config\.seed: 0 -> 7.*--allow_resume_changes"):
        resume(copy_of, corpus_file, seed=7, num_steps=44)
    with pytest.raises(ValueError, match=r"config\.optim\.lr: 0\.003 -> 0\.001"):
        resume(copy_of, corpus_file, **{"optim.lr": 1e-3, "num_steps": 44})
    summary = train_and_evaluate(
        build_experiment(crash_config(corpus_file, seed=7, num_steps=44)),
        copy_of,
        progress=False,
        allow_resume_changes=True,
    )
    assert summary.resumed_from == 40 and summary.step == 44


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"optim.lr": -1e-3}, "config.optim.lr=-0.001 is out of range"),
        ({"optim.warmup_steps": -5}, "config.optim.warmup_steps=-5 is out of range"),
        ({"optim.warmup_steps": 10**12}, "config.optim.warmup_steps=1000000000000 is out of "),
        ({"optim.grad_clip": -1.0}, "config.optim.grad_clip=-1.0 is out of range"),
        ({"optim.min_lr": 0.1}, "config.optim.min_lr=0.1 is above optim.lr=0.003"),
        ({"num_steps": 10**12}, "config.num_steps must be a positive integer below 2**31"),
        ({"seed": -1}, "config.seed=-1 is out of range"),
        ({"model.n_head": 3}, "n_embd=32 is not divisible by n_head=3"),
        ({"model.embed_scale": float("inf")}, "embed_scale must be a positive number"),
        ({"mesh.data": 3}, "needs 3 devices but 1 are present"),
        ({"data.val_fraction": 0.0}, "config.data.val_fraction=0.0 is out of range"),
        ({"data.tokenizer": "word"}, "config.data.tokenizer='word' is not a known tokenizer"),
        ({"data.corpus": "books"}, "config.data.corpus='books' is not a known corpus kind"),
        ({"data.path": "/nonexistent/corpus.txt"}, "/nonexistent/corpus.txt does not exist"),
        ({"data.tokenizer": "bpe", "data.vocab_size": 1}, "BPE vocab_size must be at least 256"),
        ({"data.format": "shards", "data.shard_tokens": 0}, "shard_tokens must be an integer from"),
        # Issue 54: 465,127 one-token shard files, 100,000 layers, NaN at step 2 from lr 1e39.
        ({"data.format": "shards", "data.shard_tokens": 1}, "from 1024 to 2147483647 (2**31 - 1)"),
        ({"model.n_layer": 100_000}, "n_layer must be a positive integer below 1024, got 100000"),
        ({"model.n_embd": 1 << 20}, "n_embd must be a positive integer below 131072"),
        ({"optim.lr": 1e39}, "optim.lr=1e+39 is out of range: it must be a finite number >= 0.0 "),
        ({"init_from": "/nonexistent/gpt2"}, "/nonexistent/gpt2 does not exist"),
        # (block 30000 is refused first by memory: at least 53.8 GiB, its attention weights)
        ({"model.block_size": 9000}, "the 'val' split has 4000 tokens but one training window"),
        ({"model.block_size": 9000, "data.format": "shards"}, "'val' split would have at most"),
    ],
)
def test_refused_configs_create_nothing(corpus_file, tmp_path, overrides, message):
    """Every check that can refuse a config runs before the first file is written (issue: the
    error came after run.lock, tokenizer.json and tokens.npy, so the corrected command failed
    on them)."""
    workdir = tmp_path / "run"
    with pytest.raises((ValueError, OSError), match=re.escape(message)):
        train_and_evaluate(
            build_experiment(crash_config(corpus_file, **overrides)), workdir, progress=False
        )
    assert not workdir.exists()
    workdir.mkdir()  # an empty directory stays empty
    with pytest.raises((ValueError, OSError), match=re.escape(message)):
        train_and_evaluate(
            build_experiment(crash_config(corpus_file, **overrides)), workdir, progress=False
        )
    assert list(workdir.iterdir()) == []


def test_shard_tokens_that_make_too_many_files_are_refused_first(tmp_path):
    """Issue 54: data.shard_tokens=1 wrote 465,127 files before `Too many open files`; a value
    above the setting's floor that would still pass MAX_SHARD_FILES files is refused before
    anything is written, naming the bound and the value that fits."""
    from minigpt_jax.data.shards.prepare import MAX_SHARD_FILES

    corpus = tmp_path / "big.txt"
    corpus.write_text("to be or not to be\n" * (MAX_SHARD_FILES * 1024 // 19 + 1000))
    workdir = tmp_path / "run"
    config = crash_config(corpus, **{"data.format": "shards", "data.shard_tokens": 1024})
    with pytest.raises(ValueError, match="the bound is 10,000 files: raise data.shard_tokens to"):
        train_and_evaluate(build_experiment(config), workdir, progress=False)
    assert not workdir.exists()


def test_refused_resumes_change_nothing(reference, copy_of, corpus_file, tmp_path):
    """A resume refused for its settings, its model, its data or its step budget leaves the run
    directory byte for byte and mtime for mtime as it was (issue: a changed corpus rewrote
    tokens.npy before the refusal)."""
    other_corpus = tmp_path / "other.txt"
    other_corpus.write_text(corpus_file.read_text()[::-1])
    before = snapshot(copy_of)
    for overrides, message in [
        ({"seed": 7, "num_steps": 44}, "config.seed: 0 -> 7"),
        ({"model.n_embd": 64}, "n_embd: 32 -> 64"),
        ({"data.path": str(other_corpus)}, "config.data.path: "),
        ({"num_steps": 20}, "is past num_steps=20, so there is nothing to train"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            resume(copy_of, corpus_file, **overrides)
        assert snapshot(copy_of) == before, overrides
    summary = resume(copy_of, corpus_file)  # the same command still works
    assert summary.resumed_from == 40 and summary.step == 40


def test_settings_newer_than_the_checkpoint_are_not_differences():
    """A checkpoint written before a setting existed resumes under the setting's default; a
    recorded setting that changed is still named."""
    saved = {"gpt_config": {"n_embd": 32}, "config": {"seed": 0, "data": {"corpus": "text"}}}
    current = {
        "gpt_config": {"n_embd": 32, "attention": "auto"},
        "config": {"seed": 0, "data": {"corpus": "text", "format": "memory"}},
    }
    assert check_resume(saved, current, "ckpt") == []
    current["config"]["data"]["corpus"] = "pydoc"
    with pytest.raises(ValueError, match=r"config\.data\.corpus: 'text' -> 'pydoc'"):
        check_resume(saved, current, "ckpt")


def test_speed_settings_may_change_on_resume_the_model_may_not():
    """dense_grad, attention, loss_chunk and remat compute the same model: a checkpoint resumes
    under other values (e.g. autodiff saved, auto now); a shape such as vocab_multiple may not
    change."""
    saved = {
        "gpt_config": {"n_embd": 32, "dense_grad": "autodiff", "attention": "explicit"},
        "config": {"seed": 0},
    }
    current = {
        "gpt_config": {
            "n_embd": 32, "dense_grad": "auto", "attention": "auto", "loss_chunk": 0,
        },
        "config": {"seed": 0},
    }  # fmt: skip
    assert check_resume(saved, current, "ckpt") == []
    saved["gpt_config"]["vocab_multiple"] = 1
    current["gpt_config"]["vocab_multiple"] = 64
    with pytest.raises(ValueError, match=r"vocab_multiple: 1 -> 64"):
        check_resume(saved, current, "ckpt")


# ----------------------------------------------------------------------------- one-line errors


def _one_line_error(args) -> str:
    result = run(args)
    assert result.returncode == 1, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize(
    "body, message",
    [
        ("def get_config(:\n", "line 1: invalid syntax; fix the config file's syntax."),
        ("def get_config(arg=None):\n    raise KeyError('x')\n", "raised KeyError: 'x'; fix it."),
        ("x = 1\n", "defines no get_config(); a config file defines get_config(arg=None)"),
        ("def get_config(arg=None):\n    return 3\n", "get_config() returned int, not an"),
        # A trial config an earlier sweep wrote, from before the apps left the library.
        (
            "from minigpt_jax.sweep.space import config_with\n\n"
            "def get_config(arg=None):\n    return config_with('tiny', {})\n",
            "imports minigpt_jax.sweep, which is minigpt_apps.sweep since",
        ),
    ],
)
def test_broken_config_file_is_one_line(tmp_path, body, message):
    """Issue: 24-55-line tracebacks."""
    path = tmp_path / "broken.py"
    path.write_text(body)
    args = [sys.executable, "-m", "minigpt_jax", "train", "--config", str(path)]
    line = _one_line_error(args + ["--workdir", str(tmp_path / "run")])
    assert line.startswith(f"minigpt-jax: error: {path}") and message in line
    assert not (tmp_path / "run").exists()


def test_empty_workdir_is_refused(corpus_file, tmp_path):
    """Issue: `--workdir=` trained into the current directory."""
    args = train_args("unused", corpus_file)
    args[args.index("--workdir") : args.index("--workdir") + 2] = ["--workdir="]
    result = run(args)
    assert result.returncode == 1
    assert "--workdir is empty: name a run directory" in result.stderr
    assert not (REPO / "checkpoints").exists() and not (REPO / "run.lock").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--config.data.tokenizer=bpe", "--config.data.path={big}"],
            "of text; data.format='memory' would need about 285.0 GiB of RAM to encode it",
        ),
        (
            ["--config.model.n_layer=48", "--config.model.n_embd=8192", "--config.model.n_head=64"],
            "GiB (train state, one call's batches, one micro-batch's logits and what its backward",
        ),
    ],
)
def test_what_cannot_fit_is_refused_before_the_work(corpus_file, tmp_path, extra, message):
    """A 3 GB corpus for data.format=memory (issue: read into RAM, then a 41-line MemoryError)
    and a model far beyond the machine (issue: minutes, then an XLA error) are refused with
    the figure and the fix, before anything is read, allocated or written."""
    big = tmp_path / "big.txt"
    with big.open("wb") as file:
        file.truncate(3 << 30)  # sparse: takes no disk
    workdir = tmp_path / "run"
    args = train_args(workdir, corpus_file) + [a.format(big=big) for a in extra]
    line = _one_line_error(args)
    assert message in line and ("data.format=shards" in line or "grad_accum_steps" in line)
    assert not workdir.exists()


def test_a_batch_beyond_the_machine_is_refused_before_a_step_runs(corpus_file, tmp_path):
    """batch_size=1000000 on the tiny config (issue: XLA's 'Out of memory allocating
    157952004292 bytes' traceback after compiling) is one line with the fix: from shapes
    before anything is written where the lower bound already exceeds the RAM, else from XLA's
    account of the compiled step before it runs. Half the RAM by the lower bound takes the
    second path (the compiled step holds ~6x more), and the run directory then still trains
    with a batch that fits."""
    from configs import tiny
    from minigpt_jax.budget import host_memory_available, train_bytes_lower_bound
    from minigpt_jax.config_dict import check_experiment_config, gpt_config_from
    from minigpt_jax.optimizers import make_optimizer
    from minigpt_jax.train.step import init_state

    line = _one_line_error(train_args(tmp_path / "a", corpus_file, "--config.batch_size=1000000"))
    assert "GiB" in line and "a smaller batch_size" in line and "grad_accum_steps" in line
    saved = tmp_path / "a" / "checkpoints"
    assert not saved.exists() or not steps(saved)

    config = check_experiment_config(tiny.get_config())
    cfg, tx = gpt_config_from(config, 65), make_optimizer(config.optim, config.num_steps)[0]
    state = jax.eval_shape(lambda key: init_state(cfg, tx, key), jax.random.key(0))

    def bound(batch):
        shape = (1, batch, cfg.block_size + 1)
        return train_bytes_lower_bound(cfg, state, batch, shape, fused_attention=False)

    per_sequence = (bound(2000) - bound(1000)) / 1000
    batch = int(0.5 * host_memory_available() / per_sequence)
    workdir = tmp_path / "b"
    line = _one_line_error(train_args(workdir, corpus_file, f"--config.batch_size={batch}"))
    assert line.startswith("minigpt-jax train: error: the compiled train step needs ")
    assert "XLA's account" in line and "so nothing was trained; use a smaller batch_size" in line
    # A fresh workdir whose setup fails is left as it was: no checkpoints folder at all.
    assert not (workdir / "checkpoints").exists()
    rerun = run(train_args(workdir, corpus_file, "--config.num_steps=4"))
    assert rerun.returncode == 0 and rerun.stdout.splitlines()[-1].startswith("step 4:")


def test_prepare_refuses_shards_that_train_would_not_read(corpus_file, tmp_path):
    """Issue: `prepare` wrote shards for a data.format=memory config, then `train` ignored them
    and encoded the corpus in one call."""
    args = train_args(tmp_path / "run", corpus_file)
    args[3] = "prepare"
    line = _one_line_error(args)
    assert "prepare writes token shards, which only data.format='shards' reads" in line
    assert "add --config.data.format=shards" in line and not (tmp_path / "run").exists()


def test_disk_full_during_a_save_is_one_line(corpus_file, tmp_path):
    """A 3 MB tmpfs fills during a save (issue: the right last line among 209 lines and 17
    tracebacks): one line, the earlier checkpoints kept."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)])
    if made.returncode != 0:
        pytest.skip("needs a tmpfs mount (root)")
    try:
        workdir = mount / "run"
        args = train_args(workdir, corpus_file, "--config.num_steps=400")
        result = run(args + ["--config.keep_checkpoints=100"])
        assert result.returncode == 1
        # Before, tensorstore's callbacks of the failed writes often printed "Event loop is
        # closed" tracebacks (unraisable errors of orbax's closed asyncio loop) before it.
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        (line,) = lines
        assert line.startswith("minigpt-jax train: error: ") and "no space left on the" in line
        assert "then rerun the same command" in line
        assert load_params(workdir)[0]
    finally:
        subprocess.run(["umount", str(mount)])


def test_disk_full_while_saving_best_is_reported_once(corpus_file, tmp_path, monkeypatch, caplog):
    """best/ fails for want of space at an evaluation (issue: CI printed a logged "the step-120
    evaluation failed; the steps trained could not be saved" line before the one-line error,
    from a second save to the full disk): the disk-full error alone, nothing logged."""
    from minigpt_jax.runtime.checkpoint import Checkpointer

    def no_space(self, step, params, meta):
        raise OSError(errno.ENOSPC, f"no space left on the device while saving step {step}")

    monkeypatch.setattr(Checkpointer, "save_best", no_space)
    caplog.set_level(logging.ERROR)
    with pytest.raises(OSError, match="no space left") as raised:
        train_and_evaluate(
            build_experiment(crash_config(corpus_file)), tmp_path / "run", progress=False
        )
    assert raised.value.errno == errno.ENOSPC
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_only_orbax_leftovers_are_silenced():
    """The unraisable-error filter drops orbax's two leftover reports and passes on the rest."""
    import asyncio

    from minigpt_jax.runtime import checkpoint

    seen = []
    previous, sys.unraisablehook = sys.unraisablehook, seen.append
    try:
        checkpoint._drop_orbax_leftover_reports()
        loop = asyncio.new_event_loop()
        loop.close()
        try:
            loop.call_soon_threadsafe(print)
        except RuntimeError as error:
            closed_loop = error
        sys.unraisablehook(_Unraisable(closed_loop, closed_loop.__traceback__, None))
        other = ValueError("Event loop is closed")
        sys.unraisablehook(_Unraisable(other, None, None))
        sys.unraisablehook(_Unraisable(RuntimeError("boom"), None, _coroutine_of("orbax")))
        sys.unraisablehook(_Unraisable(RuntimeError("boom"), None, _coroutine_of("elsewhere")))
    finally:
        sys.unraisablehook = previous
    assert [u.exc_value for u in seen][0] is other and len(seen) == 2
    assert "elsewhere" in seen[1].object.cr_code.co_filename


class _Unraisable:
    def __init__(self, exc_value, exc_traceback, obj):
        self.exc_type, self.exc_value = type(exc_value), exc_value
        self.exc_traceback, self.object, self.err_msg = exc_traceback, obj, None


def _coroutine_of(package):
    """A coroutine whose code object says it was defined in site-packages/<package>/x.py."""
    namespace = {}
    filename = os.path.join(os.sep, "site-packages", package, "x.py")
    exec(compile("async def read():\n    pass\n", filename, "exec"), namespace)
    coroutine = namespace["read"]()
    coroutine.close()
    return coroutine


def test_prompt_that_is_not_utf8_is_one_line(reference):
    """Issue: the tokenizers library's `TextEncodeInput must be Union[...]`."""
    args = [sys.executable, "-m", "minigpt_jax", "sample", f"--workdir={reference}"]
    line = _one_line_error([*args, b"--prompt=caf\xe9 \xff".decode(errors="surrogateescape")])
    assert line == (
        "minigpt-jax sample: error: the prompt is not valid UTF-8 text (byte 0xe9 at character "
        "3); pass UTF-8 (check the terminal's encoding, e.g. LANG=C.UTF-8)."
    )


class _DiskFullFromStep:
    """The `os` module for metrics.py, whose os.write fails like a full disk's (ENOSPC, no file
    named) for every record of step `step` onwards."""

    def __init__(self, step: int):
        self.step = step

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data: bytes) -> int:
        if json.loads(data)["step"] >= self.step:
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)


@pytest.mark.parametrize("full_from, kept", [(5, 8), (1, 4)])
def test_a_full_disk_at_a_metrics_write_names_the_file_and_what_is_kept(
    corpus_file, tmp_path, monkeypatch, full_from, kept
):
    """Issue 40: os.write's ENOSPC named no file, and the command line promised a resume "from
    its last checkpoint" where none was saved. Since issue 54 the steps trained when the write
    failed are checkpointed where space allows (here only metrics.jsonl is full), their rows
    since the last write lost: a chunk's rows are written once the next chunk is dispatched."""
    from minigpt_jax.train import metrics

    monkeypatch.setattr(metrics, "os", _DiskFullFromStep(full_from))
    workdir = tmp_path / "run"
    with pytest.raises(OSError) as raised:
        resume(workdir, corpus_file, num_steps=8, eval_every=8)
    assert raised.value.errno == errno.ENOSPC
    assert raised.value.filename == str(workdir / "metrics.jsonl"), raised.value
    assert f"it resumes from step {kept}, kept in {workdir}" in str(raised.value)
    assert steps(workdir / "checkpoints")[-1] == kept
