"""Attention's swappable parts: masks and kernels, the registries `ATTENTION_MASKS` and
`ATTENTION_KERNELS`, and the "auto" kernel choice read from the kernels' entries.

A mask entry is one function `(q_positions_BxT, k_positions_BxS, cfg) -> mask_Bx1xTxS` (True:
the query may attend to the key; None: every key), used by training, evaluation and the KV
cache alike (empty cache slots are masked apart). A kernel computes softmax(q·kᵀ/√K)·v.
`config.model.attention_mask` picks the mask (`module:attr` for your own) and
`config.model.attention` the kernel ("auto": the first entry whose `picks` says yes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp

from minigpt_jax.model import backend
from minigpt_jax.registry import ContractError, Registry

Array = chex.Array
GPTConfig = Any  # a config.GPTConfig (config imports this module, not the other way)


# ----------------------------------------------------------------------------- masks


def causal_mask(q_positions_BxT: Array, k_positions_BxS: Array) -> Array:
    """mask_Bx1xTxS: query at position t may see keys at positions <= t."""
    return k_positions_BxS[:, None, None, :] <= q_positions_BxT[:, None, :, None]


@dataclasses.dataclass(frozen=True)
class AttentionMask:
    """A mask function and whether, over positions 0..T-1, it is exactly the causal triangle
    (then fused kernels build it themselves, `is_causal`, instead of reading an array)."""

    fn: Callable[[Array, Array, GPTConfig], Array | None]
    causal_triangle: bool = False


def _causal_or_full(q_positions_BxT: Array, k_positions_BxS: Array, cfg: GPTConfig):
    """The causal mask, or None (every key) when cfg.causal is False."""
    return causal_mask(q_positions_BxT, k_positions_BxS) if cfg.causal else None


def _mask_contract(mask: AttentionMask, cfg: GPTConfig) -> None:
    """mask.fn(q_positions_BxT, k_positions_BxS, cfg) is None or a bool array broadcasting to
    (B, H, T, S) with its last two axes T and S (S > T: the KV cache's keys)."""
    b, t, s = 2, 5, 7
    q_positions_BxT = jax.ShapeDtypeStruct((b, t), jnp.int32)
    k_positions_BxS = jax.ShapeDtypeStruct((b, s), jnp.int32)
    out = jax.eval_shape(lambda q, k: mask.fn(q, k, cfg), q_positions_BxT, k_positions_BxS)
    if out is None:
        return
    shape, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
    if shape is None or dtype != jnp.bool_:
        raise ContractError(f"it returned {type(out).__name__} {dtype}, not a bool mask or None")
    full = (b, cfg.n_head, t, s)
    fits = len(shape) == 4 and tuple(shape[2:]) == (t, s)
    if not fits or any(n not in (1, m) for n, m in zip(shape, full, strict=True)):
        raise ContractError(
            f"its mask has shape {tuple(shape)} for B={b}, T={t} queries and S={s} keys; it "
            f"must broadcast to (B, H, T, S) = {full}, e.g. (B, 1, T, S)"
        )


ATTENTION_MASKS: Registry[AttentionMask] = Registry(
    "attention mask",
    "model.attention_mask",
    {"causal": AttentionMask(_causal_or_full, causal_triangle=True)},
    entry_class=AttentionMask,
    arity=3,
    shape="a function (q_positions_BxT, k_positions_BxS, cfg) -> mask_Bx1xTxS (bool) or None, "
    "or an attention_fns.AttentionMask",
    contract=_mask_contract,
)


# ----------------------------------------------------------------------------- kernels


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
    path and for masks other than the triangle, where XLA takes it. Neither returns the weights
    nor drops them out.
    """
    return jax.nn.dot_product_attention(
        q_BxTxHxK,
        k_BxSxHxK,
        v_BxSxHxK,
        mask=mask,
        is_causal=causal,
        implementation=implementation,
    )


@dataclasses.dataclass(frozen=True)
class AttentionKernel:
    """How a kernel is called and when "auto" picks it.

    explicit: the einsum + softmax path, which can return the weights and drop them out (the
    attention module runs it itself); else `fused_attention` with this implementation.
    takes_any_mask: it reads an arbitrary mask array (the KV cache's, a custom mask entry's);
    one that cannot falls back to XLA's kernel for such calls.
    picks: (cfg, weight_dropout, plain_mask) -> whether "auto" takes it; entries are asked in
    table order. plain_mask: no mask or the causal triangle over positions 0..T-1.
    """

    explicit: bool
    takes_any_mask: bool
    picks: Callable[[GPTConfig, bool, bool], bool]


ATTENTION_KERNELS: Registry[AttentionKernel] = Registry(
    "attention kernel",
    "model.attention",
    {
        # cuDNN flash attention where it runs; never while weights are dropped out.
        "cudnn": AttentionKernel(
            explicit=False,
            takes_any_mask=False,
            picks=lambda cfg, dropout, plain: (
                plain and not dropout and backend.cudnn_attention_supported(cfg)
            ),
        ),
        # On CPU XLA compiles the explicit path with fewer copies than dot_product_attention's
        # and runs it faster (benchmarks/README.md); only it drops out attention weights.
        "explicit": AttentionKernel(
            explicit=True,
            takes_any_mask=True,
            picks=lambda cfg, dropout, plain: dropout or jax.default_backend() == "cpu",
        ),
        "xla": AttentionKernel(
            explicit=False, takes_any_mask=True, picks=lambda cfg, dropout, plain: True
        ),
    },
)
AUTO = "auto"


def choose_kernel(cfg: GPTConfig, *, weight_dropout: bool, cached: bool, plain_mask: bool = True):
    """The kernel a call takes: cfg.attention, or for "auto" the first entry that `picks` it.

    cached: the KV-cache path, whose mask (left padding, causality by position) cuDNN's causal
    and sequence-length masks cannot express: a kernel without `takes_any_mask` gives way to
    XLA's there, and for masks other than the triangle (a one-token decode step is bound by
    reading the cache anyway).
    """
    plain = plain_mask and not cached
    if cfg.attention != AUTO:
        kernel = ATTENTION_KERNELS[cfg.attention]
        return cfg.attention if plain or kernel.takes_any_mask else "xla"
    for name in ATTENTION_KERNELS:
        kernel = ATTENTION_KERNELS[name]
        if (plain or kernel.takes_any_mask) and kernel.picks(cfg, weight_dropout, plain):
            return name
    return "xla"
