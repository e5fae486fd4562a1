"""JAX's persistent compilation cache, on by default for `minigpt-jax train` (and so for every
trial of a sweep): a rerun of the same config loads its compiled steps from disk instead of
compiling them again. The executables are XLA's own, so the numbers do not change.

MINIGPT_JAX_COMPILATION_CACHE picks the folder; `off` (or 0, false, none, empty) turns it off;
unset, it is $XDG_CACHE_HOME/minigpt_jax/jax_compilation (~/.cache/... without XDG_CACHE_HOME).
A folder set through JAX's own JAX_COMPILATION_CACHE_DIR is left as it is. A leaf module.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

ENV = "MINIGPT_JAX_COMPILATION_CACHE"
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
        return Path(jax.config.jax_compilation_cache_dir)
    path = cache_dir(environ)
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        _log.warning("compilation cache off: %s (set %s to a writable folder)", error, ENV)
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    # Every program, however quick to compile: on a small CPU the many small ones add up.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
