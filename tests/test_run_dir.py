"""Tests for minigpt_jax.runtime.run_dir: the names of a run directory's paths never change (old
runs still resume), and the modules that write a run directory take their paths from RunDir."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import tensorboard_scalars

from minigpt_jax.data.in_memory import prepare_dataset
from minigpt_jax.runtime import locks as run_lock
from minigpt_jax.runtime.checkpoint import Checkpointer
from minigpt_jax.runtime.run_dir import RunDir, fingerprint_path
from minigpt_jax.train import metrics

PACKAGE = Path(__file__).resolve().parents[1] / "minigpt_jax"


def test_paths_keep_the_names_older_runs_have(tmp_path):
    run = RunDir(str(tmp_path))
    assert run.root == tmp_path and RunDir(tmp_path) == run
    relative = {
        "lock": run.lock(),
        "tokenizer": run.tokenizer,
        "tokens": run.tokens,
        "tokens_fingerprint": run.tokens_fingerprint,
        "shards": run.shards,
        "metrics": run.metrics,
        "tensorboard": run.tensorboard,
        "checkpoints": run.checkpoints,
        "best": run.best,
    }
    assert {k: p.relative_to(tmp_path).as_posix() for k, p in relative.items()} == {
        "lock": "run.lock",
        "tokenizer": "tokenizer.json",
        "tokens": "tokens.npy",
        "tokens_fingerprint": "tokens.npy.fingerprint",
        "shards": "shards",
        "metrics": "metrics.jsonl",
        "tensorboard": "tensorboard",
        "checkpoints": "checkpoints",
        "best": "best",
    }
    assert run.lock(0) == run.lock() and run.lock(3) == tmp_path / "run.3.lock"
    cache = tmp_path / "cache" / "x.npy"
    assert fingerprint_path(cache) == tmp_path / "cache" / "x.npy.fingerprint"


def test_checkpoint_dirs(tmp_path):
    run = RunDir(tmp_path)
    assert run.checkpoint_dir("latest") == run.checkpoints
    assert run.checkpoint_dir("best") == run.best
    with pytest.raises(ValueError, match="'latest', 'best'"):
        run.checkpoint_dir("newest")
    assert not run.has_checkpoints()
    run.best.mkdir()
    assert run.has_checkpoints()


def test_the_writers_of_a_run_directory_use_its_paths(tmp_path):
    run = RunDir(tmp_path)
    assert run_lock.RunLock(tmp_path).path == run.lock()
    assert run_lock.RunLock(tmp_path, 2).path == run.lock(2)
    writer = metrics.MetricsWriter(tmp_path)
    writer.write(1, {"loss": 1.5})
    writer.close()
    assert writer.path == run.metrics and run.metrics.is_file() and run.tensorboard.is_dir()
    assert metrics.read_metrics(tmp_path) == [{"step": 1, "loss": 1.5}]
    checkpointer = Checkpointer(tmp_path)
    assert not run.checkpoints.exists()  # it only reads until it starts writing
    checkpointer.start_writing()
    checkpointer.close()
    assert run.checkpoints.is_dir() and run.best.is_dir()
    (tmp_path / "a.txt").write_text("abcdefghij" * 10, encoding="utf-8")
    dataset = prepare_dataset("text", tmp_path / "a.txt", "char", 0, 8, tmp_path)
    assert run.tokenizer.is_file() and run.tokens_fingerprint.is_file()
    np.testing.assert_array_equal(np.load(run.tokens), np.concatenate([dataset.train, dataset.val]))


def test_no_module_but_run_dir_spells_a_run_directory_name():
    """The names with no other meaning in the package appear as string literals in run_dir
    only ("tokenizer.json" is also Hugging Face's file name, "best" a checkpoint choice and
    "shards" a data format, so they are not checked here)."""
    names = {"run.lock", "tokens.npy", "metrics.jsonl", "tensorboard", "checkpoints"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "run_dir.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}")
    assert not found, found


def test_the_metrics_writer_writes_tensorboard_without_importing_torch(tmp_path):
    """tensorboardX's writer imports torch (1-2 s of every `train`'s start-up where torch is
    installed) only to accept torch tensors; the metrics writer imports it without, writes the
    same scalars, and torch still imports afterwards."""
    pytest.importorskip("torch")  # the claim is about a machine where torch is installed
    code = (
        "import sys\n"
        "from minigpt_jax.train.metrics import MetricsWriter\n"
        f"writer = MetricsWriter({str(tmp_path)!r})\n"
        "writer.write(3, {'loss': 1.5, 'lr': 0.25})\n"
        "writer.close()\n"
        "print('torch' in sys.modules)\n"
        "import torch\n"
        "print(torch.ones(2).sum().item())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "2.0"]
    assert tensorboard_scalars(tmp_path) == {"loss": {3: 1.5}, "lr": {3: 0.25}}
