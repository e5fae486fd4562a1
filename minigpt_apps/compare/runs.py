"""Training a comparison's runs: each is an ordinary run directory, OUT/ARM/seed-S/ with its
config.py (the base config, the arm's values, config.seed = S), trained by train_and_evaluate,
one after another in this process (--workers 1), or in K `minigpt-jax train` children at once
(the sweep's trial.start: a child dies with this process and saves a checkpoint as it goes).
A run that ends has its end recorded (record.write_end); a run stopped by a signal has none and
resumes from its checkpoint when the same command runs again."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from minigpt_apps.compare.plan import Arm, Comparison
from minigpt_apps.compare.record import read_record, write_end
from minigpt_apps.sweep import space as spaces
from minigpt_apps.sweep import trial as trials
from minigpt_jax.runtime.run_dir import RunDir
from minigpt_jax.runtime.signals import StopRequest

Say = Callable[[str], None]


class CompareStop(StopRequest):
    """SIGINT/SIGTERM: start no more runs, and pass SIGTERM on to the children training (each
    saves a checkpoint and ends)."""

    def __init__(self):
        super().__init__()
        self.children: list[subprocess.Popen] = []

    def on_signal(self, sig: signal.Signals) -> None:
        super().on_signal(sig)
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)


def prepare(comparison: Comparison, arm: Arm, seed: int) -> Path:
    """The run directory with its config.py (written once; the same on every rerun), free of
    a run lock a killed command's child may still hold while it saves. Returns config.py."""
    run_dir = comparison.run_dir(arm, seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    doc = comparison.run_doc(arm, seed)
    text = spaces.config_file_text(arm.config_spec, comparison.values(arm, seed), doc)
    config_file = run_dir / "config.py"
    if not config_file.exists() or config_file.read_text() != text:
        config_file.write_text(text)
    if RunDir(run_dir).lock().exists():
        trials.wait_for_run_lock(run_dir)
    return config_file


def _first_line(error: BaseException | str) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _end_of_error(run_dir: Path, line: str, diverged: bool) -> str:
    status = "diverged" if diverged or "non-finite" in line else "failed"
    write_end(run_dir, status, line)
    return status


def _said(comparison: Comparison, arm: Arm, seed: int, status: str, started: float) -> str:
    record = read_record(comparison.run_dir(arm, seed), arm.name, seed)
    what = (
        f"final val loss {record.final_val_loss:.4f}, best {record.best_val_loss:.4f}"
        if record.status == "ok"
        else f"{status}: {record.error}"
    )
    return f"{arm.name} seed {seed}: {what} ({time.perf_counter() - started:.1f} s)"


def run_here(comparison: Comparison, jobs: list[tuple[Arm, int]], stop: CompareStop, say: Say):
    """Trains `jobs` one after another in this process (its output in each run's train.log);
    returns when they are done or a signal stopped one (the run keeps its checkpoint)."""
    from minigpt_jax.config_dict import load_config_file
    from minigpt_jax.runtime import compile_cache
    from minigpt_jax.train.loop import train_and_evaluate

    compile_cache.enable()
    for number, (arm, seed) in enumerate(jobs, start=1):
        if stop.requested():
            return
        started, config_file = time.perf_counter(), prepare(comparison, arm, seed)
        run_dir = config_file.parent
        status, summary = "ok", None
        checkpoints = RunDir(run_dir).checkpoints
        resumed = checkpoints.is_dir() and any(checkpoints.iterdir())
        if resumed:
            say(f"{arm.name} seed {seed}: resuming from its checkpoint")
        # The run's own output goes to its train.log (appended, line by line: a kill -9 of this
        # process leaves every line printed); this command's lines to the terminal.
        with (
            open(run_dir / "train.log", "a", buffering=1) as log,
            contextlib.redirect_stdout(log),
            contextlib.redirect_stderr(log),
        ):
            try:
                summary = train_and_evaluate(
                    load_config_file(str(config_file)), run_dir, progress=False
                )
            except Exception as error:  # the run's own failure: recorded, the others go on
                line = _first_line(error)
                print(f"{type(error).__name__}: {line}", file=log)
                status = _end_of_error(run_dir, line, isinstance(error, FloatingPointError))
        if summary is not None and summary.interrupted_by:  # checkpoint saved: a rerun resumes
            stop.on_signal(signal.Signals[summary.interrupted_by])
            say(
                f"{arm.name} seed {seed}: stopped by {summary.interrupted_by} at step "
                f"{summary.step}, checkpoint kept"
            )
            return
        if summary is not None:
            write_end(run_dir, "ok")
        say(f"[{number}/{len(jobs)}] " + _said(comparison, arm, seed, status, started))


def run_children(
    comparison: Comparison,
    jobs: list[tuple[Arm, int]],
    workers: int,
    gpus_per_worker: int,
    stop: CompareStop,
    say: Say,
) -> None:
    """Trains `jobs` in up to `workers` `minigpt-jax train` children at once; with
    `gpus_per_worker`, the child in slot i sees GPUs i·N .. i·N + N − 1 only."""
    pending, running = list(jobs), {}
    done = 0
    while pending or running:
        while pending and len(running) < workers and not stop.requested():
            arm, seed = pending.pop(0)
            config_file = prepare(comparison, arm, seed)
            slot = min(set(range(workers)) - {s for *_, s in running.values()})
            child = trials.start(
                config_file.parent, config_file, trials.child_env(slot, gpus_per_worker, workers)
            )
            running[child] = (arm, seed, time.perf_counter(), slot)
            stop.children.append(child)
        for child, (arm, seed, started, _) in list(running.items()):
            code = child.poll()
            if code is None:
                continue
            del running[child]
            stop.children.remove(child)
            run_dir = comparison.run_dir(arm, seed)
            if code == 0:
                status = "ok"
                write_end(run_dir, status)
            elif code < 0 or code in (128 + signal.SIGTERM, 128 + signal.SIGINT):
                name = signal.Signals(-code if code < 0 else code - 128).name
                say(
                    f"{arm.name} seed {seed}: stopped by {name}; rerun the same command to "
                    "resume it from its checkpoint"
                )
                continue
            else:
                status = _end_of_error(run_dir, trials.last_line(run_dir), False)
            done += 1
            say(f"[{done}/{len(jobs)}] " + _said(comparison, arm, seed, status, started))
        if not running and stop.requested():
            return
        time.sleep(trials.POLL_S)
