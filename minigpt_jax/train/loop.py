"""The training loop: `train_and_evaluate` sets a run up (train.setup), then drives its `Trainer`
chunk by chunk: dispatch the compiled steps, log their metrics (train.metrics), evaluate and
keep the best params, checkpoint, and stop cleanly on SIGINT/SIGTERM."""

from __future__ import annotations

import dataclasses
import errno
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from minigpt_jax.checkpoint import Checkpointer
from minigpt_jax.config_dict import check_experiment_config
from minigpt_jax.data import dataset as data
from minigpt_jax.hooks import HookContext, HookError, Hooks, hook_plugin_error
from minigpt_jax.model.losses import term_name
from minigpt_jax.runtime.locks import RunLock
from minigpt_jax.runtime.run_dir import RunDir, entries_of, remove_created
from minigpt_jax.runtime.signals import StopBeforeTraining, TrainingStop
from minigpt_jax.settings.registry import (
    PluginError,
    host_callback_errors,
    plugin_error,
    user_modules,
)
from minigpt_jax.train.evaluation import evaluate
from minigpt_jax.train.metrics import RunLogger
from minigpt_jax.train.setup import Run, set_up, train_batches

Array = chex.Array
_log = logging.getLogger(__name__)


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
    config: Any,
    workdir: str | Path,
    *,
    progress: bool = True,
    stop_at: int | None = None,
    allow_resume_changes: bool = False,
) -> RunSummary:
    """Trains `config` (an experiment ConfigDict) in `workdir`, resuming from its latest checkpoint.

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
    wall_start = time.perf_counter()
    workdir = Path(workdir)
    stop = TrainingStop()
    # Nothing is created until every check has passed (RunLock.create, called by set_up).
    lock = RunLock(workdir, jax.process_index(), create=False)
    before = _fresh_workdir_entries(workdir)
    with stop, lock:
        try:
            # The config's plug-ins are imported here (a slow import is a phase of its own).
            stop.setup_phase("importing the config's plug-ins and checking it", None)
            config = check_experiment_config(config)  # complete: every setting, defaults in
            last_step = _last_step(config, stop_at)
            _warn_if_all_warmup(config)
            run = set_up(
                config,
                workdir,
                progress=progress,
                allow_resume_changes=allow_resume_changes,
                before_writing=lock.create,
                on_phase=stop.setup_phase,
                last_step=last_step,
            )
            try:
                stop.training_starts()
            except StopBeforeTraining:
                run.checkpointer.close()
                raise
        except StopBeforeTraining as stopped:
            return _stopped_before_training(stopped, stop.step, wall_start)
        except Exception:
            # A fresh run whose setup failed (e.g. a plug-in failing when the step is traced)
            # leaves its workdir as it was: what it created goes, run.lock (released) too.
            if before is not None and jax.process_index() == 0:
                lock.__exit__(None, None, None)
                remove_created(workdir, before)
            raise
        trainer, log, failed = Trainer(run), None, False
        try:
            log = RunLogger(config, workdir, run.step, trainer.non_finite_step, progress=progress)
            _train(trainer, log, stop, last_step)
        except OSError as error:
            failed = True
            raise _disk_full_error(error, run.checkpointer) from error
        except Exception:
            failed = True
            raise
        finally:
            if log is not None:
                log.close()
            kept = run.checkpointer.latest_step()
            run.checkpointer.close()
            # A fresh run that failed before its first checkpoint leaves its workdir as it was.
            if failed and kept is None and before is not None and jax.process_index() == 0:
                lock.__exit__(None, None, None)
                remove_created(workdir, before)
    return RunSummary(
        step=run.step,
        train_loss=log.train_loss,
        val_loss=log.val_loss,
        eval_train_loss=log.eval_train_loss,
        best_val_loss=_finite_or_none(run.best_val),
        wall_time_s=time.perf_counter() - wall_start,
        compile_time_s=run.compile_time_s,
        median_step_ms=log.median_step_ms(),
        resumed_from=run.resumed_from,
        interrupted_by=stop.signal_name,
    )


def _last_step(config: Any, stop_at: int | None) -> int:
    """The step a run of `config` (complete) stops at: num_steps, or stop_at if earlier."""
    if stop_at is not None and (stop_at < 1 or stop_at % config.steps_per_call):
        raise ValueError(
            f"stop_at={stop_at} must be a positive multiple of "
            f"steps_per_call={config.steps_per_call}."
        )
    return config.num_steps if stop_at is None else min(stop_at, config.num_steps)


def _train(trainer: Trainer, log: RunLogger, stop: TrainingStop, last_step: int) -> None:
    """The loop: chunks of steps up to last_step, each evaluated and checkpointed on its
    cadence, the hooks (config.hooks) called after; a signal, or a hook asking to stop, is
    answered with a checkpoint after the chunk in flight."""
    run, config = trainer.run, trainer.run.config
    hooks = Hooks(config)
    if run.pending_evaluation:  # a signal stopped this step's evaluation before it resumed
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
            f"step {run.step} is already trained (num_steps={config.num_steps}); raise "
            "--config.num_steps to train further."
        )
    for first_step in range(run.step, last_step, config.steps_per_call):
        if stop.requested():
            break
        dispatched_at = time.perf_counter()
        log.dispatched(first_step, trainer.train_chunk(first_step), dispatched_at)
        end = first_step + config.steps_per_call
        evaluate_now = end % config.eval_every == 0 or end == config.num_steps
        save_now = end % config.checkpoint_every == 0 or end == last_step
        hook_now = hooks.wants_step(end)
        if not (evaluate_now or save_now or hook_now or stop.requested()):
            continue
        log.drain()
        results = _evaluate(trainer, log, end, stop, saved=False) if evaluate_now else None
        evaluated = results is not None or not evaluate_now
        hook_stop = trainer.call_hooks(hooks, log, hooks.step) if hook_now else False
        if results is not None:
            hook_stop |= trainer.call_hooks(hooks, log, hooks.evaluation, *results)
        # Decided after the evaluation: a signal during it is answered by this save.
        if save_now or stop.requested() or hook_stop:
            trainer.save(pending_evaluation=not evaluated)
            log.flush()
            hook_stop |= trainer.call_hooks(hooks, log, hooks.checkpoint, saved=True)
            if stop.requested() or hook_stop:
                why = "a hook asked to stop" if hook_stop else f"{stop.signal_name} received"
                log.message(
                    f"{why}: checkpoint saved at step {end}"
                    + ("" if evaluated else " (its evaluation was stopped; it runs first")
                    + ("" if evaluated else " when the run resumes)")
                    + "; rerun the same command to resume."
                )
                break
        log.flush()


class Trainer:
    """A set-up run's work from step to step: compiled chunks of steps, evaluation that keeps
    the best params, checkpoints that never hold anything non-finite."""

    def __init__(self, run: Run):
        self.run = run

    def train_chunk(self, first_step: int) -> dict[str, Array]:
        """Dispatches steps_per_call steps from `first_step`; the metrics (C,) stay on device."""
        run = self.run
        run.state, metrics = run.train_chunk(run.state, train_batches(run, first_step))
        return metrics

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
                batch_size=run.micro_batch_size,  # what fits in memory
                block_size=run.config.model.block_size,
                seed=run.config.seed,
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
            raise non_finite_error(
                f"val loss {val_loss}",
                step,
                run.checkpointer,
                run.terms,
                val,
                _user_keys_in_play(run.config),
            )
        if val_loss < run.best_val:
            self._check_params_finite(step, params)
            run.best_val = val_loss
            run.checkpointer.save_best(step, params, {**run.meta, "val_loss": val_loss})
        return val, train

    def call_hooks(
        self,
        hooks: Hooks,
        log: RunLogger,
        call: Callable[..., bool],
        *args: Any,
        saved: bool = False,
    ) -> bool:
        """call(context, *args) for the step the run stands at: whether a hook asks to stop. A
        hook's exception is raised as a plug-in error once the trained steps are in a
        checkpoint (`saved`: they already are)."""
        if not hooks.hooks:
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
            return call(context, *args)
        except HookError as error:
            if not saved:
                self.save()
                log.flush()
            raise hook_plugin_error(error, run.step) from error.error

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
        meta = {**run.meta, "best_val_loss": _finite_or_none(run.best_val)}
        if pending_evaluation:
            meta["pending_evaluation"] = True
        # Other eval params than the trained ones are saved beside the state, for sampling.
        eval_params = None if run.select_eval_params is None else self.eval_params()
        if eval_params is not None:
            self._check_params_finite(run.step, eval_params)
        run.checkpointer.save(run.state, meta, eval_params=eval_params)

    def evaluation_failed(
        self, step: int, error: Exception, callback_errors: list[BaseException], saved: bool
    ) -> Exception:
        """The error to raise for the step-`step` evaluation that raised `error`; the steps
        trained are checkpointed first (unless `saved`), the evaluation pending, so a rerun
        resumes there and evaluates first. Raised in user code (its own frames, or a host
        callback's exception in `callback_errors`): a PluginError naming the key. A full disk
        (saving best/ failed) is raised as it is: its message says what is kept, and another
        save to that disk would only add a second report of the same cause."""
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return error
        kept = self._keep_steps(step, saved)
        cause = callback_errors[0] if callback_errors else error
        plugin = error if isinstance(error, PluginError) else plugin_error(cause)
        if plugin is None and callback_errors:  # raised in a helper of the user's own
            plugin = plugin_error(cause, where=_user_keys_in_play(self.run.config) or "user code")
        if plugin is None:
            _log.error("the step-%d evaluation failed; %s", step, kept)
            return error
        plugin.header += f" (in the step-{step} evaluation)"
        plugin.note = kept
        return plugin

    def _keep_steps(self, step: int, saved: bool) -> str:
        """Checkpoints the train state with its evaluation pending (unless `saved`); says
        what is kept and how to go on."""
        if not saved:
            try:
                self.save(pending_evaluation=True)
            except Exception as error:  # e.g. non-finite parameters: never saved as good
                good = self.run.checkpointer.latest_step()
                return f"the steps trained could not be saved ({error}); " + (
                    f"checkpoint {good} is kept." if good else "no checkpoint was saved."
                )
        return (
            f"The {step} steps trained are kept in checkpoint {step} (its evaluation runs first "
            "when the run resumes): fix the code, then rerun the same command (with "
            "--allow_resume_changes if you edited a module the run imports) to resume from it."
        )

    def non_finite_step(self, step: int, values: dict[str, float]) -> None:
        """Raises the error for training step `step`, whose loss or grad norm is not finite
        (values: its metrics by name): out-of-vocabulary data named as the cause, else a loss
        term's own non-finite value, else the learning rate."""
        problem = self._batch_problem(step)
        if problem is not None:
            raise ValueError(problem)
        what = f"training loss {values['loss']} (grad norm {values['grad_norm']})"
        raise non_finite_error(
            what,
            step,
            self.run.checkpointer,
            self.run.terms,
            values,
            _user_keys_in_play(self.run.config),
        )

    def _batch_problem(self, step: int) -> str | None:
        """What is wrong with the token ids of the batch of training step `step` (1-based),
        read again from the data: an id outside the vocabulary (memory-mapped shards changed
        under the run), or None."""
        config, cfg = self.run.config, self.run.cfg
        batch = data.get_batch(
            self.run.dataset.train,
            config.batch_size,
            config.model.block_size,
            seed=config.seed,
            step=step - 1,
        )
        largest = int(np.max(batch))
        if largest < cfg.vocab_size:
            return None
        if config.data.format == "shards":
            shards = config.data.shards_dir or RunDir(self.run.checkpointer.workdir).shards
            where = f"the shards in {shards}"
        else:
            where = "the training data"
        return (
            f"the batch of step {step} holds token id {largest:,}, outside the model's "
            f"vocabulary [0, {cfg.vocab_size:,}): {where} changed or were damaged while the run "
            "read them; nothing of this step was saved. Rerun the same command: a run checks its "
            "data at the start (and prepares damaged shards again), then resumes from its last "
            "checkpoint."
        )

    def _check_params_finite(self, step: int, params: Any = None) -> None:
        params = self.run.state.params if params is None else params
        if not bool(jax.device_get(_all_finite(params))):
            raise non_finite_error(
                "parameters",
                step,
                self.run.checkpointer,
                suspects=_user_keys_in_play(self.run.config),
            )


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
            raise trainer.evaluation_failed(step, error, callback_errors, saved) from error
    if results is not None:
        log.evaluation(step, *results)
    return results


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


def _fresh_workdir_entries(workdir: Path) -> set[str] | None:
    """The names in a workdir that holds no run yet (no checkpoints; an empty set if it does
    not exist), for `remove_created`; None for a workdir with a run in it (never cleaned)."""
    if workdir.exists() and RunDir(workdir).has_checkpoints():
        return None
    return entries_of(workdir)


def _disk_full_error(error: OSError, checkpointer: Checkpointer) -> OSError:
    """`error` itself, or for a full disk without our own advice, the error naming the file it
    could not write and what a rerun resumes from (the newest checkpoint, or nothing)."""
    if error.errno != errno.ENOSPC or "rerun" in str(error):
        return error
    good = checkpointer.latest_step()
    kept = (
        f"it resumes from step {good}, kept in {checkpointer.workdir}"
        if good is not None
        else "no checkpoint was saved yet, so the run starts again"
    )
    where = f" ({error.filename})" if error.filename else ""
    return OSError(
        errno.ENOSPC,
        f"no space left on the device{where}; free some space, then rerun the same command: "
        + kept,
        error.filename,
    )


def _warn_if_all_warmup(config: Any) -> None:
    """Warns of a learning rate that never leaves its warmup within num_steps."""
    warmup, steps = config.optim.warmup_steps, config.num_steps
    if warmup > steps:
        _log.warning(
            "optim.warmup_steps=%d is above num_steps=%d: the learning rate never leaves its "
            "warmup and peaks at %.2g%% of optim.lr; lower optim.warmup_steps (e.g. to %d) or "
            "raise num_steps.",
            warmup,
            steps,
            100 * steps / warmup,
            max(steps // 10, 1),
        )


@jax.jit
def _all_finite(tree: Any) -> Array:
    return jnp.all(jnp.stack([jnp.isfinite(leaf).all() for leaf in jax.tree.leaves(tree)]))


def non_finite_error(
    what: str,
    step: int,
    checkpointer: Checkpointer,
    terms: tuple[tuple[str, float], ...] = (),
    values: dict[str, float] | None = None,
    suspects: str = "",
) -> FloatingPointError:
    """The error for a non-finite `what` at `step`, naming the newest checkpoint: the last good
    one, since nothing non-finite is ever saved. A loss term whose own value (`values`, the
    step's aux values by name) is non-finite is named as the cause instead of the lr; else the
    user code in play (`suspects`, e.g. "config.model.activation='m:f'") comes before the lr."""
    good = checkpointer.latest_step()
    for key, _ in terms:
        value = (values or {}).get(term_name(key))
        if value is not None and not math.isfinite(value):
            return FloatingPointError(
                f"the loss term {key} gave {value} at step {step} (config.loss.terms; {what}); "
                "nothing of it was saved. Fix the term so it stays finite"
                + (
                    f", then rerun the same command with --allow_resume_changes (its code "
                    f"changed) to resume from step {good}, kept in {checkpointer.workdir}."
                    if good is not None
                    else ", then start again."
                )
            )
    suspect = (
        f"first check the user code in play, {suspects} (e.g. a log or sqrt of a negative), else "
        if suspects
        else ""
    )
    return FloatingPointError(
        f"non-finite {what} at step {step}; nothing of it was saved. "
        + (
            f"The last good checkpoint, step {good}, is kept in {checkpointer.workdir}; "
            f"{suspect}lower optim.lr or raise optim.warmup_steps, then rerun the same command "
            "with --allow_resume_changes to resume from it."
            if good is not None
            else f"No checkpoint was saved yet; {suspect}lower optim.lr, and start again."
        )
    )


def _user_keys_in_play(config: Any) -> str:
    """The config keys that name user code (`module:attr`), e.g. "config.eval.metrics='m:f'",
    joined with "and"; "" when there are none."""
    keys = [key for keys in user_modules(config).values() for key in keys]
    return " and ".join(f"config.{key}" for key in dict.fromkeys(keys))


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
