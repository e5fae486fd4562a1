"""Loss terms added to the next-token cross-entropy: the registry `LOSS_TERMS`.

A term is either
- per token, a function `(logits_ExV, targets_E) -> values_E`: a float32 value per scored token,
  computed from that token's logits (float32, V columns) and its target id, inside the same
  read-out as the cross-entropy (so `loss_chunk` chunks it too); or
- of the model's internals, `LossTerm(of_model=fn)`, `fn(intermediates, params, cfg) -> value`:
  one float32 scalar from what the model sowed in the step's forward (`self.sow("intermediates",
  name, value)` in any module; `sown(intermediates, name)` finds every value of a name) and the
  params: a router's balance loss, an activation or weight penalty; or
- of the step, `LossTerm(of_context=fn)`, `fn(ctx: TermContext) -> value`: one float32 scalar
  from the batch's inputs and targets, the final features, the step number, the intermediates,
  the params and the term's own declared settings (`ctx.options`): multi-token prediction,
  distillation.
The model is applied with the 'intermediates' collection only when a term of the last two
kinds is picked.
A run's objective is

    mean(cross-entropy) + sum over terms of weight * mean(term)

and the loss returns `(objective, aux)`, aux holding the mean of the cross-entropy and of each
term by name, which the training loop logs (metrics.jsonl, TensorBoard) without naming them.
`config.loss.terms` picks terms as comma-separated `name[=weight]`, a name being a key of
`LOSS_TERMS` or `module:attr` of your own (a function, or a `LossTerm` to set its default weight).
A term may declare settings (`settings.declares` on the LossTerm): they join `config.loss`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from minigpt_jax.model.config import GPTConfig
from minigpt_jax.settings.groups import make_options, options_of
from minigpt_jax.settings.registry import ContractError, Registry, expect_shape, is_user_key

Array = chex.Array

# The aux key of the plain next-token cross-entropy, logged beside the terms.
CROSS_ENTROPY = "cross_entropy"
TermFn = Callable[[Array, Array], Array]
ModelTermFn = Callable[[Any, Any, Any], Array]  # (intermediates, params, cfg) -> scalar
ContextTermFn = Callable[["TermContext"], Array]  # (ctx) -> scalar


@dataclasses.dataclass(frozen=True)
class LossTerm:
    """A term (per token, of the model's internals, or of the step's context) and the weight it
    gets when `loss.terms` gives none. Exactly one of `per_token`, `of_model` and `of_context`
    is set."""

    per_token: TermFn | None = None
    weight: float = 1.0
    of_model: ModelTermFn | None = None
    of_context: ContextTermFn | None = None

    def __post_init__(self):
        if sum(fn is not None for fn in (self.per_token, self.of_model, self.of_context)) != 1:
            raise ValueError(
                "a LossTerm takes exactly one of per_token=(logits_ExV, targets_E) -> values_E, "
                "of_model=(intermediates, params, cfg) -> scalar and of_context=(ctx) -> scalar."
            )


@dataclasses.dataclass(frozen=True)
class TermContext:
    """What a term of the step's context (`LossTerm(of_context=fn)`) reads: one per step in
    training, one per batch in evaluation. Targets are inputs shifted by one: targets_BxT[:, t]
    = tokens[:, t + 1], so the token two ahead of input t is targets_BxT[:, t + 1]."""

    inputs_BxT: Array  # int32 token ids the model read
    targets_BxT: Array  # int32 next-token ids
    weights_BxT: Array  # float32: 1, or 0 for a target across a packed document's boundary
    features_BxTxD: Array  # the final-norm features the head reads out (logits = read-out)
    intermediates: Any  # what the modules sowed in this forward (`sown(intermediates, name)`)
    params: Any  # the params being trained (a gradient flows through them)
    cfg: GPTConfig
    step: Array | None  # int32 scalar: optimizer steps taken before this one; None in evaluation
    train: bool  # dropout on (a training step) or off (evaluation)
    options: Any = None  # the term's own declared settings (`settings.declares`), or None


class PickedTerm(NamedTuple):
    """One item of `loss.terms`, resolved: its key, its weight and the options object of the
    settings its entry declares (None when it declares none)."""

    key: str
    weight: float
    options: Any = None


def sown(intermediates: Any, name: str) -> list[Array]:
    """Every value sown under `name` anywhere in the 'intermediates' tree, in tree order (one
    per call of `sow`: a module applied in each block gives one per block)."""
    found = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(intermediates):
        keys = [str(getattr(k, "key", "")) for k in path]
        if name in keys:
            found.append(leaf)
    return found


def activation_l2(intermediates: Any, params: Any, cfg: GPTConfig) -> Array:
    """The mean over blocks of mean(x²) of each block's output (`residual_sq`, sown by
    `GPT.hidden`): a penalty on the residual stream's size."""
    del params, cfg
    return jnp.mean(jnp.stack(sown(intermediates, "residual_sq")))


def z_loss(logits_ExV: Array, targets_E: Array) -> Array:
    """log²Z, Z the softmax's normaliser: keeps the logits from drifting (PaLM, Chowdhery et
    al. 2022, section 5: weight 1e-4)."""
    del targets_E
    return jnp.square(jax.nn.logsumexp(logits_ExV, axis=-1))


def _term_contract(term: LossTerm, loss: Any) -> None:
    """term.per_token(logits_ExV, targets_E) is values_E: one float per scored token (a term of
    the model's internals is checked when the step is traced: its value must be a scalar)."""
    del loss
    if term.per_token is None:
        return
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
    {
        "z_loss": LossTerm(z_loss, weight=1e-4),
        "activation_l2": LossTerm(of_model=activation_l2, weight=1e-3),
    },
    entry_class=LossTerm,
    arity=2,
    shape="a function (logits_ExV, targets_E) -> values_E (one value per token) or a LossTerm",
    contract=_term_contract,
    split=_term_keys,
)


def parse_terms(spec: str, loss: Any = None) -> tuple[PickedTerm, ...]:
    """`loss.terms` as (PickedTerm(key, weight, options), ...), every key resolved (raises
    ValueError naming the term and the fix); `loss` is the group (config.loss) whose values set
    a term's declared settings (None: their defaults). The compiled step closes over it."""
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
        terms.append(PickedTerm(key, weight, _options(key, loss)))
    names = [term_name(term.key) for term in terms]
    if len(set(names)) != len(names) or CROSS_ENTROPY in names:
        raise ValueError(
            f"config.loss.terms={spec!r} names a term twice (or one called {CROSS_ENTROPY!r}): "
            "each term is logged under its name, so names must differ."
        )
    return tuple(terms)


def _options(key: str, loss: Any) -> Any:
    """The options object of the settings `key`'s entry declares, from `loss` (its defaults
    when None), or None when it declares none."""
    classes = LOSS_TERMS.options_classes_of(key)
    if not classes:
        return None
    if len(classes) > 1:
        raise ValueError(
            f"config.loss.terms: {key!r} declares settings in {len(classes)} options classes; "
            "declare all of a term's settings in one (settings.declares on the LossTerm)."
        )
    return make_options(classes[0], {}, "loss") if loss is None else options_of(loss, classes[0])


def term_name(key: str) -> str:
    """The name a term is logged under: its registry key, or `attr` of `module:attr`."""
    return key.rpartition(":")[2].rpartition(".")[2] if is_user_key(key) else key


def per_token_terms(terms: tuple[PickedTerm, ...]) -> tuple[PickedTerm, ...]:
    """The terms computed per token from the logits (the rest read the model or the step)."""
    return tuple(term for term in terms if LOSS_TERMS[term.key].per_token is not None)


def scalar_term_values(terms: tuple[PickedTerm, ...], ctx: TermContext) -> dict[str, Array]:
    """{name: float32 scalar} of each term of the model's internals or of the step's context
    among `terms` (each of the latter sees `ctx` with its own options); raises ContractError
    naming a term whose value is not a scalar."""
    values = {}
    for term in terms:
        entry = LOSS_TERMS[term.key]
        if entry.of_model is not None:
            value = entry.of_model(ctx.intermediates, ctx.params, ctx.cfg)
        elif entry.of_context is not None:
            value = entry.of_context(dataclasses.replace(ctx, options=term.options))
        else:
            continue
        value = jnp.asarray(value, jnp.float32)
        if value.shape != ():
            raise ContractError(
                f"loss term {term.key!r} returned shape {value.shape}: a term of the model's "
                f"internals or of the step returns one scalar (e.g. the mean of what it read)."
            )
        values[term_name(term.key)] = value
    return values


def term_values(terms: tuple[PickedTerm, ...], logits_ExV: Array, targets_E: Array):
    """[values_E of each per-token term], in float32."""
    return [
        LOSS_TERMS[term.key].per_token(logits_ExV, targets_E).astype(jnp.float32)
        for term in per_token_terms(terms)
    ]
