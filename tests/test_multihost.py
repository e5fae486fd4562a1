"""Multi-host on one machine: two processes joined by jax.distributed train like one process.

Each process is `python -m minigpt_jax train` with 2 fake CPU devices and the
JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID variables, exactly the two-terminal
commands of docs/devices.md; cross-process collectives run over gloo. The pair shares one run
directory, as hosts share a filesystem, on a data=2 x fsdp=2 mesh (the batch split four ways,
params over fsdp); the reference is one process with 4 devices and the same mesh, batch and
seed. Within one topology a resume is bit-exact; across process counts gloo sums in another
order, so the comparison is to float32 tolerance.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from minigpt_jax.runtime.checkpoint import load_params
from minigpt_jax.sharding import HEARTBEAT_TIMEOUT_ENV

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
TRAIN = [
    *("--config", "configs/tiny.py", "--progress=false"),
    *("--config.mesh.data=2", "--config.mesh.fsdp=2"),
    *("--config.num_steps=20", "--config.eval_every=10", "--config.checkpoint_every=10"),
    "--config.eval_batches=1",
    "--config.model.matmul_dtype=float32",  # float32 equivalence on every CPU (bf16: its own)
]
# The per-step figures a resumed run must reproduce bit for bit (tokens_per_sec is wall time).
EXACT_KEYS = ("train_loss", "grad_norm", "lr", "val_loss", "eval_train_loss")
TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(
    workdir: Path, *, devices: int, process: tuple[int, int, int] | None, extra=(), env_extra=None
):
    """`python -m minigpt_jax train` on `devices` CPU devices; process = (id, count, port)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env.update(env_extra or {})
    if process is not None:
        process_id, count, port = process
        env["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{port}"
        env["JAX_NUM_PROCESSES"] = str(count)
        env["JAX_PROCESS_ID"] = str(process_id)
    command = [sys.executable, "-m", "minigpt_jax", "train", "--workdir", str(workdir), *TRAIN]
    return subprocess.Popen(
        [*command, *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"a training process hung past {TIMEOUT_S} s:\n{err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]
    return out, err


def _train_pair(workdir: Path, extra=()) -> list[str]:
    port = _free_port()
    procs = [_start(workdir, devices=2, process=(i, 2, port), extra=extra) for i in range(2)]
    return [_finish(proc)[0] for proc in procs]


def _train_one(workdir: Path) -> str:
    return _finish(_start(workdir, devices=4, process=None))[0]


def _records(workdir: Path) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _exact(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k == "step" or k in EXACT_KEYS} for r in records]


def _losses(records: list[dict]) -> np.ndarray:
    return np.array([r["train_loss"] for r in records if "train_loss" in r])


def _max_param_diff(workdir_a: Path, workdir_b: Path) -> float:
    params_a, _ = load_params(workdir_a)
    params_b, _ = load_params(workdir_b)
    diffs = jax.tree_util.tree_map(
        lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))), params_a, params_b
    )
    return max(jax.tree_util.tree_leaves(diffs))


def _rewind_to_step_10(source: Path, target: Path) -> None:
    """A copy of a finished run as if every process had been killed right after step 10's
    checkpoint: step 20's saves and metrics are gone."""
    shutil.copytree(source, target)
    shutil.rmtree(target / "checkpoints" / "20")
    for best in (target / "best").iterdir():
        if int(best.name) > 10:
            shutil.rmtree(best)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("multihost")
    pair_out = _train_pair(root / "pair")
    one_out = _train_one(root / "one")
    _rewind_to_step_10(root / "pair", root / "pair_resumed")
    resumed_out = _train_pair(root / "pair_resumed")
    _rewind_to_step_10(root / "pair", root / "one_resumed")
    one_resumed_out = _train_one(root / "one_resumed")
    return {
        "root": root,
        "pair_out": pair_out,
        "one_out": one_out,
        "resumed_out": resumed_out,
        "one_resumed_out": one_resumed_out,
    }


def test_two_processes_train_like_one(runs):
    root = runs["root"]
    pair, one = _records(root / "pair"), _records(root / "one")
    assert [r["step"] for r in pair] == [r["step"] for r in one]
    np.testing.assert_allclose(_losses(pair), _losses(one), rtol=1e-5)
    assert _max_param_diff(root / "pair", root / "one") < 1e-5
    # Both processes report the same final figures, the same as the single process.
    summary = [out.strip().splitlines()[-1].split("; wall")[0] for out in runs["pair_out"]]
    assert summary[0] == summary[1]
    assert summary[0].startswith("step 20: train loss")


def test_only_process_zero_writes_metrics_and_tensorboard(runs):
    pair = _records(runs["root"] / "pair")
    train_steps = [r["step"] for r in pair if "train_loss" in r]
    assert train_steps == list(range(1, 21))  # every step once: process 1 appended nothing
    assert [r["step"] for r in pair if "val_loss" in r] == [10, 20]
    event_files = list((runs["root"] / "pair" / "tensorboard").iterdir())
    assert len(event_files) == 1, event_files


def test_pair_checkpoint_resumes_bit_exactly_in_the_pair(runs):
    root = runs["root"]
    assert all("resumed from step 10" in out for out in runs["resumed_out"])
    assert _exact(_records(root / "pair_resumed")) == _exact(_records(root / "pair"))
    assert _max_param_diff(root / "pair_resumed", root / "pair") == 0.0


def test_pair_checkpoint_resumes_in_one_process(runs):
    root = runs["root"]
    assert "resumed from step 10" in runs["one_resumed_out"]
    resumed, pair = _records(root / "one_resumed"), _records(root / "pair")
    assert [r["step"] for r in resumed] == [r["step"] for r in pair]
    np.testing.assert_allclose(_losses(resumed), _losses(pair), rtol=1e-5)
    assert _max_param_diff(root / "one_resumed", root / "pair") < 1e-5


def test_a_dead_process_makes_the_other_exit_with_a_clear_message(tmp_path):
    workdir, port = tmp_path / "run", _free_port()
    extra = ("--config.num_steps=100000", "--config.eval_every=100000")
    # A kill that lands while the survivor waits in a coordination-service barrier (inside a
    # save) is noticed only when the dead process misses its heartbeats: bound that wait.
    heartbeat = {HEARTBEAT_TIMEOUT_ENV: "20"}
    survivor, victim = (
        _start(workdir, devices=2, process=(i, 2, port), extra=extra, env_extra=heartbeat)
        for i in range(2)
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not (workdir / "checkpoints" / "10").exists():
            assert survivor.poll() is None and victim.poll() is None, "a process ended early"
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.2)
        victim.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = survivor.communicate(timeout=90)
        waited = time.monotonic() - killed_at
    finally:
        for proc in (survivor, victim):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    # Usually a collective fails first and our message ends the run (status 1); when JAX's
    # coordination service notices the dead task first, JAX aborts the process itself, with its
    # own message. Either way the survivor ends promptly and says why.
    ours = survivor.returncode == 1 and (
        "process 0 of 2 lost contact with another process" in err
        and "start every process again with the same command" in err
    )
    jax_abort = survivor.returncode == -signal.SIGABRT and "another task died" in err
    assert ours or jax_abort, (survivor.returncode, err[-3000:])
    assert waited < 90
