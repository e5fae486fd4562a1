"""Attention's math: the causal mask and softmax(q·kᵀ/√K)·v.

`explicit_attention` is the plain kernel the default path reads. Which keys a query sees is
picked in model/attention_masks.py (`ATTENTION_MASKS`: causal, by default), what is added to the
raw scores in model/attention_scores.py (`ATTENTION_SCORES`: none, by default), and the fused
kernels that stand in for this path, with their "auto" choice, in model/speed/kernels.py.
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp

Array = chex.Array


def causal_mask(q_positions_BxT: Array, k_positions_BxS: Array) -> Array:
    """mask_Bx1xTxS: query at position t may see keys at positions <= t."""
    return k_positions_BxS[:, None, None, :] <= q_positions_BxT[:, None, :, None]


def attention_weights(
    q_BxTxHxK: Array,
    k_BxSxHxK: Array,
    mask: Array | None = None,
    score: Callable[[Array], Array] | None = None,
) -> Array:
    """softmax(score(q·kᵀ / sqrt(K))) over keys, computed in float32: weights_BxHxTxS.

    score: scores_BxHxTxS -> scores_BxHxTxS (an attention-score entry bound to its positions),
    applied before the mask; mask broadcasts to (B, H, T, S); False entries get zero weight.
    """
    scale = q_BxTxHxK.shape[-1] ** -0.5
    scores_BxHxTxS = jnp.einsum(
        "bthk,bshk->bhts", q_BxTxHxK, k_BxSxHxK, preferred_element_type=jnp.float32
    )
    scores_BxHxTxS = scores_BxHxTxS * scale
    if score is not None:
        scores_BxHxTxS = score(scores_BxHxTxS)
    if mask is not None:
        scores_BxHxTxS = jnp.where(mask, scores_BxHxTxS, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(scores_BxHxTxS, axis=-1)


def mix_values(weights_BxHxTxS: Array, v_BxSxHxK: Array) -> Array:
    """out_BxTxHxK = Σ_s weights[b, h, t, s] · v[b, s, h]."""
    return jnp.einsum("bhts,bshk->bthk", weights_BxHxTxS.astype(v_BxSxHxK.dtype), v_BxSxHxK)


def _triangle(mask: Array | None, causal: bool, length: int, keys: int) -> Array | None:
    if not causal:
        return mask
    triangle_TxS = jnp.tril(jnp.ones((length, keys), bool))
    return triangle_TxS if mask is None else mask & triangle_TxS


def explicit_attention(
    q_BxTxHxK: Array,
    k_BxSxHxK: Array,
    v_BxSxHxK: Array,
    mask: Array | None,
    *,
    causal: bool,
    score: Callable[[Array], Array] | None = None,
) -> Array:
    """out_BxTxHxK = `mix_values(attention_weights(q, k, mask, score), v)`; causal adds the
    top-left triangle. (The attention module runs this path itself, to sow and drop out the
    weights.)"""
    mask = _triangle(mask, causal, q_BxTxHxK.shape[1], k_BxSxHxK.shape[1])
    return mix_values(attention_weights(q_BxTxHxK, k_BxSxHxK, mask, score), v_BxSxHxK)
