"""What a run does when a step goes wrong, beside the loop (train.loop): a non-finite loss,
value or parameter raised as the error that names its cause (train.guard), after a damaged
restore the fall-back to the intact checkpoint before it, and the steps trained kept in a
checkpoint when a step metric's host callback raises or writing the logs fails."""

from __future__ import annotations

import collections
import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax

from minigpt_jax.settings.registry import host_callback_errors, plugin_error
from minigpt_jax.train import guard
from minigpt_jax.train.metrics import RunLogger
from minigpt_jax.train.setup import Run


class Recovery:
    """The failure handling of a run's `Trainer`: `save(pending_evaluation=...)` is its
    checkpoint, which never holds anything non-finite."""

    def __init__(self, run: Run, save: Callable[..., None]):
        self.run, self.save = run, save
        self.fell_back_from: int | None = None  # a restored checkpoint taken as damaged
        # The states the last two chunks started from: where a step metric's host callback
        # failed, the newest one still readable holds the steps trained (unless donated).
        self.starts: collections.deque = collections.deque(maxlen=2)
        self.user_code = guard.user_keys_in_play(run.config)  # "" when nothing picks user code

    @contextlib.contextmanager
    def compiled_steps(self, log: RunLogger) -> Iterator[None]:
        """Within: compiled steps run and their metrics are fetched. An exception that a host
        callback of a step metric raised (config.step_metrics) is one plug-in error naming its
        key and the user's frames, raised once the steps trained are saved. Only with user code
        in play (`user_code`): without it no host callback can raise, and the loop runs its
        chunks without this guard."""
        with host_callback_errors() as callback_errors:
            try:
                yield
            except Exception as error:
                if not callback_errors:
                    raise
                cause = callback_errors[0]
                where = self.user_code
                plugin = plugin_error(cause) or plugin_error(cause, where=where)
                plugin.header += " (in the compiled step, a host callback)"
                plugin.note = self._keep_steps_trained(log)
                raise plugin from error

    def _keep_steps_trained(self, log: RunLogger) -> str:
        """Saves the newest train state that a failed chunk left readable (one that started a
        chunk, not donated to it); says what is kept and how to go on."""
        checkpointer = self.run.checkpointer
        for state in reversed(self.starts):
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

    def keep_after_a_log_failure(self, log: RunLogger) -> None:
        """Checkpoints the steps trained when writing metrics.jsonl or TensorBoard failed, so
        the rerun resumes there (their rows since the last write are lost); a save that fails
        too (the same full disk) leaves the last checkpoint, which the run's error names."""
        run = self.run
        config = run.config
        evaluation_step = run.step % config.eval_every == 0 or run.step == config.num_steps
        with contextlib.suppress(Exception):
            self.save(pending_evaluation=evaluation_step and log.evaluated_step != run.step)

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
            fell_back_from=self.fell_back_from,
        )

    def fall_back(self, damaged: guard.DamagedRestore) -> None:
        """Restores damaged.older, the intact checkpoint before the one the run diverged
        just after restoring, to train again from there: trained the same way, a run that
        diverges again does so on its own, and is reported as such."""
        run = self.run
        guard.warn_of_damaged_restore(damaged, run.checkpointer)
        self.starts.clear()
        state, meta = run.checkpointer.restore(run.state, damaged.older)
        run.state, run.resumed_from = state, int(state.step)
        run.pending_evaluation = bool(meta.get("pending_evaluation"))
        if math.isfinite(run.best_val):  # inf: none yet, or the data changed since
            run.best_val = meta.get("best_val_loss") or math.inf
        self.fell_back_from = damaged.restored

    def check_params_finite(self, step: int, params: Any = None) -> None:
        """Raises the non-finite error at `step` when `params` (default: the trained ones)
        hold a NaN or inf: nothing non-finite is ever saved."""
        params = self.run.state.params if params is None else params
        if not bool(jax.device_get(guard.all_finite(params))):
            raise self.non_finite_error("parameters", step)
