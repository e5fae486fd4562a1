"""Exclusive OS file locks that name their holder, released by the OS when the holding process
ends in any way (kill -9 included), so a lock is never stale. The run lock (train/run_lock.py)
and the prepare lock of a shards directory (data/shards.py) are both built on them. A leaf
module: it imports nothing of the package."""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Callable


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
