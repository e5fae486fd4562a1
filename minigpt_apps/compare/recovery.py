"""What a comparison's folder may have lost or had damaged since its runs trained, checked before
any run starts: a run folder replaced by a file (refused, one line), an ok run whose
metrics.jsonl no longer matches its end's digest (trained again, never scored), and a lost or
unreadable OUT/compare.json (rebuilt from the runs' own config.py files when they are this
command's runs)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable

from minigpt_apps.compare import plan as plans
from minigpt_apps.compare.record import damage
from minigpt_apps.compare.runs import config_text

Say = Callable[[str], None]


def check_run_folders(comparison: plans.Comparison) -> None:
    """Raises CompareError (one line) when the place of a planned run is not a folder."""
    for arm, seed in comparison.runs():
        for path in (comparison.run_dir(arm, seed).parent, comparison.run_dir(arm, seed)):
            if path.exists() and not path.is_dir():
                raise plans.CompareError(
                    f"{path} is a file where the run {arm.name} seed {seed} keeps its folder; "
                    "move it aside (the run then trains again), then rerun the same command."
                )


def retrain_damaged(comparison: plans.Comparison, say: Say) -> None:
    """Removes each ended-ok run whose metrics.jsonl was cut or edited since it ended (its
    values would be read wrong), saying so: it trains again from step 0, the same run."""
    for arm, seed in comparison.runs():
        run_dir = comparison.run_dir(arm, seed)
        problem = damage(run_dir)
        if problem is not None:
            say(f"{arm.name} seed {seed}: {problem}: its values are not scored; training it again")
            shutil.rmtree(run_dir)


def lost_identity(comparison: plans.Comparison) -> str | None:
    """When OUT holds run folders but its compare.json is gone or unreadable: what was lost
    ("deleted" or "unreadable"), once every run folder in OUT is one of this command's, with
    the config.py this command writes for it; None when compare.json is there and readable, or
    OUT holds no run. Raises CompareError naming a run folder that is not this command's."""
    out, path = comparison.out, comparison.out / plans.IDENTITY_FILE
    lost = "deleted"
    if path.exists():
        try:
            json.loads(path.read_text())["identity"]
            return None
        except (OSError, ValueError, KeyError, TypeError):
            lost = "unreadable"
    if not out.is_dir():
        return None
    planned = {comparison.run_dir(arm, seed): (arm, seed) for arm, seed in comparison.runs()}
    found = [
        run_dir
        for arm_dir in out.iterdir()
        if arm_dir.is_dir()
        for run_dir in arm_dir.iterdir()
        if run_dir.is_dir() and run_dir.name.startswith("seed-")
    ]
    if not found:
        return None
    for run_dir in found:
        config = run_dir / "config.py"
        if run_dir not in planned or not config.is_file():
            mismatch = "is not one of this command's runs"
        elif config.read_text() != config_text(comparison, *planned[run_dir]):
            mismatch = "holds another config.py than this command writes for it"
        else:
            continue
        raise plans.CompareError(
            f"--out {out} lost its {plans.IDENTITY_FILE} ({lost}) and {run_dir} {mismatch}: "
            "rerun the command that made the comparison (its runs' config.py say how they were "
            "set) to rebuild it from its runs, or give another --out."
        )
    return lost
