"""Exclusive OS file locks that name their holder, released by the OS when the holding process
ends in any way (kill -9 included), so a lock is never stale: `RunLock`, one trainer per run
directory (WORKDIR/run.lock), and the prepare lock of a shards directory
(data/shards/prepare.py)."""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Callable
from pathlib import Path

from minigpt_jax.runtime.run_dir import RunDir


class LockHeld(RuntimeError):
    """Another live process holds the lock."""


def lock_file(fd: int, refusal: Callable[[str, str], str]) -> None:
    """Takes an exclusive flock on the open file `fd`, or closes it and raises
    LockHeld(refusal(pid, host)) naming the holder that `write_holder` recorded."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 256, 0).decode(errors="replace").split()
        os.close(fd)
        pid, host = (holder + ["?", "?"])[:2]
        raise LockHeld(refusal(pid, host)) from None


def write_holder(fd: int) -> None:
    """Records "pid host" of this process in the locked file `fd`."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)


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
