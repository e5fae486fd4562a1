"""What a run says when it ends, beside the loop (train.loop): the `RunSummary` that
`train_and_evaluate` returns, the one line of a run stopped during its setup, and the message of
a run that a hook stopped early."""

from __future__ import annotations

import dataclasses
import sys
import time

from minigpt_jax.runtime.signals import StopBeforeTraining
from minigpt_jax.train import guard
from minigpt_jax.train.hooks import Hooks
from minigpt_jax.train.metrics import RunLogger
from minigpt_jax.train.setup import Run


@dataclasses.dataclass
class RunSummary:
    """What a run reports when it ends (returned by `train_and_evaluate`)."""

    step: int
    train_loss: float | None
    val_loss: float | None
    eval_train_loss: float | None
    best_val_loss: float | None
    wall_time_s: float
    compile_time_s: float
    median_step_ms: float | None
    resumed_from: int | None
    interrupted_by: str | None
    before_training: bool = False  # stopped during the setup: its one line says all of it


def summary(run: Run, log: RunLogger, interrupted_by: str | None, wall_start: float) -> RunSummary:
    """The summary of a run that trained (or had nothing left to train)."""
    return RunSummary(
        step=run.step,
        train_loss=log.train_loss,
        val_loss=log.val_loss,
        eval_train_loss=log.eval_train_loss,
        best_val_loss=guard.finite_or_none(run.best_val),
        wall_time_s=time.perf_counter() - wall_start,
        compile_time_s=run.compile_time_s,
        median_step_ms=log.median_step_ms(),
        resumed_from=run.resumed_from,
        interrupted_by=interrupted_by,
    )


def stopped_before_training(
    stopped: StopBeforeTraining, step: int | None, wall_start: float
) -> RunSummary:
    """The summary (and the one line saying so) of a run stopped during its setup; step: the
    one it stands at, None if the checkpoints were not checked yet."""
    print(
        f"{stopped.signal_name} received while {stopped.phase}, before training"
        + ("" if step is None else f" step {step + 1}")
        + ": nothing new to save"
        + (f" (checkpoint {step} is unchanged)" if step else "")
        + "; rerun the same command to resume.",
        file=sys.stderr,
        flush=True,
    )
    return RunSummary(
        step=step or 0,
        train_loss=None,
        val_loss=None,
        eval_train_loss=None,
        best_val_loss=None,
        wall_time_s=time.perf_counter() - wall_start,
        compile_time_s=0.0,
        median_step_ms=None,
        resumed_from=step or None,
        interrupted_by=stopped.signal_name,
        before_training=True,
    )


def early_stop_message(hooks: Hooks, step: int, num_steps: int) -> str:
    """What a run that a hook stopped says: that it ended early, and how to go on (the same
    command would only ask the hook again)."""
    key, method = hooks.stopped_by or ("?", "?")
    return (
        f"config.hooks.names={key!r} asked to stop ({method} at step {step}): the run ended "
        f"early, at step {step} of num_steps={num_steps}, with a checkpoint saved there. To "
        "train on, resume with the hook off (--config.hooks.names without it), or change what "
        "stops it (its settings, or a larger --config.num_steps where it stops at a step "
        "count); the same command would ask it again."
    )


def signal_stop_message(signal_name: str | None, step: int, evaluated: bool) -> str:
    """What a run that a signal stopped after its chunk says: the checkpoint saved at `step`
    (its evaluation, unless `evaluated`, runs first when the run resumes)."""
    return (
        f"{signal_name} received: checkpoint saved at step {step}"
        + ("" if evaluated else " (its evaluation was stopped; it runs first")
        + ("" if evaluated else " when the run resumes)")
        + "; rerun the same command to resume."
    )
