"""The attention-mask registry `ATTENTION_MASKS`: which keys each query sees.

A mask entry is one function `(q_positions_BxT, k_positions_BxS, cfg) -> mask_Bx1xTxS` (True:
the query may attend to the key; None: every key), used by training, evaluation and the KV
cache alike (empty cache slots are masked apart). An `AttentionMask(fn, documents=True)` also
receives each token's document (`fn(q_positions, k_positions, cfg, q_segments_BxT,
k_segments_BxS)`: the count of end-of-text tokens before it) and packs documents: positions
restart at each document, and no target crosses a boundary (`model.gpt.documents`); the
built-in `document` is causal attention within each document (model/variants/attention.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp

from minigpt_jax.model.attention import causal_mask
from minigpt_jax.model.config import CAUSAL, GPTConfig
from minigpt_jax.settings.registry import Builtin, ContractError, Registry

Array = chex.Array


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
        CAUSAL: AttentionMask(_causal_or_full, causal_triangle=True),
        "document": Builtin("minigpt_jax.model.variants.attention:DOCUMENT"),
    },
    entry_class=AttentionMask,
    arity=3,
    shape="a function (q_positions_BxT, k_positions_BxS, cfg) -> mask_Bx1xTxS (bool) or None, "
    "or an attention_masks.AttentionMask",
    contract=_mask_contract,
)
