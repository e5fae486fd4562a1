"""Hooks through the command line from a folder outside the package: docs/extending/'s early
stop sees every evaluation and stops the run with a checkpoint that a rerun resumes; the
built-in samples hook writes its samples; a hook that raises is one plug-in error naming
config.hooks.names and its frame, after the steps trained so far are saved."""

import json
import subprocess
from pathlib import Path

import pytest
from helpers import extending_files, steps, train_args

pytestmark = pytest.mark.slow  # trainings through the CLI

FAILING = """
class Boom:
    every = 1

    def __init__(self, hooks_config):
        pass

    def on_step(self, ctx):
        if ctx.step == 3:
            raise RuntimeError(f"boom at {ctx.step}")
"""

PERIODIC = """
import json


class Never:
    every = 0  # its on_step never runs

    def __init__(self, hooks_config):
        pass

    def on_step(self, ctx):
        raise RuntimeError(f"on_step of a hook with every = 0, at step {ctx.step}")


class EveryTwo:
    every = 2

    def __init__(self, hooks_config):
        pass

    def on_step(self, ctx):
        with open(ctx.workdir / "steps.jsonl", "a") as out:
            out.write(json.dumps(ctx.step) + "\\n")
"""


def _train(folder: Path, workdir: Path, corpus_file, *extra) -> subprocess.CompletedProcess:
    args = train_args(workdir, corpus_file, "--config.steps_per_call=1", *extra)
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=folder)


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user_hooks")
    source = extending_files()["my_hooks.py"]
    (folder / "my_hooks.py").write_text(source)
    (folder / "my_failing_hooks.py").write_text(FAILING)
    (folder / "my_periodic_hooks.py").write_text(PERIODIC)
    return folder


def test_an_early_stop_hook_stops_with_a_checkpoint_and_the_rerun_resumes(
    user_dir, tmp_path, corpus_file
):
    workdir = tmp_path / "run"
    # lr 0: the val loss never improves after the first evaluation, so patience 2 stops at 6
    settings = [
        "--config.hooks.names=my_hooks:EarlyStop",
        "--config.hooks.patience=2",
        "--config.optim.lr=0",
        "--config.optim.min_lr=0",
        "--config.num_steps=12",
        "--config.eval_every=2",
        "--config.checkpoint_every=4",
    ]
    result = _train(user_dir, workdir, corpus_file, *settings)
    assert result.returncode == 0, result.stderr
    assert (
        "config.hooks.names='my_hooks:EarlyStop' asked to stop (on_evaluation at step 6): the "
        "run ended early, at step 6 of num_steps=12" in result.stdout + result.stderr
    ), result.stderr
    records = [json.loads(x) for x in (workdir / "early_stop.jsonl").read_text().splitlines()]
    assert [(r["step"], r["waited"]) for r in records] == [(2, 0), (4, 1), (6, 2)]
    assert 6 in steps(workdir / "checkpoints")
    again = _train(user_dir, workdir, corpus_file, *settings)
    assert again.returncode == 0, again.stderr
    assert "resumed from step 6" in again.stdout + again.stderr


def test_the_samples_hook_writes_a_sample_every_n_steps(user_dir, tmp_path, corpus_file):
    workdir = tmp_path / "run"
    result = _train(
        user_dir,
        workdir,
        corpus_file,
        "--config.hooks.names=samples",
        "--config.hooks.sample_every=2",
        "--config.hooks.sample_prompt=The ",
        "--config.hooks.sample_tokens=12",
        "--config.num_steps=4",
        "--config.eval_every=4",
        "--config.checkpoint_every=4",
    )
    assert result.returncode == 0, result.stderr
    samples = [json.loads(x) for x in (workdir / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [2, 4]
    assert all(s["text"].startswith("The ") and len(s["text"]) == 16 for s in samples)


def test_a_hook_that_raises_is_a_plugin_error_after_the_steps_are_saved(
    user_dir, tmp_path, corpus_file
):
    workdir = tmp_path / "run"
    result = _train(
        user_dir,
        workdir,
        corpus_file,
        "--config.hooks.names=my_failing_hooks:Boom",
        "--config.num_steps=8",
        "--config.eval_every=8",
        "--config.checkpoint_every=8",
    )
    assert result.returncode == 1
    assert (
        "error in user code of config.hooks.names='my_failing_hooks:Boom' (on_step at step 3, "
        "saved first): RuntimeError: boom at 3" in result.stderr
    ), result.stderr
    assert "my_failing_hooks.py" in result.stderr and "Traceback" not in result.stderr
    assert steps(workdir / "checkpoints") == [3]


def test_a_hook_with_every_0_beside_a_periodic_one_is_never_called(user_dir, tmp_path, corpus_file):
    """Found when the hooks' periods came to be read once: a hook whose every is 0 (its on_step
    never due) beside one whose every is 2 raised ZeroDivisionError at step 2, a traceback
    naming no hook."""
    workdir = tmp_path / "run"
    result = _train(
        user_dir,
        workdir,
        corpus_file,
        "--config.hooks.names=my_periodic_hooks:Never,my_periodic_hooks:EveryTwo",
        "--config.num_steps=4",
        "--config.eval_every=4",
        "--config.checkpoint_every=4",
    )
    assert result.returncode == 0, result.stderr
    assert (workdir / "steps.jsonl").read_text().split() == ["2", "4"]
