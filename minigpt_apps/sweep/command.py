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

Each trial trains in OUT/trials/NNNN (NNNN: its trial number; a study other than the default
`sweep` has its own folder OUT/studies/NAME for its trials/, trials.csv, best_config.py and
plots/, so studies in one OUT stay apart) and reports every evaluation's
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
import hashlib
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

from minigpt_apps.command_line import OneLineParser
from minigpt_apps.sweep.study import (
    DEFAULT_STUDY,
    MAX_SEED,
    PRUNERS,
    SAMPLERS,
    Sweep,
    SweepError,
    ask_lock,
    masked_url,
    open_study,
    storage_errors,
    storage_failure,
)
from minigpt_apps.sweep.worker import WorkerStop, work
from minigpt_jax.runtime.run_dir import entries_of, remove_created
from minigpt_jax.runtime.signals import recorded_signal
from minigpt_jax.settings.registry import user_module_digests

HELP = "train many configs of a search space and rank them"  # minigpt-jax --help
MAX_HEARTBEAT_S = 3600  # a stale trial is found 4 heartbeats late: hours at most


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser("minigpt-jax sweep", __doc__, SweepError)
    add = parser.add_argument
    add("--config", required=True, help="config file[:arg], e.g. configs/tiny.py")
    add("--out", required=True, help="the sweep folder: study.db, trials/, trials.csv, plots/")
    add(
        "--study",
        default=DEFAULT_STUDY,
        help="the study's name in the storage (default: sweep); another's trials, table, best "
        "config and plots go in OUT/studies/NAME",
    )
    add("--storage", default=None, help="an RDB URL (default: sqlite:///OUT/study.db)")
    add("--set", action="append", default=[], metavar="KEY=VALUE", help="fixed for every trial")
    add("--space", action="append", default=[], metavar="KEY=SPEC", help="searched (repeat)")
    add("--sampler", default="tpe", help=f"one of {', '.join(SAMPLERS)} (default: tpe)")
    add("--pruner", default="median", help=f"one of {', '.join(PRUNERS)} (default: median)")
    add("--pruner_startup", type=int, default=3, help="median: complete trials before pruning")
    add("--pruner_warmup", type=int, default=0, help="steps before a trial may be pruned")
    add("--trials", type=int, default=None, help="trials of the study (default: 20; grid: all)")
    add("--timeout", type=float, default=None, help="start no trial after this many seconds")
    add("--seed", type=int, default=0, help="the sampler's seed, 0..2**32-1")
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


def check(argv: list[str]) -> Sweep:
    """Parses and checks the command; raises SweepError with one line, before any write."""
    from minigpt_apps.sweep import space as spaces
    from minigpt_jax.config_dict import (
        add_entry_settings,
        check_experiment_config,
        config_file_of,
    )

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
    if not 0 <= args.seed <= MAX_SEED:
        raise SweepError(f"--seed {args.seed} is out of range; give one of 0..{MAX_SEED}.")
    if not 0 < args.heartbeat <= MAX_HEARTBEAT_S:  # inf, nan: refused here, not by the storage
        raise SweepError(
            f"--heartbeat {args.heartbeat} must be a positive number of seconds, at most "
            f"{MAX_HEARTBEAT_S} (default 5)."
        )
    if not args.study.strip():
        raise SweepError("--study is empty; name the study, e.g. --study lr.")
    if args.study in (".", "..") or any(c in args.study for c in "/\\\0"):
        raise SweepError(
            f"--study {args.study!r} names its folder OUT/studies/NAME: use no / or \\ and not . "
            "or .., e.g. --study lr."
        )
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SweepError(f"--out {out} is a file; name a folder for the sweep.")
    storage_url = args.storage or f"sqlite:///{out.resolve() / 'study.db'}"
    if "://" not in storage_url:
        raise SweepError(
            f"--storage {storage_url!r} is not a database URL; e.g. sqlite:///sweep.db or "
            "postgresql://user:password@host/db."
        )
    args.config = config_file_of(args.config)  # `--config tiny`: the packaged file
    try:
        config = spaces.base_config(args.config)
        # The settings of the entries the config or a --set picks, so --set and --space find
        # them (an entry's own setting is swept like any other).
        picks = dict(argument.partition("=")[::2] for argument in args.set)
        add_entry_settings(config, {key.strip(): text.strip() for key, text in picks.items()})
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
        "plugins": user_module_digests(complete),
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


def _spawn_workers(sweep: Sweep, argv: list[str]) -> list[subprocess.Popen]:
    """Workers 1..K-1 of this machine: the same command, one worker each."""
    from minigpt_apps.sweep.trial import die_with_parent

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
            preexec_fn=die_with_parent,
        )
        for index in range(1, sweep.args.workers)
    ]


def summary(study, sweep: Sweep, wall_s: float) -> list[str]:
    """The closing lines: trials by state, the best trial, what was written."""
    from optuna.trial import TrialState

    from minigpt_apps.sweep import report

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
    table = report.write_table(study, sweep.folder)
    best_config = report.write_best_config(study, sweep.folder, sweep.args.config, sweep.fixed)
    plots, skipped = report.write_plots(study, sweep.folder)
    lines.append(
        f"wrote {table}"
        + (f", {best_config}" if best_config else "")
        + (f", {len(plots)} plots in {sweep.folder / 'plots'}" if plots else "")
    )
    lines += [f"plot skipped: {note}" for note in skipped]
    shown = masked_url(sweep.storage_url)
    lines.append(
        f"live view: optuna-dashboard {shown}"
        + (" (with the password for ***)" if shown != sweep.storage_url else "")
    )
    return lines


def complete_trials(study) -> int:
    """How many trials of `study` completed."""
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def _unlock_as_found(out: Path, found: set[str]) -> None:
    """After a refusal at the study's opening: removes OUT/.ask.lock unless it was there
    before (`found`, run_dir.entries_of), and OUT itself if this command made it and it is
    empty (another command may be using it)."""
    if ".ask.lock" not in found:
        (out / ".ask.lock").unlink(missing_ok=True)
    if "." not in found:
        try:
            out.rmdir()
        except OSError:  # not empty: another command's study
            pass


def main(argv: list[str]) -> int:
    """`minigpt-jax sweep ARGS`: the exit status (an error is one line on stderr)."""
    wall_start = time.perf_counter()
    try:
        import optuna  # noqa: F401
    except ImportError as error:
        print(
            f"minigpt-jax sweep: error: the sweep needs the `sweep` extra ({error}); install it "
            "with pip install -e '.[sweep]'.",
            file=sys.stderr,
        )
        return 2
    stop = WorkerStop()  # from here: a signal while the config loads is not swallowed
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    early = recorded_signal()  # one that came while the command started (minigpt_jax.__main__)
    if early is not None:
        stop(early, None)
    try:
        sweep = check(argv)
    except SweepError as error:
        print(f"minigpt-jax sweep: error: {error}", file=sys.stderr)
        return 2
    if stop.signal_name:
        print(
            f"minigpt-jax sweep: stopped by {stop.signal_name} before the study opened; "
            "nothing written.",
            file=sys.stderr,
        )
        return stop.exit_status
    found = entries_of(sweep.out)
    sweep.out.mkdir(parents=True, exist_ok=True)
    try:
        with ask_lock(sweep.out):  # two commands at once: one creates the study, one loads it
            in_lock = entries_of(sweep.out)  # no other command writes OUT while this holds it
            try:
                study = open_study(sweep)  # once, before the workers: a refusal stops them all
                sweep.folder.mkdir(parents=True, exist_ok=True)
            except Exception:
                remove_created(sweep.out, in_lock)  # what the refused open wrote
                raise
    except (SweepError, *storage_errors()) as error:
        _unlock_as_found(sweep.out, found)
        why = error if isinstance(error, SweepError) else storage_failure(sweep, error)
        print(f"minigpt-jax sweep: error: {why}", file=sys.stderr)
        return 2
    try:
        if sweep.args.worker_index == 0:
            stop.children = _spawn_workers(sweep, argv)
        work(sweep, stop, study._storage)
        status = 0
        for child in stop.children:
            status = max(status, child.wait())
        if sweep.args.worker_index == 0:
            for line in summary(study, sweep, time.perf_counter() - wall_start):
                print(line, flush=True)
    except storage_errors() as error:  # written while the study ran: its trials keep their runs
        for child in stop.children:
            child.terminate()
            child.wait()
        print(f"minigpt-jax sweep: error: {storage_failure(sweep, error)}", file=sys.stderr)
        return 2
    if stop.signal_name:
        print(
            f"minigpt-jax sweep: stopped by {stop.signal_name}: the trial in flight kept its "
            "checkpoint and is queued; rerun the same command to resume the study.",
            file=sys.stderr,
            flush=True,
        )
        return stop.exit_status
    if status == 0 and sweep.args.worker_index == 0 and not complete_trials(study):
        print(
            f"minigpt-jax sweep: error: no trial of study {sweep.args.study!r} completed "
            f"(see {sweep.folder / 'trials.csv'} and each trial's train.log); fix what failed, "
            "then start another --study (a failed trial is not run again).",
            file=sys.stderr,
        )
        return 1
    return status
