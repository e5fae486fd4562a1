"""The error of a plug-in that breaks `model.remat`: a value kept outside a block's call (a
module-level global, a class attribute) escapes the trace that `jax.checkpoint` makes of each
block, and JAX raises `UnexpectedTracerError` where another block reads it, or where the traced
program first runs (the escaped value became one of its constants). `remat_leak` names the
plug-ins and the fix in its place; `naming_remat_leaks` raises it around a program's calls."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator

import jax

from minigpt_jax.model.config import GPTConfig
from minigpt_jax.settings.registry import PluginError, is_user_file, is_user_key, plugin_error


def model_plugins(cfg: GPTConfig) -> list[str]:
    """["model.block='my_blocks:Leaky'", ...]: the settings of cfg that pick user code."""
    return [
        f"model.{field.name}={getattr(cfg, field.name)!r}"
        for field in dataclasses.fields(cfg)
        if isinstance(getattr(cfg, field.name), str) and is_user_key(getattr(cfg, field.name))
    ]


def remat_leak(error: Exception, cfg: GPTConfig) -> Exception:
    """A PluginError for a jax UnexpectedTracerError raised while cfg's blocks are traced under
    model.remat: its header names the model's plug-ins, its frames the user's own, its note the
    fix; `error` itself when remat is off or no plug-in is picked (nothing to name)."""
    plugins = model_plugins(cfg)
    if cfg.remat == "none" or not plugins:
        return error
    where = " and ".join(plugins)
    found = plugin_error(error, where=where)
    frames = found.frames if found is not None else []
    # The frames end inside jax; its message lists where the escaped value was made.
    made = [
        f"  the escaped value was made at {path}:{line} ({function})"
        for path, line, function in re.findall(r"^(\S+?):(\d+):\d+ \((.*)\)$", str(error), re.M)
        if is_user_file(path)
    ]
    frames += made[-1:]
    return PluginError(
        f"error in user code of {where}: UnexpectedTracerError under "
        f"model.remat={cfg.remat!r}: a value kept outside a block's call (a module-level "
        "global, a class attribute) escaped the trace jax.checkpoint makes of each block",
        frames,
        "Fix: pass the value through the block's inputs and outputs, or keep it in params, not "
        "in a global; or train without remat (--config.model.remat=none).",
    )


@contextlib.contextmanager
def naming_remat_leaks(cfg: GPTConfig) -> Iterator[None]:
    """Raises `remat_leak`'s PluginError in place of a jax UnexpectedTracerError from inside."""
    try:
        yield
    except jax.errors.UnexpectedTracerError as error:
        leak = remat_leak(error, cfg)
        if leak is error:
            raise
        raise leak from error
