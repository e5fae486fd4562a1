"""One trainer per run directory: an OS file lock (minigpt_jax.locks) on WORKDIR/run.lock,
released by the OS when its process ends in any way (kill -9 included), so it is never stale."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from minigpt_jax.locks import LockHeld, lock_file, write_holder
from minigpt_jax.run_dir import RunDir


class RunDirectoryInUse(LockHeld):
    """Another live process holds the run directory's lock."""


class RunLock:
    """Context manager holding an exclusive flock on `workdir/run.lock`.

    The holder writes "pid host" into the file, so a second trainer can say who holds it. In a
    multi-host run each process locks its own file (`run.<i>.lock` for process i > 0).

    create=False (a run whose config is still being checked): an existing lock file is locked
    at once, but nothing is created or written until `create()`, so a refused config leaves the
    directory as it was.
    """

    def __init__(self, workdir: str | Path, process_index: int = 0, *, create: bool = True):
        self.path = RunDir(workdir).lock(process_index)
        self._create_at_enter = create
        self._fd: int | None = None
        self._written = False

    def __enter__(self) -> RunLock:
        if self._create_at_enter:
            self.create()
        else:
            try:
                fd = os.open(self.path, os.O_RDWR)
            except (FileNotFoundError, NotADirectoryError):
                return self  # nobody has locked it yet; create() will
            self._lock(fd)
        return self

    def create(self) -> None:
        """Creates the directory and the lock file if needed, holds the lock and writes the
        holder's name (idempotent)."""
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644))
        if not self._written:
            write_holder(self._fd)
            self._written = True

    def _lock(self, fd: int) -> None:
        try:
            lock_file(
                fd,
                lambda pid, host: (
                    f"{self.path.parent} is in use by another trainer (PID {pid} on host {host}, "
                    f"holding {self.path}); wait for it to finish, stop it, or use another "
                    "--workdir."
                ),
            )
        except LockHeld as held:
            raise RunDirectoryInUse(str(held)) from None
        self._fd = fd

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor releases the lock
            self._fd = None


def lock_is_held(workdir: str | Path, process_index: int = 0) -> bool:
    """Whether a live process holds the run lock of `workdir` (creates nothing)."""
    try:
        fd = os.open(RunDir(workdir).lock(process_index), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the shared lock if it was taken
    return False
