"""Attention variants, registered in attention_masks' and attention_scores' registries by
name (`Builtin`) and imported only when a config picks one: the document mask (packed
documents) and the attention scores ALiBi, soft-cap and T5's relative bias.
"""

from __future__ import annotations

import dataclasses

import chex
import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from minigpt_jax.model.attention import causal_mask
from minigpt_jax.model.attention_masks import AttentionMask
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.param_meta import declare
from minigpt_jax.settings.groups import MODEL, options_of, setting
from minigpt_jax.settings.registry import declares

Array = chex.Array


# ----------------------------------------------------------------------------- masks


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


# model.attention_mask "document": causal attention within each packed document.
DOCUMENT = AttentionMask(same_document_causal, documents=True)


# ----------------------------------------------------------------------------- scores


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
