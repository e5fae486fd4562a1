"""Attention's math and its swappable parts: the causal mask, softmax(q·kᵀ/√K)·v, and the
registries `ATTENTION_MASKS` and `ATTENTION_SCORES` (their variants, the document mask and the
ALiBi, soft-cap and relative scores, live in model/variants/attention.py, named here).

A mask entry is one function `(q_positions_BxT, k_positions_BxS, cfg) -> mask_Bx1xTxS` (True:
the query may attend to the key; None: every key), used by training, evaluation and the KV
cache alike (empty cache slots are masked apart). An `AttentionMask(fn, documents=True)` also
receives each token's document (`fn(q_positions, k_positions, cfg, q_segments_BxT,
k_segments_BxS)`: the count of end-of-text tokens before it) and packs documents: positions
restart at each document, and no target crosses a boundary (`model.gpt.documents`); the
built-in `document` is causal attention within each document.

A score entry is one function `(scores_BxHxTxS, q_positions_BxT, k_positions_BxS, cfg) ->
scores_BxHxTxS` over the raw scores q·kᵀ/√K (float32), applied before the mask and the softmax,
in training, evaluation and the KV cache alike; or a flax module class with a `cfg` field, called
the same way inside the attention module (its parameters live under `attn/score`).

`explicit_attention` is the plain kernel; `AttentionKernel` is the entry shape of
model.attention's registry, whose fused kernels (XLA's, cuDNN's) and "auto" choice are the
speed room's (model/speed/kernels.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from minigpt_jax.model import param_meta
from minigpt_jax.model.config import NO_SCORE, GPTConfig
from minigpt_jax.settings.registry import (
    Builtin,
    ContractError,
    Registry,
    expect_shape,
)

Array = chex.Array


# ----------------------------------------------------------------------------- masks


def causal_mask(q_positions_BxT: Array, k_positions_BxS: Array) -> Array:
    """mask_Bx1xTxS: query at position t may see keys at positions <= t."""
    return k_positions_BxS[:, None, None, :] <= q_positions_BxT[:, None, :, None]


@dataclasses.dataclass(frozen=True)
class AttentionMask:
    """A mask function and whether, over positions 0..T-1, it is exactly the causal triangle
    (then fused kernels build it themselves, `is_causal`, instead of reading an array)."""

    fn: Callable[..., Array | None]
    causal_triangle: bool = False
    # fn also takes (q_segments_BxT, k_segments_BxS): the documents of packed sequences
    documents: bool = False


def _causal_or_full(q_positions_BxT: Array, k_positions_BxS: Array, cfg: GPTConfig):
    """The causal mask, or None (every key) when cfg.causal is False."""
    return causal_mask(q_positions_BxT, k_positions_BxS) if cfg.causal else None


def _mask_contract(mask: AttentionMask, cfg: GPTConfig) -> None:
    """mask.fn(q_positions_BxT, k_positions_BxS, cfg) is None or a bool array broadcasting to
    (B, H, T, S) with its last two axes T and S (S > T: the KV cache's keys)."""
    b, t, s = 2, 5, 7
    q_positions_BxT = jax.ShapeDtypeStruct((b, t), jnp.int32)
    k_positions_BxS = jax.ShapeDtypeStruct((b, s), jnp.int32)
    if mask.documents:  # the segments have the positions' shapes
        out = jax.eval_shape(
            lambda q, k: mask.fn(q, k, cfg, q, k), q_positions_BxT, k_positions_BxS
        )
    else:
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
    {
        "causal": AttentionMask(_causal_or_full, causal_triangle=True),
        "document": Builtin("minigpt_jax.model.variants.attention:DOCUMENT"),
    },
    entry_class=AttentionMask,
    arity=3,
    shape="a function (q_positions_BxT, k_positions_BxS, cfg) -> mask_Bx1xTxS (bool) or None, "
    "or an attention_fns.AttentionMask",
    contract=_mask_contract,
)


# ----------------------------------------------------------------------------- scores

ScoreFn = Callable[[Array, Array, Array, "GPTConfig"], Array]


def no_score(
    scores_BxHxTxS: Array, q_positions_BxT: Array, k_positions_BxS: Array, cfg: GPTConfig
) -> Array:
    """The raw scores unchanged (the default)."""
    return scores_BxHxTxS


def _as_score(value: Any) -> Any:
    if isinstance(value, type) and issubclass(value, nn.Module):
        return value
    if callable(value):
        return value
    raise TypeError(
        "an attention score must be a function (scores_BxHxTxS, q_positions_BxT, "
        "k_positions_BxS, cfg) -> scores_BxHxTxS, or a flax module class with a cfg field "
        f"called so, got {type(value).__name__}."
    )


def _score_contract(entry: Any, cfg: GPTConfig) -> None:
    """entry(scores_BxHxTxS, q_positions_BxT, k_positions_BxS, cfg) is float scores of the same
    shape (S > T: the KV cache's keys); a module entry's parameters each declare their
    metadata."""
    b, t, s = 2, 5, 7
    scores = jax.ShapeDtypeStruct((b, cfg.n_head, t, s), jnp.float32)
    q_positions = jax.ShapeDtypeStruct((b, t), jnp.int32)
    k_positions = jax.ShapeDtypeStruct((b, s), jnp.int32)
    if isinstance(entry, type) and issubclass(entry, nn.Module):
        module = entry(cfg)
        out, variables = jax.eval_shape(
            lambda *a: module.init_with_output(jax.random.key(0), *a, cfg),
            scores,
            q_positions,
            k_positions,
        )
        _check_declared(variables)
    else:
        out = jax.eval_shape(lambda *a: entry(*a, cfg), scores, q_positions, k_positions)
    expect_shape(out, scores.shape, "its scores (scores_BxHxTxS in)", dtype_kind="f")


def _check_declared(variables: Any) -> None:
    try:
        param_meta.metadata(variables.get("params", {}), ("block_0", "attn", "score"))
    except param_meta.UndeclaredParameterError as error:
        raise ContractError(str(error).rstrip(".")) from None


ATTENTION_SCORES: Registry[Any] = Registry(
    "attention score",
    "model.attention_score",
    {
        NO_SCORE: no_score,
        "alibi": Builtin("minigpt_jax.model.variants.attention:alibi"),
        "softcap": Builtin("minigpt_jax.model.variants.attention:softcap"),
        "relative": Builtin("minigpt_jax.model.variants.attention:RelativeBias"),
    },
    coerce=_as_score,
    shape="a function (scores_BxHxTxS, q_positions_BxT, k_positions_BxS, cfg) -> "
    "scores_BxHxTxS, or a flax module class with a cfg field called so",
    contract=_score_contract,
)


def score_fn(cfg: GPTConfig) -> ScoreFn | None:
    """cfg.attention_score's function (a module entry instantiated as `score`: call it inside
    the attention module's compact scope), or None for "none"."""
    if cfg.attention_score == NO_SCORE:
        return None
    entry = ATTENTION_SCORES[cfg.attention_score]
    if isinstance(entry, type) and issubclass(entry, nn.Module):
        return entry(cfg, name="score")
    return entry


# ----------------------------------------------------------------------------- kernels


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


KernelFn = Callable[..., Array]


@dataclasses.dataclass(frozen=True)
class AttentionKernel:
    """A kernel's function and how it is called and when "auto" picks it.

    fn: (q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask | None, *, causal, score) -> out_BxTxHxK, with
    mask as `speed.kernels.fused_attention` takes it, causal the top-left triangle and score
    None or a function over the raw scores_BxHxTxS.
    explicit: the einsum + softmax path, which can return the weights and drop them out (the
    attention module runs it itself rather than calling fn).
    takes_any_mask: it reads an arbitrary mask array (the KV cache's, a custom mask entry's);
    one that cannot falls back to XLA's kernel for such calls.
    takes_score: it applies an attention score; one that does not is refused with any score
    but "none" (naming model.attention=explicit).
    picks: (cfg, weight_dropout, plain_mask) -> whether "auto" takes it; entries are asked in
    table order. plain_mask: no mask or the causal triangle over positions 0..T-1.
    """

    fn: KernelFn
    explicit: bool = False
    takes_any_mask: bool = True
    takes_score: bool = False
    picks: Callable[[GPTConfig, bool, bool], bool] = lambda cfg, dropout, plain: False
