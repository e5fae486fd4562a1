"""The command line, end to end in subprocesses: errors, SIGTERM, SIGKILL and resuming; sampling
from a run, streamed, batched and stopped."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, run, train_args

# The full suite only (`python -m pytest -q`): the command line in subprocesses.
pytestmark = pytest.mark.slow


def _saved_steps(workdir):
    directory = Path(workdir) / "checkpoints"
    return (
        sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
        if directory.exists()
        else []
    )


def _start_and_wait_for_checkpoint(args):
    """Starts a long run and returns it once its first checkpoint is complete."""
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    deadline = time.monotonic() + 240
    while not _saved_steps(args[args.index("--workdir") + 1]):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.05)
    return process


LONG_RUN = ("--config.num_steps=1000", "--config.checkpoint_every=100", "--config.eval_every=500")


def test_config_key_typo_is_a_clear_error(tmp_path, corpus_file):
    result = run(train_args(tmp_path, corpus_file, "--config.optim.lrr=0.1"))
    assert result.returncode != 0
    assert "unknown config key config.optim.lrr (did you mean 'lr'?)" in result.stderr
    assert "valid keys of config.optim: lr, min_lr" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_corpus_is_a_clear_error(tmp_path):
    result = run(
        [
            sys.executable,
            "-m",
            "minigpt_jax",
            "train",
            "--config",
            "configs/tiny.py",
            "--workdir",
            str(tmp_path / "run"),
            "--config.data.corpus=text",
            f"--config.data.path={tmp_path / 'absent.txt'}",
        ]
    )
    assert result.returncode != 0
    assert "minigpt-jax train: error:" in result.stderr and "absent.txt" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_command_and_missing_workdir(tmp_path):
    result = run([sys.executable, "-m", "minigpt_jax", "fly", "--workdir", str(tmp_path)])
    assert result.returncode != 0 and "name one command: train | prepare | sample" in result.stderr
    result = run([sys.executable, "-m", "minigpt_jax", "train", "--config", "configs/tiny.py"])
    assert result.returncode != 0 and "--workdir is required" in result.stderr


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path, corpus_file):
    args = train_args(tmp_path / "run", corpus_file, *LONG_RUN)
    process = _start_and_wait_for_checkpoint(args)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr  # 128 + SIGTERM, for a scheduler to tell
    assert "SIGTERM received: checkpoint saved at step" in stderr  # stop lines: stderr
    stopped_at = int(stderr.split("checkpoint saved at step ")[1].split(";")[0])
    assert _saved_steps(tmp_path / "run")[-1] == stopped_at
    assert "stopped by SIGTERM" in stdout


@pytest.mark.slow
def test_sigkill_mid_training_resumes_from_the_last_checkpoint(tmp_path, corpus_file):
    args = train_args(tmp_path / "run", corpus_file, *LONG_RUN)
    process = _start_and_wait_for_checkpoint(args)
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    saved = _saved_steps(tmp_path / "run")
    assert saved and saved[-1] < 1000
    result = run(args)
    assert result.returncode == 0, result.stderr
    assert f"resumed from step {saved[-1]}" in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("step 1000:")


@pytest.fixture(scope="module")
def trained_workdir(corpus_file, tmp_path_factory):
    """A tiny model trained for 20 steps on the text corpus, for sampling."""
    from configs import tiny
    from minigpt_jax.train.loop import train_and_evaluate
    from minigpt_jax.typed_config import build_experiment

    config = tiny.get_config()
    config.num_steps = 20
    config.data.corpus, config.data.path = "text", str(corpus_file)
    workdir = tmp_path_factory.mktemp("trained")
    train_and_evaluate(build_experiment(config), workdir, progress=False)
    return workdir


def test_sample_from_workdir_continues_the_prompt(trained_workdir):
    from minigpt_jax.sampling.texts import sample_from_workdir

    texts = sample_from_workdir(trained_workdir, "The ", max_new_tokens=30, seed=1, num_samples=3)
    assert len(texts) == 3 and all(t.startswith("The ") and len(t) == 34 for t in texts)
    assert texts == sample_from_workdir(
        trained_workdir, "The ", max_new_tokens=30, seed=1, num_samples=3
    )
    greedy = [
        sample_from_workdir(trained_workdir, "The ", max_new_tokens=30, temperature=0.0, seed=s)
        for s in (0, 1)
    ]
    assert greedy[0] == greedy[1]


def test_sample_command_prints_samples_and_names_unknown_characters(trained_workdir):
    base = [sys.executable, "-m", "minigpt_jax", "sample", "--workdir", str(trained_workdir)]
    result = run([*base, "--prompt=The ", "--max_new_tokens=25", "--num_samples=2"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("---------- sample") == 2 and "\nThe " in result.stdout
    result = run([*base, "--prompt=The \u00fc", "--max_new_tokens=5"])
    assert result.returncode != 0
    assert (
        "character '\u00fc' at position 4 is not in the CharTokenizer vocabulary" in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_sample_without_a_trained_run_says_how_to_train(tmp_path):
    result = run(
        [sys.executable, "-m", "minigpt_jax", "sample", "--workdir", str(tmp_path), "--prompt=a"]
    )
    assert result.returncode != 0
    assert "no checkpoints in" in result.stderr and "minigpt-jax train" in result.stderr


def test_streamed_texts_equal_the_texts_of_one_call(trained_workdir):
    """Pieces of one token's call at first, in batches of 2 that a memory budget asks for,
    join to the texts of unbatched, unstreamed sampling; they come in printing order."""
    from minigpt_jax.model_files import load_run
    from minigpt_jax.sampling.api import plan_sampling
    from minigpt_jax.sampling.texts import sample_texts, stream_texts

    run = load_run(trained_workdir)
    settings = dict(max_new_tokens=30, seed=4, num_samples=3, top_k=10)
    row = plan_sampling(run.cfg, 3, 4, 30).row_bytes
    notices, pieces = [], []
    for piece in stream_texts(
        *(run.params, run.cfg, run.tokenizer), "The ", memory_bytes=int(2.5 * row),
        chunk_seconds=1e-9, on_notice=notices.append, **settings,
    ):  # fmt: skip
        pieces.append(piece)
    texts = sample_texts(run.params, run.cfg, run.tokenizer, "The ", **settings)
    assert [p.index for p in pieces] == sorted(p.index for p in pieces)
    assert ["".join(p.text for p in pieces if p.index == i) for i in range(3)] == texts
    assert sum(p.index == 0 for p in pieces) > 5  # streamed, not whole
    assert [p.index for p in pieces if p.done] == [0, 1, 2]
    assert len(notices) == 2 and "sampling them in 2 batches of 2" in notices[0], notices
    assert "new tokens of each sample pass block_size=16" in notices[1], notices


def test_text_stream_never_cuts_a_character():
    """Byte-level BPE ids of a text with 2-, 3- and 4-byte characters, cut at every place:
    no piece ends inside a character, and the pieces join to the text."""
    from minigpt_jax.data.tokenizers import BPETokenizer
    from minigpt_jax.sampling.texts import TextStream

    text = "caf\u00e9 \u2013 \U0001f600!"
    tokenizer = BPETokenizer.train(text * 4, vocab_size=260)
    ids = tokenizer.encode(text)
    assert len(ids) > len(text)  # some characters span tokens
    for cut in range(len(ids) + 1):
        stream = TextStream(tokenizer, ids[:0])
        first = stream.feed(ids[:cut], final=False)
        assert "\ufffd" not in first and text.startswith(first)
        assert first + stream.feed(ids[cut:], final=True) == text


def _sample_args(workdir, *extra):
    return [sys.executable, "-m", "minigpt_jax", "sample", "--workdir", str(workdir), *extra]


def test_sample_command_prints_the_library_texts_in_batches(trained_workdir):
    """stdout equals sample_from_workdir's texts (unbatched) under their headers; stderr holds
    the one notice: the tokens past block_size and their measured cost."""
    from minigpt_jax.sampling.texts import sample_from_workdir

    args = ["--prompt=The ", "--max_new_tokens=40", "--seed=2", "--num_samples=3"]
    result = run(_sample_args(trained_workdir, *args, "--samples_per_batch=2"))
    assert result.returncode == 0, result.stderr
    texts = sample_from_workdir(trained_workdir, "The ", max_new_tokens=40, seed=2, num_samples=3)
    assert result.stdout == "".join(
        f"---------- sample {i + 1}/3\n{t}\n" for i, t in enumerate(texts)
    )
    notice = result.stderr.strip()
    assert "\n" not in notice, notice
    assert re.fullmatch(
        r"minigpt-jax sample: 27 of the 40 new tokens of each sample pass block_size=16, "
        r"where learned positions have no KV cache: each recomputes the last 16 tokens, "
        r"[\d.]+ m?s per token \(timed\), about [\d.]+ m?s for them in all \(a rope or "
        r"sinusoidal model keeps its cache\)\.",
        notice,
    ), notice


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_sample_streams_and_a_signal_ends_it_with_what_was_sampled(trained_workdir, sig):
    """A million tokens: text shows up while it runs; the signal stops it with one line, and
    the text printed is exactly the first tokens of the same sample asked for in full."""
    from minigpt_jax.sampling.texts import sample_from_workdir

    args = _sample_args(trained_workdir, "--prompt=The ", "--max_new_tokens=1000000", "--seed=3")
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    received, deadline = b"", time.monotonic() + 120
    while len(received) < 200:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no streamed text within 120 s"
        received += os.read(process.stdout.fileno(), 4096)
    process.send_signal(sig)
    rest, stderr = process.communicate(timeout=120)
    stdout, stderr = (received + rest).decode(), stderr.decode()
    assert process.returncode == 128 + sig, stderr
    assert "Traceback" not in stderr
    notice, stop = stderr.strip().splitlines()
    assert "999,987 of the 1,000,000 new tokens pass block_size=16" in notice
    match = re.fullmatch(
        rf"minigpt-jax sample: stopped by {sig.name} after ([\d,]+) of 1,000,000 new tokens; "
        r"the text above is all that was sampled\.",
        stop,
    )
    assert match, stop
    made = int(match.group(1).replace(",", ""))
    assert 0 < made < 1_000_000
    expected = sample_from_workdir(trained_workdir, "The ", max_new_tokens=made, seed=3)[0]
    assert stdout == expected + "\n"


def test_sample_refuses_more_tokens_than_positions_index(trained_workdir):
    result = run(_sample_args(trained_workdir, "--prompt=a", "--max_new_tokens=1000000000000"))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "minigpt-jax sample: error: max_new_tokens=1,000,000,000,000 needs 1,099,511,627,784 "
        "token slots, more than the 2,147,483,647 that int32 positions index: ask for fewer "
        "new tokens."
    )


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--temperature=-1", "temperature=-1.0 must be finite and >= 0 (0 means greedy argmax)."),
        ("--top_p=1.5", "top_p=1.5 must be in (0, 1], or None to keep all tokens."),
    ],
)
def test_sample_refuses_a_bad_setting_in_one_line_before_loading(tmp_path, flag, message):
    """The command's flags become one SampleSettings, which checks itself: a bad value is one
    line naming the setting and the fix, before any model is read (there is none here)."""
    result = run(_sample_args(tmp_path / "no_run", "--prompt=a", flag))
    assert result.returncode == 1
    assert result.stderr.strip() == f"minigpt-jax sample: error: {message}"
