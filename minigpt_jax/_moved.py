"""Module paths of earlier versions that user code may import, kept working: importing an old
path gives a module whose names are looked up in the modules that hold them now, with a
DeprecationWarning naming those (installed by minigpt_jax/__init__.py)."""

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
    "minigpt_jax.io.sampling": (
        "minigpt_jax.sampling.api",
        "minigpt_jax.sampling.settings",
        "minigpt_jax.sampling.filters",
        "minigpt_jax.sampling.plan",
        "minigpt_jax.sampling.decode",
        "minigpt_jax.sampling.loop",
    ),
    "minigpt_jax.io.runs": (
        "minigpt_jax.sampling.texts",
        "minigpt_jax.sampling.command",
        "minigpt_jax.runtime.signals",
    ),
    "minigpt_jax.io.evaluate": ("minigpt_jax.train.evaluation",),
    "minigpt_jax.registry": ("minigpt_jax.settings.registry",),
    "minigpt_jax.run_config": ("minigpt_jax.experiment",),
    "minigpt_jax.signals": ("minigpt_jax.runtime.signals",),
    "minigpt_jax.locks": ("minigpt_jax.runtime.locks",),
    "minigpt_jax.train.run_lock": ("minigpt_jax.runtime.locks",),
    "minigpt_jax.run_dir": ("minigpt_jax.runtime.run_dir",),
    "minigpt_jax.digests": ("minigpt_jax.runtime.digests",),
    "minigpt_jax.compile_cache": ("minigpt_jax.runtime.compile_cache",),
    "minigpt_jax.timing": ("minigpt_jax.runtime.timing",),
    "minigpt_jax.train.optimizers": ("minigpt_jax.optimizers",),
    "minigpt_jax.train.checkpoint": ("minigpt_jax.checkpoint",),
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

        def __getattr__(name: str):
            instead = REPLACED.get(f"{module.__name__}.{name}")
            if instead is not None:
                raise AttributeError(f"{module.__name__}.{name} is gone: use {instead}")
            for home in homes:
                found = importlib.import_module(home)
                if hasattr(found, name):
                    return getattr(found, name)
            raise AttributeError(
                f"{module.__name__} (now {' and '.join(homes)}) has no attribute {name!r}"
            )

        module.__getattr__ = __getattr__


def install() -> None:
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())
