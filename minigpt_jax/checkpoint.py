"""Orbax checkpoints: the latest few train states for resuming, and the best params by val loss.

Layout under a run's workdir:
  checkpoints/<step>/{state,meta}   latest `keep` train states (resume from the newest)
  best/<step>/{params,meta}         params of the lowest val loss so far (for sampling)
Saves are synchronous and atomic (orbax writes a temporary directory, then renames it), so a run
killed at any moment leaves only complete checkpoints behind.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

# Orbax logs every save at INFO; the training loop reports what matters.
logging.getLogger("absl").setLevel(logging.WARNING)

LATEST_DIR = "checkpoints"
BEST_DIR = "best"


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be read, or does not fit this run."""


def _manager(directory: Path, keep: int, items: tuple[str, ...], read_only=False):
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        enable_async_checkpointing=False,
        # read_only=True would make orbax log warnings on every load; not creating or cleaning
        # anything is enough to leave a run untouched.
        create=not read_only,
        cleanup_tmp_directories=not read_only,
    )
    return ocp.CheckpointManager(directory, options=options, item_names=items)


class Checkpointer:
    """Saves and restores a run's checkpoints under `workdir`."""

    def __init__(self, workdir: str | Path, keep: int = 3):
        self.workdir = Path(workdir).resolve()
        self._latest = _manager(self.workdir / LATEST_DIR, keep, ("state", "meta"))
        self._best = _manager(self.workdir / BEST_DIR, 1, ("params", "meta"))

    def latest_step(self) -> int | None:
        return self._latest.latest_step()

    def save(self, state: Any, meta: dict) -> None:
        """Saves the train state (a pytree with a `step`) and JSON metadata."""
        step = int(state.step)
        self._latest.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )

    def save_best(self, step: int, params: Any, meta: dict) -> None:
        self._best.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )

    def restore(self, target_state: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restores (state, meta) at `step` (default: latest) into the structure of target_state."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.workdir / LATEST_DIR}.")
        restored = _restore(
            self._latest,
            step,
            ocp.args.Composite(
                state=ocp.args.StandardRestore(target_state), meta=ocp.args.JsonRestore()
            ),
        )
        return restored.state, restored.meta

    def close(self) -> None:
        self._latest.close()
        self._best.close()


def _restore(manager, step: int, args) -> Any:
    step_dir = Path(manager.directory) / str(step)
    try:
        return manager.restore(step, args=args)
    except Exception as error:  # orbax/tensorstore raise many types for damaged files
        others = [s for s in manager.all_steps() if s != step]
        raise CheckpointError(
            f"checkpoint {step_dir} cannot be read ({type(error).__name__}: "
            f"{str(error).splitlines()[0][:200] if str(error) else 'no detail'}). It is damaged "
            f"or was written by a different model/config. "
            + (
                f"Delete {step_dir} to resume from step {max(others)}, "
                if others
                else "Delete it, "
            )
            + "or train in a fresh --workdir."
        ) from error


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


def load_params(workdir: str | Path, which: str = "latest") -> tuple[Any, dict]:
    """(params, meta) of a run for inference: `which` is 'latest' or 'best'.

    meta holds the run's 'gpt_config' (GPTConfig fields) and 'config' (the experiment config).
    """
    if which not in ("latest", "best"):
        raise ValueError(f"which={which!r}: choose 'latest' or 'best'.")
    directory = Path(workdir).resolve() / (LATEST_DIR if which == "latest" else BEST_DIR)
    if not directory.is_dir():
        raise CheckpointError(
            f"no checkpoints in {directory}: train first with "
            f"`minigpt-jax train --config configs/X.py --workdir {workdir}`."
        )
    item = "state" if which == "latest" else "params"
    manager = _manager(directory, 1, (item, "meta"), read_only=True)
    step = manager.latest_step()
    if step is None:
        raise CheckpointError(f"no complete checkpoint in {directory}.")
    restored = _restore(
        manager,
        step,
        ocp.args.Composite(
            **{
                item: ocp.args.StandardRestore(_on_one_device(manager, step, item)),
                "meta": ocp.args.JsonRestore(),
            }
        ),
    )
    manager.close()
    params = restored[item]["params"] if which == "latest" else restored[item]
    return params, restored["meta"]
