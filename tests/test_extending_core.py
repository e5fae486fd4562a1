"""Plug-ins as a researcher writes them, from files in a folder outside the package and through
the command line: settings an entry declares, errors that point at the plug-in's own file and
line, entries checked against their registry's contract before anything is written, and a
run's identity that includes the plug-ins' source."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from minigpt_jax import forward, init_params
from minigpt_jax.run_config import check_experiment_config, default_config, gpt_config_from

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "tiny.py")

MASKS = """\
from minigpt_jax.registry import declares
from minigpt_jax.settings import MODEL, setting


@declares(window=setting(4, "keys each query sees, itself included", MODEL, low=1))
def sliding_window(q_positions_BxT, k_positions_BxS, cfg):
    q_Bx1xTx1 = q_positions_BxT[:, None, :, None]
    k_Bx1x1xS = k_positions_BxS[:, None, None, :]
    return (k_Bx1x1xS <= q_Bx1xTx1) & (k_Bx1x1xS > q_Bx1xTx1 - cfg.window)
"""

OPTS = """\
import optax

from minigpt_jax.registry import declares
from minigpt_jax.settings import TRAJECTORY, setting


@declares(sf_b1=setting(0.9, "schedule-free's interpolation", TRAJECTORY, low=0.0, high=1.0))
def schedule_free(optim, learning_rate):
    return optax.contrib.schedule_free_adamw(optim.lr, b1=optim.sf_b1)
"""


def _write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def _cli(folder: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m minigpt_jax ARGS` run from the user's folder, as a researcher would."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(folder)])}
    env.pop("MINIGPT_JAX_TRACEBACK", None)
    result = subprocess.run(
        [sys.executable, "-m", "minigpt_jax", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
        env=env,
    )
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def _train(folder: Path, workdir: str, *extra: str, check: bool = True):
    return _cli(
        folder,
        "train",
        "--config",
        TINY,
        "--workdir",
        workdir,
        "--config.num_steps=2",
        "--config.eval_every=2",
        "--config.checkpoint_every=2",
        "--config.eval_batches=1",
        "--progress=false",
        *extra,
        check=check,
    )


def _meta(workdir: Path) -> dict:
    (path,) = workdir.glob("checkpoints/*/meta/metadata")
    return json.loads(path.read_text())


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    _write(tmp_path, "my_masks.py", MASKS)
    _write(tmp_path, "my_opts.py", OPTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


# ----------------------------------------------------------------------------- entry settings


def test_an_entry_setting_is_listed_overridden_checked_and_recorded(user_dir):
    pick = "--config.model.attention_mask=my_masks:sliding_window"
    listed = _cli(user_dir, "settings", "--config", TINY, pick, "--config.model.window=8")
    (line,) = [line for line in listed.stdout.splitlines() if line.split()[:1] == ["window"]]
    assert line.split()[:3] == ["window", "8", "model"]
    assert "my_masks:sliding_window" in line

    refused = _train(user_dir, "runs/zero", pick, "--config.model.window=0", check=False)
    assert refused.returncode != 0
    assert "config.model.window must be a positive integer, got 0" in refused.stderr
    assert not (user_dir / "runs" / "zero").exists()

    _train(user_dir, "runs/w2", pick, "--config.model.window=2")
    meta = _meta(user_dir / "runs" / "w2")
    assert meta["config"]["model"]["window"] == 2
    assert meta["gpt_config"]["entry_settings"] == [["window", 2]]
    # A MODEL setting must match on resume.
    other = _train(user_dir, "runs/w2", pick, "--config.model.window=3", check=False)
    assert "holds a different model" in other.stderr
    assert "config.model.window: 2 -> 3" in other.stderr


def test_the_window_setting_changes_what_the_model_sees(user_dir):
    config = default_config()
    config.model.update(block_size=16, n_layer=1, n_head=2, n_embd=32, dropout=0.0)
    config.model.attention_mask = "my_masks:sliding_window"
    config.model.window = 2
    config = check_experiment_config(config)
    cfg2 = gpt_config_from(config, 64)
    assert cfg2.window == 2
    cfg4 = gpt_config_from(check_experiment_config({"model": {**config.model, "window": 4}}), 64)
    params = init_params(cfg2, jax.random.key(0))
    tokens_BxT = jax.random.randint(jax.random.key(1), (1, 12), 0, 64)
    edited_BxT = tokens_BxT.at[:, 5].set((tokens_BxT[:, 5] + 1) % 64)
    # One layer of window 2 sees t-1..t: token 5 reaches positions 5 and 6 only.
    np.testing.assert_array_equal(
        forward(params, tokens_BxT, cfg2)[:, 7:], forward(params, edited_BxT, cfg2)[:, 7:]
    )
    assert not np.allclose(
        forward(params, tokens_BxT, cfg4)[:, 7:], forward(params, edited_BxT, cfg4)[:, 7:]
    )


def test_an_optimizer_setting_is_a_trajectory_setting(user_dir):
    pick = "--config.optim.name=my_opts:schedule_free"
    _train(user_dir, "runs/sf", pick, "--config.optim.sf_b1=0.95")
    assert _meta(user_dir / "runs" / "sf")["config"]["optim"]["sf_b1"] == 0.95
    more = ("--config.num_steps=4", "--config.checkpoint_every=2")
    refused = _train(user_dir, "runs/sf", pick, "--config.optim.sf_b1=0.9", *more, check=False)
    assert "config.optim.sf_b1: 0.95 -> 0.9" in refused.stderr
    assert "--allow_resume_changes" in refused.stderr


def test_a_clash_with_a_built_in_setting_names_both(user_dir):
    _write(
        user_dir,
        "clash.py",
        """\
        from minigpt_jax.registry import declares
        from minigpt_jax.settings import TRAJECTORY, setting


        @declares(b1=setting(0.5, "mine", TRAJECTORY))
        def opt(optim, learning_rate):
            raise AssertionError("never built")
        """,
    )
    config = default_config()
    config.optim.name = "clash:opt"
    with pytest.raises(ValueError, match=r"optim.name='clash:opt'.*'b1'.*config.optim.b1"):
        check_experiment_config(config)
