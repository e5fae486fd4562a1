"""Dense contractions with a hand-written VJP and bfloat16 operands: the same math as
autodiff's, faster on XLA:CPU.

`GPTConfig.dense_grad` picks it: "autodiff" leaves flax's Dense layers on `lax.dot_general`
and `jax.grad`; "direct" hands them `direct_grad_dot_general`, whose backward pass writes
dx = dy·Wᵀ and dW = xᵀ·dy as two plain 2-D dots (benchmarks/train_throughput.py times both);
"auto" is direct on CPU, autodiff elsewhere (`speed.backend.dense_grad`, resolved once per
config: `speed_of(cfg)`).

`GPTConfig.matmul_dtype` = "bfloat16" rounds the operands of those contractions (forward and both
backward dots) to bfloat16 and accumulates in float32; weights, activations and gradients stay in
their own dtypes (`backend.matmul_dtype` resolves "auto").
"""

from __future__ import annotations

import functools
import math

import chex
import jax
import jax.numpy as jnp

Array = chex.Array


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _matmul(x_MxI: Array, w_IxO: Array, precision, operand_dtype) -> Array:
    return _matmul_fwd(x_MxI, w_IxO, precision, operand_dtype)[0]


def _dot(a: Array, b: Array, dims, precision, operand_dtype) -> Array:
    """One 2-D dot; with an operand dtype, of operands rounded to it and summed in float32."""
    if operand_dtype is None:
        return jax.lax.dot_general(a, b, (dims, ((), ())), precision=precision)
    return jax.lax.dot_general(
        a.astype(operand_dtype),
        b.astype(operand_dtype),
        (dims, ((), ())),
        precision=precision,
        preferred_element_type=jnp.float32,
    )


def _matmul_fwd(x_MxI, w_IxO, precision, operand_dtype):
    out_MxO = _dot(x_MxI, w_IxO, ((1,), (0,)), precision, operand_dtype)
    if operand_dtype is None:
        return out_MxO, (x_MxI, w_IxO)
    # The backward dots read the rounded operands (half the bytes kept); x and w share one
    # dtype here (direct_grad_dot_general promotes them), the output's and the cotangents'.
    rounded = (x_MxI.astype(operand_dtype), w_IxO.astype(operand_dtype))
    return out_MxO.astype(x_MxI.dtype), rounded


def _matmul_bwd(precision, operand_dtype, residuals, dy_MxO):
    # Written out, each gradient is one plain 2-D dot. jax.grad's transpose of the N-D
    # dot_general leaves XLA:CPU transposes and copies around the backward dots: twice as many
    # in the compiled train step, 0.89x the ms/step without them (benchmarks/README.md).
    x_MxI, w_IxO = residuals
    dx_MxI = _dot(dy_MxO, w_IxO, ((1,), (1,)), precision, operand_dtype)
    if operand_dtype is None:
        dw_IxO = _dot(x_MxI, dy_MxO, ((0,), (0,)), precision, operand_dtype)
    else:
        # XLA:CPU hands a bfloat16 dot that contracts both operands' first axis (xᵀ·dy) back to
        # Eigen in float32, converting both operands up; with xᵀ copied out first (the barrier
        # keeps XLA from folding the transpose back into the dot) it stays a bfloat16 YNNPACK
        # dot: 0.96x the ms/step on an Intel Xeon with AMX (docs/speed.md).
        xt_IxM = jax.lax.optimization_barrier(x_MxI.T)
        dw_IxO = _dot(xt_IxM, dy_MxO, ((1,), (0,)), precision, operand_dtype)
    if operand_dtype is not None:  # the residuals are rounded; the primals had dy's dtype
        return dx_MxI.astype(dy_MxO.dtype), dw_IxO.astype(dy_MxO.dtype)
    return dx_MxI.astype(x_MxI.dtype), dw_IxO.astype(w_IxO.dtype)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def _dense_or_lax(dense_matmul, lhs, rhs, dimension_numbers, precision, preferred_element_type, kw):
    """`dense_matmul(x_MxI, w_IxO)` for what nn.Dense / nn.DenseGeneral ask for (lhs's trailing
    dims against rhs's leading ones, no batch dims, no other options), as one 2-D matmul;
    anything else goes to `lax.dot_general` as asked."""
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
    out_MxO = dense_matmul(lhs.reshape(-1, contracted), rhs.reshape(contracted, -1))
    return out_MxO.reshape(*lhs.shape[: lhs.ndim - n], *rhs.shape[n:])


def direct_grad_dot_general(
    lhs: Array,
    rhs: Array,
    dimension_numbers,
    precision=None,
    preferred_element_type=None,
    *,
    operand_dtype=None,
    **kw,
) -> Array:
    """`lax.dot_general` for Dense layers, with the VJP of `_matmul` (GPTConfig.dense_grad);
    the operands rounded to `operand_dtype` when given, summed in float32
    (GPTConfig.matmul_dtype)."""

    def dense_matmul(x_MxI, w_IxO):
        if operand_dtype is not None:  # one dtype for both, as flax's Dense already gives
            common = jnp.result_type(x_MxI, w_IxO)
            x_MxI, w_IxO = x_MxI.astype(common), w_IxO.astype(common)
        return _matmul(x_MxI, w_IxO, precision, operand_dtype)

    return _dense_or_lax(
        dense_matmul, lhs, rhs, dimension_numbers, precision, preferred_element_type, kw
    )


def rounded_operand_dot_general(
    lhs: Array,
    rhs: Array,
    dimension_numbers,
    precision=None,
    preferred_element_type=None,
    *,
    operand_dtype,
    **kw,
) -> Array:
    """`lax.dot_general` for Dense layers with the operands rounded to `operand_dtype` and
    summed in float32, differentiated by jax.grad (dense_grad="autodiff", matmul_dtype
    "bfloat16")."""

    def dense_matmul(x_MxI, w_IxO):
        out_MxO = _dot(x_MxI, w_IxO, ((1,), (0,)), precision, operand_dtype)
        return out_MxO.astype(jnp.result_type(x_MxI, w_IxO))

    return _dense_or_lax(
        dense_matmul, lhs, rhs, dimension_numbers, precision, preferred_element_type, kw
    )


def dot_general_for(dense_grad: str, matmul_dtype: str):
    """The `dot_general` Dense layers take for resolved settings (None: flax's lax default):
    `direct_grad_dot_general` for dense_grad "direct", operands rounded to bfloat16 for
    matmul_dtype "bfloat16"."""
    direct = dense_grad == "direct"
    if matmul_dtype == "bfloat16":
        dot = direct_grad_dot_general if direct else rounded_operand_dot_general
        return functools.partial(dot, operand_dtype=jnp.bfloat16)
    return direct_grad_dot_general if direct else None
