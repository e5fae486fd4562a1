"""The Dense layers' shared options and init.

Dense layers are flax's, differentiated by autodiff; where a faster contraction of the same
math stands in (a hand-written VJP, bfloat16 operands: `GPTConfig.dense_grad`, `matmul_dtype`),
it comes from the speed room in one call, `speed_of(cfg).dot_general` (model/speed/dense.py).
"""

from __future__ import annotations

import flax.linen as nn

from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.speed.backend import speed_of

# Every weight of the model is initialised N(0, 0.02^2), as GPT-2 / nanoGPT; the projections
# into the residual stream are scaled down further (`residual_init`).
INIT_STDDEV = 0.02


def dense_options(cfg: GPTConfig) -> dict:
    """Keyword arguments every Dense / DenseGeneral layer of the model shares: bias, dtypes and
    the `dot_general` the speed room stands in with (None: flax's `lax.dot_general`)."""
    return dict(
        use_bias=cfg.use_bias,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.weight_dtype,
        dot_general=speed_of(cfg).dot_general,
    )


def residual_init(cfg: GPTConfig):
    """Init of the projections into the residual stream: GPT-2 scales N(0, 0.02²) by
    1/sqrt(2N), two per block; zeros with cfg.zero_init_proj (the NanoGPT speedrun)."""
    if cfg.zero_init_proj:
        return nn.initializers.zeros_init()
    return nn.initializers.normal(stddev=INIT_STDDEV / (2 * cfg.n_layer) ** 0.5)
