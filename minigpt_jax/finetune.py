"""Fine-tuning's params (`config.init_from`): a loaded model's weights placed into a config's
model by parameter path, its other parameters (a plug-in's adapters) left at the model's init.

The rule: every weight of the checkpoint must find its path in the config's model with the same
shape (after `model_files.params_for` crops the positions and pads the vocabulary); a
parameter of the config's model that the checkpoint lacks is new and keeps its init. A
checkpoint weight with no home is an error, not dropped: the model would otherwise compute
something else than the checkpoint with a fresh weight in its place (a plug-in that renamed
`fc` to `fc1` loads nothing into it), which no loss curve would tell.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.gpt import Params, declared_params
from minigpt_jax.model.param_meta import path_names
from minigpt_jax.model_files import LoadedModel, check_fits, params_for

Shapes = dict[tuple[str, ...], tuple[int, ...]]
_LISTED = 3  # paths named in an error before "and N more"


def new_parameters(loaded: LoadedModel, wanted: GPTConfig) -> list[str]:
    """The paths ("block_0/mlp/fc_lora_a") of `wanted`'s parameters the checkpoint lacks, which
    keep the model's init. Raises ValueError (one line, from shapes alone: nothing is
    allocated) when the checkpoint's model cannot become `wanted` (`check_fits`), when one of
    its weights has no path in `wanted`'s model, or when one has another shape there."""
    check_fits(loaded.cfg, wanted)
    have = _shapes(jax.eval_shape(lambda: params_for(loaded, wanted)))
    want = {path: shape for path, (shape, _) in declared_params(wanted).items()}
    new = [path for path in want if path not in have]
    homeless = [path for path in have if path not in want]
    if homeless:
        instead = f"; its new parameters: {_listed(new)}" if new else ""
        weights = "weights" if len(homeless) > 1 else "weight"
        have_no = "have" if len(homeless) > 1 else "has"
        raise ValueError(
            f"config.init_from: the checkpoint's {weights} {_listed(homeless)} {have_no} no "
            f"place in the config's model{instead}. A plug-in that wraps a built-in part "
            f"must keep its parameter names (paths), or pick the checkpoint's model.* entries."
        )
    for path, shape in have.items():
        if want[path] != shape:
            raise ValueError(
                f"config.init_from: the checkpoint's weight {'/'.join(path)} has shape {shape}, "
                f"the config's model {want[path]}: give the plug-in's parameter the "
                f"checkpoint's shape, or another name (a new parameter, initialised afresh)."
            )
    return ["/".join(path) for path in new]


def fitted_params(fresh: Params, loaded: LoadedModel, wanted: GPTConfig) -> Params:
    """`fresh` (the model's init) with each of the loaded weights at its path, as host arrays;
    its other leaves (the new parameters) unchanged. Check with `new_parameters` first."""
    weights = {
        path_names(path): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(params_for(loaded, wanted))
    }
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: weights.get(path_names(path), leaf), fresh
    )


def _shapes(tree: Any) -> Shapes:
    return {
        path_names(path): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    }


def _listed(paths: list[tuple[str, ...]]) -> str:
    """'a/b, c/d, e/f and 2 more'."""
    names = ["/".join(path) for path in paths[:_LISTED]]
    more = f" and {len(paths) - _LISTED} more" if len(paths) > _LISTED else ""
    return ", ".join(names) + more
