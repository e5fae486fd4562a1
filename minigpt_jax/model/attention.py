"""Multi-head self-attention: its math (the causal mask, softmax(q·kᵀ/√K)·v), the linen module
and its KV cache.

The module's parts are public, for attention modules of one's own: `project_qkv` (the fused
q/k/v projection), `mask_for` (which keys each query sees), `project_out` (the heads joined and
projected back). Another mask or a score on the raw scores is an entry of
`attention_masks.ATTENTION_MASKS` or `attention_scores.ATTENTION_SCORES`, read only when picked;
a fused kernel of the speed room (model/speed/kernels.py) stands in for the softmax path in one
call, where "auto" picks one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from minigpt_jax.model.attention_scores import score_fn
from minigpt_jax.model.config import CAUSAL, NO_SCORE, STANDARD, GPTConfig
from minigpt_jax.model.layers import INIT_STDDEV, dense_options, residual_init, rms_normalize
from minigpt_jax.model.param_meta import declare
from minigpt_jax.model.parametrization import scale_queries

Array = chex.Array
ATTENTION = ("attention",)  # the tag of every parameter of the attention (param_meta)
QKV_INIT = nn.initializers.normal(stddev=INIT_STDDEV)  # of the q, k and v kernels

__all__ = [
    "KVCache",
    "MultiHeadAttention",
    "attention_weights",
    "causal_mask",
    "expand_kv_heads",
    "explicit_attention",
    "mask_for",
    "mix_values",
    "project_out",
    "project_qkv",
]


# ----------------------------------------------------------------------------- the math


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


def _with_triangle(mask: Array | None, causal: bool, length: int, keys: int) -> Array | None:
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
    mask = _with_triangle(mask, causal, q_BxTxHxK.shape[1], k_BxSxHxK.shape[1])
    return mix_values(attention_weights(q_BxTxHxK, k_BxSxHxK, mask, score), v_BxSxHxK)


# ----------------------------------------------------------------------------- the module


class KVCache(NamedTuple):
    """One layer's keys and values for S slots, written in order from slot 0 by `write`.

    The layout, for attention modules of one's own: k_BxSxGxK and v_BxSxGxK hold G = cfg.kv_heads
    key/value heads (H without grouped-query attention, fewer with `n_kv_head`) of width K;
    positions_BxS holds each slot's token position, and -1 marks a slot that is empty or holds
    left padding, never attended to; `index` is the next slot to write. A module reads the
    filled slots by masking with `positions_BxS >= 0`, and widens G heads to its H query heads
    with `expand_kv_heads`.
    """

    k_BxSxGxK: Array
    v_BxSxGxK: Array
    positions_BxS: Array
    index: Array

    @classmethod
    def empty(cls, cfg: GPTConfig, batch: int, length: int) -> KVCache:
        kv_BxSxGxK = jnp.zeros((batch, length, cfg.kv_heads, cfg.head_dim), cfg.compute_dtype)
        return cls(
            kv_BxSxGxK,
            kv_BxSxGxK,
            jnp.full((batch, length), -1, jnp.int32),
            jnp.zeros((), jnp.int32),
        )

    def write(self, k_BxTxGxK: Array, v_BxTxGxK: Array, positions_BxT: Array) -> KVCache:
        """The cache with T new keys, values and positions in slots index .. index+T-1."""
        chex.assert_shape(positions_BxT, k_BxTxGxK.shape[:2])
        chex.assert_equal_shape([k_BxTxGxK, v_BxTxGxK])
        chex.assert_shape(k_BxTxGxK, (None, None, *self.k_BxSxGxK.shape[2:]))

        def put(buf, new):
            return jax.lax.dynamic_update_slice_in_dim(buf, new.astype(buf.dtype), self.index, 1)

        return KVCache(
            put(self.k_BxSxGxK, k_BxTxGxK),
            put(self.v_BxSxGxK, v_BxTxGxK),
            put(self.positions_BxS, positions_BxT),
            self.index + positions_BxT.shape[1],
        )

    def extended(self, length: int) -> KVCache:
        """The cache with empty slots appended up to `length` slots."""

        def pad(x_BxSx, value):
            widths = [(0, 0), (0, length - x_BxSx.shape[1])] + [(0, 0)] * (x_BxSx.ndim - 2)
            return jnp.pad(x_BxSx, widths, constant_values=value)

        return self._replace(
            k_BxSxGxK=pad(self.k_BxSxGxK, 0),
            v_BxSxGxK=pad(self.v_BxSxGxK, 0),
            positions_BxS=pad(self.positions_BxS, -1),
        )


def expand_kv_heads(x_BxSxGxK: Array, n_head: int) -> Array:
    """x_BxSxHxK: each of the G key/value heads repeated for its n_head / G query heads, so query
    head h reads kv head h // (H / G) (LLaMA's `repeat_kv` order); the input itself when G = H."""
    groups = x_BxSxGxK.shape[2]
    if groups == n_head:
        return x_BxSxGxK
    return jnp.repeat(x_BxSxGxK, n_head // groups, axis=2)


class MultiHeadAttention(nn.Module):
    """Self-attention with H heads of width K = D / H, masked by cfg.attention_mask's entry
    (causal unless cfg.causal is False), its raw scores through cfg.attention_score's entry.

    `cfg.attention_mask` picks the mask, `cfg.attention_score` the score function (with the
    query and key positions: the cache's for the KV-cache path) and
    `speed.kernels.choose_kernel` the kernel (once per config: `cfg.parts.speed.kernels`). The
    explicit path sows the attention weights (B, H, T, S) into the 'intermediates' collection
    as `attention_weights`; see `model.forward_with_attention`, which asks for it.

    Returns `(out_BxTxD, cache)`. With a `cache` the T new keys and values are written at
    `cache.index` and the queries attend to every filled slot (positions_BxT must then be
    (B, T); negative ones mark padding); without one the returned cache is None.
    `segments_BxT` (packed documents, a mask with `documents=True`) goes to the mask.
    """

    cfg: GPTConfig

    @nn.compact
    def __call__(
        self,
        x_BxTxD: Array,
        positions_BxT: Array,
        *,
        deterministic: bool = True,
        cache: KVCache | None = None,
        segments_BxT: Array | None = None,
    ) -> tuple[Array, KVCache | None]:
        cfg = self.cfg
        # qkv: projected, QK-normed (cfg.qk_norm), rotated by a rotary encoding (RoPE's).
        q_BxTxHxK, k_BxTxGxK, v_BxTxGxK = project_qkv(cfg, x_BxTxD)
        if cfg.qk_norm:
            q_BxTxHxK, k_BxTxGxK = rms_normalize(q_BxTxHxK), rms_normalize(k_BxTxGxK)
        rotary = cfg.parts.position.rotary
        if rotary is not None:
            q_BxTxHxK = rotary(q_BxTxHxK, positions_BxT, cfg)
            k_BxTxGxK = rotary(k_BxTxGxK, positions_BxT, cfg)

        # The parametrization's factor on the scores (μP's √K_base/K for 1/√K); standard: none.
        if cfg.parametrization != STANDARD:
            q_BxTxHxK = scale_queries(q_BxTxHxK, cfg)

        # The keys: this call's, or (written into it first) every slot of the cache.
        k_BxSxGxK, v_BxSxGxK, k_positions_BxS = k_BxTxGxK, v_BxTxGxK, positions_BxT
        if cache is not None:
            cache = cache.write(k_BxTxGxK, v_BxTxGxK, positions_BxT)
            k_BxSxGxK, v_BxSxGxK, k_positions_BxS = cache[:3]
        k_BxSxHxK, v_BxSxHxK = k_BxSxGxK, v_BxSxGxK
        if cfg.kv_heads != cfg.n_head:  # grouped-query attention: each kv head serves H / G
            k_BxSxHxK = expand_kv_heads(k_BxSxGxK, cfg.n_head)
            v_BxSxHxK = expand_kv_heads(v_BxSxGxK, cfg.n_head)

        # The mask (broadcasting to B, H, T, S; None: every key), and whether it is the triangle.
        mask, triangle = mask_for(cfg, positions_BxT, k_positions_BxS, segments_BxT, cache)

        # scores -> softmax -> mix, through the kernel chosen for this kind of call; the
        # explicit path sows its weights (B, H, T, S) as `attention_weights` and drops them out.
        weight_dropout = not deterministic and cfg.dropout > 0
        kernel = cfg.parts.speed.kernels[
            weight_dropout, cache is not None, mask is None or triangle
        ]
        score = None  # the raw scores' entry, bound to the positions (none by default)
        if cfg.attention_score != NO_SCORE:
            entry_score = score_fn(cfg)

            def score(scores_BxHxTxS):
                return entry_score(scores_BxHxTxS, positions_BxT, k_positions_BxS, cfg)

        if kernel.explicit:
            weights_BxHxTxS = attention_weights(q_BxTxHxK, k_BxSxHxK, mask, score)
            self.sow("intermediates", "attention_weights", weights_BxHxTxS)
            weights_BxHxTxS = nn.Dropout(cfg.dropout)(weights_BxHxTxS, deterministic=deterministic)
            out_BxTxHxK = mix_values(weights_BxHxTxS, v_BxSxHxK)
        else:  # choose_kernel never hands a score to a kernel that does not take one
            out_BxTxHxK = kernel.fn(
                q_BxTxHxK,
                k_BxSxHxK,
                v_BxSxHxK,
                None if triangle else mask,
                causal=triangle,
                score=score,
            )

        return project_out(cfg, out_BxTxHxK), cache


def mask_for(
    cfg: GPTConfig,
    positions_BxT: Array,
    k_positions_BxS: Array,
    segments_BxT: Array | None = None,
    cache: KVCache | None = None,
) -> tuple[Array | None, bool]:
    """(mask, triangle): which keys each query sees, broadcasting to (B, H, T, S) (None: every
    key), and whether it is the causal triangle over positions 0..T-1 (then a fused kernel
    builds it itself, `is_causal`: cuDNN skips its masked blocks instead of reading one).

    The default is the causal mask (every key when cfg.causal is False); another
    cfg.attention_mask, or a `cache`, is `entry_mask`'s."""
    if cfg.attention_mask != CAUSAL or cache is not None:
        return entry_mask(cfg, positions_BxT, k_positions_BxS, segments_BxT, cache)
    if not cfg.causal:
        return None, False
    return causal_mask(positions_BxT, k_positions_BxS), True


def entry_mask(
    cfg: GPTConfig,
    positions_BxT: Array,
    k_positions_BxS: Array,
    segments_BxT: Array | None = None,
    cache: KVCache | None = None,
) -> tuple[Array | None, bool]:
    """`mask_for`'s (mask, triangle) from cfg.attention_mask's `ATTENTION_MASKS` entry over the
    query and key positions (`segments_BxT`: packed documents); with a `cache` (its key
    positions, `k_positions_BxS`) only its filled slots are seen, and a sample continues one
    document, document 0."""
    mask_entry = cfg.parts.mask
    documents = () if segments_BxT is None else (segments_BxT, segments_BxT)
    if cache is not None and mask_entry.documents:
        documents = (jnp.zeros_like(positions_BxT), jnp.zeros_like(k_positions_BxS))
    mask = mask_entry.fn(positions_BxT, k_positions_BxS, cfg, *documents)
    if cache is not None:
        filled_Bx1x1xS = (k_positions_BxS >= 0)[:, None, None, :]
        mask = filled_Bx1x1xS if mask is None else filled_Bx1x1xS & mask
    return mask, cache is None and mask is not None and mask_entry.causal_triangle


def project_out(cfg: GPTConfig, out_BxTxHxK: Array) -> Array:
    """out_BxTxD: the heads joined and projected back to D (GPT-2's c_proj)."""
    return nn.DenseGeneral(
        cfg.n_embd,
        axis=(-2, -1),
        kernel_init=declare(
            residual_init(cfg),
            ("tensor", None, None),
            muon=((0, 1), 2),
            decay=True,
            gpt2="h.{i}.attn.c_proj.weight",
            tags=ATTENTION,
        ),
        bias_init=declare(
            nn.initializers.zeros_init(), gpt2="h.{i}.attn.c_proj.bias", tags=ATTENTION
        ),
        name="proj",
        **dense_options(cfg),
    )(out_BxTxHxK)


def project_qkv(cfg: GPTConfig, x_BxTxD: Array) -> tuple[Array, Array, Array]:
    """(q_BxTxHxK, k_BxTxGxK, v_BxTxGxK): one fused (D, 3, H, K) projection (GPT-2's c_attn);
    `project_grouped_qkv`'s when fewer key/value heads serve groups of query heads (G < H)."""
    if cfg.kv_heads != cfg.n_head:
        return project_grouped_qkv(cfg, x_BxTxD)
    # The mesh's tensor axis splits the heads (minigpt_jax/sharding.py); Muon reads each
    # kernel as (D, H·K) matrices, one each for q, k and v.
    qkv_BxTx3xHxK = nn.DenseGeneral(
        (3, cfg.n_head, cfg.head_dim),
        kernel_init=declare(
            QKV_INIT,
            (None, None, "tensor", None),
            muon=(0, (2, 3)),
            decay=True,
            gpt2="h.{i}.attn.c_attn.weight",
            tags=ATTENTION,
        ),
        bias_init=declare(
            nn.initializers.zeros_init(),
            (None, "tensor", None),
            gpt2="h.{i}.attn.c_attn.bias",
            tags=ATTENTION,
        ),
        name="qkv",
        **dense_options(cfg),
    )(x_BxTxD)
    return qkv_BxTx3xHxK[:, :, 0], qkv_BxTx3xHxK[:, :, 1], qkv_BxTx3xHxK[:, :, 2]


def project_grouped_qkv(cfg: GPTConfig, x_BxTxD: Array) -> tuple[Array, Array, Array]:
    """(q_BxTxHxK, k_BxTxGxK, v_BxTxGxK) of grouped-query attention (cfg.n_kv_head = G < H): a
    query projection (D, H, K) and a key/value one (D, 2, G, K)."""
    q_BxTxHxK = nn.DenseGeneral(
        (cfg.n_head, cfg.head_dim),
        kernel_init=declare(
            QKV_INIT, (None, "tensor", None), muon=(0, (1, 2)), decay=True, tags=ATTENTION
        ),
        bias_init=declare(nn.initializers.zeros_init(), ("tensor", None), tags=ATTENTION),
        name="q",
        **dense_options(cfg),
    )(x_BxTxD)
    # G may be smaller than the tensor axis (multi-query: G = 1), so kv heads are not split.
    kv_BxTx2xGxK = nn.DenseGeneral(
        (2, cfg.kv_heads, cfg.head_dim),
        kernel_init=declare(
            QKV_INIT, (None, None, None, None), muon=(0, (2, 3)), decay=True, tags=ATTENTION
        ),
        bias_init=declare(nn.initializers.zeros_init(), (None, None, None), tags=ATTENTION),
        name="kv",
        **dense_options(cfg),
    )(x_BxTxD)
    return q_BxTxHxK, kv_BxTx2xGxK[:, :, 0], kv_BxTx2xGxK[:, :, 1]
