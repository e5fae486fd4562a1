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
