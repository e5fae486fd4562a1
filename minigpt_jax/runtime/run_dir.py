"""Every path of a run directory (`--workdir`), named once.

  run.lock                 one trainer at a time (run.<i>.lock: process i > 0 of a multi-host run)
  tokenizer.json           the run's tokenizer (a shards directory holds one of the same name)
  tokens.npy               data.format "memory": the encoded corpus, and beside it
  tokens.npy.fingerprint   what it was encoded from, and its sha256
  shards/                  data.format "shards": the default data.shards_dir
  metrics.jsonl            one JSON line per logged step
  tensorboard/             TensorBoard event files
  checkpoints/<step>/      the latest train states (resume from the newest)
  best/<step>/             the params of the lowest val loss so far

The names never change: a run directory written by an older minigpt-jax still resumes. A leaf
module: it imports nothing of the package.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

LOCK_FILENAME = "run.lock"
TOKENIZER_FILENAME = "tokenizer.json"
TOKENS_FILENAME = "tokens.npy"
FINGERPRINT_SUFFIX = ".fingerprint"
SHARDS_DIRNAME = "shards"
METRICS_FILENAME = "metrics.jsonl"
TENSORBOARD_DIRNAME = "tensorboard"
LATEST_DIRNAME = "checkpoints"
BEST_DIRNAME = "best"
CHECKPOINT_DIRNAMES = {"latest": LATEST_DIRNAME, "best": BEST_DIRNAME}


def fingerprint_path(cache_path: str | os.PathLike) -> Path:
    """The sidecar that says what a token cache was encoded from: `<cache_path>.fingerprint`."""
    cache_path = Path(cache_path)
    return cache_path.with_name(cache_path.name + FINGERPRINT_SUFFIX)


@dataclass(frozen=True)
class RunDir:
    """The paths of the run directory `root` (nothing is created or read)."""

    root: Path  # given as a str or a Path; kept as a Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    def lock(self, process_index: int = 0) -> Path:
        """The lock file of process `process_index`."""
        if process_index == 0:
            return self.root / LOCK_FILENAME
        return self.root / f"run.{process_index}.lock"

    @property
    def tokenizer(self) -> Path:
        return self.root / TOKENIZER_FILENAME

    @property
    def tokens(self) -> Path:
        return self.root / TOKENS_FILENAME

    @property
    def tokens_fingerprint(self) -> Path:
        return fingerprint_path(self.tokens)

    @property
    def shards(self) -> Path:
        """Where a shards run prepares its shards unless data.shards_dir names a folder."""
        return self.root / SHARDS_DIRNAME

    @property
    def metrics(self) -> Path:
        return self.root / METRICS_FILENAME

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD_DIRNAME

    @property
    def checkpoints(self) -> Path:
        return self.root / LATEST_DIRNAME

    @property
    def best(self) -> Path:
        return self.root / BEST_DIRNAME

    def checkpoint_dir(self, which: str) -> Path:
        """checkpoints/ for `which` 'latest', best/ for 'best'."""
        if which not in CHECKPOINT_DIRNAMES:
            raise ValueError(f"which={which!r}: choose one of {list(CHECKPOINT_DIRNAMES)}.")
        return self.root / CHECKPOINT_DIRNAMES[which]

    def has_checkpoints(self) -> bool:
        """Whether the directory looks like a run's: it has checkpoints/ or best/."""
        return self.checkpoints.is_dir() or self.best.is_dir()


def entries_of(folder: Path) -> set[str]:
    """The names in `folder`, and "." if it exists (an empty set if it does not): what
    `remove_created` keeps."""
    if not folder.exists():
        return set()
    return {path.name for path in folder.iterdir()} | {"."}


def remove_created(folder: Path, before: set[str]) -> None:
    """Removes what a failed or refused command created in `folder` since `before`
    (`entries_of`): the folder itself if it did not exist."""
    if not folder.exists():
        return
    created = (
        [folder]
        if "." not in before
        else [path for path in folder.iterdir() if path.name not in before]
    )
    for path in created:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
