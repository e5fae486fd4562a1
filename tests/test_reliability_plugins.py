"""Reliability, fourth round (issue 40), the training side: a plug-in that fails or turns NaN
while a run trains loses no trained step and is named, a run's identity covers every module of
the user's own a plug-in imports, and a signal during a slow plug-in import names its phase."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, assert_one_plugin_error, cli_in, error_lines, steps, write_module

# The full suite only (`python -m pytest -q`): plug-ins through the command line.
pytestmark = pytest.mark.slow

TINY = str(REPO / "configs" / "tiny.py")

# A metric whose host callback raises: jit can only fail while the evaluation runs.
RAISING_METRIC = """\
import jax
import jax.numpy as jnp


def _on_host(total):
    raise RuntimeError("the metric failed on the host")


def boom(params, batch_BxT1, intermediates, cfg):
    return jax.pure_callback(_on_host, jax.ShapeDtypeStruct((), jnp.float32), batch_BxT1.sum())
"""


# 4 steps, evaluated and saved at step 4 (the probe), one eval batch.
SETTINGS = {
    "data.corpus": "text",
    "data.path": "corpus.txt",
    "num_steps": 4,
    "steps_per_call": 2,
    "eval_every": 4,
    "checkpoint_every": 4,
    "eval_batches": 1,
}


def _train(folder: Path, *extra: str, check: bool = False, **settings):
    """`minigpt-jax train` of configs/tiny.py with SETTINGS (and `settings`) in folder/run."""
    flags = [f"--config.{k}={v}" for k, v in {**SETTINGS, **settings}.items()]
    args = ["train", "--config", TINY, "--workdir", "run", "--progress=false", *flags, *extra]
    return cli_in(folder, *args, check=check)


def test_a_metric_raising_in_the_evaluation_keeps_the_steps_and_is_named(user_dir):
    """Issue 40, defect 1: a 68-line traceback ending in `INTERNAL: CpuCallback error`, the key
    not named, and no checkpoint at all after a 4-step run evaluated and saved at step 4."""
    write_module(user_dir, "bad_metric.py", RAISING_METRIC)
    failed = _train(user_dir, "--config.eval.metrics=bad_metric:boom")
    assert failed.returncode == 1
    lines = assert_one_plugin_error(
        failed.stderr,
        "minigpt-jax train: error in user code of config.eval.metrics='bad_metric:boom': "
        "RuntimeError: the metric failed on the host (in the step-4 evaluation)",
        f'{user_dir / "bad_metric.py"}", line 6, in _on_host',
        "The 4 steps trained are kept in checkpoint 4",
    )
    assert steps(user_dir / "run" / "checkpoints") == [4]
    # The same command again: the pending evaluation runs first and is refused the same way.
    again = _train(user_dir, "--config.eval.metrics=bad_metric:boom")
    assert again.returncode == 1 and error_lines(again.stderr) == lines, again.stderr
    assert steps(user_dir / "run" / "checkpoints") == [4]


ACTIVATION = """\
import jax.numpy as jnp
from my_scale import SCALE


def scaled_tanh(x):
    return jnp.tanh(x) * SCALE
"""


def test_editing_a_helper_module_of_a_plugin_is_a_change_of_code(user_dir):
    """Issue 40, defect 7: a module the plug-in imports was edited and the run resumed silently
    (it drifted from 3.2617 to 3.3703); sample, eval and export said nothing either."""
    write_module(user_dir, "my_act.py", ACTIVATION)
    write_module(user_dir, "my_scale.py", "SCALE = 1.0\n")
    activation = "--config.model.activation=my_act:scaled_tanh"
    _train(user_dir, activation, check=True, num_steps=2, eval_every=2, checkpoint_every=2)
    write_module(user_dir, "my_scale.py", "SCALE = 1.0  # a comment counts: the source's digest\n")
    refused = _train(user_dir, activation, num_steps=2, eval_every=2, checkpoint_every=2)
    assert refused.returncode == 1
    assert "the source of module my_scale (sha256 " in refused.stderr, refused.stderr
    assert "--allow_resume_changes" in refused.stderr
    sampled = cli_in(user_dir, "sample", "--workdir", "run", "--max_new_tokens=4")
    (warning,) = [line for line in sampled.stderr.splitlines() if "plug-in code" in line]
    assert "run was trained with other plug-in code: the source of module my_scale" in warning


def test_a_nan_from_an_activation_names_it_and_leaves_no_run_behind(user_dir):
    """Issue 40: an activation turning NaN (log of negatives) was blamed on the learning rate
    alone, and the fresh run left run.lock, tokens.npy and an empty checkpoints/ behind."""
    write_module(
        user_dir, "nan_act.py", "import jax.numpy as jnp\n\n\ndef bad(x):\n    return jnp.log(x)\n"
    )
    failed = _train(user_dir, "--config.model.activation=nan_act:bad")
    assert failed.returncode == 1
    error = failed.stderr.strip().splitlines()[-1]
    assert "non-finite training loss nan" in error, failed.stderr
    assert error.index("config.model.activation='nan_act:bad'") < error.index("optim.lr"), error
    assert not (user_dir / "run").exists(), sorted(p.name for p in (user_dir / "run").iterdir())


def test_a_nan_metric_is_named_once_and_not_sent_to_tensorboard(user_dir):
    """Issue 40: a metric plug-in returning NaN logged "nan" with absl lines from TensorBoard
    (`NaN or Inf found in input tensor`) naming nothing."""
    source = "import jax.numpy as jnp\n\n\ndef bad(params, batch_BxT1, intermediates, cfg):\n"
    write_module(
        user_dir, "nan_metric.py", source + "    return jnp.log(-1.0 + 0 * batch_BxT1.sum())\n"
    )
    ran = _train(user_dir, "--config.eval.metrics=nan_metric:bad", check=True, eval_every=2)
    assert "NaN or Inf" not in ran.stderr, ran.stderr
    warnings = [line for line in ran.stderr.splitlines() if "val_bad is nan" in line]
    assert len(warnings) == 1, ran.stderr  # two evaluations, one warning
    assert "config.eval.metrics" in warnings[0], warnings[0]


def test_a_signal_during_a_slow_plugin_import_names_the_import(user_dir):
    """Issue 40: SIGTERM while a plug-in's module was still being imported was reported as
    "received while checking the checkpoints"."""
    source = "from pathlib import Path\nimport time\n\nPath('importing').touch()\ntime.sleep(60)\n"
    write_module(
        user_dir, "slow_metric.py", source + "\n\ndef slow(params, batch, inter, cfg):\n    pass\n"
    )
    flags = [f"--config.{k}={v}" for k, v in SETTINGS.items()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(user_dir)])}
    child = subprocess.Popen(
        [sys.executable, "-m", "minigpt_jax", "train", "--config", TINY, "--workdir", "run",
         "--progress=false", *flags, "--config.eval.metrics=slow_metric:slow"],
        cwd=user_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (user_dir / "importing").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    child.send_signal(signal.SIGTERM)
    output, _ = child.communicate(timeout=60)
    assert "SIGTERM received while importing the config's plug-ins" in output, output
    assert not (user_dir / "run").exists()
