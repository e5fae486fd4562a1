"""Orbax checkpoints: the latest few train states for resuming, and the best params by val loss.

Layout under a run's workdir:
  checkpoints/<step>/{state,meta}   latest `keep` train states (resume from the newest), and
                  .../eval_params   the params evaluation uses when they are not the trained
                                    ones (optim.eval_params; meta["eval_params"] names them)
  best/<step>/{params,meta}         the eval params of the lowest val loss so far (for sampling)
  <step>/sha256sums.txt             the digest of every file of the step, written after the save
                                    completes (`sha256sum -c sha256sums.txt` checks it by hand)
Saves are synchronous and atomic (orbax writes a temporary directory, then renames it), so every
step directory holds a complete save. A step whose files do not match its digest (damaged later)
is skipped with a warning in favour of the newest intact one. A step without a digest (written by
a version without digests, or killed between orbax's rename and the digest) is used unverified,
with a warning, so older run directories still resume. Saving a step that exists replaces it, so
the same command always resumes.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from minigpt_jax.runtime.digests import sha256_file
from minigpt_jax.runtime.run_dir import BEST_DIRNAME, LATEST_DIRNAME, RunDir

# Orbax logs every save at INFO; the training loop reports what matters.
logging.getLogger("absl").setLevel(logging.WARNING)
_log = logging.getLogger(__name__)

LATEST_DIR = LATEST_DIRNAME  # the names RunDir gives checkpoints/ and best/
BEST_DIR = BEST_DIRNAME
DIGEST_FILENAME = "sha256sums.txt"
LATEST_ITEMS = ("state", "meta", "eval_params")  # eval_params: only when not the trained ones
EVAL_PARAMS_ITEM = LATEST_ITEMS[2]


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be read, or does not fit this run."""


def _drop_orbax_leftover_reports() -> None:
    """Silences, for the rest of the process, two harmless reports of orbax's asyncio work that
    Python prints as unraisable errors: tensorstore completing a write (a failed one on a full
    disk, or one at shutdown) after orbax closed the loop that awaited it ("Event loop is
    closed"), and the sibling reads of a read that failed (a step rotated away under a reader;
    the failure itself is raised and handled) collected unfinished, which asyncio also logs
    ("exception was never retrieved"). Every other unraisable error still reaches the previous
    hook, and every other asyncio record its logger."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_orbax_leftovers", False):
        return

    def hook(unraisable) -> None:
        if not _is_orbax_leftover(unraisable):
            previous(unraisable)

    hook.drops_orbax_leftovers = True
    sys.unraisablehook = hook
    # asyncio logs the same sibling reads, when their future is collected, as an ERROR, and
    # Python warns of those never started.
    logging.getLogger("asyncio").addFilter(_not_an_orbax_read_never_retrieved)
    warnings.filterwarnings(
        "ignore", r"coroutine '.*' was never awaited", RuntimeWarning, r"orbax\."
    )


def _not_an_orbax_read_never_retrieved(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    if "exception was never retrieved" not in message:
        return True
    if any(word in message for word in ("TensorStore", "tensorstore", "OCDBT")):
        return False
    return not (record.exc_info and _raised_in_orbax(record.exc_info[1]))


def _raised_in_orbax(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from, passed through orbax's code."""
    while error is not None:
        traceback = error.__traceback__
        while traceback is not None:
            if _orbax_code(traceback.tb_frame.f_code):
                return True
            traceback = traceback.tb_next
        error = error.__cause__ or error.__context__
    return False


def _is_orbax_leftover(unraisable) -> bool:
    error = unraisable.exc_value
    if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
        traceback = unraisable.exc_traceback
        while traceback is not None and traceback.tb_next is not None:
            traceback = traceback.tb_next
        return traceback is not None and "asyncio" in traceback.tb_frame.f_code.co_filename
    code = getattr(unraisable.object, "cr_code", None)  # a coroutine collected unfinished
    return code is not None and _orbax_code(code)


def _orbax_code(code) -> bool:
    return f"{os.sep}orbax{os.sep}" in code.co_filename


def _manager(directory: Path, items: tuple[str, ...], read_only=False):
    _drop_orbax_leftover_reports()
    options = ocp.CheckpointManagerOptions(
        # Old steps are deleted by _save once the new one's digest is written, not by orbax
        # before that: a crash in between must leave an intact step to resume from.
        max_to_keep=None,
        enable_async_checkpointing=False,
        # read_only=True would make orbax log warnings on every load; not creating or cleaning
        # anything is enough to leave a run untouched.
        create=not read_only,
        cleanup_tmp_directories=not read_only,
    )
    return ocp.CheckpointManager(directory, options=options, item_names=items)


def _step_files(step_dir: Path) -> list[Path]:
    return sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != DIGEST_FILENAME)


def write_digest(step_dir: Path) -> None:
    """Writes step_dir/sha256sums.txt over every file of a completed save (atomically)."""
    lines = "".join(
        f"{sha256_file(p)}  {p.relative_to(step_dir).as_posix()}\n" for p in _step_files(step_dir)
    )
    tmp = step_dir / (DIGEST_FILENAME + ".part")
    tmp.write_text(lines, encoding="ascii")
    os.replace(tmp, step_dir / DIGEST_FILENAME)


UNVERIFIED = "unverified: it has no sha256sums.txt"


class CheckpointVanished(CheckpointError):
    """The step was removed while it was read (a trainer rotating its checkpoints)."""


def check_digest(step_dir: Path) -> str | None:
    """None if step_dir matches its sha256sums.txt, UNVERIFIED if it has none, else what is
    wrong with it."""
    digest_path = step_dir / DIGEST_FILENAME
    if not digest_path.is_file():
        return UNVERIFIED
    expected = {}
    lines = digest_path.read_text(encoding="ascii", errors="replace").splitlines()
    for number, line in enumerate(lines, 1):
        hexdigest, _, name = line.partition("  ")
        if not (len(hexdigest) == 64 and name and all(c in "0123456789abcdef" for c in hexdigest)):
            return (
                f"damaged: line {number} of {DIGEST_FILENAME} is not '<sha256>  <file>' (the "
                "digest file is truncated or overwritten)"
            )
        expected[name] = hexdigest
    actual = {p.relative_to(step_dir).as_posix(): p for p in _step_files(step_dir)}
    for name, hexdigest in expected.items():
        if name not in actual:
            return f"damaged: {name} is missing"
        if sha256_file(actual[name]) != hexdigest:
            return f"damaged: {name} does not match its sha256"
    extra = sorted(set(actual) - set(expected))
    if extra:
        return (
            f"damaged: {extra[0]} has no line in {DIGEST_FILENAME} (the digest file is "
            "truncated, or the file was added)"
        )
    return None


def newest_intact_step(
    manager, wait_for_digest_s: float = 0.0, below: int | None = None
) -> int | None:
    """The newest step of `manager` whose files match their digest, warning about each newer
    step it skips. Raises CheckpointError if steps exist but every one is damaged.

    A step removed while it is checked (a trainer rotating its checkpoints) is passed over
    silently. wait_for_digest_s: how long a reader beside a live trainer waits for the digest
    of a step that was just renamed into place, when the run's other steps have digests.
    below: only steps before it (a newer one matched its digest but could not be read).
    """
    skipped, vanished = [], False
    steps = sorted((s for s in manager.all_steps() if below is None or s < below), reverse=True)
    directory = Path(manager.directory)
    for step in steps:
        step_dir = directory / str(step)
        problem = _digest_problem(step_dir)
        if problem == UNVERIFIED and wait_for_digest_s > 0:
            # Older steps are deleted only after this one's digest is written: checked first,
            # they tell a step whose digest is on its way from one that never had one.
            others = _others_have_digests(steps, step, directory)
            problem = _digest_problem(step_dir)
            deadline = time.monotonic() + wait_for_digest_s
            while others and problem == UNVERIFIED and time.monotonic() < deadline:
                time.sleep(0.02)
                problem = _digest_problem(step_dir)
        if not step_dir.is_dir():
            vanished = True  # rotated away while it was checked
            continue
        # A step being rotated away loses its digest first; unverified, it is that when a
        # newer step appeared since the listing.
        if problem is not None and _superseded(directory, step, steps):
            raise CheckpointVanished(f"{step_dir} was being removed while it was checked.")
        if problem == UNVERIFIED:
            # orbax renames a step into place only once its save is complete
            _log.warning(
                "%s has no %s (written by an older minigpt-jax, or killed just before its "
                "digest): using it unverified.",
                step_dir,
                DIGEST_FILENAME,
            )
            problem = None
        if problem is None:
            if skipped:
                _log.warning(
                    "skipping %s; using step %d, the newest intact checkpoint.",
                    "; ".join(skipped),
                    step,
                )
            return step
        skipped.append(f"{step_dir} ({problem})")
    if vanished:
        raise CheckpointVanished(f"the steps of {directory} were removed while they were read.")
    if any("(damaged" in s for s in skipped):
        raise CheckpointError(
            f"every checkpoint in {manager.directory} is damaged: "
            f"{'; '.join(skipped)}. Restore them from a backup, or delete them to train again "
            "from step 0."
        )
    return None


def _digest_problem(step_dir: Path) -> str | None:
    """check_digest, with a step that vanished while it was read reported as missing."""
    try:
        return check_digest(step_dir)
    except FileNotFoundError:
        return "damaged: removed while it was checked"


def _superseded(directory: Path, step: int, listed) -> bool:
    """Whether `step` is gone, or a newer step than those `listed` before it was read exists
    now: a trainer beside a reader deletes a step only once a newer one is complete, so a read
    that failed then is a race, not damage."""
    if not (directory / str(step)).is_dir():
        return True
    listed = set(listed)
    return any(
        p.name.isdigit() and int(p.name) > step and int(p.name) not in listed
        for p in directory.iterdir()
    )


def _others_have_digests(steps: list[int], step: int, directory: Path) -> bool:
    return any((directory / str(s) / DIGEST_FILENAME).is_file() for s in steps if s != step)


def _save(manager, step: int, args, write: bool, keep: int) -> None:
    """Saves `step`, replacing a step of that number left by an interrupted earlier run; then
    writes its digest and keeps only it and the keep - 1 steps before it. (Steps after it are
    leftovers of an interrupted or replaced trajectory.)"""
    if step in manager.all_steps():
        manager.delete(step)
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.CRITICAL)  # orbax logs each failed write with its traceback
    try:
        manager.save(step, args=args, force=True)
    except Exception as error:
        if not _disk_full(error):
            raise
        raise OSError(
            errno.ENOSPC,
            f"no space left on the device of {manager.directory} while saving step {step}; "
            "the earlier checkpoints are kept. Free some space (or lower keep_checkpoints), "
            "then rerun the same command to resume",
        ) from None
    finally:
        absl_logger.setLevel(level)
    if write:
        write_digest(Path(manager.directory) / str(step))
    before = sorted(s for s in manager.all_steps() if s < step)
    for old in before[: max(len(before) - (keep - 1), 0)] + [
        s for s in manager.all_steps() if s > step
    ]:
        manager.delete(old)


def _disk_full(error: BaseException) -> bool:
    """Whether a save failed for want of space (tensorstore says RESOURCE_EXHAUSTED)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "RESOURCE_EXHAUSTED" in str(error) or "No space left" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


class Checkpointer:
    """Saves and restores a run's checkpoints under `workdir`.

    write_digests: whether this process writes the digests (process 0 of a multi-host run).
    It only reads until `start_writing()` (a run whose config is still being checked creates,
    cleans and changes nothing).
    """

    def __init__(self, workdir: str | Path, keep: int = 3, *, write_digests: bool = True):
        self.workdir = Path(workdir).resolve()
        self.run_dir = RunDir(self.workdir)
        self._write = write_digests
        self._keep = keep
        self._writing = False
        self._latest = _manager(self.run_dir.checkpoints, LATEST_ITEMS, read_only=True)
        self._best = _manager(self.run_dir.best, ("params", "meta"), read_only=True)
        self._last_saved: int | None = None
        self._newest_intact: tuple[int | None] | None = None  # found once: hashing is not free

    def start_writing(self) -> None:
        """Creates checkpoints/ and best/ and removes what an interrupted save left there."""
        if not self._writing:
            self.close()
            self._latest = _manager(self.run_dir.checkpoints, LATEST_ITEMS)
            self._best = _manager(self.run_dir.best, ("params", "meta"))
            self._writing = True

    def latest_step(self) -> int | None:
        """The newest intact checkpoint (skipping damaged ones with a warning)."""
        if self._last_saved is not None:
            return self._last_saved
        if self._newest_intact is None:
            self._newest_intact = (newest_intact_step(self._latest),)
        return self._newest_intact[0]

    def suspect_restore(self, step: int, within: int = 10) -> tuple[int, int | None] | None:
        """(the checkpoint this run restored, the newest intact one before it) when a run
        diverged at `step`, at most `within` steps after restoring it with nothing saved since:
        a checkpoint damaged before its digest was written restores and diverges at once.
        None otherwise."""
        if self._last_saved is not None or self._newest_intact is None:
            return None
        (restored,) = self._newest_intact
        if restored is None or not 0 < step - restored <= within:
            return None
        return restored, newest_intact_step(self._latest, below=restored)

    def save(self, state: Any, meta: dict, eval_params: Any = None) -> None:
        """Saves the train state (a pytree with a `step`) and JSON metadata, and the params to
        evaluate when they are not state.params (`load_params` then reads them)."""
        self.start_writing()
        step = int(state.step)
        items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta)}
        if eval_params is not None:
            items[EVAL_PARAMS_ITEM] = ocp.args.StandardSave(eval_params)
        args = ocp.args.Composite(**items)
        _save(self._latest, step, args, self._write, self._keep)
        self._last_saved = step

    def save_best(self, step: int, params: Any, meta: dict) -> None:
        self.start_writing()
        args = ocp.args.Composite(
            params=ocp.args.StandardSave(params), meta=ocp.args.JsonSave(meta)
        )
        _save(self._best, step, args, self._write, 1)

    def read_meta(self, step: int) -> dict:
        """The JSON metadata saved with checkpoint `step` (reads nothing else)."""
        return _restore(self._latest, step, ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

    def restore(self, target_state: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restores (state, meta) at `step` (default: latest) into the structure of target_state;
        a step that matches its digest but cannot be read (damaged before its digest was
        written) is passed over, with a warning, for the newest intact step before it."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.run_dir.checkpoints}.")
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(target_state), meta=ocp.args.JsonRestore()
        )
        while True:
            try:
                restored = _restore(self._latest, step, args)
                _check_finite(restored.state, self._latest, step)
            except CheckpointVanished:
                raise
            except CheckpointError as error:
                older = newest_intact_step(self._latest, below=step)
                if older is None:
                    raise
                _log.warning(
                    "skipping %s (it matches its %s but %s); using step %d, the newest intact "
                    "checkpoint before it.",
                    self.run_dir.checkpoints / str(step),
                    DIGEST_FILENAME,
                    getattr(error, "problem", f"cannot be read: {error.detail}"),
                    older,
                )
                step = older
                continue
            self._newest_intact = (step,)
            return restored.state, restored.meta

    def close(self) -> None:
        self._latest.close()
        self._best.close()


def _restore(manager, step: int, args) -> Any:
    step_dir = Path(manager.directory) / str(step)
    try:
        return manager.restore(step, args=args)
    except Exception as error:  # orbax/tensorstore raise many types for unreadable files
        if _superseded(step_dir.parent, step, manager.all_steps()):
            raise CheckpointVanished(
                f"{step_dir} was removed while it was read (a trainer keeps only its newest "
                "checkpoints); read again."
            ) from error
        detail = (
            f"{type(error).__name__}: "
            f"{str(error).splitlines()[0][:200] if str(error) else 'no detail'}"
        )
        unreadable = CheckpointError(
            f"checkpoint {step_dir} matches its sha256sums.txt but cannot be read ({detail}); "
            "it was written by a different version or model, or damaged before its digest was "
            "written. Train in a fresh --workdir."
        )
        unreadable.detail = detail
        raise unreadable from error


def _check_finite(tree: Any, manager, step: int) -> None:
    """Raises CheckpointError when a float tensor restored from `step` holds a NaN or an
    infinity: nothing non-finite is ever saved, so its files were damaged (and its digest
    written, or written again, after that)."""
    import jax.numpy as jnp

    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        dtype = getattr(leaf, "dtype", None)
        if dtype is None or not jnp.issubdtype(dtype, jnp.inexact):
            continue
        if not bool(jnp.isfinite(leaf).all()):
            name = jax.tree_util.keystr(path)
            step_dir = Path(manager.directory) / str(step)
            damaged = CheckpointError(
                f"checkpoint {step_dir} holds non-finite values in {name}, which no run saves: "
                "it was damaged. Restore it from a backup, or train in a fresh --workdir."
            )
            damaged.detail = f"non-finite values in {name}"
            damaged.problem = f"holds non-finite values in {name}"
            raise damaged


def _on_one_device(manager, step: int, item: str) -> Any:
    """The saved tree's shapes and dtypes placed on this process's first device: a checkpoint
    written by many devices or hosts restores for sampling on one (orbax refuses a target-less
    restore across topologies)."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    metadata = ocp.CheckpointManager(
        manager.directory,
        options=ocp.CheckpointManagerOptions(create=False, cleanup_tmp_directories=False),
        item_handlers={item: ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()},
    ).item_metadata(step)[item]
    return jax.tree_util.tree_map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device), metadata
    )


def load_params(
    workdir: str | Path, which: str = "latest", *, trained: bool = False
) -> tuple[Any, dict]:
    """(params, meta) of a run for inference: `which` is 'latest' or 'best'; the params are the
    run's eval params (meta["eval_params"] names them: schedule-free's x, an EMA, ...; 'best'
    holds only those), or with trained=True the latest checkpoint's trained params.

    meta holds the run's 'gpt_config' (GPTConfig fields) and 'config' (the experiment config).
    """
    if which not in ("latest", "best"):
        raise ValueError(f"which={which!r}: choose 'latest' or 'best'.")
    directory = RunDir(Path(workdir).resolve()).checkpoint_dir(which)
    if not directory.is_dir():
        raise CheckpointError(
            f"no checkpoints in {directory}: train first with "
            f"`minigpt-jax train --config configs/X.py --workdir {workdir}`."
        )
    if trained and which != "latest":
        raise ValueError("best/ holds only the eval params: load which='latest' with trained.")
    items = ("state", EVAL_PARAMS_ITEM) if which == "latest" else ("params",)
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    # orbax warns about each file a rotated-away step lacks; the retries below answer that.
    absl_logger.setLevel(logging.ERROR)
    try:
        # Read as concrete arrays even when asked while a step is traced (a loss term loading a
        # teacher run: the arrays are then the step's constants).
        with jax.ensure_compile_time_eval():
            return _load_newest(directory, items, trained)
    finally:
        absl_logger.setLevel(level)


def _load_newest(directory: Path, items: tuple[str, ...], trained: bool) -> tuple[Any, dict]:
    # A trainer beside this reader may delete the step it picked (keeping only its newest):
    # then the next newest is read.
    below, unreadable = None, None  # a step that matched its digest but could not be read
    for attempt in range(_READ_ATTEMPTS):
        manager = None
        try:
            manager = _manager(directory, (*items, "meta"), read_only=True)
            step = newest_intact_step(manager, wait_for_digest_s=_DIGEST_WAIT_S, below=below)
            if step is None and unreadable is not None:
                raise unreadable
            if step is None:
                # A trainer's rename or deletion caught mid-way lists no step for a moment.
                if attempt < _READ_ATTEMPTS - 1 and any(directory.iterdir()):
                    time.sleep(_EMPTY_RETRY_S)
                    continue
                raise CheckpointError(f"no complete checkpoint in {directory}.")
            item = items[0]
            if len(items) > 1 and not trained and (directory / str(step) / items[1]).is_dir():
                item = items[1]  # the eval params, saved when they are not the trained ones
            try:
                target = _on_one_device(manager, step, item)
            except Exception:  # orbax raises many types for a vanished step
                if not _superseded(directory, step, manager.all_steps()):
                    raise
                continue
            args = ocp.args.Composite(
                **{item: ocp.args.StandardRestore(target), "meta": ocp.args.JsonRestore()}
            )
            try:
                restored = _restore(manager, step, args)
            except CheckpointVanished:
                raise
            except CheckpointError as error:
                _log.warning(
                    "skipping %s (it matches its %s but cannot be read: %s).",
                    directory / str(step),
                    DIGEST_FILENAME,
                    error.detail,
                )
                below, unreadable = step, unreadable or error
                continue
        except (CheckpointVanished, OSError):
            # OSError: orbax lists and stats the steps, and one deleted meanwhile is missing.
            if not directory.is_dir():
                raise CheckpointError(f"{directory} was removed while it was read.") from None
            if attempt == _READ_ATTEMPTS - 1:
                raise
            continue
        finally:
            if manager is not None:
                manager.close()
        params = restored[item]["params"] if item == "state" else restored[item]
        return params, restored["meta"]
    raise CheckpointError(
        f"the checkpoints in {directory} were removed {_READ_ATTEMPTS} times while they were "
        "read: a trainer is replacing them faster than they load; read again, or raise its "
        "checkpoint_every."
    )


_READ_ATTEMPTS = 20
_DIGEST_WAIT_S = 5.0  # hashing a large step's files takes a while
_EMPTY_RETRY_S = 0.05
