"""What `optimizers.build_optimizer` wraps around the picked optimizer: the per-tag learning-rate
multipliers (`optim.lr_multipliers`, `scale_by_tags`), the frozen tags (`optim.frozen_tags`,
`zero_frozen`), the model's parametrization's
(`model.parametrization`, `scale_by_parametrization`: μP's) and the parameters evaluation uses
(`optim.eval_params`): an `EvalParams` choice, schedule-free's x (`schedule_free_x`) and the
exponential moving average (`track_ema`, the `ema` entry `EMA`).

An `EvalParams` is a choice of `optim.eval_params`: `select(opt_state, params) -> params` over
the whole optimizer's state, and `track(tx, optim) -> tx`, which makes the optimizer's state keep
what select reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from minigpt_jax.model import param_meta
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.param_meta import ParamMeta
from minigpt_jax.model.parametrization import parametrization_of
from minigpt_jax.settings.groups import TRAJECTORY, UNTAGGED, Optim, options_of, setting
from minigpt_jax.settings.registry import declares

Params = Any
# (an optimizer's state, params) -> the params to evaluate; optax's schedule_free_eval_params.
EvalParamsFn = Callable[[optax.OptState, Params], Params]


def _refuse_undeclared(params: Params, tags, setting: str, *, untagged: bool) -> None:
    """ValueError naming the `tags` that no parameter of `params` declares, and the tags there
    are (with `untagged`, `UNTAGGED` stands for the parameters declaring none)."""
    declared: set[str] = set()
    none = (UNTAGGED,) if untagged else ()
    jax.tree_util.tree_map_with_path(
        lambda path, leaf: declared.update(param_meta.tags_of(path, leaf) or none), params
    )
    unknown = sorted(set(tags) - declared)
    if unknown:
        hint = f"{UNTAGGED}: those declaring none" if untagged else "param_meta.declare(tags=...)"
        raise ValueError(
            f"{setting} names {unknown}, which no parameter declares; the parameters' tags: "
            f"{sorted(declared)} ({hint})."
        )


def scale_by_tags(factors: dict[str, float]) -> optax.GradientTransformation:
    """Each update times the product of `factors` over its parameter's tags (1 for a parameter
    without any of them; `param_meta.declare(tags=...)`). `init` raises ValueError for a tag
    that no parameter declares, naming the tags there are."""

    def factor_of(path, leaf) -> float:
        scale = 1.0
        for tag in param_meta.tags_of(path, leaf):
            scale *= factors.get(tag, 1.0)
        return scale

    def init(params):
        _refuse_undeclared(params, factors, "optim.lr_multipliers", untagged=False)
        return optax.EmptyState()

    def update(updates, state, params=None):
        del params
        scaled = jax.tree_util.tree_map_with_path(
            lambda path, u: u * jnp.asarray(factor_of(path, u), u.dtype), updates
        )
        return scaled, state

    return optax.GradientTransformation(init, update)


def zero_frozen(tags: tuple[str, ...]) -> optax.GradientTransformation:
    """Each update of a parameter carrying one of `tags` (`UNTAGGED`: one that declares no tag)
    replaced by exact zeros, the others passed on unchanged; `init` raises ValueError for a tag
    that no parameter declares, naming the tags there are. `build_optimizer` applies it to the
    gradients before clipping (a frozen gradient takes no share of the norm) and to the
    updates last (no weight decay, no step: a frozen parameter stays bit-identical)."""
    wanted = set(tags)

    def frozen(path, leaf) -> bool:
        own = param_meta.tags_of(path, leaf)
        return bool(wanted.intersection(own)) or (UNTAGGED in wanted and not own)

    def init(params):
        _refuse_undeclared(params, wanted, "optim.frozen_tags", untagged=True)
        return optax.EmptyState()

    def update(updates, state, params=None):
        del params
        zeroed = jax.tree_util.tree_map_with_path(
            lambda path, u: jnp.zeros_like(u) if frozen(path, u) else u, updates
        )
        return zeroed, state

    return optax.GradientTransformation(init, update)


def scale_by_parametrization(
    model: GPTConfig, orthogonalised: Callable[[ParamMeta], bool]
) -> optax.GradientTransformation | None:
    """Each update times its parameter's learning-rate factor under model.parametrization's rule
    (`parametrization.Parametrization.learning_rate`: μP's 1/m on the hidden matrices); None
    for a parametrization without one (the chain, and its state, unchanged). `orthogonalised`:
    whether the optimizer orthogonalises a parameter of this metadata (Muon's matrices)."""
    rule = parametrization_of(model).learning_rate
    if rule is None:
        return None

    def factor_of(path, leaf) -> float:
        meta = param_meta.lookup(path, leaf)
        return rule(meta, tuple(leaf.shape), model, orthogonalised(meta))

    def update(updates, state, params=None):
        del params
        scaled = jax.tree_util.tree_map_with_path(
            lambda path, u: u * jnp.asarray(factor_of(path, u), u.dtype), updates
        )
        return scaled, state

    return optax.GradientTransformation(optax.init_empty_state, update)


def schedule_free_states(opt_state: optax.OptState) -> list:
    """The optax.contrib.ScheduleFreeState nodes of an optimizer state."""
    kind = optax.contrib.ScheduleFreeState
    leaves = jax.tree_util.tree_leaves(opt_state, is_leaf=lambda node: isinstance(node, kind))
    return [leaf for leaf in leaves if isinstance(leaf, kind)]


def schedule_free_x(opt_state: optax.OptState, params: Params) -> Params:
    """Schedule-free's x, where it is meant to be evaluated (Defazio et al. 2024;
    optax.contrib.schedule_free_eval_params), from the one ScheduleFreeState in opt_state; the
    params a schedule-free optimizer trains are its y, where gradients are taken."""
    (state,) = schedule_free_states(opt_state)
    return optax.contrib.schedule_free_eval_params(state, params)


class EmaState(NamedTuple):
    """The state of `track_ema`: the wrapped optimizer's, and the params' moving average."""

    count: jax.Array  # int32: updates averaged so far
    inner: optax.OptState
    ema: Params


@dataclasses.dataclass(frozen=True)
class EmaOptions:
    """The `ema` eval-params entry's own setting (`optim.ema_decay`)."""

    ema_decay: float = setting(
        0.999, "eval_params=ema: the moving average's decay", TRAJECTORY, low=0.0, high=1.0
    )


def track_ema(tx: optax.GradientTransformation, optim: Optim) -> optax.GradientTransformation:
    """`tx`, also keeping an exponential moving average of the params it produces: after
    update t, ema <- d ema + (1 - d) params with d = min(EmaOptions.ema_decay, (1 + t) / (10 + t))
    (the warmup of TensorFlow's ExponentialMovingAverage, so early averages are not mostly the
    initialisation). Kept in the optimizer state, so a resumed run continues it bit-exactly."""
    decay = options_of(optim, EmaOptions).ema_decay

    def init(params):
        return EmaState(jnp.zeros((), jnp.int32), tx.init(params), params)

    def update(updates, state, params=None, **extra_args):
        if params is None:
            raise ValueError("optim.eval_params=ema needs the params in tx.update.")
        updates, inner = tx.update(updates, state.inner, params, **extra_args)
        count = state.count + 1
        d = jnp.minimum(decay, (1.0 + count) / (10.0 + count))
        new_params = optax.apply_updates(params, updates)
        ema = jax.tree_util.tree_map(
            lambda e, p: (d * e + (1.0 - d) * p).astype(e.dtype), state.ema, new_params
        )
        return updates, EmaState(count, inner, ema)

    return optax.GradientTransformationExtraArgs(init, update)


def ema_params(opt_state: EmaState, params: Params) -> Params:
    del params
    return opt_state.ema


@dataclasses.dataclass(frozen=True)
class EvalParams:
    """A choice of `optim.eval_params`: `select(opt_state, params) -> params` over the whole
    optimizer's state (None: the trained params); `track(tx, optim) -> tx` wraps the optimizer
    so that its state keeps what select reads (None: nothing to keep)."""

    select: EvalParamsFn | None
    track: Callable[[optax.GradientTransformation, Any], optax.GradientTransformation] | None = None


EMA = declares(EmaOptions)(EvalParams(ema_params, track_ema))
