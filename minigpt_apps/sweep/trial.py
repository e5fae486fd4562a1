"""One trial of a sweep: `python -m minigpt_jax train` in a child process on the trial's run
directory, followed through its metrics.jsonl, and the trial's result read from that file.

The child dies with its worker (Linux: PR_SET_PDEATHSIG sends it SIGTERM, so it saves a
checkpoint), so a worker killed with kill -9 leaves no orphan training on, and a rerun resumes
the run directory from its checkpoint. Optuna is not imported here: the worker passes
`on_evaluation`, which says whether to stop.
"""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from minigpt_jax.runtime.run_dir import RunDir
from minigpt_jax.train.metrics import read_metrics

POLL_S = 0.2  # how often the worker looks at the child and its metrics
STOP_GRACE_S = 120  # a SIGTERMed child saves a checkpoint; past this it is killed


def die_with_parent() -> None:  # pragma: no cover - runs in the child, between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: a killed worker's child trains on, and its run lock keeps it alone


def start(run_dir: Path, config_file: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python -m minigpt_jax train --config config_file --workdir run_dir` in a child whose
    output goes to run_dir/train.log (`env`: variables set for it over this process's)."""
    log = open(run_dir / "train.log", "ab")  # noqa: SIM115 - the child holds it
    command = [
        sys.executable, "-m", "minigpt_jax", "train", "--config", str(config_file),
        "--workdir", str(run_dir), "--progress=false",
    ]  # fmt: skip
    try:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
            env=None if env is None else {**os.environ, **env},
        )
    finally:
        log.close()


def child_env(slot: int, gpus_per_worker: int, workers: int) -> dict[str, str]:
    """The variables a training child started by worker `slot` (of `workers` on this machine)
    gets over this process's: its own `gpus_per_worker` GPUs (slot·N .. slot·N + N − 1), or,
    when workers share the GPUs, no preallocation (no child takes 75% of one)."""
    if gpus_per_worker:
        first = slot * gpus_per_worker
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(first + i) for i in range(gpus_per_worker))}
    if workers > 1 and "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ:
        return {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    return {}


def wait_for_run_lock(run_dir: Path, timeout: float = STOP_GRACE_S) -> None:
    """Waits (up to `timeout`) until no process holds the run directory's run lock, as a
    trial resumed after its worker died may find its old child still saving a checkpoint."""
    path = RunDir(run_dir).lock()
    deadline = time.monotonic() + timeout
    while path.exists() and time.monotonic() < deadline:
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(POLL_S)
        finally:
            os.close(fd)  # closing releases a lock taken here


class MetricsFollower:
    """New complete records of a growing metrics.jsonl (a torn last line waits its turn)."""

    def __init__(self, path: Path):
        self.path, self._offset = path, 0

    def new_records(self) -> list[dict]:
        if not self.path.exists():
            return []
        if self.path.stat().st_size < self._offset:  # rewritten on resume: read it again
            self._offset = 0
        with open(self.path, "rb") as file:
            file.seek(self._offset)
            data = file.read()
        end = data.rfind(b"\n") + 1
        self._offset += end
        records = []
        for line in data[:end].splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records


def follow(
    child: subprocess.Popen,
    run_dir: Path,
    on_evaluation: Callable[[int, float], str | None],
    keep_going: Callable[[], bool],
) -> tuple[int | None, str | None]:
    """Waits for the child, calling on_evaluation(step, val_loss) for every evaluation it
    records in order (from the start of the file: a resumed run's earlier ones too); stops the
    child (SIGTERM, then SIGKILL) when that returns a reason ("pruned", "reached") or
    keep_going() turns False ("stopped"). Returns (the child's exit code, the reason or None)."""
    follower, seen, why = MetricsFollower(RunDir(run_dir).metrics), set(), None
    while True:
        done = child.poll() is not None
        for record in follower.new_records():
            val = record.get("val_loss")
            if isinstance(val, (int, float)) and record["step"] not in seen and why is None:
                seen.add(record["step"])
                why = on_evaluation(record["step"], float(val))
        if why is None and not keep_going():
            why = "stopped"
        if done:
            return child.returncode, why
        if why is not None:
            return stop(child), why
        time.sleep(POLL_S)


def stop(child: subprocess.Popen) -> int:
    """SIGTERM (the child saves a checkpoint and ends), SIGKILL if it is not gone in time.
    Returns the child's exit code, 0 for a child that ended as asked: a train stopped by
    SIGTERM exits 128 + SIGTERM once its checkpoint is saved, and one the SIGTERM reaches after
    its last step, once its handler is gone (it is exiting), ends by the signal itself (-SIGTERM);
    what it saved is read from its run directory, not from this code."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return 0 if child.returncode in (128 + signal.SIGTERM, -signal.SIGTERM) else child.returncode


def records_of(run_dir: Path) -> list[dict]:
    """The records of the run's metrics.jsonl; none when the child ended before writing one
    (stopped or killed while it started)."""
    if not RunDir(run_dir).metrics.exists():
        return []
    return read_metrics(run_dir)


@dataclasses.dataclass
class Result:
    """A finished run directory's record: its evaluations, best val loss, last step and, for a
    target, the training seconds to its first evaluation at or below it."""

    evals: list[tuple[int, float]]
    best_val_loss: float | None
    last_step: int
    train_seconds: float
    seconds_to_target: float | None
    step_at_target: int | None


def result_of(run_dir: Path, tokens_per_step: int, target: float | None) -> Result:
    """The result metrics.jsonl records. Seconds are training time: each step's share of its
    chunk's time (tokens per step / tokens_per_sec), start-up, compilation and evaluation left
    out, so a trial resumed from its checkpoint is timed as one that ran through."""
    evals, seconds, elapsed, last = [], {}, 0.0, 0
    for record in records_of(run_dir):
        step = record["step"]
        last = max(last, step)
        rate = record.get("tokens_per_sec")
        if isinstance(rate, (int, float)) and rate > 0:
            elapsed += tokens_per_step / rate
            seconds[step] = elapsed
        val = record.get("val_loss")
        if isinstance(val, (int, float)) and math.isfinite(val):
            evals.append((step, float(val)))
    at_target = next((s for s, v in evals if target is not None and v <= target), None)
    return Result(
        evals=evals,
        best_val_loss=min((v for _, v in evals), default=None),
        last_step=last,
        train_seconds=elapsed,
        seconds_to_target=None if at_target is None else seconds.get(at_target, elapsed),
        step_at_target=at_target,
    )


def last_line(run_dir: Path) -> str:
    """The last non-empty line the child wrote (its one-line error, when it failed)."""
    try:
        lines = (run_dir / "train.log").read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no train.log"
    return lines[-1].strip() if lines else "no output"
