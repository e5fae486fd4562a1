"""`minigpt-jax sweep` against bad input and interruptions (issue 40): an unknown group named
with its valid keys, a seed out of range, studies apart in one folder, a storage it cannot
write or a damaged study.db, --heartbeat inf, an unknown command's --help, a signal while a
trial starts. Each refusal is one line, and nothing is written before it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The full suite only (`python -m pytest -q`): sweep commands in subprocesses.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "tiny.py")
SPACE = ["--space", "optim.lr=1e-3,2e-3"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("jax_cache")
    return {**os.environ, "PYTHONPATH": str(REPO), "MINIGPT_JAX_COMPILATION_CACHE": str(cache)}


def _run(env, *args, timeout=600):
    """`minigpt-jax ARGS` in a subprocess: the CompletedProcess."""
    command = [sys.executable, "-m", "minigpt_jax", *args]
    return subprocess.run(
        command, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout
    )


def _sweep(env, out, *args, timeout=600):
    return _run(env, "sweep", "--config", TINY, "--out", str(out), *args, timeout=timeout)


def _one_line_error(result) -> str:
    """The refusal's one line (exit 2, nothing on stdout)."""
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minigpt-jax sweep: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "args",
    [["--space", "nosuch.key=1,2"], [*SPACE, "--set", "train.steps=2"]],
    ids=["space", "set"],
)
def test_a_key_of_an_unknown_group_lists_the_valid_keys(args, env, tmp_path):
    out = tmp_path / "sweep"
    line = _one_line_error(_sweep(env, out, *args, "--trials", "1"))
    group = args[-1].split(".")[0] if args[0] == "--space" else "train"
    assert f"unknown config key config.{group}" in line, line
    assert "valid keys of config: seed, batch_size" in line and "optim" in line, line
    assert not out.exists()


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_seed_numpy_cannot_take_is_refused_before_anything_is_written(seed, env, tmp_path):
    out = tmp_path / "sweep"
    line = _one_line_error(_sweep(env, out, *SPACE, "--trials", "1", "--seed", seed))
    assert f"--seed {seed} is out of range; give one of 0..4294967295" in line, line
    assert not out.exists()  # no study.db


@pytest.mark.parametrize("sampler", ["tpe", "random", "cmaes"])
def test_the_largest_seed_varied_per_worker_and_rerun_still_seeds_a_sampler(sampler, tmp_path):
    from minigpt_jax.sweep import command as sweep_command
    from minigpt_jax.sweep import study as sweep_study

    argv = ["--config", TINY, "--out", str(tmp_path), *SPACE, "--sampler", sampler]
    sweep = sweep_command.check([*argv, "--seed", str(2**32 - 1), "--worker_index", "3"])
    sampler_made = sweep_study.make_sampler(sweep, existing=10**6)  # seed + 1009*3 + 7919e6
    assert type(sampler_made).__name__.lower().startswith(sampler[:3]), sampler_made
