"""One trainer per run directory: an OS file lock on WORKDIR/run.lock, released by the OS when
its process ends in any way (kill -9 included), so a lock is never stale."""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from minigpt_jax.run_dir import RunDir


class RunDirectoryInUse(RuntimeError):
    """Another live process holds the run directory's lock."""


class RunLock:
    """Context manager holding an exclusive flock on `workdir/run.lock` (created if needed).

    The holder writes "pid host" into the file, so a second trainer can say who holds it. In a
    multi-host run each process locks its own file (`run.<i>.lock` for process i > 0).
    """

    def __init__(self, workdir: str | Path, process_index: int = 0):
        self.path = RunDir(workdir).lock(process_index)
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode(errors="replace").split()
            os.close(fd)
            pid, host = (holder + ["?", "?"])[:2]
            raise RunDirectoryInUse(
                f"{self.path.parent} is in use by another trainer (PID {pid} on host {host}, "
                f"holding {self.path}); wait for it to finish, stop it, or use another --workdir."
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor releases the lock
            self._fd = None
