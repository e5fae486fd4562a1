"""`minigpt-jax sweep`: an Optuna study over config keys, its trials `minigpt-jax train` runs
in child processes, pruned from their val curves, shared by any number of workers.

    minigpt-jax sweep --config configs/tiny.py --out sweeps/lr --space optim.lr=log:1e-4..3e-2 \\
        [--space model.norm=layernorm,rmsnorm] [--set num_steps=200] [--trials 20] \\
        [--sampler tpe|random|grid|cmaes|qmc] [--pruner median|halving|hyperband|none] \\
        [--target 1.88] [--workers 2] [--storage URL] [--study NAME] [--timeout S] [--seed 0]

The study lives in --storage (default: sqlite:///OUT/study.db); other machines join it by
running the same command with the same --storage URL (PostgreSQL or MySQL across machines).
Its identity is its fixed settings (the --config file and the config it returns, --set, the
space, the objective and the source of the plug-in modules the config names): the same command
resumes the study, another is refused, naming what differs.

Each trial trains in OUT/trials/NNNN (NNNN: its trial number) and reports every evaluation's
val loss to the pruner. A worker records a heartbeat while its trial runs; a trial whose worker
died (kill -9, a lost machine) is marked failed by the next worker to look and queued again,
and the new trial resumes the same run directory from its checkpoint (at most 3 attempts). A
trial that crashes (an error of its own) is failed and not retried.

Samplers: TPE (the first max(2, min(10, trials // 4)) trials random, then modelled; a running
trial counts as a bad one, so workers spread out), random, grid (lists only), CMA-ES, QMC.
Objective: the best val loss of the trial, or with --target the seconds of training (chunk time
from metrics.jsonl; start-up, compilation and evaluation excluded) until its first evaluation
at or below the target; the trial then stops there. A trial that never reaches it scores twice
its whole training time (worse than reaching it at its last evaluation), never a crash.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

MAX_ATTEMPTS = 3  # runs of one run directory: the first and two resumes
SAMPLERS = ("tpe", "random", "grid", "cmaes", "qmc")
PRUNERS = ("median", "halving", "hyperband", "none")
HOLD_ENV = "MINIGPT_JAX_SWEEP_HOLD_BEFORE_RECORD"  # tests: seconds between a trial's end and tell


class SweepError(ValueError):
    """A bad argument or a refused study: printed as one line, nothing written."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise SweepError(f"{message}; see minigpt-jax sweep --help.")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="minigpt-jax sweep",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    add = parser.add_argument
    add("--config", required=True, help="config file[:arg], e.g. configs/tiny.py")
    add("--out", required=True, help="the sweep folder: study.db, trials/, trials.csv, plots/")
    add("--study", default="sweep", help="the study's name in the storage (default: sweep)")
    add("--storage", default=None, help="an RDB URL (default: sqlite:///OUT/study.db)")
    add("--set", action="append", default=[], metavar="KEY=VALUE", help="fixed for every trial")
    add("--space", action="append", default=[], metavar="KEY=SPEC", help="searched (repeat)")
    add("--sampler", default="tpe", help=f"one of {', '.join(SAMPLERS)} (default: tpe)")
    add("--pruner", default="median", help=f"one of {', '.join(PRUNERS)} (default: median)")
    add("--pruner_startup", type=int, default=3, help="median: complete trials before pruning")
    add("--pruner_warmup", type=int, default=0, help="steps before a trial may be pruned")
    add("--trials", type=int, default=None, help="trials of the study (default: 20; grid: all)")
    add("--timeout", type=float, default=None, help="start no trial after this many seconds")
    add("--seed", type=int, default=0, help="the sampler's seed")
    add("--target", type=float, default=None, help="objective: training seconds to this val loss")
    add("--workers", type=int, default=1, help="worker processes on this machine (default: 1)")
    add(
        "--gpus_per_worker",
        type=int,
        default=0,
        help="give each worker its own N GPUs (CUDA_VISIBLE_DEVICES); 0: trials share them all",
    )
    add("--heartbeat", type=float, default=5.0, help="seconds between a trial's heartbeats")
    add("--worker_index", type=int, default=0, help=argparse.SUPPRESS)
    return parser


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

    @property
    def objective(self) -> str:
        target = self.args.target
        return "best val loss" if target is None else f"training seconds to val loss {target}"


# ----------------------------------------------------------------------------- checking


def check(argv: list[str]) -> Sweep:
    """Parses and checks the command; raises SweepError with one line, before any write."""
    from minigpt_jax.experiment import check_experiment_config
    from minigpt_jax.sweep import space as spaces

    args = _parser().parse_args(argv)
    if args.sampler not in SAMPLERS:
        raise SweepError(f"--sampler {args.sampler!r} is unknown; one of {', '.join(SAMPLERS)}.")
    if args.pruner not in PRUNERS:
        raise SweepError(f"--pruner {args.pruner!r} is unknown; one of {', '.join(PRUNERS)}.")
    for name, low in (("trials", 1), ("workers", 1), ("pruner_startup", 0), ("pruner_warmup", 0)):
        value = getattr(args, name)
        if value is not None and value < low:
            raise SweepError(f"--{name} {value} must be at least {low}.")
    if args.gpus_per_worker < 0:
        raise SweepError("--gpus_per_worker must be 0 (share) or a positive number of GPUs.")
    if args.timeout is not None and not args.timeout > 0:
        raise SweepError(f"--timeout {args.timeout} must be a positive number of seconds.")
    if args.target is not None and not (math.isfinite(args.target) and args.target > 0):
        raise SweepError(f"--target {args.target} must be a positive val loss.")
    if not args.heartbeat > 0:
        raise SweepError("--heartbeat must be a positive number of seconds.")
    if not args.study.strip():
        raise SweepError("--study is empty; name the study, e.g. --study lr.")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SweepError(f"--out {out} is a file; name a folder for the sweep.")
    storage_url = args.storage or f"sqlite:///{out.resolve() / 'study.db'}"
    if "://" not in storage_url:
        raise SweepError(
            f"--storage {storage_url!r} is not a database URL; e.g. sqlite:///sweep.db or "
            "postgresql://user:password@host/db."
        )
    try:
        config = spaces.base_config(args.config)
        fixed = spaces.parse_sets(config, args.set)
        dimensions = spaces.parse_space(config, args.space, fixed)
        spaces.check_space(args.config, fixed, dimensions)
        complete = check_experiment_config(spaces.config_with(args.config, fixed))
    except ValueError as error:
        raise SweepError(str(error)) from None
    lists = [d for d in dimensions if d.values is not None]
    if args.sampler == "grid":
        ranges = [d.key for d in dimensions if d.values is None]
        if ranges:
            raise SweepError(
                f"--sampler grid needs lists of values, but {', '.join(ranges)} is a range; "
                "list its values (a,b,c) or use --sampler tpe."
            )
        size = math.prod(len(d.values) for d in lists)
        n_trials = size if args.trials is None else min(args.trials, size)
    else:
        n_trials = 20 if args.trials is None else args.trials
    if args.sampler == "cmaes":
        _require("cmaes", "--sampler cmaes", "pip install cmaes")
    if args.sampler == "qmc":
        _require("scipy", "--sampler qmc", "pip install scipy")
    identity = {
        "config_file_sha256": spaces.file_digest(args.config),
        "config": json.loads(json.dumps(complete.to_dict(), default=repr)),
        "set": fixed,
        "space": {d.key: d.describe() for d in dimensions},
        "objective": {"target": args.target},
        "plugins": spaces.plugin_digests(complete),
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=repr).encode()).hexdigest()
    return Sweep(
        args=args,
        out=out,
        storage_url=storage_url,
        fixed=fixed,
        space=dimensions,
        n_trials=n_trials,
        num_steps=complete.num_steps,
        eval_every=complete.eval_every,
        identity=identity,
        digest=digest,
    )


def _require(module: str, what: str, fix: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise SweepError(f"{what} needs the {module} package; {fix} (or the `sweep` extra).")


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


# ----------------------------------------------------------------------------- the study


def _storage(sweep: Sweep):
    import optuna

    kwargs = {}
    if sweep.storage_url.startswith("sqlite"):
        # Workers write at once: wait on SQLite's lock instead of failing with "locked".
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 300}}
    try:
        return optuna.storages.RDBStorage(
            sweep.storage_url,
            heartbeat_interval=max(1, round(sweep.args.heartbeat)),
            grace_period=max(4, round(4 * sweep.args.heartbeat)),
            heartbeat_stale_trial_callback=resume_failed,
            **kwargs,
        )
    except Exception as error:  # SQLAlchemy's many kinds: a missing driver, a refused login
        line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SweepError(f"--storage {sweep.storage_url}: {line}; check the URL.") from None


def open_study(sweep: Sweep, sampler=None, pruner=None):
    """The study, created if new, with this command's identity; refuses one with another."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Heartbeats outside Study.optimize are what a trial in a child process needs: Optuna's
    # "experimental" and "supposed to be used with optimize" warnings say nothing to act on.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
    study = optuna.create_study(
        study_name=sweep.args.study,
        storage=_storage(sweep),
        sampler=sampler,
        pruner=pruner,
        direction="minimize",
        load_if_exists=True,
    )
    if "identity" not in study.user_attrs:
        study.set_user_attr("identity", sweep.digest)
        study.set_user_attr("fixed_settings", sweep.identity)
        study.set_user_attr("objective", sweep.objective)
        study = optuna.load_study(
            study_name=sweep.args.study, storage=study._storage, sampler=sampler, pruner=pruner
        )  # two commands at once: the last write is the study's; the other is refused below
    if study.user_attrs["identity"] != sweep.digest:
        differs = _differences(study.user_attrs.get("fixed_settings", {}), sweep.identity)
        raise SweepError(
            f"study {sweep.args.study!r} in {sweep.storage_url} was made with other fixed "
            f"settings: {differs}; rerun its own command to resume it, or start a new study "
            f"with --study NEWNAME."
        )
    return study


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


def _sampler(sweep: Sweep, existing: int):
    import optuna

    args, index = sweep.args, sweep.args.worker_index
    # Grid and QMC index one shared sequence: every worker must hold the same seed. The others
    # draw: each worker (and each rerun) its own stream, or they would propose the same points.
    varied = args.seed + 1009 * index + 7919 * existing
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


def _pruner(sweep: Sweep):
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
def _ask_lock(out: Path):
    """One worker of this machine at a time counts the study's trials and asks for one."""
    fd = os.open(out / ".ask.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _claim(study, sweep: Sweep):
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


# ----------------------------------------------------------------------------- a worker


class _Stop:
    """SIGINT/SIGTERM to a worker: stop its trial (it saves a checkpoint) and end."""

    def __init__(self):
        self.signal_name: str | None = None
        self.children: list[subprocess.Popen] = []  # spawned workers, told in turn

    def __call__(self, sig, frame) -> None:
        self.signal_name = signal.Signals(sig).name
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)


def work(sweep: Sweep, stop: _Stop, storage) -> None:
    """Runs trials until the study has --trials, --timeout passes or a signal comes."""
    import optuna

    existing = len(optuna.load_study(study_name=sweep.args.study, storage=storage).trials)
    study = optuna.load_study(
        study_name=sweep.args.study,
        storage=storage,
        sampler=_sampler(sweep, existing),
        pruner=_pruner(sweep),
    )
    started = time.monotonic()
    while stop.signal_name is None:
        if sweep.args.timeout and time.monotonic() - started > sweep.args.timeout:
            break
        with _ask_lock(sweep.out):
            optuna.storages.fail_stale_trials(study)
            trial, others = _claim(study, sweep)
        if trial is None:
            if not others:
                break
            time.sleep(sweep.args.heartbeat)  # another worker's trial: done, or stale soon
            continue
        run_trial(study, trial, sweep, stop)


def _say(sweep: Sweep, text: str) -> None:
    print(f"[worker {sweep.args.worker_index}] {text}", flush=True)


def _prune_reason(study, trial, step: int, value: float, pruner: str) -> str:
    from optuna.trial import TrialState

    if pruner == "median":
        others = [
            t.intermediate_values[step]
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if step in t.intermediate_values
        ]
        if others:  # Optuna compares the trial's best so far with the others' at this step
            reported = study._storage.get_trial(trial._trial_id).intermediate_values
            best = min(v for s, v in reported.items() if s <= step)
            return (
                f"val loss {value:.4f} at step {step} (its best so far {best:.4f}) is above "
                f"the median {statistics.median(others):.4f} of {len(others)} complete "
                "trials there (median pruner)"
            )
    words = {"halving": "successive halving", "hyperband": "Hyperband", "median": "median"}
    return f"val loss {value:.4f} at step {step} is not among the best there ({words[pruner]})"


def run_trial(study, trial, sweep: Sweep, stop: _Stop) -> None:
    """Trains one trial in its run directory and records its end: complete (its objective),
    pruned (where and why), failed (the child's error), or queued to resume (stopped)."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    from minigpt_jax.experiment import check_experiment_config
    from minigpt_jax.sweep import space as spaces
    from minigpt_jax.sweep import trial as trials
    from minigpt_jax.train.metrics import read_metrics

    storage, number = study._storage, trial.number
    run_rel = trial.user_attrs.get("run_dir") or f"trials/{number:04d}"
    trial.set_user_attr("run_dir", run_rel)
    run_dir = sweep.out / run_rel
    run_dir.mkdir(parents=True, exist_ok=True)
    values = {**sweep.fixed, **trial.params}
    shown = ", ".join(f"{k}={v!r}" for k, v in trial.params.items())
    resumes = trial.user_attrs.get("resumes")
    again = "" if resumes is None else f" (resumes trial {resumes})"
    _say(sweep, f"trial {number}: {shown}{again}")
    config_file = run_dir / "config.py"
    doc = f"Trial {number} of study {sweep.args.study!r} (minigpt-jax sweep): {shown}."
    config_file.write_text(spaces.config_file_text(sweep.args.config, values, doc))

    def fail(reason: str) -> None:
        trial.set_user_attr("error", reason)
        study.tell(trial, state=TrialState.FAIL)
        _say(sweep, f"trial {number}: failed: {reason}")

    try:
        config = check_experiment_config(spaces.config_with(sweep.args.config, values))
    except ValueError as error:
        return fail(f"config refused: {error}")
    tokens_per_step = config.batch_size * config.model.block_size
    target = sweep.args.target
    beat = {"at": time.monotonic(), "mine": True}
    pruned: dict[str, Any] = {}

    def on_evaluation(step: int, val_loss: float) -> str | None:
        trial.report(val_loss, step)
        if target is not None and val_loss <= target:
            return "reached"
        if trial.should_prune():
            pruned.update(
                step=step, reason=_prune_reason(study, trial, step, val_loss, sweep.args.pruner)
            )
            return "pruned"
        return None

    def keep_going() -> bool:
        if time.monotonic() - beat["at"] >= sweep.args.heartbeat:
            beat["at"] = time.monotonic()
            storage.record_heartbeat(trial._trial_id)
            beat["mine"] = storage.get_trial(trial._trial_id).state == TrialState.RUNNING
        return stop.signal_name is None and beat["mine"]

    if resumes is not None:
        trials.wait_for_run_lock(run_dir)  # the killed worker's child may still be saving
    env_child = _child_env(sweep)
    with _environ(env_child):
        child = trials.start(run_dir, config_file)
    code, why = trials.follow(child, run_dir, on_evaluation, keep_going)
    if os.environ.get(HOLD_ENV):
        time.sleep(float(os.environ[HOLD_ENV]))  # tests: a kill -9 between the end and tell
    if not beat["mine"]:
        return _say(sweep, f"trial {number}: taken over (its heartbeat lapsed); left to it")
    try:
        if why == "pruned":
            last = max((r["step"] for r in read_metrics(run_dir)), default=pruned["step"])
            trial.set_user_attr("pruned_at_step", pruned["step"])
            trial.set_user_attr("stopped_at_step", last)  # a few steps on: the worker's reaction
            trial.set_user_attr("pruned_reason", pruned["reason"])
            study.tell(trial, state=TrialState.PRUNED)
            return _say(
                sweep, f"trial {number}: pruned at step {pruned['step']}: {pruned['reason']}"
            )
        result = trials.result_of(run_dir, tokens_per_step, target)
        reached = why == "reached" or result.step_at_target is not None
        if why == "stopped" or (code == 0 and not reached and result.last_step < config.num_steps):
            # Stopped before its end (a signal): queued to resume from its checkpoint.
            trial.set_user_attr("stopped_at_step", result.last_step)
            study.tell(trial, state=TrialState.FAIL)
            resume_failed(study, storage.get_trial(trial._trial_id))
            return _say(
                sweep,
                f"trial {number}: stopped at step {result.last_step}, checkpoint kept; rerun the "
                "same command to resume it",
            )
        if code != 0 or result.best_val_loss is None:
            return fail(trials.last_line(run_dir) if code else "the run recorded no val loss")
        trial.set_user_attr("best_val_loss", result.best_val_loss)
        trial.set_user_attr("last_step", result.last_step)
        trial.set_user_attr("train_seconds", result.train_seconds)
        if target is None:
            value = result.best_val_loss
            words = f"best val loss {value:.4f}"
        elif reached:
            value = result.seconds_to_target
            trial.set_user_attr("step_at_target", result.step_at_target)
            words = f"val loss {target} at step {result.step_at_target}, {value:.2f} s of training"
        else:
            value = 2 * result.train_seconds
            trial.set_user_attr("missed_target", True)
            words = f"missed {target} (best {result.best_val_loss:.4f}): scores {value:.2f} s"
        study.tell(trial, value)
        _say(sweep, f"trial {number}: {words}")
    except UpdateFinishedTrialError:
        _say(sweep, f"trial {number}: another worker recorded it first (heartbeat lapsed)")


def _child_env(sweep: Sweep) -> dict[str, str]:
    env = {}
    per = sweep.args.gpus_per_worker
    if per:
        first = sweep.args.worker_index * per
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + i) for i in range(per))
    elif sweep.args.workers > 1 and "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # shared GPUs: no trial takes 75% of one
    return env


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ----------------------------------------------------------------------------- the command


def _spawn_workers(sweep: Sweep, argv: list[str]) -> list[subprocess.Popen]:
    """Workers 1..K-1 of this machine: the same command, one worker each."""
    from minigpt_jax.sweep.trial import _die_with_parent

    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "minigpt_jax",
                "sweep",
                *argv,
                f"--worker_index={index}",
            ],  # fmt: skip
            preexec_fn=_die_with_parent,
        )
        for index in range(1, sweep.args.workers)
    ]


def summary(study, sweep: Sweep, wall_s: float) -> list[str]:
    """The closing lines: trials by state, the best trial, what was written."""
    from optuna.trial import TrialState

    from minigpt_jax.sweep import report

    trials = study.get_trials(deepcopy=False)
    by_state = {s: sum(t.state == s for t in trials) for s in TrialState}
    resumed = sum(1 for t in trials if "resumes" in t.user_attrs)
    lines = [
        f"study {sweep.args.study!r}: {len(trials)} trials: {by_state[TrialState.COMPLETE]} "
        f"complete, {by_state[TrialState.PRUNED]} pruned, {by_state[TrialState.FAIL]} failed"
        + (f" ({resumed} resumed later)" if resumed else "")
        + (f", {by_state[TrialState.RUNNING]} running" if by_state[TrialState.RUNNING] else "")
        + f"; this command's wall time {wall_s:.1f} s"
    ]
    if by_state[TrialState.COMPLETE]:
        best = study.best_trial
        shown = ", ".join(f"{k}={v!r}" for k, v in best.params.items())
        lines.append(
            f"best: trial {best.number} ({shown}): {sweep.objective} {best.value:.6g}"
            + (
                f", best val loss {best.user_attrs['best_val_loss']:.4f}"
                if sweep.args.target is not None and "best_val_loss" in best.user_attrs
                else ""
            )
        )
    table = report.write_table(study, sweep.out)
    best_config = report.write_best_config(study, sweep.out, sweep.args.config, sweep.fixed)
    plots, skipped = report.write_plots(study, sweep.out)
    lines.append(
        f"wrote {table}"
        + (f", {best_config}" if best_config else "")
        + (f", {len(plots)} plots in {sweep.out / 'plots'}" if plots else "")
    )
    lines += [f"plot skipped: {note}" for note in skipped]
    lines.append(f"live view: optuna-dashboard {sweep.storage_url}")
    return lines


def main(argv: list[str]) -> int:
    """`minigpt-jax sweep ARGS`: the exit status (an error is one line on stderr)."""
    wall_start = time.perf_counter()
    try:
        sweep = check(argv)
    except SweepError as error:
        print(f"minigpt-jax sweep: error: {error}", file=sys.stderr)
        return 2
    stop = _Stop()
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    sweep.out.mkdir(parents=True, exist_ok=True)
    try:
        with _ask_lock(sweep.out):  # two commands at once: one creates the study, one loads it
            study = open_study(sweep)  # once, before the workers: a refusal stops them all
    except SweepError as error:
        print(f"minigpt-jax sweep: error: {error}", file=sys.stderr)
        return 2
    if sweep.args.worker_index == 0:
        stop.children = _spawn_workers(sweep, argv)
    work(sweep, stop, study._storage)
    status = 0
    for child in stop.children:
        status = max(status, child.wait())
    if sweep.args.worker_index == 0:
        for line in summary(study, sweep, time.perf_counter() - wall_start):
            print(line, flush=True)
    if stop.signal_name:
        print(
            f"stopped by {stop.signal_name}: the trial in flight kept its checkpoint and is "
            "queued; rerun the same command to resume the study.",
            flush=True,
        )
        return 1
    return status
