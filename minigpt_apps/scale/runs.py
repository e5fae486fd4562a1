"""Training a study's runs the way compare trains its arms (compare.runs: one process or K
`minigpt-jax train` children, a stopped run resumed from its checkpoint, an ended one never
trained again); each grid point is an ordinary run directory, OUT/runs/NAME/."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from minigpt_apps.compare.plan import Arm, Comparison
from minigpt_apps.compare.record import has_ended, read_record
from minigpt_apps.compare.runs import CompareStop, Say, run_children, run_here
from minigpt_apps.scale.plan import SEED, Point, Study

RUNS = "runs"


class _Grid(Comparison):
    """The study's runs as compare's arms at one seed, in OUT/runs/NAME/."""

    def run_dir(self, arm: Arm, seed: int) -> Path:
        return self.out / RUNS / arm.name

    def run_doc(self, arm: Arm, seed: int) -> str:
        study = f"the scaling study in {self.out} (minigpt-jax scale)"
        return f"Run {arm.name} of {study}: {arm.about}."


def _arm(study: Study, point: Point) -> Arm:
    about = (
        f"{point.shape.name}, N = {point.params:,} weights, {point.tokens:,} tokens in "
        f"{point.num_steps} steps, {point.flops:.3g} FLOPs (budget {point.budget:.3g})"
    )
    return Arm(point.name, study.values(point), study.config_spec, about=about)


def _grid(study: Study, points: list[Point]) -> _Grid:
    return _Grid(
        config_spec=study.config_spec,
        out=study.out,
        fixed={},
        arms=[_arm(study, p) for p in points],
        seeds=[SEED],
        num_steps=max(p.num_steps for p in points),
        identity=study.identity,
        tokens_per_step={p.name: study.tokens_per_step for p in points},
    )


def run_dir(study: Study, point: Point) -> Path:
    return study.out / RUNS / point.name


def to_train(study: Study, points: list[Point]) -> list[Point]:
    return [p for p in points if not has_ended(run_dir(study, p))]


def train(
    study: Study,
    points: list[Point],
    workers: int,
    gpus_per_worker: int,
    stop: CompareStop,
    say: Say,
) -> None:
    """Trains the `points` not yet ended, in this process or in `workers` children."""
    todo = to_train(study, points)
    if not todo:
        return
    grid = _grid(study, todo)
    jobs = [(arm, SEED) for arm in grid.arms]
    if workers == 1:
        run_here(grid, jobs, stop, say)
    else:
        run_children(grid, jobs, workers, gpus_per_worker, stop, say)


@dataclasses.dataclass(frozen=True)
class Result:
    """A run's point and how it ended: status ok with its final val loss, or why not."""

    point: Point
    status: str  # ok, diverged, failed, not run (compare.record's)
    loss: float | None
    error: str


def result(study: Study, point: Point) -> Result:
    record = read_record(run_dir(study, point), point.name, SEED)
    return Result(point, record.status, record.final_val_loss, record.error)
