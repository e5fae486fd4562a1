"""Module paths of earlier versions that user code may import, kept working: importing an old
path gives a module whose names are looked up in the modules that hold them now, with a
DeprecationWarning naming those (installed by minigpt_jax/__init__.py). A module that became a
package of the same name (minigpt_jax.data.shards) looks its old names up the same way
(`old_names`, its __init__'s __getattr__)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old module -> the modules that hold its names now
MOVED = {
    "minigpt_jax.io": (),
    "minigpt_jax.io.pretrained": ("minigpt_jax.gpt2", "minigpt_jax.loading"),
    "minigpt_jax.io.sampling": ("minigpt_jax.sampling.api",),
    "minigpt_jax.io.runs": ("minigpt_jax.sampling.texts",),
    "minigpt_jax.io.evaluate": ("minigpt_jax.train.evaluation",),
    "minigpt_jax.registry": ("minigpt_jax.settings.registry",),
    "minigpt_jax.run_config": ("minigpt_jax.experiment", "minigpt_jax.data.storage"),
    "minigpt_jax.signals": ("minigpt_jax.runtime.signals",),
    "minigpt_jax.locks": ("minigpt_jax.runtime.locks",),
    "minigpt_jax.train.run_lock": ("minigpt_jax.runtime.locks",),
    "minigpt_jax.run_dir": ("minigpt_jax.runtime.run_dir",),
    "minigpt_jax.digests": ("minigpt_jax.runtime.digests",),
    "minigpt_jax.compile_cache": ("minigpt_jax.runtime.compile_cache",),
    "minigpt_jax.timing": ("minigpt_jax.runtime.timing",),
    "minigpt_jax.train.optimizers": ("minigpt_jax.optimizers",),
    "minigpt_jax.train.checkpoint": ("minigpt_jax.checkpoint",),
    "minigpt_jax.data.memory": (
        "minigpt_jax.data.dataset",
        "minigpt_jax.data.sources",
        "minigpt_jax.data.in_memory",
        "minigpt_jax.data.corpus",
        "minigpt_jax.data.tokenizers",
        "minigpt_jax.runtime.run_dir",
    ),
    # now a package: its __init__ looks the old names up (old_names)
    "minigpt_jax.data.shards": (
        "minigpt_jax.data.shards.layout",
        "minigpt_jax.data.shards.verify",
        "minigpt_jax.data.shards.digest",
        "minigpt_jax.data.shards.prepare",
        "minigpt_jax.data.shards.read",
    ),
}

_SAMPLING_CHECKS = (
    "minigpt_jax.sampling.settings.SampleSettings, which checks its values when made, and "
    "minigpt_jax.sampling.api.check_request"
)
# names of an old module that no module holds now -> what to use instead
REPLACED = {
    "minigpt_jax.io.sampling.check_settings": _SAMPLING_CHECKS,
    "minigpt_jax.io.runs.check_settings": _SAMPLING_CHECKS,
    "minigpt_jax.io.runs.sample_from_pretrained": (
        "minigpt_jax.sampling.texts.sample_texts with minigpt_jax.loading.load_model(DIR)"
    ),
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        is_package = any(name.startswith(fullname + ".") for name in MOVED)
        return importlib.util.spec_from_loader(fullname, self, is_package=is_package)

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module) -> None:
        homes = MOVED[module.__name__]
        if not homes:
            return  # a package that only holds moved modules
        warnings.warn(
            f"{module.__name__} has moved: import from {' or '.join(homes)}",
            DeprecationWarning,
            stacklevel=3,
        )
        module.__getattr__ = old_names(module.__name__, warn=False)


def old_names(old: str, *, warn: bool = True):
    """A module __getattr__ that finds the names module `old` held in the modules of MOVED[old]
    (warning once, when `warn`, with the module that defines it now); AttributeError for any
    other."""
    homes = MOVED[old]

    def __getattr__(name: str):
        instead = REPLACED.get(f"{old}.{name}")
        if instead is not None:
            raise AttributeError(f"{old}.{name} is gone: use {instead}")
        if not name.startswith("__"):
            for home in homes:
                found = importlib.import_module(home)
                if hasattr(found, name):
                    value = getattr(found, name)
                    if warn:
                        defined_in = getattr(value, "__module__", None)
                        warnings.warn(
                            f"{old}.{name} has moved: import it from "
                            f"{defined_in if isinstance(defined_in, str) else home}",
                            DeprecationWarning,
                            stacklevel=2,
                        )
                        setattr(sys.modules[old], name, value)  # found once, warned once
                    return value
        raise AttributeError(f"{old} (now {' and '.join(homes)}) has no attribute {name!r}")

    return __getattr__


def install() -> None:
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())
