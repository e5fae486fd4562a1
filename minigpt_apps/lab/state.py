"""What the lab page's parts share: the table (`LabState`) and its copy in the browser's storage."""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import numpy as np

from minigpt_apps.lab import compute

STORAGE_KEY = "minigpt-jax-lab-table"


class LabState(NamedTuple):
    """What the parts share: the table, the word of each id, the steps taken and their record.

    `history` holds (steps taken, p(target), loss) after each step; `last_run` the figures before
    the last run of steps while the table is still what that run left (None after any other
    change)."""

    table_VxD: np.ndarray
    vocab: tuple[str, ...]
    steps: int = 0
    history: tuple[tuple[int, float, float], ...] = ()
    last_run: dict | None = None


def initial_state() -> LabState:
    return LabState(compute.TABLE_VxD.copy(), compute.VOCAB, 0)


def table_key(state: LabState) -> str:
    """A short fingerprint of the table and its vocabulary: every view carries the one it used."""
    digest = hashlib.sha1(np.ascontiguousarray(state.table_VxD, np.float32).tobytes())
    digest.update("|".join(state.vocab).encode())
    return digest.hexdigest()[:12]


def to_storage(state: LabState) -> dict:
    """The state as JSON for the browser's storage (float32 values round-trip exactly)."""
    return {
        "table": np.asarray(state.table_VxD, np.float32).tolist(),
        "vocab": list(state.vocab),
        "steps": state.steps,
        "history": [list(point) for point in state.history],
    }


def from_storage(stored: Any) -> LabState | None:
    """The state stored by `to_storage`, or None when it is missing or not a valid lab table."""
    try:
        table_VxD = np.asarray(stored["table"], np.float32)
        vocab = tuple(stored["vocab"])
        steps = int(stored["steps"])
        history = tuple((int(s), float(p), float(loss)) for s, p, loss in stored["history"])
    except (KeyError, TypeError, ValueError):
        return None
    if (
        table_VxD.shape != compute.TABLE_VxD.shape
        or not np.isfinite(table_VxD).all()
        or sorted(vocab) != sorted(compute.VOCAB)
        or steps < 0
    ):
        return None
    return LabState(table_VxD, vocab, steps, history[-10 * compute.MAX_STEPS :])
