"""The attention-score registry `ATTENTION_SCORES`: what is done to the raw scores q·kᵀ/√K.

A score entry is one function `(scores_BxHxTxS, q_positions_BxT, k_positions_BxS, cfg) ->
scores_BxHxTxS` over the raw scores (float32), applied before the mask and the softmax, in
training, evaluation and the KV cache alike; or a flax module class with a `cfg` field, called
the same way inside the attention module (its parameters live under `attn/score`). The default,
"none", applies none; ALiBi, soft-cap and the relative bias are model/variants/attention.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from minigpt_jax.model import param_meta
from minigpt_jax.model.config import NO_SCORE, GPTConfig
from minigpt_jax.settings.registry import Builtin, ContractError, Registry, expect_shape

Array = chex.Array
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
