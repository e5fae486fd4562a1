"""Muon's parts (Jordan et al. 2024): which parameters it orthogonalises and how each is read as
matrices (`muon_dimension_numbers`, from what each parameter declares), the quintic
Newton-Schulz iteration (`newton_schulz`, optionally on bfloat16 operands), and the optax
transformations built on them (`scale_by_muon`, `scale_by_width`): optax.contrib.muon's
arithmetic and state. The `muon` optimizer entry (Muon on these, AdamW on the rest) is
optimizer_entries.muon.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from minigpt_jax.model import param_meta

Params = Any


def muon_dimension_numbers(params: Params) -> Params:
    """Which leaves Muon orthogonalises, and how each is read as matrices (reduction -> output
    axes; the others are batch axes), as each parameter declares it (`param_meta.declare(muon=)`):
    the blocks' attention and MLP kernels. Every other leaf (embeddings, an untied head, biases,
    norm scales) is None: AdamW's, as in the speedrun."""

    def rule(path, leaf):
        muon = param_meta.lookup(path, leaf).muon
        if muon is None:
            return None
        reduction, output = muon
        return optax.contrib.MuonDimensionNumbers(reduction_axis=reduction, output_axis=output)

    return jax.tree_util.tree_map_with_path(rule, params)


def _matrix_axes(x: jax.Array, dims: optax.contrib.MuonDimensionNumbers):
    """(batch, reduction, output): x's axes as optax.contrib reads MuonDimensionNumbers (an
    int or a tuple each, negative from the end; every other axis is a batch axis)."""
    reduction, output = (
        tuple(axis % x.ndim for axis in (axes if isinstance(axes, tuple) else (axes,)))
        for axes in (dims.reduction_axis, dims.output_axis)
    )
    batch = tuple(axis for axis in range(x.ndim) if axis not in reduction + output)
    return batch, reduction, output


def _fans(x: jax.Array, dims: optax.contrib.MuonDimensionNumbers) -> tuple[int, int]:
    """(I, O): the sizes of the matrices x is read as, the products of its reduction and of its
    output axes."""
    _, reduction, output = _matrix_axes(x, dims)
    return tuple(math.prod(x.shape[axis] for axis in axes) for axes in (reduction, output))


def _as_matrices(x: jax.Array, dims: optax.contrib.MuonDimensionNumbers):
    """(stacked, restore): x as a stack of (I, O) matrices (I the product of the reduction axes,
    O of the output axes, the batch axes flattened in front), and the function that turns such
    a stack back into x's shape."""
    batch, reduction, output = _matrix_axes(x, dims)
    order = batch + reduction + output
    ordered_shape = tuple(x.shape[axis] for axis in order)
    fan_in, fan_out = _fans(x, dims)
    stacked = x.transpose(order).reshape(-1, fan_in, fan_out)
    return stacked, lambda y: y.reshape(ordered_shape).transpose(np.argsort(order))


def newton_schulz(
    g_IxO: jax.Array, coeffs: jax.Array, steps: int, eps: float, operand_dtype: str
) -> jax.Array:
    """g_IxO orthogonalised (its singular values pushed towards 1) by `steps` quintic
    Newton-Schulz iterations X <- c0 X + (c1 A + c2 A²) X with A = X Xᵀ, on the wide
    orientation (rows <= columns), after scaling by the Frobenius norm (+ eps): optax.contrib's
    orthogonalize_via_newton_schulz. operand_dtype "bfloat16" rounds every dot's operands to
    bfloat16 and sums in float32 (X, A and the polynomial stay float32; modded-nanogpt runs the
    whole iteration in bfloat16); "float32" is optax's own arithmetic."""

    def dot(a, b):
        if operand_dtype == "float32":
            return a @ b
        return jnp.matmul(
            a.astype(operand_dtype), b.astype(operand_dtype), preferred_element_type=jnp.float32
        )

    tall = g_IxO.shape[0] > g_IxO.shape[1]
    x = g_IxO.T if tall else g_IxO
    x = x / (jnp.linalg.norm(x, ord="fro") + eps)
    c0, c1, c2 = coeffs.astype(x.dtype)
    for _ in range(steps):
        gram = dot(x, x.T)
        x = c0 * x + dot(c1 * gram + dot(c2 * gram, gram), x)
    return x.T if tall else x


def scale_by_muon(
    dimension_numbers: Callable[[Params], Params],
    *,
    beta: float,
    operand_dtype: str,
    ns_coeffs: tuple[float, float, float] = (3.4445, -4.7750, 2.0315),
    ns_steps: int = 5,
    eps: float = 1e-8,
) -> optax.GradientTransformation:
    """Muon's direction (Jordan et al. 2024): Nesterov momentum (bias-corrected), then each leaf
    orthogonalised as the matrices `dimension_numbers(updates)` reads it as (a
    MuonDimensionNumbers for every leaf; `newton_schulz` on `operand_dtype` operands):
    optax.contrib.scale_by_muon with its default coefficients, steps, eps and nesterov=True, and
    its state (MuonState; the momentum stays float32 whatever operand_dtype)."""

    def init(params):
        mu = optax.tree.zeros_like(params)
        return optax.contrib.MuonState(jnp.zeros([], jnp.int32), mu, jnp.asarray(ns_coeffs))

    def update(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, beta, 1)
        count = optax.safe_increment(state.count)
        mu_hat = jax.tree.map(
            lambda m, g: beta * m + (1 - beta) * g,
            optax.tree.bias_correction(mu, beta, optax.safe_increment(count)),
            optax.tree.bias_correction(updates, beta, count),
        )

        def orthogonalise(x, dims):
            stacked, restore = _as_matrices(x, dims)
            ns = functools.partial(
                newton_schulz,
                coeffs=state.ns_coeffs,
                steps=ns_steps,
                eps=eps,
                operand_dtype=operand_dtype,
            )
            return restore(jax.vmap(ns)(stacked))

        directions = jax.tree.map(
            orthogonalise, mu_hat, dimension_numbers(updates), is_leaf=is_dimension_numbers
        )
        return directions, optax.contrib.MuonState(count, mu, state.ns_coeffs)

    return optax.GradientTransformation(init, update)


def scale_by_width(dimension_numbers: Callable[[Params], Params]) -> optax.GradientTransformation:
    """Each update times sqrt(max(1, O / I)) of the matrices `dimension_numbers(updates)` reads
    it as (Jordan's width scaling; optax.contrib's scale_by_shape without consistent_rms)."""

    def update(updates, state, params=None):
        del params

        def scale(x, dims):
            fan_in, fan_out = _fans(x, dims)
            return jnp.sqrt(jnp.maximum(1, fan_out / fan_in)) * x

        dims = dimension_numbers(updates)
        return jax.tree.map(scale, updates, dims, is_leaf=is_dimension_numbers), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def is_dimension_numbers(node: Any) -> bool:
    """Whether a node of `muon_dimension_numbers`' tree is a leaf of it (None: AdamW's)."""
    return node is None or isinstance(node, optax.contrib.MuonDimensionNumbers)
