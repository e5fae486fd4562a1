"""A sweep's Optuna study: what a checked sweep command is (`Sweep`), its storage, opening the
study under the command's identity (another identity is refused, naming what differs), the
samplers and pruners, and how a worker claims the next trial (a queued resume first)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import os
import re
import time
import warnings
from pathlib import Path
from typing import Any

MAX_ATTEMPTS = 3  # runs of one run directory: the first and two resumes
SAMPLERS = ("tpe", "random", "grid", "cmaes", "qmc")
PRUNERS = ("median", "halving", "hyperband", "none")
MAX_SEED = 2**32 - 1  # numpy's seeds: 0..2**32-1


class SweepError(ValueError):
    """A bad argument or a refused study: printed as one line, nothing written."""


@dataclasses.dataclass
class Sweep:
    """A checked sweep command: what every worker of it needs."""

    args: argparse.Namespace
    out: Path
    storage_url: str
    fixed: dict[str, Any]
    space: list  # of space.Dimension
    n_trials: int
    num_steps: int
    eval_every: int
    identity: dict[str, Any]
    digest: str
    # The study's own folder, where its trials/, trials.csv, best_config.py and plots/ go: OUT
    # for the default study, OUT/studies/NAME for another, so studies in one OUT stay apart.
    # open_study sets it from the study (one an older version made keeps OUT).
    folder: Path | None = None

    @property
    def objective(self) -> str:
        target = self.args.target
        return "best val loss" if target is None else f"training seconds to val loss {target}"


def _storage(sweep: Sweep):
    import optuna

    kwargs = {}
    if sweep.storage_url.startswith("sqlite"):
        # Workers write at once: wait on SQLite's lock instead of failing with "locked".
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 300}}
    try:
        for attempt in range(SCHEMA_ATTEMPTS):
            try:
                return optuna.storages.RDBStorage(
                    sweep.storage_url,
                    heartbeat_interval=max(1, round(sweep.args.heartbeat)),
                    grace_period=max(4, round(4 * sweep.args.heartbeat)),
                    heartbeat_stale_trial_callback=resume_failed,
                    **kwargs,
                )
            except Exception as error:
                # Two machines opening a new database at once both create Optuna's tables:
                # one of them fails on a duplicate name, then finds the other's tables.
                if attempt + 1 == SCHEMA_ATTEMPTS or not _created_meanwhile(error):
                    raise
                time.sleep(1.0 + attempt)
    except Exception as error:  # SQLAlchemy's many kinds: a missing driver, a refused login
        shown = masked_url(sweep.storage_url)
        driver = _missing_driver(sweep.storage_url, error)
        if driver is not None:
            raise SweepError(f"--storage {shown}: {driver}") from None
        line = str(error).splitlines()[0] if str(error) else type(error).__name__
        line = line.replace(sweep.storage_url, shown)
        raise SweepError(f"--storage {shown}: {line}; check the URL.") from None


SCHEMA_ATTEMPTS = 5


def _created_meanwhile(error: Exception) -> bool:
    """Whether `error` is a duplicate name from creating tables another process created."""
    import sqlalchemy.exc

    return isinstance(error, sqlalchemy.exc.IntegrityError) or (
        isinstance(error, sqlalchemy.exc.ProgrammingError) and "already exists" in str(error)
    )


# The package that brings each database's driver (SQLAlchemy 2's default dialect driver).
_DRIVERS = {
    "postgresql": "psycopg (3): pip install 'minigpt-jax[postgres]'",
    "mysql": "mysqlclient: pip install mysqlclient (or give mysql+pymysql:// and "
    "pip install PyMySQL)",
}


def _missing_driver(url: str, error: Exception) -> str | None:
    """The words for a storage URL whose database driver is not installed, or None."""
    chain, cause = [], error
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if not any(isinstance(e, ImportError) for e in chain):
        return None
    scheme = url.partition("://")[0]
    dialect = scheme.partition("+")[0]
    package = _DRIVERS.get(dialect) if "+" not in scheme else None
    return f"the driver of {scheme}:// is not installed; " + (
        f"install {package}." if package else "install the driver the URL names."
    )


def masked_url(url: str) -> str:
    """`url` with its password shown as ***, for every line and file a sweep writes."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy reads: mask what looks like user:password@
        return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


def storage_errors() -> tuple[type[Exception], ...]:
    """What Optuna and SQLAlchemy raise when the storage cannot be read or written."""
    import optuna
    import sqlalchemy.exc

    return (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError)


def storage_failure(sweep: Sweep, error: Exception) -> str:
    """One line for a storage error (a study.db it cannot write, another program's database):
    the database, the driver's reason, the fix."""
    cause = error.__cause__ if error.__cause__ is not None else error
    reason = str(getattr(cause, "orig", None) or cause).strip().splitlines()
    url = sweep.storage_url
    where = url.partition(":///")[2] if url.startswith("sqlite:///") else masked_url(url)
    why = reason[0] if reason else type(cause).__name__
    return (
        f"the study's storage {where} cannot be used ({why}); "
        "make it and its folder writable, or give --storage a database this sweep made (not "
        "another program's); the runs in OUT are kept."
    )


def open_study(sweep: Sweep, sampler=None, pruner=None):
    """The study, created if new, with this command's identity; refuses one with another."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Heartbeats outside Study.optimize are what a trial in a child process needs: Optuna's
    # "experimental" and "supposed to be used with optimize" warnings say nothing to act on.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
    from sqlalchemy.exc import IntegrityError

    storage = _storage(sweep)
    if sweep.args.study not in {s.study_name for s in storage.get_all_studies()}:
        _refuse_runs_of_a_lost_study(sweep)
    study = optuna.create_study(
        study_name=sweep.args.study,
        storage=storage,
        sampler=sampler,
        pruner=pruner,
        direction="minimize",
        load_if_exists=True,
    )
    if "identity" not in study.user_attrs:
        try:
            study.set_user_attr("folder", study_folder(sweep.args.study))
            study.set_user_attr("identity", sweep.digest)
            study.set_user_attr("fixed_settings", sweep.identity)
            study.set_user_attr("objective", sweep.objective)
        except IntegrityError:  # another command made the study at once and wrote first
            pass
        study = optuna.load_study(
            study_name=sweep.args.study, storage=storage, sampler=sampler, pruner=pruner
        )  # two commands at once: the last write is the study's; the other is refused below
    if study.user_attrs["identity"] != sweep.digest:
        differs = _differences(study.user_attrs.get("fixed_settings", {}), sweep.identity)
        raise SweepError(
            f"study {sweep.args.study!r} in {masked_url(sweep.storage_url)} was made with other "
            f"fixed settings: {differs}; rerun its own command to resume it, or start a new study "
            f"with --study NEWNAME."
        )
    sweep.folder = sweep.out / study.user_attrs.get("folder", ".")  # none: made before folders
    return study


DEFAULT_STUDY = "sweep"


def _refuse_runs_of_a_lost_study(sweep: Sweep) -> None:
    """A study new to the storage whose trials folder already holds runs (study.db emptied,
    truncated to 0 bytes or deleted): refused, as its trials would resume or overwrite them."""
    trials = sweep.out / study_folder(sweep.args.study) / "trials"
    runs = sorted(p.name for p in trials.iterdir() if p.is_dir()) if trials.is_dir() else []
    if runs:
        raise SweepError(
            f"study {sweep.args.study!r} is not in {masked_url(sweep.storage_url)} (an empty, "
            f"0-byte or replaced study.db?), but {trials} holds {len(runs)} runs of it "
            f"({runs[0]}...); restore its study.db, or move {trials} aside to start the study "
            "afresh."
        )


def study_folder(name: str) -> str:
    """The folder of study `name`, relative to OUT: "." for the default study, else
    studies/NAME (a name that is no plain folder name is refused by the command)."""
    return "." if name == DEFAULT_STUDY else f"studies/{name}"


def resume_failed(study, trial) -> None:
    """Queues a trial whose worker died (its heartbeat went stale) to resume its run directory
    from its checkpoint: same params, same run_dir, one more attempt (at most MAX_ATTEMPTS)."""
    attempt = trial.user_attrs.get("attempt", 1)
    if attempt >= MAX_ATTEMPTS or not trial.params:
        return
    attrs = {"resumes": trial.number, "attempt": attempt + 1}
    if "run_dir" in trial.user_attrs:
        attrs["run_dir"] = trial.user_attrs["run_dir"]
    study.enqueue_trial(trial.params, user_attrs=attrs)


def make_sampler(sweep: Sweep, existing: int):
    import optuna

    args, index = sweep.args, sweep.args.worker_index
    # Grid and QMC index one shared sequence: every worker must hold the same seed. The others
    # draw: each worker (and each rerun) its own stream, or they would propose the same points.
    varied = (args.seed + 1009 * index + 7919 * existing) % (MAX_SEED + 1)
    if args.sampler == "grid":
        return _grid_sampler({d.key: list(d.values) for d in sweep.space}, args.seed)
    if args.sampler == "qmc":
        return optuna.samplers.QMCSampler(seed=args.seed, warn_independent_sampling=False)
    if args.sampler == "random":
        return optuna.samplers.RandomSampler(seed=varied)
    if args.sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=varied, warn_independent_sampling=False)
    return optuna.samplers.TPESampler(
        seed=varied,
        n_startup_trials=min(10, max(2, sweep.n_trials // 4)),
        constant_liar=True,  # a running trial counts as a bad one: workers spread out
    )


def _grid_sampler(space: dict, seed: int):
    """Optuna's grid, less its after_trial: that calls Study.stop, which works only inside
    Study.optimize (and reads a grid_id a resumed trial has not); the workers count trials."""
    import optuna

    class Grid(optuna.samplers.GridSampler):
        def after_trial(self, study, trial, state, values) -> None:
            return None

    return Grid(space, seed)


def make_pruner(sweep: Sweep):
    import optuna

    args = sweep.args
    if args.pruner == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=args.pruner_startup, n_warmup_steps=args.pruner_warmup
        )
    if args.pruner == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=args.pruner_warmup or sweep.eval_every
        )
    if args.pruner == "hyperband":
        max_resource = "auto" if any(d.key == "num_steps" for d in sweep.space) else sweep.num_steps
        return optuna.pruners.HyperbandPruner(
            min_resource=args.pruner_warmup or sweep.eval_every, max_resource=max_resource
        )
    return optuna.pruners.NopPruner()


@contextlib.contextmanager
def ask_lock(out: Path):
    """One worker of this machine at a time counts the study's trials and asks for one."""
    fd = os.open(out / ".ask.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def claim(study, sweep: Sweep):
    """(a trial to run, whether others are still running): a queued trial (a resume) first;
    a new one while the study has fewer than --trials (a resumed failure not counted)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    resumed = {t.user_attrs.get("resumes") for t in trials}
    counted = [t for t in trials if t.number not in resumed]
    waiting = any(t.state == TrialState.WAITING for t in trials)
    if waiting or len(counted) < sweep.n_trials:
        trial = study.ask({d.key: d.distribution() for d in sweep.space})
        study._storage.record_heartbeat(trial._trial_id)  # from now on it can go stale
        return trial, True
    return None, any(t.state == TrialState.RUNNING for t in counted)


def _differences(saved: dict, mine: dict) -> str:
    """Words for what differs between two identities (top level, and keys of config/set)."""
    words = []
    for name in ("config_file_sha256", "set", "space", "objective", "plugins"):
        if saved.get(name) != mine.get(name):
            label = {
                "config_file_sha256": "the --config file's content",
                "set": "--set",
                "space": "--space",
                "objective": "the objective (--target)",
                "plugins": "the source of plug-in modules",
            }[name]
            if name == "config_file_sha256":
                words.append(label)
            else:
                words.append(f"{label} ({saved.get(name)!r} then, {mine.get(name)!r} now)")
    old, new = _flat(saved.get("config", {})), _flat(mine.get("config", {}))
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if changed and not words:  # the config file's imports changed what it returns
        words.append(f"the config ({', '.join(f'config.{k}' for k in changed)})")
    return "; ".join(words) or "its fixed settings"


def _flat(config: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
