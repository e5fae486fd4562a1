"""minigpt_jax/runtime/compile_cache.py: where JAX's persistent compilation cache lives, and that
a run with it, warm or cold, trains to exactly the losses of a run without it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minigpt_jax.runtime import compile_cache

# The full suite only (`python -m pytest -q`): runs in subprocesses.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_the_folder_follows_the_environment(tmp_path):
    home = {"XDG_CACHE_HOME": str(tmp_path)}
    assert compile_cache.cache_dir(home) == tmp_path / "minigpt_jax" / "jax_compilation"
    assert compile_cache.cache_dir({compile_cache.ENV: str(tmp_path / "c")}) == tmp_path / "c"
    for off in ("off", "0", "false", "", "None"):
        assert compile_cache.cache_dir({compile_cache.ENV: off}) is None


def _train(workdir, cache):
    env = {**os.environ, "PYTHONPATH": str(REPO), compile_cache.ENV: cache}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    command = [
        sys.executable, "-m", "minigpt_jax", "train", "--config", str(REPO / "configs/tiny.py"),
        "--workdir", str(workdir), "--progress=false", "--config.num_steps=10",
        "--config.eval_every=5", "--config.checkpoint_every=10",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("train_loss"), r.get("val_loss")) for r in rows]


@pytest.mark.slow
def test_losses_are_the_same_with_a_cold_cache_a_warm_one_and_none(tmp_path):
    cache = tmp_path / "cache"
    cold = _train(tmp_path / "cold", str(cache))
    entries = sorted(p.name for p in cache.iterdir())
    assert any(name.startswith("jit_") for name in entries)  # the train chunk was written
    warm = _train(tmp_path / "warm", str(cache))
    off = _train(tmp_path / "off", "off")
    assert len(cold) == 12 and cold == warm == off  # 10 train rows, 2 evaluations: exactly equal


# Two programs compiled through the cache, in a child process as a command would.
JIT_TWICE = """
import jax, jax.numpy as jnp
from minigpt_jax.runtime import compile_cache
compile_cache.enable()
print(float(jax.jit(lambda x: jnp.sin(x) * 2)(jnp.arange(3.0)).sum()))
print(float(jax.jit(lambda x: jnp.cos(x) + 1)(jnp.arange(3.0)).sum()))
"""


def _jit_twice(cache: Path) -> list[str]:
    """stderr's lines of JIT_TWICE run with `cache` as the compilation cache."""
    env = {**os.environ, "PYTHONPATH": str(REPO), compile_cache.ENV: str(cache)}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    result = subprocess.run(
        [sys.executable, "-c", JIT_TWICE], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stderr.splitlines()


def test_damaged_entries_are_removed_once_not_warned_of_on_every_run(tmp_path):
    """Issue 40: a damaged cache printed JAX's `Error reading persistent compilation cache
    entry` warning (2 lines each) for every entry, on every run."""
    cache = tmp_path / "cache"
    assert _jit_twice(cache) == []
    entries = sorted(cache.glob("*-cache"))
    for entry in entries:
        entry.write_bytes(b"not an executable")
    (line,) = _jit_twice(cache)
    assert line.endswith(f"compilation cache {cache}: removed {len(entries)} damaged entries "
                         "(compiled again when needed)"), line  # fmt: skip
    assert _jit_twice(cache) == []  # repaired: the entries were written again


def test_a_full_cache_folder_is_bypassed_with_one_line(tmp_path):
    """Issue 40: a full (or read-only) cache folder printed JAX's `Error writing persistent
    compilation cache entry` warning for every program, on every run."""
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)]).returncode:
        pytest.skip("needs a tmpfs mount (root)")
    try:
        with open(mount / "filler", "wb") as filler, pytest.raises(OSError):
            filler.write(bytes(512 << 10))  # more than it holds: full
            filler.flush()
        (line,) = _jit_twice(mount / "cache")
        cache = mount / "cache"
        assert f"compilation cache off for this run: {cache} cannot be written" in line, line
        assert f"set {compile_cache.ENV} to another folder" in line
    finally:
        subprocess.run(["umount", str(mount)])
