"""The training loop: `train_and_evaluate` sets a run up (train.setup), then drives its `Trainer`
chunk by chunk: dispatch the compiled steps, log their metrics (train.metrics), evaluate and
keep the best params (train.evaluation), checkpoint, and stop cleanly on SIGINT/SIGTERM. What
surrounds it (the setup under the stop signals and run.lock, the files closed) is said in
train.guard, what it does when a step goes wrong (a non-finite value, a damaged restore, a
failed host callback or log) in train.recovery, and what it says when it ends in
train.summary."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import chex

from minigpt_jax.runtime.signals import StopBeforeTraining, TrainingStop
from minigpt_jax.train import guard
from minigpt_jax.train.evaluation import evaluate_and_record
from minigpt_jax.train.hooks import HookContext, HookError, Hooks, HookStopped, hook_plugin_error
from minigpt_jax.train.metrics import RunLogger
from minigpt_jax.train.recovery import Recovery
from minigpt_jax.train.setup import Run
from minigpt_jax.train.summary import (
    RunSummary,
    early_stop_message,
    signal_stop_message,
    stopped_before_training,
    summary,
)
from minigpt_jax.typed_config import Experiment

Array = chex.Array


def train_and_evaluate(
    config: Experiment,
    workdir: str | Path,
    *,
    progress: bool = True,
    stop_at: int | None = None,
    allow_resume_changes: bool = False,
) -> RunSummary:
    """Trains `config` in `workdir`, resuming from its latest checkpoint. `config` is the typed
    experiment: `typed_config.build_experiment(run_config)` builds it from a config file's
    ConfigDict (a TypeError says so for anything else).

    A fresh run starts from config.init_from when set: a Hugging Face GPT-2 directory or another
    run's workdir, whose tokenizer it takes; config.model must match that model's shape, but a
    plug-in's new parameters (adapters), which start from the model's init (minigpt_jax.finetune).

    stop_at: end this call after that step (a multiple of steps_per_call) with a checkpoint, as an
    interruption would; the learning-rate schedule still spans config.num_steps.
    allow_resume_changes: resume even though seed, batch_size, data or optim differ from the
    checkpoint's (minigpt_jax.train.resume); the model must always match.

    Writes workdir/{run.lock, tokenizer.json, tokens.npy (data.format "memory") or shards/
    (data.format "shards", unless data.shards_dir is elsewhere), metrics.jsonl, tensorboard/,
    checkpoints/, best/}, only once every config, model and mesh check has passed, and holding
    run.lock, so a second trainer in the same workdir fails at once. SIGINT/SIGTERM save a
    checkpoint and return; a non-finite loss, val loss or parameter raises FloatingPointError
    and leaves the last good checkpoint in place (nothing non-finite is ever saved).
    """
    if not isinstance(config, Experiment):
        raise TypeError(
            f"train_and_evaluate takes the typed experiment, got {type(config).__name__}: build "
            "it from the run config with minigpt_jax.typed_config.build_experiment(config)."
        )
    wall_start, workdir = time.perf_counter(), Path(workdir)
    with guard.guarded(workdir) as run_guard:  # signals, run.lock, cleanup, files closed
        try:
            run, last_step = run_guard.set_up(
                config,
                stop_at=stop_at,
                progress=progress,
                allow_resume_changes=allow_resume_changes,
            )
        except StopBeforeTraining as stopped:
            return stopped_before_training(stopped, run_guard.stop.step, wall_start)
        trainer = Trainer(run)

        def new_log() -> RunLogger:  # from the step the run stands at
            on_non_finite = trainer.recovery.non_finite_step
            return run_guard.closes(
                RunLogger(run.config, workdir, run.step, on_non_finite, progress=progress)
            )

        log = new_log()
        try:
            hooks = Hooks(run.config)
            trainer.call_hooks(hooks, log, run_guard.stop, hooks.start, saved=True)  # checks
            while True:
                try:
                    _train(trainer, log, run_guard.stop, hooks, last_step)
                    break
                except guard.DamagedRestore as damaged:  # once: train again from the older one
                    log.close()
                    trainer.recovery.fall_back(damaged)
                    log = new_log()  # metrics.jsonl and TensorBoard cut back to that step
        except OSError:
            if log.writer.failed:  # the logs' disk is full: keep the steps, where space allows
                trainer.recovery.keep_after_a_log_failure(log)
            raise
    return summary(run, log, run_guard.stop.signal_name, wall_start)


def _train(
    trainer: Trainer, log: RunLogger, stop: TrainingStop, hooks: Hooks, last_step: int
) -> None:
    """The loop: chunks of steps up to last_step, each evaluated and checkpointed on its
    cadence, the hooks (config.hooks, started) called after; a signal, or a hook asking to
    stop, is answered with a checkpoint after the chunk in flight."""
    run, config = trainer.run, trainer.run.config
    _before_the_first_chunk(trainer, log, stop, last_step)
    # A host callback's error (user code's step metrics) named as the plug-in's; without user
    # code in play no callback can raise, and the chunks run as they are.
    compiled_steps = trainer.recovery.compiled_steps if trainer.recovery.user_code else nullcontext
    for first_step in range(run.step, last_step, config.steps_per_call):
        if stop.requested():
            break
        dispatched_at = time.perf_counter()
        with compiled_steps(log):
            log.dispatched(first_step, trainer.train_chunk(first_step), dispatched_at)
        end = first_step + config.steps_per_call
        evaluate_now = end % config.eval_every == 0 or end == config.num_steps
        save_now = end % config.checkpoint_every == 0 or end == last_step
        hook_now = any(end % every == 0 for every in hooks.step_every)
        if evaluate_now or save_now or hook_now or stop.requested():
            with compiled_steps(log):
                log.drain()
            if _after_chunk(trainer, log, stop, hooks, end, evaluate_now, save_now, hook_now):
                break


def _before_the_first_chunk(
    trainer: Trainer, log: RunLogger, stop: TrainingStop, last_step: int
) -> None:
    """A resumed step whose evaluation a signal stopped is evaluated (and saved) first; a run
    with nothing left to train says so."""
    run = trainer.run
    if run.pending_evaluation:
        if evaluate_and_record(run, trainer.recovery, log, run.step, stop, saved=True) is not None:
            trainer.save()  # the same step, its evaluation done
            log.flush()
        else:
            log.message(
                f"{stop.signal_name} received during the step-{run.step} evaluation: stopped; "
                "its checkpoint is unchanged; rerun the same command to resume."
            )
    if run.step >= last_step and not stop.requested():
        log.message(
            f"step {run.step} is already trained (num_steps={run.config.num_steps}); raise "
            "--config.num_steps to train further."
        )


def _after_chunk(
    trainer: Trainer,
    log: RunLogger,
    stop: TrainingStop,
    hooks: Hooks,
    end: int,
    evaluate_now: bool,
    save_now: bool,
    hook_now: bool,
) -> bool:
    """The host's work at step `end`, after its chunk: the evaluation, the hooks, the
    checkpoint; whether the run stops here (a signal, or a hook asking to, answered with a
    checkpoint)."""
    results = None
    if evaluate_now:
        results = evaluate_and_record(trainer.run, trainer.recovery, log, end, stop, saved=False)
    evaluated = results is not None or not evaluate_now
    hook_stop = trainer.call_hooks(hooks, log, stop, hooks.step) if hook_now else False
    if results is not None:
        hook_stop |= trainer.call_hooks(hooks, log, stop, hooks.evaluation, *results)
    # Decided after the evaluation: a signal during it is answered by this save.
    if save_now or stop.requested() or hook_stop:
        trainer.save(pending_evaluation=not evaluated)
        log.flush()
        hook_stop |= trainer.call_hooks(hooks, log, stop, hooks.checkpoint, saved=True)
        if stop.requested():
            log.message(signal_stop_message(stop.signal_name, end, evaluated))
            return True
        if hook_stop:
            log.message(early_stop_message(hooks, end, trainer.run.config.num_steps))
            return True
    log.flush()
    return False


class Trainer:
    """A set-up run's work from step to step: compiled chunks of steps, checkpoints that never
    hold anything non-finite, the hooks called; what it does when a step goes wrong is its
    `recovery` (train.recovery)."""

    def __init__(self, run: Run):
        self.run = run
        self.recovery = Recovery(run, self.save)

    def train_chunk(self, first_step: int) -> dict[str, Array]:
        """Dispatches steps_per_call steps from `first_step`; the metrics (C,) stay on device."""
        run = self.run
        self.recovery.starts.append(run.state)
        run.state, metrics = run.train_chunk(run.state, run.train_batches(first_step))
        return metrics

    def save(self, pending_evaluation: bool = False) -> None:
        """Checkpoints the train state; refuses non-finite parameters (never saved as good).
        pending_evaluation: this step's evaluation was stopped; a resumed run does it first."""
        run = self.run
        self.recovery.check_params_finite(run.step)
        meta = {**run.meta, "best_val_loss": guard.finite_or_none(run.best_val)}
        if pending_evaluation:
            meta["pending_evaluation"] = True
        # Other eval params than the trained ones are saved beside the state, for sampling.
        eval_params = None if run.select_eval_params is None else run.eval_params()
        if eval_params is not None:
            self.recovery.check_params_finite(run.step, eval_params)
        run.checkpointer.save(run.state, meta, eval_params=eval_params)

    def call_hooks(
        self,
        hooks: Hooks,
        log: RunLogger,
        stop: TrainingStop,
        call: Callable[..., bool],
        *args: Any,
        saved: bool = False,
    ) -> bool:
        """call(context, *args) for the step the run stands at, under the guard of user code
        (`stop.user_code`: a signal is answered even if a hook hangs): whether a hook asks to
        stop. A hook's exception (sys.exit() included) or a return value other than
        None/True/False is raised as a plug-in error once the trained steps are in a
        checkpoint (`saved`: they already are). A hook that a signal stopped is said, and no
        hook runs again: the loop answers the signal with its checkpoint."""
        if not hooks.hooks or hooks.interrupted:
            return False
        run = self.run
        context = HookContext(
            step=run.step,
            config=run.config,
            cfg=run.cfg,
            state=run.state,
            params=run.eval_params(),
            tokenizer=run.dataset.tokenizer,
            workdir=run.checkpointer.workdir,
        )
        try:
            with stop.user_code():
                return call(context, *args)
        except HookStopped as stopped:
            log.message(
                f"{stopped.signal_name} received while config.hooks.names={stopped.key!r} ran "
                f"{stopped.method} at step {run.step}; it had not returned {stopped.grace_s:g} s "
                "later, so it was stopped there."
            )
            return False
        except HookError as error:
            if not saved:
                self.save()
                log.flush()
            kept = "before training" if error.method == "on_start" else "saved first"
            raise hook_plugin_error(error, run.step, kept) from error.error
