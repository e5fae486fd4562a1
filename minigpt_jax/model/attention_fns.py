"""Attention's swappable parts: masks, scores and kernels, the registries `ATTENTION_MASKS`,
`ATTENTION_SCORES` and `ATTENTION_KERNELS`, and the "auto" kernel choice read from the kernels'
entries.

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

A kernel computes softmax(score(q·kᵀ/√K))·v: an `AttentionKernel` holding its function. One
that cannot apply a score (`takes_score=False`: the fused ones) is refused with any score but
"none". `config.model.attention_mask`, `.attention_score` and `.attention` pick them
(`module:attr` for your own; "auto": the explicit path under a score, else the first kernel
whose `picks` says yes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from minigpt_jax.model import param_meta
from minigpt_jax.model.config import NO_SCORE, GPTConfig
from minigpt_jax.model.param_meta import declare
from minigpt_jax.settings.groups import MODEL, options_of, setting
from minigpt_jax.settings.registry import (
    ContractError,
    Registry,
    declares,
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


def same_document_causal(
    q_positions_BxT: Array,
    k_positions_BxS: Array,
    cfg: GPTConfig,
    q_segments_BxT: Array,
    k_segments_BxS: Array,
) -> Array:
    """mask_Bx1xTxS: a query sees the keys of its own document at positions <= its own (the
    positions restart at each document, so within one they still order the tokens)."""
    same_BxTxS = q_segments_BxT[:, :, None] == k_segments_BxS[:, None, :]
    return same_BxTxS[:, None] & causal_mask(q_positions_BxT, k_positions_BxS)


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
        "document": AttentionMask(same_document_causal, documents=True),
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


def alibi_slopes(n_head: int, max_bias: float = 8.0) -> np.ndarray:
    """slopes_H of ALiBi (Press et al. 2022, arXiv:2108.12409): the geometric sequence
    2^(-max_bias·h/n), h = 1..n, for n heads a power of two; otherwise those of the power of two
    below, then every other slope of the power of two above (their code's `get_slopes`)."""

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-max_bias * (h + 1) / n) for h in range(n)]

    if n_head & (n_head - 1) == 0:
        return np.asarray(power_of_two(n_head), np.float32)
    below = 2 ** int(np.floor(np.log2(n_head)))
    extra = power_of_two(2 * below)[0::2][: n_head - below]
    return np.asarray(power_of_two(below) + extra, np.float32)


@dataclasses.dataclass(frozen=True)
class AlibiOptions:
    """The built-in alibi score's own setting (`model.alibi_max_bias`)."""

    # Press et al. (2022): slopes 2^(-8h/H); 8 is the paper's.
    alibi_max_bias: float = setting(
        8.0, "ALiBi's slopes are 2^(-alibi_max_bias * h / H)", MODEL, low=0.0, low_open=True
    )


@declares(AlibiOptions)
def alibi(
    scores_BxHxTxS: Array, q_positions_BxT: Array, k_positions_BxS: Array, cfg: GPTConfig
) -> Array:
    """ALiBi: scores − slope_h · |q position − k position|, slopes `alibi_slopes(H,
    AlibiOptions.alibi_max_bias)` (with causal masking, −slope · (t − s) for the keys t sees)."""
    max_bias = options_of(cfg, AlibiOptions).alibi_max_bias
    slopes_H = jnp.asarray(alibi_slopes(scores_BxHxTxS.shape[1], max_bias))
    distance_BxTxS = jnp.abs(q_positions_BxT[:, :, None] - k_positions_BxS[:, None, :])
    bias_BxHxTxS = -slopes_H[None, :, None, None] * distance_BxTxS[:, None].astype(jnp.float32)
    return scores_BxHxTxS + bias_BxHxTxS


# Gemma 2 (Team et al. 2024) caps attention logits at 50.
@declares(
    attention_softcap=setting(
        50.0, "the cap of scores -> cap * tanh(scores / cap)", MODEL, low=0.0, low_open=True
    )
)
def softcap(
    scores_BxHxTxS: Array, q_positions_BxT: Array, k_positions_BxS: Array, cfg: GPTConfig
) -> Array:
    """Gemma 2's attention-logit soft cap (Team et al. 2024): cap · tanh(scores / cap), cap
    the entry's own setting model.attention_softcap."""
    cap = options_of(cfg, softcap).attention_softcap
    return cap * jnp.tanh(scores_BxHxTxS / cap)


def relative_bucket(relative_BxTxS: Array, causal: bool, num_buckets: int, max_distance: int):
    """T5's bucket of each relative position k − q (Raffel et al. 2020; mesh-tensorflow's
    `_relative_position_bucket`): exact buckets for small distances, logarithmic ones up to
    max_distance; bidirectional attention spends half the buckets on each side."""
    n = -relative_BxTxS
    bucket = jnp.zeros_like(n)
    if not causal:
        num_buckets //= 2
        bucket = bucket + (n < 0).astype(n.dtype) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    large = max_exact + (
        jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact)
        / np.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).astype(n.dtype)
    large = jnp.minimum(large, num_buckets - 1)
    return bucket + jnp.where(n < max_exact, n, large)


class RelativeBias(nn.Module):
    """T5's learned relative-position bias: scores + b[bucket(k − q), h], one table b (buckets,
    H) per layer at `attn/score/rel_bias` (AdamW, no decay; the tensor axis splits the heads)."""

    cfg: GPTConfig
    num_buckets: int = 32
    max_distance: int = 128

    @nn.compact
    def __call__(
        self,
        scores_BxHxTxS: Array,
        q_positions_BxT: Array,
        k_positions_BxS: Array,
        cfg: GPTConfig,
    ) -> Array:
        init = declare(nn.initializers.normal(0.02), (None, "tensor"), decay=False)
        table_NxH = self.param("rel_bias", init, (self.num_buckets, cfg.n_head), jnp.float32)
        relative_BxTxS = k_positions_BxS[:, None, :] - q_positions_BxT[:, :, None]
        bucket_BxTxS = relative_bucket(
            relative_BxTxS, cfg.causal, self.num_buckets, self.max_distance
        )
        bias_BxTxSxH = table_NxH[bucket_BxTxS]
        return scores_BxHxTxS + jnp.moveaxis(bias_BxTxSxH, -1, 1)


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
    {NO_SCORE: no_score, "alibi": alibi, "softcap": softcap, "relative": RelativeBias},
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
