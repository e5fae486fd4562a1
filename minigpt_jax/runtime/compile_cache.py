"""JAX's persistent compilation cache, on by default for `minigpt-jax train` (and so for every
trial of a sweep): a rerun of the same config loads its compiled steps from disk instead of
compiling them again. The executables are XLA's own, so the numbers do not change.

MINIGPT_JAX_COMPILATION_CACHE picks the folder; `off` (or 0, false, none, empty) turns it off;
unset, it is $XDG_CACHE_HOME/minigpt_jax/jax_compilation (~/.cache/... without XDG_CACHE_HOME).
A folder set through JAX's own JAX_COMPILATION_CACHE_DIR is used as it is.

The folder is checked once as a process starts (`enable`): damaged entries (JAX would warn on
every read of one, on every run) are removed, and a folder that cannot be written (read-only,
full) turns the cache off with one warning naming it, in place of JAX's warning per program.
Entries older than its `.verified` stamp were checked by an earlier start. A leaf module.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

ENV = "MINIGPT_JAX_COMPILATION_CACHE"
_STAMP = ".verified"  # entries older than it were checked whole by an earlier start
_PROBE_BYTES = 1 << 20  # about one compiled step: a folder with less room is as good as full
_OFF = ("", "0", "off", "false", "none", "no")
_log = logging.getLogger(__name__)


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The folder the cache uses under `environ`, or None when it is turned off."""
    value = environ.get(ENV)
    if value is None:
        base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "minigpt_jax" / "jax_compilation"
    if value.strip().lower() in _OFF:
        return None
    return Path(value).expanduser()


def enable(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Turns the cache on in this process (before its first compilation); returns its folder,
    or None when it is off or the folder cannot be made (a warning, never an error)."""
    import jax

    if jax.config.jax_compilation_cache_dir:  # the user's JAX_COMPILATION_CACHE_DIR
        path = Path(jax.config.jax_compilation_cache_dir)
    else:
        path = cache_dir(environ)
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
        _check_writable(path)
        _remove_damaged_entries(path)
    except OSError as error:
        _log.warning(
            "compilation cache off for this run: %s cannot be written (%s); free space or make "
            "it writable, or set %s to another folder (or to off)",
            path,
            error.strerror or error,
            ENV,
        )
        jax.config.update("jax_compilation_cache_dir", None)
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    # Every program, however quick to compile: on a small CPU the many small ones add up.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def _check_writable(path: Path) -> None:
    """Raises OSError unless `path` takes a file of about one entry's size (then removed)."""
    probe = path / f".probe-{os.getpid()}"
    try:
        with open(probe, "wb") as file:
            file.write(bytes(_PROBE_BYTES))
            file.flush()
            os.fsync(file.fileno())
    finally:
        probe.unlink(missing_ok=True)


def _remove_damaged_entries(path: Path) -> None:
    """Removes each entry (KEY-cache, with its KEY-atime) that does not decompress, of those
    written since the last check, and stamps the folder as checked."""
    from jax._src.compilation_cache import decompress_executable

    stamp = path / _STAMP
    checked_at = stamp.stat().st_mtime if stamp.exists() else float("-inf")
    removed = 0
    for entry in path.glob("*-cache"):
        if entry.stat().st_mtime < checked_at:
            continue
        try:
            decompress_executable(entry.read_bytes())
        except Exception:  # any decompressor's error: the entry is damaged
            entry.unlink(missing_ok=True)
            entry.with_name(entry.name.removesuffix("-cache") + "-atime").unlink(missing_ok=True)
            removed += 1
    stamp.touch()
    if removed:
        _log.warning(
            "compilation cache %s: removed %d damaged entr%s (compiled again when needed)",
            path,
            removed,
            "y" if removed == 1 else "ies",
        )
