"""`minigpt-jax compare`: two or more arms of a config trained over the same seeds, and whether
their difference from the baseline is real (paired statistics over the seeds).

    minigpt-jax compare --config configs/tiny.py --out compares/norm --seeds 5 \\
        --arm rmsnorm:model.norm=rmsnorm [--arm NAME:key=value[,key=value] ...] \\
        [--baseline NAME] [--set key=value ...] [--config.key=value ...] [--workers K] \\
        [--metric final_val_loss|best_val_loss|time_to_target --target LOSS] [--sesoi X] \\
        [--eval_tokens N] [--allow_partial]
    minigpt-jax compare --config configs/tiny.py --out compares/aa --seeds 10 --aa
    minigpt-jax compare --from_sweep SWEEP_OUT [--study NAME] --baseline configs/X.py \\
        --out compares/recheck --seeds 5

Arms: the baseline is the --config unchanged (named `baseline`), unless --baseline names one of
the --arm arms (an --arm NAME with no settings is the config unchanged). --set (or
--config.key=value) applies to every arm. --aa: the config against itself (arm aa) on seeds
2**30 above the baseline's, to see how often identical arms differ: the report counts the
disjoint blocks of 3 paired seeds the paired t-test calls different at 0.05, the observed
false-positive rate with its exact 95% interval beside the nominal 5%. Seeds: `--seeds 5` is
seeds 0..4, `--seeds 3,7,11` those, each checked against the config before anything trains;
config.seed fixes the initialisation, the data order and dropout, so every arm at seed S sees
the same batches: the differences are paired. Every run is scored on one fixed eval set: at
least --eval_tokens val tokens a pass (default 8192), drawn with one key (config.eval_seed 0)
whatever the seed.

A sweep's winner (--from_sweep): its best trial's config (arm sweep_best) against --baseline
CONFIG (arm baseline), both with the sweep's own fixed settings (its --set), on seeds none of
its trials used (`--seeds 5`: the five smallest such; a list naming a tuned seed is refused),
and both at the winner's tuned seed too: the report gives the paired selection optimism (the
fresh seeds' mean paired difference minus the tuned seed's) with its interval, and whether the
tuned seed's difference lies in the 95% prediction interval of one fresh seed's.

Each arm at each seed is an ordinary run directory, OUT/ARM/seed-S/ (config.py, metrics.jsonl,
checkpoints: `minigpt-jax sample --workdir` reads it), trained one after another in this process
or, with --workers K, in K `minigpt-jax train` processes at once. OUT/compare.json records the
comparison (the config, --set, the arms, the baseline, the seeds, the eval set) and the code
version: the same command run again resumes it, training only the runs that have not ended (a
stopped one from its checkpoint); more --seeds or more --arm grow it (the new runs train, the
others are read); any other command, or other code, is refused, naming what differs. A run that
fails or diverges is recorded as such, shown in the verdicts and the tables, and left out of the
pairs; delete its compare_end.json to run it again. A run that fails for want of something
outside it (a full disk, an input path not there yet) is not recorded: the next command runs it
again. An ended run whose metrics.jsonl was cut or edited since (its end's sha256) trains again;
a lost or unreadable compare.json is rebuilt when every run folder in OUT is this command's.

Written into OUT, one set per metric: report-METRIC.md (the command, versions, commit, machine,
date and eval set; a verdict per arm; a compact table arm | Δ (CI) | % of baseline | d_z | p_adj
| n; the arms' means, intervals and seed std), results-METRIC.csv (one row per arm and seed) and
figure-METRIC.png (skipped with a note without matplotlib). With m arms against the baseline each
is judged at alpha 0.05/m: its paired t-test's p times m (Bonferroni) beside its simultaneous
1 - 0.05/m interval, so the verdict never contradicts the interval. When not significant: the
minimum detectable effect at the seeds run; with --sesoi X, the paired TOST verdict "equivalent
within ±X" or "not shown equivalent" with its 1 - 2α interval, and the seeds that would detect
X. time_to_target (training seconds to the first evaluation at or below --target, start-up,
compilation and evaluation left out): a run that never reaches it is censored at its training
time; "reached within budget k/n" per arm, a paired sign test (it decides) and a log-rank test
over the runs beside it; an arm that reaches the target less often is never called faster.
--metric is not part of the comparison: a rerun with another reads the same runs again into its
own files.
Exit status 0 once every run has ended well (a diverged run counts: it is a result), 1 when a
signal stopped the comparison (rerun to resume it), 2 for a refused command, 3 when a planned
run failed or did not end (a killed worker) unless --allow_partial.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from pathlib import Path

from minigpt_apps.command_line import OneLineParser, lock_out
from minigpt_apps.compare import plan as plans
from minigpt_apps.compare import recovery, report
from minigpt_apps.compare.record import has_ended, read_record
from minigpt_apps.compare.runs import CompareStop, run_children, run_here
from minigpt_jax.runtime.locks import LockHeld
from minigpt_jax.runtime.signals import record_signals_while_starting

PROG = "minigpt-jax compare"
DEFAULT_EVAL_TOKENS = 8192
HELP = "train arms of a config over paired seeds; is the difference real?"


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(PROG, __doc__, plans.CompareError)
    add = parser.add_argument
    add("--config", default=None, help="the base config file[:arg], e.g. configs/tiny.py")
    add("--out", required=True, help="the comparison's folder: ARM/seed-S/, report-METRIC.md, ...")
    add(
        "--arm",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE[,KEY=VALUE]",
        help="an arm: the base config with these values (repeat)",
    )
    add(
        "--baseline",
        default=None,
        metavar="NAME",
        help="the --arm the others are compared with (default: the config unchanged); with "
        "--from_sweep, the baseline's config file[:arg]",
    )
    add(
        "--from_sweep",
        default=None,
        metavar="SWEEP_OUT",
        help="recheck a sweep's best trial (arm sweep_best) against --baseline CONFIG on seeds "
        "the sweep did not tune on",
    )
    add("--study", default=None, help="with --from_sweep: the study, when SWEEP_OUT holds several")
    add("--seeds", required=True, help="a count (5: seeds 0..4) or a list (0,1,2); at least 2")
    add("--set", action="append", default=[], metavar="KEY=VALUE", help="for every arm")
    add("--workers", type=int, default=1, help="runs trained at once, each in its own process")
    add(
        "--gpus_per_worker",
        type=int,
        default=0,
        help="give each worker its own N GPUs (CUDA_VISIBLE_DEVICES); 0: runs share them all",
    )
    add(
        "--metric",
        default=None,
        choices=plans.METRICS,
        help="the value compared (default: final_val_loss; with --from_sweep, the sweep's "
        "objective)",
    )
    add(
        "--target",
        type=float,
        default=None,
        help="the val loss time_to_target times (training seconds to the first evaluation at "
        "or below it)",
    )
    add(
        "--sesoi",
        type=float,
        default=None,
        metavar="X",
        help="the smallest effect of interest, in the metric's units: equivalence within ±X "
        "(paired TOST) and the seeds that would detect X",
    )
    add(
        "--eval_tokens",
        type=int,
        default=DEFAULT_EVAL_TOKENS,
        metavar="N",
        help="score every run on at least N val tokens a pass, drawn once with one key "
        f"whatever the seed (default {DEFAULT_EVAL_TOKENS}; a config that evaluates more keeps "
        "its size)",
    )
    add("--aa", action="store_true", help="A/A: the config against itself on disjoint seeds")
    add(
        "--allow_partial",
        action="store_true",
        help="exit 0 with a report even when a planned run did not end well (failed, not run)",
    )
    return parser


def _config_flags_as_sets(argv: list[str]) -> list[str]:
    """`--config.key=value` (the train command's way) as `--set key=value`, and a value that
    starts with "-" joined to its flag (`--seeds -1,2`: argparse would read it as a flag)."""
    joined, index = [], 0
    while index < len(argv):
        arg = argv[index]
        if arg.startswith("--config."):
            arg = f"--set={arg.removeprefix('--config.')}"
        elif arg in _VALUED and index + 1 < len(argv) and argv[index + 1][:1] == "-":
            following = argv[index + 1]
            if following[1:2].isdigit() or following[1:2] == ".":
                arg, index = f"{arg}={following}", index + 1
        joined.append(arg)
        index += 1
    return joined


_VALUED = ("--seeds", "--target", "--sesoi", "--eval_tokens", "--workers", "--gpus_per_worker")


def check(argv: list[str]) -> tuple[plans.Comparison, argparse.Namespace]:
    """Parses and checks the command; raises CompareError with one line, before any write."""
    args = _parser().parse_args(_config_flags_as_sets(argv))
    if args.workers < 1:
        raise plans.CompareError(f"--workers {args.workers} must be at least 1.")
    if args.gpus_per_worker < 0:
        raise plans.CompareError("--gpus_per_worker must be 0 (share) or a number of GPUs.")
    if args.sesoi is not None and not args.sesoi > 0:
        raise plans.CompareError(
            f"--sesoi {args.sesoi} must be a positive difference in the metric's units, e.g. "
            "--sesoi 0.02."
        )
    if args.eval_tokens < 0:
        raise plans.CompareError("--eval_tokens must be 0 (the config's own) or a count.")
    if args.from_sweep is None:
        if args.config is None:
            raise plans.CompareError(
                "give --config FILE (the arms' base config), or --from_sweep SWEEP_OUT."
            )
        if args.study is not None:
            raise plans.CompareError("--study goes with --from_sweep; drop it.")
        comparison = plans.plan(
            args.config,
            Path(args.out),
            args.set,
            args.arm,
            args.baseline,
            args.seeds,
            aa=args.aa,
            eval_tokens=args.eval_tokens,
        )
    else:
        if args.config is not None or args.arm or args.aa:
            raise plans.CompareError(
                "--from_sweep compares the sweep's best trial with --baseline CONFIG; drop "
                "--config and --arm (or compare them without --from_sweep)."
            )
        if args.baseline is None:
            raise plans.CompareError(
                "--from_sweep needs --baseline CONFIG: the config the winner is checked against."
            )
        comparison = plans.plan_from_sweep(
            Path(args.from_sweep),
            args.study,
            args.baseline,
            Path(args.out),
            args.set,
            args.seeds,
            args.eval_tokens,
        )
    sweep_metric, sweep_target = None, None  # the sweep's objective, as a metric
    if comparison.sweep_value is not None:
        objective = comparison.sweep_value[0]
        if objective.startswith("training seconds to val loss "):
            sweep_metric, sweep_target = "time_to_target", float(objective.rsplit(" ", 1)[1])
        else:
            sweep_metric = "best_val_loss"
    if args.metric is None:
        args.metric = sweep_metric or "final_val_loss"
        if args.target is None:
            args.target = sweep_target
    if args.metric == "time_to_target" and args.target is None:
        raise plans.CompareError("--metric time_to_target needs --target LOSS (the val loss).")
    if args.target is not None and args.metric != "time_to_target":
        raise plans.CompareError("--target goes with --metric time_to_target; drop one.")
    if args.target is not None and not 0 < args.target < math.inf:
        raise plans.CompareError(
            f"--target {args.target} must be a positive finite val loss (in nats) the runs can "
            "reach, e.g. --target 3.5."
        )
    if args.metric != sweep_metric:
        comparison.sweep_value = None  # not the same measure: nothing to set beside it
    if args.sesoi is not None and args.metric == "time_to_target":
        raise plans.CompareError(
            "--sesoi goes with a loss metric (time_to_target uses censored rank tests); drop it."
        )
    return comparison, args


def _warnings(comparison: plans.Comparison, metric: str) -> list[str]:
    """Lines that warn of arms scored unlike the baseline."""
    lines = []
    if len(set(comparison.eval_tokens.values())) > 1:
        sizes = ", ".join(f"{k} {v:,}" for k, v in comparison.eval_tokens.items())
        lines.append(f"warning: the arms are scored on eval sets of different sizes ({sizes}).")
    if metric == "best_val_loss" and len(set(comparison.eval_every.values())) > 1:
        every = ", ".join(f"{k} {v}" for k, v in comparison.eval_every.items())
        lines.append(
            f"warning: the arms evaluate at different cadences (eval_every: {every}); the best "
            "val loss favours the arm that evaluates more often."
        )
    return lines


def _head(comparison: plans.Comparison, argv, code, warnings: list[str]) -> list[str]:
    """report.md's first lines: how it was made, the eval set, the warnings."""
    sizes = sorted(set(comparison.eval_tokens.values()))
    eval_words = (
        f"- eval set: {' / '.join(f'{n:,}' for n in sizes)} val tokens a pass, drawn once with "
        "one key for every arm and seed (--eval_tokens)"
    )
    grown = []
    for earlier in plans.earlier_commands(comparison):
        identity = earlier["identity"]
        grown.append(
            f"- grown from `{shlex.join(earlier['command'])}` (seeds {identity['seeds']}, arms "
            f"{', '.join(identity['arms'])}); every arm is now judged against "
            f"{len(comparison.arms) - 1} comparisons"
        )
    command = ["minigpt-jax", "compare", *argv]
    return [*report.provenance_lines(command, code), eval_words, *grown, "", *warnings, ""]


def main(argv: list[str]) -> int:
    """`minigpt-jax compare ARGS`: the exit status (an error is one line on stderr)."""
    wall_start = time.perf_counter()
    try:
        comparison, args = check(argv)
        code = plans.code_version()
        recovery.check_run_folders(comparison)
        lost = recovery.lost_identity(comparison)  # compare.json, rebuilt from the runs
        state = "new" if lost else plans.check_out(comparison, code)
        try:
            comparison.out.mkdir(parents=True, exist_ok=True)
            lock = lock_out(comparison.out / plans.LOCK_FILE, "compare")
        except OSError as error:
            raise plans.CompareError(
                f"--out {comparison.out} cannot be written ({error.strerror or error}); give a "
                "folder you can write to."
            ) from None
    except (plans.CompareError, LockHeld) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    record_signals_while_starting()  # until CompareStop takes them (or a run's own stop)
    try:
        return _compare(comparison, args, argv, code, state, lost, lock, wall_start)
    except OSError as error:  # a full disk, a folder made read-only: the runs ended are kept
        where = f" ({error.filename})" if error.filename else ""
        print(
            f"{PROG}: error: {error.strerror or error}{where}; fix it (free some space, make "
            "--out writable), then rerun the same command: the runs that ended are kept and "
            "the others run again or resume.",
            file=sys.stderr,
            flush=True,
        )
        return 3


def _compare(comparison, args, argv, code, state: str, lost: str | None, lock, wall_start) -> int:
    """The checked command, OUT locked: its runs trained or read, the report written."""

    def say(line: str) -> None:
        print(line, flush=True)

    identity = comparison.out / plans.IDENTITY_FILE
    if lost == "unreadable":  # kept aside, for whoever wants to see it
        identity.replace(identity.with_name(identity.name + ".unreadable"))
    if state != "resume":
        plans.write_identity(comparison, ["minigpt-jax", "compare", *argv], code)
    if lost:
        say(
            f"{identity} was {lost}: rebuilt from this command and the run folders in "
            f"{comparison.out}, each this command's config.py (the code version they trained "
            "with is not known: the current one is recorded)"
        )
    recovery.retrain_damaged(comparison, say)
    runs = comparison.runs()
    todo = [(arm, seed) for arm, seed in runs if not has_ended(comparison.run_dir(arm, seed))]
    grown = " (grown: the new seeds and arms train, the others are read)" * (state == "grow")
    print(
        f"compare: {len(comparison.arms)} arms × {len(comparison.seeds)} seeds = {len(runs)} "
        f"runs in {comparison.out}: {len(todo)} to run, {len(runs) - len(todo)} already "
        f"ended{grown}",
        flush=True,
    )
    with CompareStop() as stop:
        if args.workers == 1:
            run_here(comparison, todo, stop, say)
        else:
            run_children(comparison, todo, args.workers, args.gpus_per_worker, stop, say)
    records = {
        (arm.name, seed): read_record(
            comparison.run_dir(arm, seed),
            arm.name,
            seed,
            comparison.tokens_per_step[arm.name],
            args.target,
        )
        for arm, seed in runs
    }
    warnings = _warnings(comparison, args.metric)
    for line in warnings:
        print(line, flush=True)
    lines = report.write(
        comparison.out,
        [(arm.name, arm.described()) for arm in comparison.arms],
        [r for (_, seed), r in records.items() if seed in comparison.seeds],
        comparison.seeds,
        args.metric,
        {(arm.name, seed): str(comparison.run_dir(arm, seed)) for arm, seed in runs},
        comparison.notes,
        None if comparison.sweep_value is None else comparison.sweep_value[1],
        target=args.target,
        sesoi=args.sesoi,
        head=_head(comparison, argv, code, warnings),
        tuned=[r for (_, seed), r in records.items() if seed in comparison.tuned_seeds],
        aa=args.aa,
    )
    for line in lines:
        print(line, flush=True)
    os.close(lock)
    print(f"wall time {time.perf_counter() - wall_start:.1f} s", flush=True)
    if stop.requested():
        missing = sum(r.status == "not run" for r in records.values())
        print(
            f"stopped by {stop.signal_name}: {missing} runs have not ended (a stopped one kept "
            "its checkpoint); rerun the same command to resume the comparison.",
            flush=True,
        )
        return 1
    unfinished = [r for r in records.values() if r.status in ("failed", "not run")]
    if unfinished and not args.allow_partial:
        named = ", ".join(f"{r.arm} seed {r.seed} {r.status}" for r in unfinished[:5])
        more = f" and {len(unfinished) - 5} more" if len(unfinished) > 5 else ""
        print(
            f"incomplete: {len(unfinished)} of {len(records)} planned runs did not end well "
            f"({named}{more}); the report covers the others. Rerun the same command to run "
            "them again (delete a failed run's compare_end.json first), or pass --allow_partial "
            "to accept a partial comparison.",
            file=sys.stderr,
            flush=True,
        )
        return 3
    return 0
