"""LayerNorm with a hand-written VJP: flax's nn.LayerNorm's math in fewer passes on XLA:CPU.

`GPTConfig.norm_grad` "auto" picks it on CPU (`speed.backend.norm_grad`): its forward takes the
mean and the mean square in one reduction, its backward the fused kernels' two reductions (over
D: mean(g) and mean(g·x̂); over the rows: the scale's and the bias's gradients) and one
elementwise pass. Its parameters are flax's ('scale', 'bias' of shape (D,)), so checkpoints and
GPT-2 files load either way; tests/test_backend.py checks values and gradients against
nn.LayerNorm.
"""

from __future__ import annotations

import functools
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

Array = chex.Array


def _pair_sum(a: Array, b: Array, axes: tuple[int, ...], pair_axis: int) -> Array:
    """(sum of a, sum of b) over `axes`, stacked on a new axis of size 2 at `pair_axis`
    (`axes` count that new axis), as ONE reduction. XLA:CPU runs each reduction as its own
    YNNPACK call: two of them over the same rows cost more than one over both. The pair is
    built by a select of two broadcasts, which XLA fuses into one pass (a concatenation
    costs a copy more)."""
    a, b = jnp.expand_dims(a, pair_axis), jnp.expand_dims(b, pair_axis)
    shape = list(a.shape)
    shape[pair_axis] = 2
    first = jax.lax.broadcasted_iota(jnp.int32, shape, pair_axis) == 0
    both = jnp.where(first, jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape))
    return jnp.sum(both, axes)


def _over_rows(vector_D: Array, like_NxD: Array) -> Array:
    """vector_D in like's dtype and rank (1, ..., 1, D), to broadcast over its rows."""
    return vector_D.astype(like_NxD.dtype).reshape((1,) * (like_NxD.ndim - 1) + (-1,))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def normalize_with_vjp(x_NxD: Array, scale_D: Array, bias_D: Array | None, epsilon: float) -> Array:
    """(x - mean) / sqrt(var + eps) * scale + bias over the last axis, in x's dtype (float32 or
    wider: DirectLayerNorm promotes), var = max(mean(x²) - mean², 0) as flax's; bias may be
    None. Any leading axes (N)."""
    return _normalize_fwd(x_NxD, scale_D, bias_D, epsilon)[0]


def _normalize_fwd(x_NxD, scale_D, bias_D, epsilon):
    last = x_NxD.ndim - 1
    moments_Nx2 = _pair_sum(x_NxD, jnp.square(x_NxD), (last + 1,), last) / x_NxD.shape[-1]
    mean_Nx1, mean_square_Nx1 = moments_Nx2[..., :1], moments_Nx2[..., 1:]
    var_Nx1 = jnp.maximum(mean_square_Nx1 - jnp.square(mean_Nx1), 0.0)
    rstd_Nx1 = jax.lax.rsqrt(var_Nx1 + epsilon)
    normed_NxD = (x_NxD - mean_Nx1) * rstd_Nx1
    out_NxD = normed_NxD * _over_rows(scale_D, normed_NxD)
    if bias_D is not None:
        out_NxD = out_NxD + _over_rows(bias_D, normed_NxD)
    return out_NxD, (normed_NxD, rstd_Nx1, scale_D, bias_D)


def _normalize_bwd(epsilon, residuals, dout_NxD):
    del epsilon  # in rstd already
    normed_NxD, rstd_Nx1, scale_D, bias_D = residuals
    dout_NxD = dout_NxD.astype(normed_NxD.dtype)
    dnormed_NxD = dout_NxD * _over_rows(scale_D, normed_NxD)
    last = normed_NxD.ndim - 1
    # Over D: mean(g) and mean(g·x̂), g the gradient of x̂.
    means_Nx2 = _pair_sum(dnormed_NxD, dnormed_NxD * normed_NxD, (last + 1,), last)
    means_Nx2 = means_Nx2 / normed_NxD.shape[-1]
    dx_NxD = rstd_Nx1 * (dnormed_NxD - means_Nx2[..., :1] - normed_NxD * means_Nx2[..., 1:])
    # Over the rows: the bias's and the scale's gradients.
    rows = tuple(range(1, last + 1))
    dbias_D, dscale_D = _pair_sum(dout_NxD, dout_NxD * normed_NxD, rows, 0)
    dbias_D = None if bias_D is None else dbias_D.astype(bias_D.dtype)
    return dx_NxD, dscale_D.astype(scale_D.dtype), dbias_D


normalize_with_vjp.defvjp(_normalize_fwd, _normalize_bwd)


class DirectLayerNorm(nn.Module):
    """nn.LayerNorm over the last axis with `normalize_with_vjp`'s VJP: the same parameters
    ('scale', and 'bias' with use_bias, of shape (D,) in param_dtype), the output in `dtype`."""

    epsilon: float
    use_bias: bool = True
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x_NxD: Array) -> Array:
        features = (x_NxD.shape[-1],)
        scale_D = self.param("scale", nn.initializers.ones_init(), features, self.param_dtype)
        bias_D = None
        if self.use_bias:
            bias_D = self.param("bias", nn.initializers.zeros_init(), features, self.param_dtype)
        # In float32 at least, as flax's statistics; the cast's gradient is autodiff's.
        x_NxD = x_NxD.astype(jnp.promote_types(x_NxD.dtype, jnp.float32))
        return normalize_with_vjp(x_NxD, scale_D, bias_D, self.epsilon).astype(self.dtype)
