"""Shared test setup: strict numerics, the persistent compilation cache, and the fixtures many
files use (the 40 kB corpus, one uninterrupted reference run); compile time dominates, so they
are made once a session."""

import os
import shutil

# XLA:GPU sums scatter-adds (a token table's gradient, say) with atomics, in a different order on
# each run: two runs of one seed then differ in float rounding (seen on an H200: a loss of
# 4.0183735 against 4.0183740 at step 8). The bit-for-bit claims (same seed twice, resume, the
# VJPs against each other) are checked on a GPU under XLA's switch to deterministic kernels
# (not yet run on a GPU with it); XLA:CPU reads and ignores it. Set before JAX starts its
# backends, and inherited by the suite's subprocesses and xdist workers.
os.environ["XLA_FLAGS"] = " ".join(  # once, though each xdist worker imports this file again
    dict.fromkeys([*os.environ.get("XLA_FLAGS", "").split(), "--xla_gpu_deterministic_ops=true"])
)

import jax
import pytest
import scheduling
from helpers import crash_train_args, pydoc_text, run

from minigpt_jax.runtime import compile_cache

# Implicit rank promotion hides shape bugs; full-precision matmuls keep GPU (TF32) runs honest.
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", "float32")
# The in-process runs load a program another test compiled, as every `minigpt-jax` command of
# the suite does (the same folder: MINIGPT_JAX_COMPILATION_CACHE, else ~/.cache); the numbers
# do not change (tests/test_compile_cache.py).
compile_cache.enable()


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory):
    """About 40 kB of real English text, as a plain .txt corpus."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(pydoc_text())
    return path


@pytest.fixture
def user_dir(tmp_path):
    """A user's folder outside the package, holding corpus.txt (real English text): where a
    test writes its plug-ins and runs the command line."""
    (tmp_path / "corpus.txt").write_text(pydoc_text())
    return tmp_path


@pytest.fixture(scope="session")
def reference(corpus_file, tmp_path_factory):
    """One uninterrupted `train` of helpers.CRASH_SETTINGS (checkpoints 36 and 40), the run
    every crash and reliability test resumes, copies or damages."""
    workdir = tmp_path_factory.mktemp("reference")
    result = run(crash_train_args(workdir, corpus_file))
    assert result.returncode == 0, result.stderr
    return workdir


@pytest.fixture
def copy_of(reference, tmp_path):
    """A fresh copy of the reference run directory."""
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    return workdir


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """The longest work first, each module's shared fixtures on one worker (tests/scheduling.py)."""
    scheduling.order_and_group(items, group=config.pluginmanager.hasplugin("xdist"))
