"""Training: optimizers and schedules, the compiled steps (`step`), the loop (`loop`:
`Trainer`, `RunLogger`, `train_and_evaluate`), checkpoints, resume rules, run locks and metrics.

`minigpt_jax.train.X` is the X of `loop`, `step` or `optimizers` (`train_and_evaluate`,
`make_train_chunk`, `make_optimizer`, ...), loaded on first use, so `from minigpt_jax.train
import train_and_evaluate` works.
"""

import importlib
import importlib.util


def __getattr__(name: str):
    # A submodule is imported as itself; any other name is the loop's, the steps' or the
    # optimizers'.
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    for module in ("loop", "step", "optimizers"):
        module = importlib.import_module(f"{__name__}.{module}")
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
