"""Loss terms added to the next-token cross-entropy: the registry `LOSS_TERMS`.

A term is one function `(logits_ExV, targets_E) -> values_E`: a float32 value per scored token,
computed from that token's logits (float32, V columns) and its target id, inside the same
read-out as the cross-entropy (so `loss_chunk` chunks it too). A run's objective is

    mean(cross-entropy) + sum over terms of weight * mean(term)

and the loss returns `(objective, aux)`, aux holding the mean of the cross-entropy and of each
term by name, which the training loop logs (metrics.jsonl, TensorBoard) without naming them.
`config.loss.terms` picks terms as comma-separated `name[=weight]`, a name being a key of
`LOSS_TERMS` or `module:attr` of your own (a function, or a `LossTerm` to set its default weight).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp

from minigpt_jax.settings.registry import Registry, expect_shape, is_user_key

Array = chex.Array
TermFn = Callable[[Array, Array], Array]

# The aux key of the plain next-token cross-entropy, logged beside the terms.
CROSS_ENTROPY = "cross_entropy"


def cross_entropy(logits_ExV: Array, targets_E: Array) -> Array:
    """losses_E: -log softmax(logits)[target] per token, as
    optax.softmax_cross_entropy_with_integer_labels computes it (logsumexp minus the target's
    logit), but with the target's logit squeezed out rather than gathered at index 0: the
    gradient of that gather is a scatter of constants, which XLA folds at compile time, for
    seconds per million tokens."""
    target_logits_E = jnp.take_along_axis(logits_ExV, targets_E[:, None], axis=-1).squeeze(-1)
    return jax.nn.logsumexp(logits_ExV, axis=-1) - target_logits_E


@dataclasses.dataclass(frozen=True)
class LossTerm:
    """A per-token term and the weight it gets when `loss.terms` gives none."""

    per_token: TermFn
    weight: float = 1.0


def z_loss(logits_ExV: Array, targets_E: Array) -> Array:
    """log²Z, Z the softmax's normaliser: keeps the logits from drifting (PaLM, Chowdhery et
    al. 2022, section 5: weight 1e-4)."""
    del targets_E
    return jnp.square(jax.nn.logsumexp(logits_ExV, axis=-1))


def _term_contract(term: LossTerm, loss: Any) -> None:
    """term.per_token(logits_ExV, targets_E) is values_E: one float per scored token."""
    del loss
    logits_ExV = jax.ShapeDtypeStruct((6, 11), jnp.float32)
    targets_E = jax.ShapeDtypeStruct((6,), jnp.int32)
    values = jax.eval_shape(term.per_token, logits_ExV, targets_E)
    expect_shape(values, (6,), "its values_E (logits_ExV (6, 11) in)", dtype_kind="f")


def _term_keys(spec: str) -> list[str]:
    """The keys of `loss.terms`' comma-separated name[=weight] items."""
    return [item.partition("=")[0].strip() for item in spec.split(",") if item.strip()]


LOSS_TERMS: Registry[LossTerm] = Registry(
    "loss term",
    "loss.terms",
    {"z_loss": LossTerm(z_loss, weight=1e-4)},
    entry_class=LossTerm,
    arity=2,
    shape="a function (logits_ExV, targets_E) -> values_E (one value per token) or a LossTerm",
    contract=_term_contract,
    split=_term_keys,
)


def parse_terms(spec: str) -> tuple[tuple[str, float], ...]:
    """`loss.terms` as ((key, weight), ...), every key resolved (raises ValueError naming the
    term and the fix). Hashable: the compiled step closes over it."""
    terms = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        key, has_weight, weight_text = item.partition("=")
        key = key.strip()
        entry = LOSS_TERMS[key]
        if has_weight:
            try:
                weight = float(weight_text)
            except ValueError:
                raise ValueError(
                    f"config.loss.terms: the weight of {key!r} is {weight_text!r}, not a number; "
                    f"write name=weight, e.g. z_loss=1e-4."
                ) from None
        else:
            weight = entry.weight
        if not jnp.isfinite(weight):
            raise ValueError(f"config.loss.terms: the weight of {key!r} must be finite.")
        terms.append((key, weight))
    names = [term_name(key) for key, _ in terms]
    if len(set(names)) != len(names) or CROSS_ENTROPY in names:
        raise ValueError(
            f"config.loss.terms={spec!r} names a term twice (or one called {CROSS_ENTROPY!r}): "
            "each term is logged under its name, so names must differ."
        )
    return tuple(terms)


def term_name(key: str) -> str:
    """The name a term is logged under: its registry key, or `attr` of `module:attr`."""
    return key.rpartition(":")[2].rpartition(".")[2] if is_user_key(key) else key


def term_values(terms: tuple[tuple[str, float], ...], logits_ExV: Array, targets_E: Array):
    """[values_E of each term], in float32."""
    return [
        LOSS_TERMS[key].per_token(logits_ExV, targets_E).astype(jnp.float32) for key, _ in terms
    ]
