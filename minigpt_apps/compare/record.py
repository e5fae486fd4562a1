"""A comparison's run as its record: how it ended (written into its run directory when it ends,
so a rerun skips it) and what its metrics.jsonl holds (its evaluations, final and best val
loss). A run not yet ended (never started, stopped by a signal, its worker killed) has no end
and is run, or resumed from its checkpoint, by the next command."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from minigpt_apps.sweep.trial import result_of
from minigpt_jax.runtime.digests import sha256_file
from minigpt_jax.runtime.run_dir import RunDir

END_FILE = "compare_end.json"  # in the run directory: {"status": ..., "error": ...}
STATUSES = ("ok", "diverged", "failed", "not run")


@dataclasses.dataclass
class RunRecord:
    """One arm at one seed. status: ok (trained to its end: its values count), diverged (a
    non-finite loss), failed (an error of the run), or not run (no end recorded yet)."""

    arm: str
    seed: int
    status: str
    evals: list[tuple[int, float]]  # (step, val loss) of every evaluation recorded
    last_step: int = 0
    error: str = ""
    seconds_to_target: float | None = None  # training seconds to the first val <= --target
    train_seconds: float = 0.0  # all its training seconds (a censored time_to_target's)

    @property
    def final_val_loss(self) -> float | None:
        return self.evals[-1][1] if self.status == "ok" else None

    @property
    def best_val_loss(self) -> float | None:
        return min(v for _, v in self.evals) if self.status == "ok" else None

    @property
    def time_to_target(self) -> float | None:
        return self.seconds_to_target if self.status == "ok" else None

    def value(self, metric: str) -> float | None:
        """The run's value of `metric` (final_val_loss, best_val_loss or time_to_target);
        None unless ok (and, for time_to_target, unless the run reached the target)."""
        return getattr(self, metric)


def write_end(run_dir: Path, status: str, error: str = "") -> None:
    """Records how the run in `run_dir` ended (atomically: a rerun sees it whole or not); an
    ok run's end holds the sha256 of its metrics.jsonl, which `damage` checks before it is
    scored."""
    end = {"status": status, "error": error}
    metrics = RunDir(run_dir).metrics
    if status == "ok" and metrics.is_file():
        end["metrics_sha256"] = sha256_file(metrics)
    path = run_dir / END_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    tmp.write_text(json.dumps(end) + "\n")
    os.replace(tmp, path)


def read_end(run_dir: Path) -> dict | None:
    """The end record of the run in `run_dir`; None when it has none, or one that is not a
    record (overwritten or damaged: the run is then run again, or resumed, as one not ended)."""
    try:
        end = json.loads((run_dir / END_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(end, dict) and end.get("status") in STATUSES[:3]):
        return None
    return end


def has_ended(run_dir: Path) -> bool:
    return read_end(run_dir) is not None


def damage(run_dir: Path) -> str | None:
    """What is wrong with an ok run's metrics.jsonl (cut, edited or gone since the run ended:
    it no longer matches the sha256 its end recorded), or None. Ends written before the digest
    was recorded are taken as they are."""
    end = read_end(run_dir)
    if end is None or end["status"] != "ok" or "metrics_sha256" not in end:
        return None
    metrics = RunDir(run_dir).metrics
    if not metrics.is_file():
        return f"its {metrics.name} is gone"
    if sha256_file(metrics) != end["metrics_sha256"]:
        return (
            f"its {metrics.name} no longer matches the sha256 recorded when it ended (cut or "
            "edited)"
        )
    return None


def read_record(
    run_dir: Path, arm: str, seed: int, tokens_per_step: int = 1, target: float | None = None
) -> RunRecord:
    """The record of the run in `run_dir` (an ok run with no evaluation counts as failed);
    with a `target`, the training seconds to it (sweep.trial.result_of's account: each step's
    share of its chunk's time, start-up, compilation and evaluation left out)."""
    exists = RunDir(run_dir).metrics.exists()
    result = result_of(run_dir, tokens_per_step, target) if exists else None
    evals = result.evals if result else []
    last_step = result.last_step if result else 0
    end = read_end(run_dir)
    if end is None:
        return RunRecord(arm, seed, "not run", evals, last_step)
    status, error = end["status"], str(end.get("error", ""))
    if status == "ok" and not evals:
        status, error = "failed", "the run recorded no val loss"
    seconds = result.seconds_to_target if result else None
    total = result.train_seconds if result else 0.0
    return RunRecord(arm, seed, status, evals, last_step, error, seconds, total)
