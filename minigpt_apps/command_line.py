"""What the apps' commands share at their edge: a flag parser whose errors are one line, and the
lock that lets one command at a time work on an OUT folder."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from minigpt_jax.runtime.locks import lock_file, write_holder


class OneLineParser(argparse.ArgumentParser):
    """The command's flags, its module docstring as their help (the first paragraph the summary,
    the rest the epilog); a usage error raises `error_type` with one line, not argparse's usage
    block and exit 2."""

    def __init__(self, prog: str, doc: str, error_type: type[Exception]):
        summary, details = doc.split("\n\n", 1)
        kind = argparse.RawDescriptionHelpFormatter
        super().__init__(prog=prog, description=summary, epilog=details, formatter_class=kind)
        self.error_type = error_type

    def error(self, message: str):
        raise self.error_type(f"{message}; see {self.prog} --help.")


def lock_out(lock_path: Path, command: str) -> int:
    """One `command` at a time on the folder of `lock_path`: a lock the OS releases when this
    process ends; the file descriptor, held for the command's life."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    lock_file(
        fd,
        lambda pid, host: (
            f"another {command} command (pid {pid} on {host}) is running on {lock_path.parent}; "
            "wait for it, or stop it and rerun."
        ),
    )
    write_holder(fd)
    return fd
