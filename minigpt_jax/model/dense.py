"""Dense contractions with a hand-written VJP: the same math as autodiff, faster on XLA:CPU.

`GPTConfig.dense_grad` picks it: "autodiff" leaves flax's Dense layers on `lax.dot_general`
and `jax.grad`; "direct" hands them `direct_grad_dot_general`, whose backward pass writes
dx = dy·Wᵀ and dW = xᵀ·dy as two plain 2-D dots (benchmarks/train_throughput.py times both);
"auto" is direct on CPU, autodiff elsewhere (`backend.dense_grad`).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import chex
import flax.linen as nn
import jax

from minigpt_jax.model import backend

if TYPE_CHECKING:  # config imports this module (its registries): a type-only import
    from minigpt_jax.model.config import GPTConfig

Array = chex.Array

# Every weight of the model is initialised N(0, 0.02^2), as GPT-2 / nanoGPT; the projections
# into the residual stream are scaled down further (`residual_init`).
INIT_STDDEV = 0.02


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _matmul(x_MxI: Array, w_IxO: Array, precision) -> Array:
    return jax.lax.dot_general(x_MxI, w_IxO, (((1,), (0,)), ((), ())), precision=precision)


def _matmul_fwd(x_MxI, w_IxO, precision):
    return _matmul(x_MxI, w_IxO, precision), (x_MxI, w_IxO)


def _matmul_bwd(precision, residuals, dy_MxO):
    # Written out, each gradient is one plain 2-D dot. jax.grad's transpose of the N-D
    # dot_general leaves XLA:CPU transposes and copies around the backward dots: twice as many
    # in the compiled train step, 0.89x the ms/step without them (benchmarks/README.md).
    x_MxI, w_IxO = residuals
    dx_MxI = jax.lax.dot_general(dy_MxO, w_IxO, (((1,), (1,)), ((), ())), precision=precision)
    dw_IxO = jax.lax.dot_general(x_MxI, dy_MxO, (((0,), (0,)), ((), ())), precision=precision)
    return dx_MxI.astype(x_MxI.dtype), dw_IxO.astype(w_IxO.dtype)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def direct_grad_dot_general(
    lhs: Array, rhs: Array, dimension_numbers, precision=None, preferred_element_type=None, **kw
) -> Array:
    """`lax.dot_general` for Dense layers, with the VJP of `_matmul` (GPTConfig.dense_grad).

    Handles what nn.Dense / nn.DenseGeneral ask for, lhs's trailing dims against rhs's leading
    ones without batch dims, as one (M, I) x (I, O) matmul; anything else goes to lax.
    """
    (lhs_contract, rhs_contract), batch = dimension_numbers
    n = len(lhs_contract)
    if (
        batch != ((), ())
        or preferred_element_type is not None
        or any(value is not None for value in kw.values())
        or tuple(lhs_contract) != tuple(range(lhs.ndim - n, lhs.ndim))
        or tuple(rhs_contract) != tuple(range(n))
    ):
        return jax.lax.dot_general(
            lhs,
            rhs,
            dimension_numbers,
            precision,
            preferred_element_type=preferred_element_type,
            **kw,
        )
    contracted = math.prod(rhs.shape[:n])
    out_MxO = _matmul(lhs.reshape(-1, contracted), rhs.reshape(contracted, -1), precision)
    return out_MxO.reshape(*lhs.shape[: lhs.ndim - n], *rhs.shape[n:])


def dense_options(cfg: GPTConfig) -> dict:
    """Keyword arguments every Dense / DenseGeneral layer of the model shares: bias, dtypes and
    the `dot_general` that `cfg.dense_grad` picks (None is flax's lax default)."""
    direct = backend.dense_grad(cfg) == "direct"
    return dict(
        use_bias=cfg.use_bias,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.weight_dtype,
        dot_general=direct_grad_dot_general if direct else None,
    )


def residual_init(cfg: GPTConfig):
    """Init of the projections into the residual stream: GPT-2 scales N(0, 0.02²) by
    1/sqrt(2N), two per block; zeros with cfg.zero_init_proj (the NanoGPT speedrun)."""
    if cfg.zero_init_proj:
        return nn.initializers.zeros_init()
    return nn.initializers.normal(stddev=INIT_STDDEV / (2 * cfg.n_layer) ** 0.5)
