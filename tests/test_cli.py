"""The command line, end to end in subprocesses: errors, SIGTERM, SIGKILL and resuming."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from pydoc_data.topics import topics

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(topics[k] for k in sorted(topics))[:40_000])
    return path


def _train_args(workdir, corpus_file, *extra):
    return [
        sys.executable,
        "-m",
        "minigpt_jax",
        "train",
        "--config",
        str(REPO / "configs" / "tiny.py"),
        "--workdir",
        str(workdir),
        "--config.data.corpus=text",
        f"--config.data.path={corpus_file}",
        "--progress=false",
        *extra,
    ]


def _run(args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO, **kwargs)


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
    result = _run(_train_args(tmp_path, corpus_file, "--config.optim.lrr=0.1"))
    assert result.returncode != 0
    assert "unknown config key config.optim.lrr (did you mean 'lr'?)" in result.stderr
    assert "valid keys of config.optim: lr, min_lr" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_corpus_is_a_clear_error(tmp_path):
    result = _run(
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
    result = _run([sys.executable, "-m", "minigpt_jax", "fly", "--workdir", str(tmp_path)])
    assert result.returncode != 0 and "name one command: train | prepare | sample" in result.stderr
    result = _run([sys.executable, "-m", "minigpt_jax", "train", "--config", "configs/tiny.py"])
    assert result.returncode != 0 and "--workdir is required" in result.stderr


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path, corpus_file):
    args = _train_args(tmp_path / "run", corpus_file, *LONG_RUN)
    process = _start_and_wait_for_checkpoint(args)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert "SIGTERM received: checkpoint saved at step" in stdout
    stopped_at = int(stdout.split("checkpoint saved at step ")[1].split(";")[0])
    assert _saved_steps(tmp_path / "run")[-1] == stopped_at
    assert "stopped by SIGTERM" in stdout


@pytest.mark.slow
def test_sigkill_mid_training_resumes_from_the_last_checkpoint(tmp_path, corpus_file):
    args = _train_args(tmp_path / "run", corpus_file, *LONG_RUN)
    process = _start_and_wait_for_checkpoint(args)
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    saved = _saved_steps(tmp_path / "run")
    assert saved and saved[-1] < 1000
    result = _run(args)
    assert result.returncode == 0, result.stderr
    assert f"resumed from step {saved[-1]}" in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("step 1000:")


@pytest.fixture(scope="module")
def trained_workdir(corpus_file, tmp_path_factory):
    """A tiny model trained for 20 steps on the text corpus, for sampling."""
    from configs import tiny
    from minigpt_jax.train.loop import train_and_evaluate

    config = tiny.get_config()
    config.num_steps = 20
    config.data.corpus, config.data.path = "text", str(corpus_file)
    workdir = tmp_path_factory.mktemp("trained")
    train_and_evaluate(config, workdir, progress=False)
    return workdir


def test_sample_from_workdir_continues_the_prompt(trained_workdir):
    from minigpt_jax.io.runs import sample_from_workdir

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
    result = _run([*base, "--prompt=The ", "--max_new_tokens=25", "--num_samples=2"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("---------- sample") == 2 and "\nThe " in result.stdout
    result = _run([*base, "--prompt=The \u00fc", "--max_new_tokens=5"])
    assert result.returncode != 0
    assert (
        "character '\u00fc' at position 4 is not in the CharTokenizer vocabulary" in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_sample_without_a_trained_run_says_how_to_train(tmp_path):
    result = _run(
        [sys.executable, "-m", "minigpt_jax", "sample", "--workdir", str(tmp_path), "--prompt=a"]
    )
    assert result.returncode != 0
    assert "no checkpoints in" in result.stderr and "minigpt-jax train" in result.stderr
