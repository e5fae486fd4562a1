"""`minigpt-jax scale`: an IsoFLOP grid trained from a base config, the scaling laws fitted
with bootstrap intervals, a run k× the largest budget predicted and (--check) trained.

    minigpt-jax scale --config configs/tiny.py --out scales/tiny --budgets 1e12,3e12,1e13 \\
        [--depths 1,2,3,4 --aspect 32 --head_dim 16 | --sizes 2x64,3x96,4x128] \\
        [--base_budget FLOPS] [--schedule cosine|wsd] [--warmup_fraction 0.05] \\
        [--min_steps 20] [--max_steps N] [--set key=value ...] [--workers K] \\
        [--predict 4] [--check] [--bootstrap 1000] [--dry_run]

The grid: for each budget C, every size of the ladder that fits it (min_steps ≤ steps ≤
max_steps), trained on D = C / FLOPs-per-token tokens with its own schedule as long as those
tokens; sizes are --depths L with width D = aspect·L in whole heads of --head_dim (defaults:
the base config's D/L and D/H), or --sizes LxD listed. FLOPs are minigpt_jax.flops_per_token
(6N + attention; the tied token table counted, a learned position table not). A budget with
fewer than 3 sizes, or a size in no budget, is refused before anything is written.

Each run is an ordinary run directory, OUT/runs/NAME/, trained one after another here or with
--workers K in K `minigpt-jax train` processes; OUT/scale.json records the study, so the same
command resumes it (a stopped run from its checkpoint, an ended one never again) and another
is refused, naming what differs; the same command with budgets added to --budgets grows the
study (the new budgets' runs train, the ended ones are read). --predict, --check, --bootstrap
and --workers are not part of the study: a rerun with others reads the same runs.

Fits: per budget a parabola in ln N (its vertex N_opt(C), D_opt(C)), then N_opt ∝ C^a and
D_opt ∝ C^b; and L(N, D) = E + A/N^α + B/D^β with a Huber loss on log residuals from many
starts; every parameter and prediction with a 95% percentile-bootstrap interval over runs, or
"not identified" with the reason. At --predict k × the largest budget: N_opt, D_opt and the
loss of the nearest shape (the ladder's or the grid's own); --check trains that run and says
whether its loss falls in the interval. Written into OUT: report.md, results.csv, isoflop.png,
frontier.png, loss_vs_compute.png. --dry_run prints the grid and an estimated time and writes
nothing. Exit status 0 when every run has ended, 1 when a signal stopped the study (rerun to resume
it) or when --check trained no run (the prediction not identified), 2 for a refused command.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from minigpt_apps.command_line import OneLineParser, lock_out
from minigpt_apps.scale import plan as plans
from minigpt_apps.scale import report, runs
from minigpt_jax.runtime.locks import LockHeld
from minigpt_jax.runtime.signals import record_signals_while_starting

PROG = "minigpt-jax scale"
HELP = "train an IsoFLOP grid, fit scaling laws with intervals, predict and check a larger run"
CHECK_FILE = "check.json"  # the check run's shape, chosen once from the fit
# --dry_run's estimate, besides --gflops: each step's fixed cost and each run's start
# (compiling, reading the corpus) on a 2-core CPU; time one run to replace them.
STEP_S, RUN_S = 0.004, 15.0


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(PROG, __doc__, plans.ScaleError)
    add = parser.add_argument
    add("--config", required=True, help="the base config file[:arg], e.g. configs/tiny.py")
    add("--out", required=True, help="the study's folder: runs/, report.md, results.csv, ...")
    add("--budgets", required=True, help="compute budgets in FLOPs (1e12,3e12) or multiples")
    add("--base_budget", type=float, default=None, help="--budgets are multiples of this")
    add("--depths", default=None, help="the ladder's layer counts (default 1,2,3,4)")
    add("--aspect", type=float, default=None, help="width per layer (default: the config's)")
    add("--head_dim", type=int, default=None, help="head size (default: the config's)")
    add("--sizes", default=None, help="LxD shapes instead of the ladder, e.g. 2x64,3x96")
    add("--schedule", default=None, help="cosine or wsd (default: the config's)")
    add("--warmup_fraction", type=float, default=0.05, help="of each run's steps (default .05)")
    add("--min_steps", type=int, default=20, help="a size fits a budget with this many steps")
    add("--max_steps", type=int, default=None, help="and at most this many (default: no cap)")
    add("--set", action="append", default=[], metavar="KEY=VALUE", help="for every run")
    add("--workers", type=int, default=1, help="runs trained at once, each in its own process")
    add("--gpus_per_worker", type=int, default=0, help="each worker's own N GPUs; 0: share")
    add("--predict", type=float, default=4.0, help="predict at this × the largest budget")
    add("--check", action="store_true", help="train the predicted run and compare")
    add("--bootstrap", type=int, default=1000, help="bootstrap draws for the intervals")
    add("--gflops", type=float, default=20.0, help="--dry_run: assumed GFLOP/s achieved")
    add("--dry_run", action="store_true", help="print the grid and its estimated time only")
    return parser


def _config_flags_as_sets(argv: list[str]) -> list[str]:
    return [
        f"--set={arg.removeprefix('--config.')}" if arg.startswith("--config.") else arg
        for arg in argv
    ]


def check(argv: list[str]) -> tuple[plans.Study, argparse.Namespace]:
    """Parses and checks the command; raises ScaleError with one line, before any write."""
    from minigpt_apps.sweep import space as spaces

    args = _parser().parse_args(_config_flags_as_sets(argv))
    if args.workers < 1:
        raise plans.ScaleError(f"--workers {args.workers} must be at least 1.")
    if args.gpus_per_worker < 0:
        raise plans.ScaleError("--gpus_per_worker must be 0 (share) or a number of GPUs.")
    if not (math.isfinite(args.predict) and args.predict > 0):
        raise plans.ScaleError(f"--predict {args.predict} must be a positive factor.")
    if args.bootstrap < 20:
        raise plans.ScaleError(f"--bootstrap {args.bootstrap}: give 20 draws or more.")
    if args.sizes is not None and (args.depths or args.aspect):
        raise plans.ScaleError("--sizes lists the shapes; drop --depths and --aspect.")
    budgets = plans.parse_budgets(args.budgets, args.base_budget)
    try:
        base = spaces.base_config(args.config)
    except ValueError as error:
        raise plans.ScaleError(str(error)) from None
    head_dim = args.head_dim or base.model.n_embd // base.model.n_head
    if head_dim < 1:
        raise plans.ScaleError(f"--head_dim {head_dim} must be at least 1.")
    args.aspect = args.aspect or base.model.n_embd / base.model.n_layer
    if args.sizes is not None:
        shapes = plans.parse_sizes(args.sizes, head_dim)
    else:
        shapes = plans.ladder(plans.parse_depths(args.depths or "1,2,3,4"), args.aspect, head_dim)
    args.head_dim = head_dim
    study = plans.plan(
        args.config,
        Path(args.out),
        args.set,
        budgets,
        shapes,
        schedule=args.schedule,
        warmup_fraction=args.warmup_fraction,
        min_steps=args.min_steps,
        max_steps=args.max_steps,
    )
    return study, args


def grid_lines(study: plans.Study, gflops: float) -> list[str]:
    """The grid as a table, with the time it is estimated to take."""
    lines = [
        f"{'run':<22} {'N':>10} {'D':>12} {'steps':>7} {'FLOPs':>9} {'est. s':>7}",
    ]
    total = 0.0
    for p in study.points:
        seconds = RUN_S + p.num_steps * STEP_S + p.flops / (gflops * 1e9)
        total += seconds
        lines.append(
            f"{p.name:<22} {p.params:>10,} {p.tokens:>12,} {p.num_steps:>7} {p.flops:>9.3g} "
            f"{seconds:>7.0f}"
        )
    lines.append(
        f"{len(study.points)} runs, {sum(p.flops for p in study.points):.3g} FLOPs: about "
        f"{total / 60:.0f} min one after another (assumed {gflops:g} GFLOP/s, {STEP_S * 1e3:g} "
        f"ms a step, {RUN_S:g} s a run to start; time one run to replace them)"
    )
    lines += [f"left out: {line}" for line in study.dropped]
    return lines


def _check_point(study: plans.Study, findings: report.Findings, args) -> plans.Point | None:
    """The check run: the shape nearest N_opt at the predicted budget, among the ladder's (up to
    4× the deepest trained) and the grid's own (--sizes), chosen once (OUT/check.json) so a
    rerun trains the same run whatever a refit says."""
    if findings.n_opt is None:
        return None
    path = study.out / CHECK_FILE
    key = f"{findings.predict_budget:.6g}"
    chosen = json.loads(path.read_text()) if path.exists() else {}
    if key in chosen:
        shape = plans.Shape(*chosen[key])
    else:
        depths = range(1, 4 * max(p.shape.n_layer for p in study.points) + 1)
        ladder = plans.ladder(list(depths), args.aspect, args.head_dim)
        shapes = list(dict.fromkeys([*ladder, *(p.shape for p in study.points)]))
        target = math.log(findings.n_opt.value)
        shape = min(
            shapes,
            key=lambda s: abs(
                math.log(plans.check_point(study, findings.predict_budget, s).params) - target
            ),
        )
        chosen[key] = [shape.n_layer, shape.n_embd, shape.n_head]
        path.write_text(json.dumps(chosen, indent=1) + "\n")
    return plans.check_point(study, findings.predict_budget, shape)


def main(argv: list[str]) -> int:
    """`minigpt-jax scale ARGS`: the exit status (an error is one line on stderr)."""
    wall_start = time.perf_counter()
    try:
        study, args = check(argv)
        if args.dry_run:
            for line in grid_lines(study, args.gflops):
                print(line, flush=True)
            return 0
        resuming = plans.check_out(study)
        study.out.mkdir(parents=True, exist_ok=True)
        lock = lock_out(study.out / plans.LOCK_FILE, "scale")
    except (plans.ScaleError, LockHeld) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    record_signals_while_starting()
    if not resuming:
        plans.write_identity(study, [PROG, *argv])  # a new study, or one with budgets added
    todo = runs.to_train(study, study.points)
    print(
        f"scale: {len(study.budgets)} budgets, {len(study.points)} runs in {study.out}: "
        f"{len(todo)} to run, {len(study.points) - len(todo)} already ended",
        flush=True,
    )

    def say(line: str) -> None:
        print(line, flush=True)

    with runs.CompareStop() as stop:
        runs.train(study, study.points, args.workers, args.gpus_per_worker, stop, say)
        results = [runs.result(study, p) for p in study.points]
        findings = report.analyse(study, results, args.predict, args.bootstrap)
        findings.check = _check_point(study, findings, args)
        if findings.check is not None and findings.parametric is not None:
            q = findings.check
            findings.check_loss = findings.parametric.loss(q.params, q.tokens)
        if args.check and findings.check is not None and not stop.requested():
            if findings.check.num_steps < 1:
                findings.notes.append("the check run has no whole step; raise --predict")
            else:
                runs.train(study, [findings.check], args.workers, args.gpus_per_worker, stop, say)
                measured = runs.result(study, findings.check)
                findings.measured = measured if measured.status != "not run" else None
    report.write_csv(study.out / "results.csv", findings)
    (study.out / "report.md").write_text(report.markdown(study, findings, [PROG, *argv]))
    skipped = report.write_figures(study.out, findings)
    for line in _summary(findings) + skipped:
        print(line, flush=True)
    os.close(lock)
    print(f"wrote {study.out / 'report.md'}; wall time {time.perf_counter() - wall_start:.1f} s")
    if stop.requested():
        print(
            f"stopped by {stop.signal_name}: rerun the same command to resume the study.",
            flush=True,
        )
        return 1
    if args.check and findings.measured is None:
        print(
            f"{PROG}: error: --check trained no run: the prediction at C = "
            f"{findings.predict_budget:.3g} is not identified (the notes above say why); add "
            "budgets to the same command (it grows the study) until it is.",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


def _summary(findings: report.Findings) -> list[str]:
    lines = []
    if findings.frontier is not None:
        f = findings.frontier
        lines.append(f"N_opt ∝ C^a, a = {f.a.text()}; D_opt ∝ C^b, b = {f.b.text()}")
    if findings.parametric is not None:
        shown = ", ".join(f"{k} {v.text()}" for k, v in findings.parametric.params.items())
        lines.append(f"L(N, D): {shown}")
    lines += [f"note: {note}" for note in findings.notes]
    if findings.n_opt is not None:
        lines.append(
            f"prediction at C = {findings.predict_budget:.3g}: N_opt {findings.n_opt.text()}, "
            f"D_opt {findings.d_opt.text()}"
        )
    if findings.check_loss is not None:
        lines.append(
            f"check run {findings.check.name}: predicted loss {findings.check_loss.text('.4f')}"
        )
    verdict = findings.verdict()
    if verdict:
        lines.append(f"check: {verdict}")
    return lines
