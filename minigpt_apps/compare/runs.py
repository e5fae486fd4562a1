"""Training a comparison's runs: each is an ordinary run directory, OUT/ARM/seed-S/ with its
config.py (the base config, the arm's values, config.seed = S), trained by train_and_evaluate,
one after another in this process (--workers 1), or in K `minigpt-jax train` children at once
(the sweep's trial.start: a child dies with this process and saves a checkpoint as it goes).
A run that ends has its end recorded (record.write_end); a run stopped by a signal has none and
resumes from its checkpoint when the same command runs again. So has a run that failed for want
of something outside it (a full disk, an input path not there yet, a folder it cannot write):
that is the machine's failure, not the run's result, and the next command runs it again."""

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
from minigpt_jax.typed_config import build_experiment

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


def config_text(comparison: Comparison, arm: Arm, seed: int) -> str:
    """The config.py of the run of `arm` at (pair) `seed`."""
    doc = comparison.run_doc(arm, seed)
    return spaces.config_file_text(arm.config_spec, comparison.values(arm, seed), doc)


def prepare(comparison: Comparison, arm: Arm, seed: int) -> Path:
    """The run directory with its config.py (written once; the same on every rerun), free of
    a run lock a killed command's child may still hold while it saves. Returns config.py."""
    run_dir = comparison.run_dir(arm, seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    text = config_text(comparison, arm, seed)
    config_file = run_dir / "config.py"
    if not config_file.exists() or config_file.read_text() != text:
        config_file.write_text(text)
    if RunDir(run_dir).lock().exists():
        trials.wait_for_run_lock(run_dir)
    return config_file


def _first_line(error: BaseException | str) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


# What a `minigpt-jax train` child's error line says when it failed for want of something
# outside the run (an OSError's words); its exit status is 1 for any error.
_ENVIRONMENT_WORDS = (
    "no space left",
    "disk quota",
    "[errno",
    "does not exist",
    "no such file",
    "permission denied",
    "read-only file system",
    "too many open files",
)
# trials.last_line's words for a child that wrote no line: on a full disk, even its log fails.
_SILENT = ("no output", "no train.log")


def environmental(error: BaseException | str) -> bool:
    """Whether a run failed for want of something outside it (a full disk, a path not there
    yet, a folder it cannot write): never its result, the next command runs it again. An
    error in process: an OSError; a child's: its error line naming one, or no line at all."""
    if isinstance(error, BaseException):
        return isinstance(error, OSError)
    return error in _SILENT or any(word in error.lower() for word in _ENVIRONMENT_WORDS)


def _end_of_error(
    run_dir: Path, line: str, diverged: bool, say: Say, name: str, machine: bool
) -> str:
    """Records the run's own failure (`line`), or for the machine's (`machine`), nothing:
    "not run"."""
    if machine:
        say(
            f"{name}: not run: {line} -- the machine's failure, not the run's result: nothing "
            "is recorded; fix it, then rerun the same command to run it again"
        )
        return "not run"
    status = "diverged" if diverged or "non-finite" in line else "failed"
    return _record_end(run_dir, status, line, say, name)


def _record_end(run_dir: Path, status: str, line: str, say: Say, name: str) -> str:
    """write_end, or "not run" with a line when it cannot be written (a full disk): the next
    command runs the run again (resuming its checkpoint)."""
    try:
        write_end(run_dir, status, line)
    except OSError as error:
        say(
            f"{name}: {status}, but its end could not be recorded ({error.strerror or error}); "
            "free some space, then rerun the same command (it resumes from its checkpoint)"
        )
        return "not run"
    return status


def _said(comparison: Comparison, arm: Arm, seed: int, status: str, started: float) -> str:
    record = read_record(comparison.run_dir(arm, seed), arm.name, seed)
    if status == "not run":
        what = "not run (said above)"
    elif record.status == "ok":
        what = f"final val loss {record.final_val_loss:.4f}, best {record.best_val_loss:.4f}"
    else:
        what = f"{status}: {record.error}"
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
        status, summary, failure = "ok", None, None
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
                experiment = build_experiment(load_config_file(str(config_file)))
                if stop.requested():  # a signal while its plug-ins were imported: train nothing
                    return
                summary = train_and_evaluate(experiment, run_dir, progress=False)
            except Exception as error:  # the run's own failure: recorded, the others go on
                line = _first_line(error)
                print(f"{type(error).__name__}: {line}", file=log)
                failure = (error, line)
        if summary is not None and summary.interrupted_by:  # checkpoint saved: a rerun resumes
            stop.on_signal(signal.Signals[summary.interrupted_by])
            say(
                f"{arm.name} seed {seed}: stopped by {summary.interrupted_by} at step "
                f"{summary.step}, checkpoint kept"
            )
            return
        name = f"{arm.name} seed {seed}"
        if failure is not None:  # said here, on the terminal, not in the run's train.log
            error, line = failure
            machine = environmental(error)
            if machine:
                line = f"{type(error).__name__}: {line}"
            diverged = isinstance(error, FloatingPointError)
            status = _end_of_error(run_dir, line, diverged, say, name, machine)
        if summary is not None:
            status = _record_end(run_dir, "ok", "", say, name)
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
            name = f"{arm.name} seed {seed}"
            if code == 0:
                status = _record_end(run_dir, "ok", "", say, name)
            elif code < 0 or code in (128 + signal.SIGTERM, 128 + signal.SIGINT):
                name = signal.Signals(-code if code < 0 else code - 128).name
                say(
                    f"{arm.name} seed {seed}: stopped by {name}; rerun the same command to "
                    "resume it from its checkpoint"
                )
                continue
            else:
                line = trials.last_line(run_dir)
                status = _end_of_error(run_dir, line, False, say, name, environmental(line))
            done += 1
            say(f"[{done}/{len(jobs)}] " + _said(comparison, arm, seed, status, started))
        if not running and stop.requested():
            return
        time.sleep(trials.POLL_S)
