"""What surrounds the loop (train.loop) and what can go wrong in a run, said once, beside it:
the run set up and closed under its guard (`guarded`: the stop signals, run.lock); a
non-finite loss, value or parameter named with its likely cause and the last good checkpoint
(raised by train.recovery); a full disk naming what a rerun resumes from; the batch whose token
ids left the vocabulary; and a fresh run's workdir left as it was when it fails before its first
checkpoint."""

from __future__ import annotations

import contextlib
import errno
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from minigpt_jax.data import dataset as data
from minigpt_jax.model.loss_terms import PickedTerm, term_name
from minigpt_jax.runtime.checkpoint import Checkpointer
from minigpt_jax.runtime.locks import RunLock
from minigpt_jax.runtime.run_dir import RunDir, entries_of, remove_created
from minigpt_jax.runtime.signals import StopBeforeTraining, TrainingStop
from minigpt_jax.settings.registry import user_modules
from minigpt_jax.settings.shape_schedule import ShapeSchedule
from minigpt_jax.train.setup import Run, set_up
from minigpt_jax.typed_config import Experiment

if TYPE_CHECKING:
    from minigpt_jax.train.metrics import RunLogger

Array = chex.Array
_log = logging.getLogger(__name__)


class RunGuard:
    """A run in `workdir` under its guard (made by `guarded`): `stop` takes SIGINT/SIGTERM,
    `lock` is run.lock, created once every check has passed; the run set up (`set_up`) and
    its logger (`closes`) are closed however the run ends."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.stop = TrainingStop()
        self.lock = RunLock(workdir, jax.process_index(), create=False)
        self.run: Run | None = None  # set up and training
        self.log: RunLogger | None = None

    def set_up(
        self,
        config: Experiment,
        *,
        stop_at: int | None,
        progress: bool,
        allow_resume_changes: bool,
    ) -> tuple[Run, int]:
        """(the run of `config`, the step it stops at); each setup phase names itself to `stop`,
        so a signal during one raises StopBeforeTraining (train.loop.train_and_evaluate)."""
        last_step = _last_step(config, stop_at)
        warn_if_all_warmup(config)
        run = set_up(
            config,
            self.workdir,
            progress=progress,
            allow_resume_changes=allow_resume_changes,
            before_writing=self.lock.create,  # nothing is created until every check passed
            on_phase=self.stop.setup_phase,
            last_step=last_step,
        )
        try:
            self.stop.training_starts()
        except StopBeforeTraining:
            run.checkpointer.close()
            raise
        self.run = run
        return run, last_step

    def closes(self, log: RunLogger) -> RunLogger:
        """`log`, closed when the run ends."""
        self.log = log
        return log


@contextlib.contextmanager
def guarded(workdir: Path) -> Iterator[RunGuard]:
    """`with guarded(workdir) as run_guard:` the signals and run.lock held, a fresh run's
    workdir cleaned if it fails (FreshRunCleanup), a full disk while training named with what a
    rerun resumes from, and the run's logger and checkpointer closed on the way out."""
    run_guard = RunGuard(workdir)
    stop, lock = run_guard.stop, run_guard.lock
    with stop, lock, FreshRunCleanup(workdir, lock, stop) as cleanup:
        failed = True
        try:
            yield run_guard
            failed = False
        except OSError as error:
            if run_guard.run is None:  # the setup's, as it is: nothing is trained yet
                raise
            raise disk_full_error(error, run_guard.run.checkpointer) from error
        finally:
            # Before closing the logs: their last write can fail too (a full disk), and the
            # checkpoints kept must be known whatever it raises, or the cleanup takes them.
            if run_guard.run is not None:
                cleanup.kept = run_guard.run.checkpointer.latest_step() is not None
            try:
                if run_guard.log is not None:
                    run_guard.log.close()
            except OSError as error:
                if not failed:  # the run's own error, if any, is the one to tell
                    if run_guard.run is None:
                        raise
                    raise disk_full_error(error, run_guard.run.checkpointer) from error
            finally:
                if run_guard.run is not None:
                    run_guard.run.checkpointer.close()


def _last_step(config: Experiment, stop_at: int | None) -> int:
    """The step a run of `config` stops at: num_steps, or stop_at if earlier."""
    if stop_at is not None and (stop_at < 1 or stop_at % config.steps_per_call):
        raise ValueError(
            f"stop_at={stop_at} must be a positive multiple of "
            f"steps_per_call={config.steps_per_call}."
        )
    return config.num_steps if stop_at is None else min(stop_at, config.num_steps)


def non_finite_error(
    what: str,
    step: int,
    checkpointer: Checkpointer,
    terms: tuple[PickedTerm, ...] = (),
    values: dict[str, float] | None = None,
    suspects: str = "",
    *,
    suspect_restore: bool = True,
    fell_back_from: int | None = None,
) -> FloatingPointError:
    """The error for a non-finite `what` at `step`, naming the newest checkpoint: the last good
    one, since nothing non-finite is ever saved. A loss term whose own value (`values`, the
    step's aux values by name) is non-finite is named as the cause instead of the lr; else the
    user code in play (`suspects`, e.g. "config.model.activation='m:f'") comes before the lr.
    suspect_restore: whether a divergence just after restoring names the checkpoint as perhaps
    damaged (not after the run already trained again from an older one); fell_back_from: the
    checkpoint the run set aside as perhaps damaged before training again from an older one
    (Recovery.fall_back): still on disk, it is what a rerun resumes from."""
    good = checkpointer.latest_step()
    for key in (term.key for term in terms):
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
    if fell_back_from is not None and good is not None and fell_back_from > good:
        return FloatingPointError(
            f"non-finite {what} at step {step}; nothing of it was saved. The run had set "
            f"checkpoint {fell_back_from} aside as perhaps damaged and trained again from step "
            f"{good}: diverging again, the divergence is likely the run's own. Both checkpoints "
            f"are kept in {checkpointer.workdir}; {suspect}lower optim.lr or raise "
            "optim.warmup_steps, then rerun the same command with --allow_resume_changes to "
            f"resume from step {fell_back_from} (move it aside to resume from step {good})."
        )
    just_restored = checkpointer.suspect_restore(step)  # then never called "good"
    at_once = just_restored if suspect_restore else None
    if at_once is not None:
        restored, older = at_once
        folder = checkpointer.run_dir.checkpoints / str(restored)
        suspect = (
            f"the run resumed from checkpoint {restored} only {step - restored} steps before: "
            f"if it trained well until then, {folder} may be damaged (its digest written after "
            "the damage); "
            + (
                f"move it aside and rerun to resume from step {older}, the intact checkpoint "
                "before it; else "
                if older is not None
                else "move it aside to start again; else "
            )
            + suspect
        )
    return FloatingPointError(
        f"non-finite {what} at step {step}; nothing of it was saved. "
        + (
            f"The {'newest' if just_restored else 'last good'} checkpoint, step {good}, is kept in "
            f"{checkpointer.workdir}; "
            f"{suspect}lower optim.lr or raise optim.warmup_steps, then rerun the same command "
            "with --allow_resume_changes to resume from it."
            if good is not None
            else f"No checkpoint was saved yet; {suspect}lower optim.lr, and start again."
        )
    )


class DamagedRestore(FloatingPointError):
    """A non-finite `what` at `step`, a few steps after the run restored checkpoint `restored`
    with nothing saved since, and an intact checkpoint `older` before it: `restored` is taken
    as damaged before its digest was written (its tensors finite, but not the ones saved), and
    the run trains again from `older` (train.recovery.Recovery.fall_back)."""

    def __init__(self, what: str, step: int, restored: int, older: int):
        super().__init__(
            f"non-finite {what} at step {step}, {step - restored} steps after restoring "
            f"checkpoint {restored}; checkpoint {older} is the intact one before it."
        )
        self.what, self.step, self.restored, self.older = what, step, restored, older


def damaged_restore(what: str, step: int, checkpointer: Checkpointer) -> DamagedRestore | None:
    """The DamagedRestore of a non-finite `what` at `step`, or None when the run did not
    diverge just after restoring a checkpoint that an intact one precedes."""
    suspect = checkpointer.suspect_restore(step)
    if suspect is None or suspect[1] is None:
        return None
    return DamagedRestore(what, step, *suspect)


def warn_of_damaged_restore(damaged: DamagedRestore, checkpointer: Checkpointer) -> None:
    _log.warning(
        "non-finite %s at step %d, only %d steps after resuming from checkpoint %d: %s is "
        "taken as damaged (its digest written after the damage); skipping it for step %d, "
        "the newest intact checkpoint before it, and training again from there (a run that "
        "diverges again is reported as its own divergence).",
        damaged.what,
        damaged.step,
        damaged.step - damaged.restored,
        damaged.restored,
        checkpointer.run_dir.checkpoints / str(damaged.restored),
        damaged.older,
    )


@jax.jit
def all_finite(tree: Any) -> Array:
    return jnp.all(jnp.stack([jnp.isfinite(leaf).all() for leaf in jax.tree.leaves(tree)]))


def batch_problem(run: Run, step: int) -> str | None:
    """What is wrong with the token ids of `run`'s batch of training step `step` (1-based),
    read again from the data: an id outside the vocabulary (memory-mapped shards changed
    under the run), or None."""
    config, cfg = run.config, run.cfg
    batch_size, seq_len = ShapeSchedule.of(config).at(step - 1)
    batch = data.get_batch(run.dataset.train, batch_size, seq_len, seed=config.seed, step=step - 1)
    largest = int(np.max(batch))
    if largest < cfg.vocab_size:
        return None
    if config.data.format == "shards":
        shards = config.data.shards_dir or RunDir(run.checkpointer.workdir).shards
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


def disk_full_error(error: OSError, checkpointer: Checkpointer) -> OSError:
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


class FreshRunCleanup:
    """`with FreshRunCleanup(workdir, lock, stop):` a fresh run (its workdir holds no checkpoint
    yet) that fails with an exception leaves its workdir as it was: what it created goes, run.lock
    (released) too, unless a checkpoint holds trained steps by then (`kept`, set once the run
    stops training). A workdir with a run in it is never cleaned; Ctrl-C and SystemExit clean
    nothing (they checkpoint or stop before writing). A signal during the cleanup is only
    recorded (`stop`): the cleanup finishes and the run's own error is its one line."""

    def __init__(self, workdir: Path, lock: RunLock, stop: TrainingStop):
        self.workdir, self.lock, self.stop = workdir, lock, stop
        self.kept = False  # a checkpoint holds trained steps: what it created stays
        has_run = workdir.exists() and RunDir(workdir).has_checkpoints()
        self.before = None if has_run else entries_of(workdir)

    def __enter__(self) -> FreshRunCleanup:
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        failed = kind is not None and issubclass(kind, Exception)
        if failed and not self.kept and self.before is not None and jax.process_index() == 0:
            self.stop.phase = None  # from here a signal is a flag: the cleanup is not cut short
            self.lock.__exit__(None, None, None)
            remove_created(self.workdir, self.before)


def warn_if_all_warmup(config: Experiment) -> None:
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


def user_keys_in_play(config: Experiment) -> str:
    """The config keys that name user code (`module:attr`), e.g. "config.eval.metrics='m:f'",
    joined with "and"; "" when there are none."""
    keys = [key for keys in user_modules(config).values() for key in keys]
    return " and ".join(f"config.{key}" for key in dict.fromkeys(keys))


def finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
