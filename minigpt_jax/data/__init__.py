"""Corpora and tokens: the one reader of files (`corpus`), tokenizers, the in-memory format
with batches (`memory`) and token shards for corpora of any size (`shards`).

`minigpt_jax.data.X` is `minigpt_jax.data.memory.X` (`get_batch`, `prepare_dataset`, ...),
loaded on first use.
"""

import importlib
import importlib.util


def __getattr__(name: str):
    # A submodule is imported as itself; any other name is memory's.
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    memory = importlib.import_module(f"{__name__}.memory")
    try:
        return getattr(memory, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
