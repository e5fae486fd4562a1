"""The model: positions, attention (masks and kernels), layers, embeddings, the GPT itself
(`gpt`), its config (`config`) and the loss terms of its read-out (`losses`).

`minigpt_jax.model.X` is `minigpt_jax.model.gpt.X` for the GPT's public functions
(`init_params`, `forward`, `forward_with_cache`, ...), loaded on first use so that importing
one submodule (e.g. `model.config`) does not import them all.
"""

import importlib
import importlib.util


def __getattr__(name: str):
    # A submodule is imported as itself; any other name is gpt's.
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    gpt = importlib.import_module(f"{__name__}.gpt")
    try:
        return getattr(gpt, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
