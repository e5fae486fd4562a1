"""The choices of the speed settings that are fixed sets of names (no module:attr): how Dense
layers and LayerNorms are differentiated, the matmul operands' dtype, what remat keeps. The
model group's settings name them by config key (`settings.registry.RegistryRef`); "auto" is
resolved per backend by `backend.speed_of`."""

from __future__ import annotations

import jax

from minigpt_jax.settings.registry import Registry

DENSE_GRADS = Registry(
    "Dense gradient",
    "model.dense_grad",
    {"auto": "direct on CPU, else autodiff", "autodiff": "jax.grad", "direct": "dense.py's VJP"},
    user_entries=False,
)
NORM_GRADS = Registry(
    "LayerNorm gradient",
    "model.norm_grad",
    {
        "auto": "direct on CPU, else autodiff",
        "autodiff": "jax.grad",
        "direct": "speed.layernorm.DirectLayerNorm's VJP",
    },
    user_entries=False,
)
MATMUL_DTYPES = Registry(
    "matmul dtype",
    "model.matmul_dtype",
    {
        "auto": "bfloat16 in training on CPUs with a bf16 dot unit, else float32",
        "float32": "float32 operands",
        "bfloat16": "bfloat16 operands, float32 sums",
    },
    user_entries=False,
)
# What each block keeps for the backward pass (model.remat); the rest is recomputed. "full"
# keeps only the block's input; "dots" also keeps the matmul outputs (the cheap elementwise work
# is redone); "none" keeps everything (no remat).
REMAT_POLICIES = Registry(
    "remat policy",
    "model.remat",
    {
        "none": None,
        "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        "full": jax.checkpoint_policies.nothing_saveable,
    },
    user_entries=False,
)
