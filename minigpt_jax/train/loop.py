"""The training loop: `train_and_evaluate` sets a run up (train.setup), then drives its `Trainer`
chunk by chunk: dispatch the compiled steps, log their metrics (train.metrics), evaluate and
keep the best params, checkpoint, and stop cleanly on SIGINT/SIGTERM. What surrounds it (the
setup under the stop signals and run.lock, the files closed) and what can go wrong (a
non-finite value, an evaluation that raises, a full disk, a fresh run's cleanup) is said in
train.guard beside it."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import chex
import jax

from minigpt_jax.hooks import HookContext, HookError, Hooks, HookStopped, hook_plugin_error
from minigpt_jax.runtime.signals import StopBeforeTraining, TrainingStop
from minigpt_jax.settings.registry import host_callback_errors, plugin_error
from minigpt_jax.train import guard
from minigpt_jax.train.evaluation import evaluate
from minigpt_jax.train.metrics import RunLogger
from minigpt_jax.train.setup import Run
from minigpt_jax.typed_config import Experiment

if TYPE_CHECKING:
    from ml_collections import ConfigDict

Array = chex.Array


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


def train_and_evaluate(
    config: Experiment | ConfigDict,
    workdir: str | Path,
    *,
    progress: bool = True,
    stop_at: int | None = None,
    allow_resume_changes: bool = False,
) -> RunSummary:
    """Trains `config` in `workdir`, resuming from its latest checkpoint. `config` is the typed
    experiment (typed_config.build_experiment), or a run config (ConfigDict) it is built from.

    A fresh run starts from config.init_from when set: a Hugging Face GPT-2 directory or another
    run's workdir, whose tokenizer it takes; config.model must match that model's shape.

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
            return _stopped_before_training(stopped, run_guard.stop.step, wall_start)
        trainer = Trainer(run)

        def new_log() -> RunLogger:  # from the step the run stands at
            return run_guard.closes(
                RunLogger(run.config, workdir, run.step, trainer.non_finite_step, progress=progress)
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
                    trainer.fall_back(damaged)
                    log = new_log()  # metrics.jsonl and TensorBoard cut back to that step
        except OSError:
            if log.writer.failed:  # the logs' disk is full: keep the steps, where space allows
                _keep_after_a_log_failure(trainer, log)
            raise
    return _summary(run, log, run_guard.stop.signal_name, wall_start)


def _train(
    trainer: Trainer, log: RunLogger, stop: TrainingStop, hooks: Hooks, last_step: int
) -> None:
    """The loop: chunks of steps up to last_step, each evaluated and checkpointed on its
    cadence, the hooks (config.hooks, started) called after; a signal, or a hook asking to
    stop, is answered with a checkpoint after the chunk in flight."""
    run, config = trainer.run, trainer.run.config
    _before_the_first_chunk(trainer, log, stop, last_step)
    for first_step in range(run.step, last_step, config.steps_per_call):
        if stop.requested():
            break
        dispatched_at = time.perf_counter()
        with trainer.compiled_steps(log):
            log.dispatched(first_step, trainer.train_chunk(first_step), dispatched_at)
        end = first_step + config.steps_per_call
        evaluate_now = end % config.eval_every == 0 or end == config.num_steps
        save_now = end % config.checkpoint_every == 0 or end == last_step
        hook_now = any(end % every == 0 for every in hooks.step_every)
        if evaluate_now or save_now or hook_now or stop.requested():
            with trainer.compiled_steps(log):
                log.drain()
            if _after_chunk(trainer, log, stop, hooks, end, evaluate_now, save_now, hook_now):
                break


def _keep_after_a_log_failure(trainer: Trainer, log: RunLogger) -> None:
    """Checkpoints the steps trained when writing metrics.jsonl or TensorBoard failed, so the
    rerun resumes there (their rows since the last write are lost); a save that fails too (the
    same full disk) leaves the last checkpoint, which the run's error names."""
    run = trainer.run
    config = run.config
    evaluation_step = run.step % config.eval_every == 0 or run.step == config.num_steps
    with contextlib.suppress(Exception):
        trainer.save(pending_evaluation=evaluation_step and log.evaluated_step != run.step)


def _before_the_first_chunk(
    trainer: Trainer, log: RunLogger, stop: TrainingStop, last_step: int
) -> None:
    """A resumed step whose evaluation a signal stopped is evaluated (and saved) first; a run
    with nothing left to train says so."""
    run = trainer.run
    if run.pending_evaluation:
        if _evaluate(trainer, log, run.step, stop, saved=True) is not None:
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
    results = _evaluate(trainer, log, end, stop, saved=False) if evaluate_now else None
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
            log.message(
                f"{stop.signal_name} received: checkpoint saved at step {end}"
                + ("" if evaluated else " (its evaluation was stopped; it runs first")
                + ("" if evaluated else " when the run resumes)")
                + "; rerun the same command to resume."
            )
            return True
        if hook_stop:
            log.message(_early_stop_message(hooks, end, trainer.run.config.num_steps))
            return True
    log.flush()
    return False


def _early_stop_message(hooks: Hooks, step: int, num_steps: int) -> str:
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


class Trainer:
    """A set-up run's work from step to step: compiled chunks of steps, evaluation that keeps
    the best params, checkpoints that never hold anything non-finite."""

    def __init__(self, run: Run):
        self.run = run
        self.fell_back_from: int | None = None  # a restored checkpoint taken as damaged
        # The states the last two chunks started from: where a step metric's host callback
        # failed, the newest one still readable holds the steps trained (unless donated).
        self._starts: collections.deque = collections.deque(maxlen=2)

    def train_chunk(self, first_step: int) -> dict[str, Array]:
        """Dispatches steps_per_call steps from `first_step`; the metrics (C,) stay on device."""
        run = self.run
        self._starts.append(run.state)
        run.state, metrics = run.train_chunk(run.state, run.train_batches(first_step))
        return metrics

    @contextlib.contextmanager
    def compiled_steps(self, log: RunLogger) -> Iterator[None]:
        """Within: compiled steps run and their metrics are fetched. An exception that a host
        callback of a step metric raised (config.step_metrics) is one plug-in error naming its
        key and the user's frames, raised once the steps trained are saved."""
        with host_callback_errors() as callback_errors:
            try:
                yield
            except Exception as error:
                if not callback_errors:
                    raise
                cause = callback_errors[0]
                where = guard.user_keys_in_play(self.run.config) or "user code"
                plugin = plugin_error(cause) or plugin_error(cause, where=where)
                plugin.header += " (in the compiled step, a host callback)"
                plugin.note = self._keep_steps_trained(log)
                raise plugin from error

    def _keep_steps_trained(self, log: RunLogger) -> str:
        """Saves the newest train state that a failed chunk left readable (one that started a
        chunk, not donated to it); says what is kept and how to go on."""
        checkpointer = self.run.checkpointer
        for state in reversed(self._starts):
            try:
                step = int(jax.device_get(state.step))
                jax.block_until_ready(state)
            except Exception:  # donated to the failed chunk, or its output: not readable
                continue
            self.run.state = state
            with contextlib.suppress(Exception):  # the chunk in flight may be the failed one
                log.drain()
            if step and step != checkpointer.latest_step():
                self.save()
                log.flush()
            if step:
                return (
                    f"The {step} steps trained are kept in checkpoint {step}: fix the code, then "
                    "rerun the same command (with --allow_resume_changes if you edited a module "
                    "the run imports) to resume from it."
                )
        good = checkpointer.latest_step()
        return (
            f"Checkpoint {good} is kept" if good else "No step was trained"
        ) + ": fix the code, then rerun the same command."

    def evaluate_and_keep_best(
        self, step: int, should_stop: Callable[[], bool] | None = None
    ) -> tuple[dict[str, float], dict[str, float]] | None:
        """(val, train) results of the eval params on the fixed eval batches, each {"loss": ...,
        term: ..., metric: ...}; saves those params to best/ when the val loss is the lowest
        yet. None, with nothing recorded, when should_stop() turned true between two batches."""
        run, results = self.run, []
        params = self.eval_params()
        for tokens, split in ((run.dataset.val, "val"), (run.dataset.train, "train")):
            result = evaluate(
                run.eval_fn,
                params,
                tokens,
                num_batches=run.config.eval_batches,
                batch_size=run.config.micro_batch_size,  # what fits in memory
                block_size=run.config.model.block_size,
                seed=run.config.seed if run.config.eval_seed < 0 else run.config.eval_seed,
                split=split,
                mesh=run.mesh,
                should_stop=should_stop,
                metric_fn=run.metric_fn,
            )
            if result is None:
                return None
            results.append(result)
        val, train = results
        val_loss = val["loss"]
        if not math.isfinite(val_loss):
            raise self.non_finite_error(f"val loss {val_loss}", step, run.terms, val)
        if val_loss < run.best_val:
            self._check_params_finite(step, params)
            run.best_val = val_loss
            run.checkpointer.save_best(step, params, {**run.meta, "val_loss": val_loss})
        return val, train

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
            params=self.eval_params(),
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

    def eval_params(self) -> Any:
        """The params evaluation, best/, sampling and export use (optim.eval_params): the
        trained ones, or what the optimizer's hook selects from the train state."""
        if self.run.select_eval_params is None:
            return self.run.state.params
        return self.run.select_eval_params(self.run.state)

    def save(self, pending_evaluation: bool = False) -> None:
        """Checkpoints the train state; refuses non-finite parameters (never saved as good).
        pending_evaluation: this step's evaluation was stopped; a resumed run does it first."""
        run = self.run
        self._check_params_finite(run.step)
        meta = {**run.meta, "best_val_loss": guard.finite_or_none(run.best_val)}
        if pending_evaluation:
            meta["pending_evaluation"] = True
        # Other eval params than the trained ones are saved beside the state, for sampling.
        eval_params = None if run.select_eval_params is None else self.eval_params()
        if eval_params is not None:
            self._check_params_finite(run.step, eval_params)
        run.checkpointer.save(run.state, meta, eval_params=eval_params)

    def non_finite_step(self, step: int, values: dict[str, float]) -> None:
        """Raises the error for training step `step`, whose loss or grad norm is not finite
        (values: its metrics by name): out-of-vocabulary data named as the cause, else a loss
        term's own non-finite value, else the learning rate."""
        problem = guard.batch_problem(self.run, step)
        if problem is not None:
            raise ValueError(problem)
        what = f"training loss {values['loss']} (grad norm {values['grad_norm']})"
        raise self.non_finite_error(what, step, self.run.terms, values)

    def non_finite_error(
        self,
        what: str,
        step: int,
        terms: tuple[tuple[str, float], ...] = (),
        values: dict[str, float] | None = None,
    ) -> FloatingPointError:
        """The error for a non-finite `what` at `step` (guard.non_finite_error): a
        guard.DamagedRestore, answered by `fall_back`, when the run diverged just after
        restoring a checkpoint that an intact one precedes (once a run)."""
        run = self.run
        if self.fell_back_from is None:
            damaged = guard.damaged_restore(what, step, run.checkpointer)
            if damaged is not None:
                return damaged
        return guard.non_finite_error(
            what,
            step,
            run.checkpointer,
            terms,
            values,
            guard.user_keys_in_play(run.config),
            suspect_restore=self.fell_back_from is None,
        )

    def fall_back(self, damaged: guard.DamagedRestore) -> None:
        """Restores damaged.older, the intact checkpoint before the one the run diverged
        just after restoring, to train again from there: trained the same way, a run that
        diverges again does so on its own, and is reported as such."""
        run = self.run
        guard.warn_of_damaged_restore(damaged, run.checkpointer)
        self._starts.clear()
        state, meta = run.checkpointer.restore(run.state, damaged.older)
        run.state, run.resumed_from = state, int(state.step)
        run.pending_evaluation = bool(meta.get("pending_evaluation"))
        if math.isfinite(run.best_val):  # inf: none yet, or the data changed since
            run.best_val = meta.get("best_val_loss") or math.inf
        self.fell_back_from = damaged.restored

    def _check_params_finite(self, step: int, params: Any = None) -> None:
        params = self.run.state.params if params is None else params
        if not bool(jax.device_get(guard.all_finite(params))):
            raise self.non_finite_error("parameters", step)


def _evaluate(
    trainer: Trainer, log: RunLogger, step: int, stop: TrainingStop, *, saved: bool
) -> tuple[dict[str, float], dict[str, float]] | None:
    """Evaluates at `step` and records it: (val, train) results, or None if a signal stopped it
    between batches. An evaluation that raises (a metric's or loss term's code) loses no
    trained step: they are checkpointed first unless `saved` (already in a checkpoint), and
    user code is named."""
    with host_callback_errors() as callback_errors:
        try:
            results = trainer.evaluate_and_keep_best(step, should_stop=stop.requested)
        except FloatingPointError:
            raise  # a non-finite val loss: nothing non-finite is saved (non_finite_error)
        except Exception as error:
            raise guard.evaluation_error(
                trainer.run, trainer.save, step, error, callback_errors, saved
            ) from error
    if results is not None:
        log.evaluation(step, *results)
    return results


def _summary(run: Run, log: RunLogger, interrupted_by: str | None, wall_start: float) -> RunSummary:
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


def _stopped_before_training(
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
