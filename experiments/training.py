"""Helpers shared by the training studies (experiments 8-10): configs, fresh runs, curves."""

from __future__ import annotations

import argparse
import contextlib
import copy
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from configs import shakespeare_char
from minigpt_jax.train.loop import RunSummary, train_and_evaluate
from minigpt_jax.train.metrics import read_metrics
from minigpt_jax.typed_config import build_experiment

# Validation passes per run: enough points for a curve, cheap next to the training steps.
EVALS_PER_RUN = 10


def add_training_args(parser: argparse.ArgumentParser, steps: int) -> argparse.ArgumentParser:
    """Adds `--steps` (the budget of every run) and `--data` (config.data.path)."""
    parser.add_argument(
        "--steps", type=int, default=steps, help=f"optimizer steps per run (default {steps})"
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="tinyshakespeare.txt or its directory (config.data.path); default: "
        "$MINIGPT_JAX_DATA, then the user cache, then a checked download",
    )
    return parser


def study_config(config: Any = None, *, steps: int, data: str | Path | None = None) -> Any:
    """A copy of `config` (default: configs/shakespeare_char.py) trained for `steps` steps.

    Only the budget changes: num_steps (the cosine schedule spans it), EVALS_PER_RUN validation
    passes, one checkpoint at the end; data sets config.data.path.
    """
    config = copy.deepcopy(config) if config is not None else shakespeare_char.get_config()
    config.num_steps = steps
    config.eval_every = max(1, steps // EVALS_PER_RUN)
    config.checkpoint_every = steps
    if data is not None:
        config.data.path = str(data)
    return config


def describe_budget(config: Any) -> str:
    """One line: steps, batch, block, tokens seen, seed, corpus."""
    tokens = config.num_steps * config.batch_size * config.model.block_size
    return (
        f"budget: {config.num_steps} steps x batch {config.batch_size} x block "
        f"{config.model.block_size} = {tokens:,} training tokens per run, seed {config.seed}, "
        f"corpus {config.data.corpus!r} ({config.data.tokenizer} tokenizer)"
    )


@contextlib.contextmanager
def runs_root(outdir: Path | None) -> Iterator[Path]:
    """OUTDIR/runs, or a temporary directory (deleted afterwards) when outdir is None."""
    if outdir is not None:
        root = Path(outdir) / "runs"
        root.mkdir(parents=True, exist_ok=True)
        yield root
    else:
        with tempfile.TemporaryDirectory(prefix="minigpt_runs_") as tmp:
            yield Path(tmp)


def train_fresh(config: Any, workdir: Path, name: str) -> RunSummary:
    """Trains `config` from scratch in `workdir`, replacing an earlier run there.

    train_and_evaluate would resume an old checkpoint, on a schedule that may not match this
    config's num_steps; a study compares runs that started from the same point.
    """
    if workdir.exists():
        shutil.rmtree(workdir)
    return train(config, workdir, name)


def train(config: Any, workdir: Path, name: str) -> RunSummary:
    """train_and_evaluate without a progress bar, then one summary line."""
    summary = train_and_evaluate(build_experiment(config), workdir, progress=False)
    print(
        f"trained {name}: {summary.step} steps in {summary.wall_time_s:.0f} s "
        f"({summary.median_step_ms:.0f} ms/step), val loss {summary.val_loss:.4f}"
    )
    return summary


def val_curve(workdir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(steps, val losses) of a run's evaluations, from workdir/metrics.jsonl."""
    rows = [row for row in read_metrics(workdir) if "val_loss" in row]
    return (
        np.array([row["step"] for row in rows]),
        np.array([row["val_loss"] for row in rows], dtype=np.float64),
    )
