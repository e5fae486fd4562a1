"""Multi-head self-attention: pure score/mix functions and the linen module."""

from __future__ import annotations

from typing import NamedTuple

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from minigpt_jax import backend
from minigpt_jax.config import GPTConfig
from minigpt_jax.dense import INIT_STDDEV, dense_options, residual_init
from minigpt_jax.positions import POSITION_ENCODINGS

Array = chex.Array


def causal_mask(q_positions_BxT: Array, k_positions_BxS: Array) -> Array:
    """mask_Bx1xTxS: query at position t may see keys at positions <= t."""
    return k_positions_BxS[:, None, None, :] <= q_positions_BxT[:, None, :, None]


class KVCache(NamedTuple):
    """One layer's keys and values for S slots, written in order from slot 0.

    positions_BxS holds each slot's token position; -1 marks a slot that is empty or holds left
    padding, and such a slot is never attended to. `index` is the next slot to write.
    """

    k_BxSxHxK: Array
    v_BxSxHxK: Array
    positions_BxS: Array
    index: Array

    @classmethod
    def empty(cls, cfg: GPTConfig, batch: int, length: int) -> KVCache:
        kv_BxSxHxK = jnp.zeros((batch, length, cfg.n_head, cfg.head_dim), cfg.compute_dtype)
        return cls(
            kv_BxSxHxK,
            kv_BxSxHxK,
            jnp.full((batch, length), -1, jnp.int32),
            jnp.zeros((), jnp.int32),
        )

    def extended(self, length: int) -> KVCache:
        """The cache with empty slots appended up to `length` slots."""

        def pad(x_BxSx, value):
            widths = [(0, 0), (0, length - x_BxSx.shape[1])] + [(0, 0)] * (x_BxSx.ndim - 2)
            return jnp.pad(x_BxSx, widths, constant_values=value)

        return self._replace(
            k_BxSxHxK=pad(self.k_BxSxHxK, 0),
            v_BxSxHxK=pad(self.v_BxSxHxK, 0),
            positions_BxS=pad(self.positions_BxS, -1),
        )


def attention_weights(q_BxTxHxK: Array, k_BxSxHxK: Array, mask: Array | None = None) -> Array:
    """softmax(q·kᵀ / sqrt(K)) over keys, computed in float32: weights_BxHxTxS.

    mask broadcasts to (B, H, T, S); False entries get zero weight.
    """
    scale = q_BxTxHxK.shape[-1] ** -0.5
    scores_BxHxTxS = jnp.einsum(
        "bthk,bshk->bhts", q_BxTxHxK, k_BxSxHxK, preferred_element_type=jnp.float32
    )
    scores_BxHxTxS = scores_BxHxTxS * scale
    if mask is not None:
        scores_BxHxTxS = jnp.where(mask, scores_BxHxTxS, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(scores_BxHxTxS, axis=-1)


def mix_values(weights_BxHxTxS: Array, v_BxSxHxK: Array) -> Array:
    """out_BxTxHxK = Σ_s weights[b, h, t, s] · v[b, s, h]."""
    return jnp.einsum("bhts,bshk->bthk", weights_BxHxTxS.astype(v_BxSxHxK.dtype), v_BxSxHxK)


def fused_attention(
    q_BxTxHxK: Array,
    k_BxSxHxK: Array,
    v_BxSxHxK: Array,
    mask: Array | None,
    *,
    causal: bool,
    implementation: str,
) -> Array:
    """out_BxTxHxK = softmax(q·kᵀ / sqrt(K)) · v through `jax.nn.dot_product_attention`.

    implementation "xla" or "cudnn" (flash attention: bf16/fp16, head dim a multiple of 8).
    causal: query t sees keys 0..t (the top-left-aligned triangle, what self-attention over
    positions 0..T-1 needs); mask (broadcasting to B, H, T, S; False: no weight) is for the cache
    path, where XLA takes it. Neither returns the weights nor drops them out.
    """
    return jax.nn.dot_product_attention(
        q_BxTxHxK,
        k_BxSxHxK,
        v_BxSxHxK,
        mask=mask,
        is_causal=causal,
        implementation=implementation,
    )


class MultiHeadAttention(nn.Module):
    """Self-attention with H heads of width K = D / H; causal unless cfg.causal is False.

    `backend.attention` picks the kernel (cfg.attention). The explicit path sows the attention
    weights (B, H, T, S) into the 'intermediates' collection as `attention_weights`; see
    `model.forward_with_attention`, which asks for it.

    Returns `(out_BxTxD, cache)`. With a `cache` the T new keys and values are written at
    `cache.index` and the queries attend to every filled slot (positions_BxT must then be
    (B, T); negative ones mark padding); without one the returned cache is None.
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
    ) -> tuple[Array, KVCache | None]:
        cfg = self.cfg
        init = nn.initializers.normal(stddev=INIT_STDDEV)
        # The mesh's tensor axis splits the heads (minigpt_jax/sharding.py).
        qkv_BxTx3xHxK = nn.DenseGeneral(
            (3, cfg.n_head, cfg.head_dim),
            kernel_init=nn.with_partitioning(init, (None, None, "tensor", None)),
            bias_init=nn.with_partitioning(nn.initializers.zeros_init(), (None, "tensor", None)),
            name="qkv",
            **dense_options(cfg),
        )(x_BxTxD)
        q_BxTxHxK, k_BxTxHxK, v_BxTxHxK = (qkv_BxTx3xHxK[:, :, i] for i in range(3))
        rotary = POSITION_ENCODINGS[cfg.pos_encoding].rotary
        if rotary is not None:
            q_BxTxHxK = rotary(q_BxTxHxK, positions_BxT)
            k_BxTxHxK = rotary(k_BxTxHxK, positions_BxT)
        if cache is None:
            keys_BxSxHxK, v_BxSxHxK, mask = k_BxTxHxK, v_BxTxHxK, None
            if cfg.causal:
                mask = causal_mask(positions_BxT, positions_BxT)
        else:
            cache = _write(cache, k_BxTxHxK, v_BxTxHxK, positions_BxT)
            keys_BxSxHxK, v_BxSxHxK = cache.k_BxSxHxK, cache.v_BxSxHxK
            mask = (cache.positions_BxS >= 0)[:, None, None, :]
            if cfg.causal:
                mask = mask & causal_mask(positions_BxT, cache.positions_BxS)
        weight_dropout = not deterministic and cfg.dropout > 0
        path = backend.attention(cfg, weight_dropout=weight_dropout, cached=cache is not None)
        if path == "explicit":
            weights_BxHxTxS = attention_weights(q_BxTxHxK, keys_BxSxHxK, mask)
            self.sow("intermediates", "attention_weights", weights_BxHxTxS)
            weights_BxHxTxS = nn.Dropout(cfg.dropout)(weights_BxHxTxS, deterministic=deterministic)
            out_BxTxHxK = mix_values(weights_BxHxTxS, v_BxSxHxK)
        else:
            # Without a cache, positions are 0..T-1 and the causal mask is the triangle that
            # is_causal builds (cuDNN skips its masked blocks instead of reading a mask).
            out_BxTxHxK = fused_attention(
                q_BxTxHxK,
                keys_BxSxHxK,
                v_BxSxHxK,
                None if cache is None else mask,
                causal=cfg.causal and cache is None,
                implementation=path,
            )
        out_BxTxD = nn.DenseGeneral(
            cfg.n_embd,
            axis=(-2, -1),
            kernel_init=nn.with_partitioning(residual_init(cfg), ("tensor", None, None)),
            name="proj",
            **dense_options(cfg),
        )(out_BxTxHxK)
        return out_BxTxD, cache


def _write(cache: KVCache, k_BxTxHxK: Array, v_BxTxHxK: Array, positions_BxT: Array) -> KVCache:
    """The cache with T new keys, values and positions in slots index .. index+T-1."""
    chex.assert_shape(positions_BxT, k_BxTxHxK.shape[:2])

    def put(buf, new):
        return jax.lax.dynamic_update_slice_in_dim(buf, new.astype(buf.dtype), cache.index, 1)

    return KVCache(
        put(cache.k_BxSxHxK, k_BxTxHxK),
        put(cache.v_BxSxHxK, v_BxTxHxK),
        put(cache.positions_BxS, positions_BxT),
        cache.index + positions_BxT.shape[1],
    )
