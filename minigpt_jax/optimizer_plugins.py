"""How any optimizer or schedule entry becomes the run's transformation, and the probes that check
an entry before any work (`optimizers.OPTIMIZERS`' and `SCHEDULES`' contracts).

An optimizer entry is one of
- a wrapper `(optim, learning_rate) -> optax.GradientTransformation`: `optim` is the run
  config's optim group (read `optim.b1`, `optim.weight_decay`, ...) and `learning_rate` the
  schedule (a function of the step);
- an optax factory as it is (`optax:lion`, `optax.contrib:schedule_free_adamw`: a function of
  optax's modules, or any whose first parameter is `learning_rate`): its keyword arguments are
  filled by name (`factory_kwargs`): learning_rate <- the schedule, mask / weight_decay_mask <-
  `decay_mask`, every other name <- the optim setting of that name (b1, b2, eps,
  weight_decay, ...), the rest keep the factory's defaults;
- an `Optimizer`: either of those with an `eval_params` hook (a wrapper function may carry
  the hook as its attribute `eval_params` instead).
Whatever it is, it must return an optax.GradientTransformation (`transformation`). A schedule
entry is one function `(optim, num_steps) -> optax.Schedule`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import optax

from minigpt_jax.model import param_meta
from minigpt_jax.model.param_meta import decay_mask
from minigpt_jax.optimizer_wrappers import EvalParamsFn
from minigpt_jax.settings.groups import Group, Optim, defaults
from minigpt_jax.settings.registry import ContractError, RegistryError, expect_shape

ScheduleFn = Callable[[Any, int], optax.Schedule]


def setting_values(optim: Optim) -> Mapping[str, Any]:
    """optim's settings by name, flat as a config file holds them (the picked entries' own
    too): a typed group's `flat_values()`, or as it is the ConfigDict group a script passes
    (`make_optimizer(config.optim, ...)`)."""
    return optim.flat_values() if isinstance(optim, Group) else optim


def optim_setting(optim: Optim, name: str) -> Any:
    """optim's `name`, or its declared default where a partial optim group leaves it out."""
    return setting_values(optim).get(name, defaults(Optim)[name])


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """An optimizer entry with its hooks: `make` is a wrapper `(optim, learning_rate) -> tx` or
    an optax factory; `eval_params(state, params) -> params` (None: the trained params) reads
    the parameters to evaluate from `make`'s own state. Called like a wrapper."""

    make: Callable[..., optax.GradientTransformation]
    eval_params: EvalParamsFn | None = None

    def __call__(self, optim: Optim, learning_rate: optax.Schedule) -> optax.GradientTransformation:
        return transformation(self.make, optim, learning_rate)


OPTIMIZER_SHAPE = (
    "a function (optim, learning_rate) -> optax.GradientTransformation, an optax factory "
    "whose first argument is learning_rate (optax:lion), or an optimizer_plugins.Optimizer"
)


def is_optax_factory(fn: Callable) -> bool:
    """Whether `fn` is an optax factory (called with keyword arguments filled by name) rather
    than a wrapper (optim, learning_rate): a function of optax's modules, or one whose first
    parameter is `learning_rate`."""
    module = getattr(fn, "__module__", None) or ""
    if module == "optax" or module.startswith("optax."):
        return True
    try:
        parameters = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: not a factory
        return False
    return bool(parameters) and parameters[0] == "learning_rate"


# Optim settings of the schedule, the clipping and the entry choice: never a factory's argument
# (a factory's own `warmup_steps` would warm up a second time on top of the schedule's).
NOT_FACTORY_ARGUMENTS = (
    "name", "schedule", "lr", "min_lr", "warmup_steps", "decay_fraction", "grad_clip",
    "eval_params", "ema_decay",
)  # fmt: skip
MASK_ARGUMENTS = ("mask", "weight_decay_mask")


def factory_kwargs(fn: Callable, optim: Optim, learning_rate: optax.Schedule) -> dict:
    """The keyword arguments of optax factory `fn` for this run: learning_rate <- the schedule,
    mask / weight_decay_mask <- `decay_mask`, any other parameter <- the optim setting of its
    name (an entry-owned one too); the rest keep their defaults. Raises ContractError naming
    every required parameter that nothing fills, and how to supply it."""
    kwargs, missing, values = {}, [], setting_values(optim)
    for name, parameter in inspect.signature(fn).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name == "learning_rate":
            kwargs[name] = learning_rate
        elif name in MASK_ARGUMENTS:
            kwargs[name] = decay_mask
        elif name in values and name not in NOT_FACTORY_ARGUMENTS:
            kwargs[name] = values[name]
        elif parameter.default is parameter.empty or parameter.kind == parameter.POSITIONAL_ONLY:
            if parameter.default is parameter.empty:
                missing.append(name)
    if missing:
        names = ", ".join(missing)
        raise ContractError(
            f"the optax factory {getattr(fn, '__name__', fn)} needs {names}, which no optim "
            "setting fills (learning_rate, mask, weight_decay_mask and any argument named like "
            "an optim setting are filled); supply it in a wrapper of your own, e.g. `def "
            f"my_opt(optim, learning_rate): return {getattr(fn, '__name__', 'factory')}"
            f"(learning_rate=learning_rate, {missing[0]}=...)` in my_file.py, and pass "
            "--config.optim.name=my_file:my_opt"
        )
    return kwargs


def optimizer_entry(value: Any) -> Optimizer:
    """Any form of optimizer entry as an `Optimizer` (a wrapper's `eval_params` attribute
    becomes its hook)."""
    if isinstance(value, Optimizer):
        return value
    return Optimizer(value, getattr(value, "eval_params", None))


def transformation(
    make: Callable[..., Any], optim: Optim, learning_rate: optax.Schedule
) -> optax.GradientTransformation:
    """`make`'s transformation for this run: a factory called with `factory_kwargs`, a wrapper
    as make(optim, learning_rate). Raises ContractError when a factory's required argument
    cannot be filled, or when it returns anything but an optax.GradientTransformation."""
    if is_optax_factory(make):
        tx = make(**factory_kwargs(make, optim, learning_rate))
    else:
        tx = make(optim, learning_rate)
    if not isinstance(tx, optax.GradientTransformation):
        shown = repr(tx)
        raise ContractError(
            f"it returned {type(tx).__name__} "
            f"({shown[:60] + '...' if len(shown) > 60 else shown}), not an "
            "optax.GradientTransformation (return e.g. optax.adamw(learning_rate, ...))"
        )
    return tx


def call_optimizer(
    entry: Optimizer, optim: Optim, learning_rate: optax.Schedule, key: str
) -> optax.GradientTransformation:
    """`transformation` of the entry `key` picks, its ContractError a RegistryError naming the
    key and the contract."""
    try:
        return transformation(entry.make, optim, learning_rate)
    except ContractError as error:
        raise RegistryError(
            f"config.optim.name={key!r} breaks the optimizer contract: {error}; an optimizer "
            f"entry is {OPTIMIZER_SHAPE}."
        ) from None


# A small parameter tree shaped like the model's (block and embedding paths), for the probes.
_PROBE_PARAMS = {
    "embed": {"tok": {"embedding": jax.ShapeDtypeStruct((16, 8), jax.numpy.float32)}},
    "block_0": {
        "mlp": {
            "fc": {
                "kernel": jax.ShapeDtypeStruct((8, 32), jax.numpy.float32),
                "bias": jax.ShapeDtypeStruct((32,), jax.numpy.float32),
            }
        }
    },
}


_PROBE_META = {
    ("embed", "tok", "embedding"): param_meta.ParamMeta(decay=True),
    ("block_0", "mlp", "fc", "kernel"): param_meta.ParamMeta(muon=(0, 1), decay=True),
    ("block_0", "mlp", "fc", "bias"): param_meta.VECTOR,
}


def optimizer_contract(entry: Any, optim: Optim) -> None:
    """The entry's transformation (`transformation`: a wrapper called, a factory filled) is an
    optax.GradientTransformation whose updates have the parameters' tree and shapes."""
    tx = transformation(optimizer_entry(entry).make, optim, optax.constant_schedule(optim.lr))

    def one_update(params):
        updates, _ = tx.update(params, tx.init(params), params)
        return updates

    with param_meta.using(_PROBE_META):  # what the model's modules declare for these paths
        updates = jax.eval_shape(one_update, _PROBE_PARAMS)
    if jax.tree.structure(updates) != jax.tree.structure(_PROBE_PARAMS):
        raise ContractError("its updates do not have the parameters' tree structure")
    for update, param in zip(jax.tree.leaves(updates), jax.tree.leaves(_PROBE_PARAMS), strict=True):
        expect_shape(update, param.shape, "each update")


def schedule_contract(make: ScheduleFn, optim: Optim) -> None:
    """make(optim, num_steps) is a function of the step returning a scalar learning rate."""
    schedule = make(optim, 100)
    if not callable(schedule):
        raise ContractError(f"it returned {type(schedule).__name__}, not a function of the step")
    step = jax.ShapeDtypeStruct((), jax.numpy.int32)
    expect_shape(jax.eval_shape(schedule, step), (), "the learning rate", dtype_kind="fiu")
