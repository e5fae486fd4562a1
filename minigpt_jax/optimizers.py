"""Optimizers, learning-rate schedules and the parameters evaluation uses: the registries
`OPTIMIZERS`, `SCHEDULES` and `EVAL_PARAMS`.

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
Whatever it is, it must return an optax.GradientTransformation. A schedule entry is one
function `(optim, num_steps) -> optax.Schedule`. `config.optim.name` and `config.optim.schedule`
pick them by name, or name your own as `module:attr` (minigpt_jax.settings.registry). Gradient
clipping (`optim.grad_clip`) is applied before every optimizer.

`config.optim.eval_params` picks the parameters that evaluation, the "best" checkpoint,
sampling and export use (`EVAL_PARAMS`): `auto` (the optimizer's own hook; schedule-free's x
for any optimizer whose state holds an optax.contrib.ScheduleFreeState; else the trained
params), `params` (the trained params), `ema` (an exponential moving average of the params,
`optim.ema_decay`, kept in the optimizer state), or `module:attr` (an `EvalParams`, or a
function `(opt_state, params) -> params` over the whole optimizer's state).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from minigpt_jax.model import param_meta
from minigpt_jax.model.speed import backend
from minigpt_jax.muon import (
    is_dimension_numbers,
    muon_dimension_numbers,
    scale_by_muon,
    scale_by_width,
)
from minigpt_jax.settings.groups import (
    AUTO,  # eval_params: the optimizer's own choice (its hook, schedule-free's x, the params)
    TRAJECTORY,
    Optim,
    defaults,
    options_of,
    parse_tag_factors,
    setting,
)
from minigpt_jax.settings.registry import (
    ContractError,
    Registry,
    RegistryError,
    declares,
    expect_shape,
)

Params = Any
OptimizerFn = Callable[[Any, optax.Schedule], optax.GradientTransformation]
ScheduleFn = Callable[[Any, int], optax.Schedule]
# (an optimizer's state, params) -> the params to evaluate; optax's schedule_free_eval_params.
EvalParamsFn = Callable[[optax.OptState, Params], Params]


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
        declared = set()
        jax.tree_util.tree_map_with_path(
            lambda path, leaf: declared.update(param_meta.tags_of(path, leaf)), params
        )
        unknown = sorted(set(factors) - declared)
        if unknown:
            raise ValueError(
                f"optim.lr_multipliers names {unknown}, which no parameter declares; the "
                f"parameters' tags: {sorted(declared)} (param_meta.declare(tags=...))."
            )
        return optax.EmptyState()

    def update(updates, state, params=None):
        del params
        scaled = jax.tree_util.tree_map_with_path(
            lambda path, u: u * jnp.asarray(factor_of(path, u), u.dtype), updates
        )
        return scaled, state

    return optax.GradientTransformation(init, update)


def decay_mask(params: Params) -> Params:
    """Each parameter's declared weight decay (`param_meta.declare(decay=)`): the weight
    matrices and embedding tables, not the biases and norm scales."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: param_meta.lookup(path, leaf).decay, params
    )


def adamw(optim: Optim, learning_rate: optax.Schedule) -> optax.GradientTransformation:
    """AdamW (Loshchilov & Hutter 2019) with decoupled decay on `decay_mask`'s leaves."""
    return optax.adamw(
        learning_rate,
        b1=optim.b1,
        b2=optim.b2,
        eps=optim.eps,
        weight_decay=optim.weight_decay,
        mask=decay_mask,
    )


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


def _optimizer_contract(entry: Any, optim: Optim) -> None:
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


def _schedule_contract(make: ScheduleFn, optim: Optim) -> None:
    """make(optim, num_steps) is a function of the step returning a scalar learning rate."""
    schedule = make(optim, 100)
    if not callable(schedule):
        raise ContractError(f"it returned {type(schedule).__name__}, not a function of the step")
    step = jax.ShapeDtypeStruct((), jax.numpy.int32)
    expect_shape(jax.eval_shape(schedule, step), (), "the learning rate", dtype_kind="fiu")


def muon_ns_dtype(optim: Optim) -> str:
    """optim.muon_ns_dtype resolved, once, when the optimizer is built: "auto" is "bfloat16" on a
    CPU with a bfloat16 dot unit (`backend.bf16_matmuls_pay`), else "float32"."""
    choice = _setting(optim, "muon_ns_dtype")
    return choice if choice != AUTO else backend.training_matmul_dtype()


def muon(optim: Optim, learning_rate: optax.Schedule) -> optax.GradientTransformation:
    """Muon (Jordan et al. 2024) on the blocks' matrices, AdamW on the rest: optax.contrib.muon
    with its defaults, its Newton-Schulz dots on optim.muon_ns_dtype operands (`muon_ns_dtype`).

    The matrices' learning rate is optim.muon_lr on the same schedule shape as optim.lr's (the
    embeddings, head, biases and norms keep AdamW at optim.lr, b1, b2, eps 1e-8 and Nesterov, as
    optax.contrib.muon); Nesterov momentum optim.muon_momentum; decoupled decay
    optim.weight_decay on `decay_mask`'s leaves, Muon's and AdamW's alike (optax.contrib.muon
    decays every AdamW leaf: a norm scale or bias declaring no decay is left undecayed here).
    """
    ratio = optim.muon_lr / optim.lr if optim.lr else 0.0

    def labels(params):  # Muon's leaves by their dimension numbers, AdamW's by None
        dims = muon_dimension_numbers(params)
        return jax.tree.map(
            lambda d: "adam" if d is None else "muon", dims, is_leaf=is_dimension_numbers
        )

    muon_transform = optax.chain(
        scale_by_muon(
            muon_dimension_numbers,
            beta=optim.muon_momentum,
            operand_dtype=muon_ns_dtype(optim),
        ),
        scale_by_width(muon_dimension_numbers),
        optax.add_decayed_weights(optim.weight_decay, decay_mask),
        optax.scale_by_learning_rate(lambda step: learning_rate(step) * ratio),
    )
    # optax.adamw's chain with the decay on decay_mask's leaves only, its state as adamw's
    # without a mask (earlier Muon checkpoints restore into it; Muon's own part keeps
    # optax.masked's decay above for the same reason: its state is what they hold).
    adam = optax.chain(
        optax.scale_by_adam(b1=optim.b1, b2=optim.b2, eps=1e-8, nesterov=True),
        decay_where_declared(optim.weight_decay),
        optax.scale_by_learning_rate(learning_rate),
    )
    return optax.partition({"muon": muon_transform, "adam": adam}, labels)


def decay_where_declared(weight_decay: float) -> optax.GradientTransformation:
    """optax.add_decayed_weights (u + weight_decay * p) on `decay_mask`'s leaves, the others as
    they are, with add_decayed_weights' unmasked state (optax.masked would wrap it in another)."""

    def update(updates, state, params):
        if weight_decay == 0.0:
            return updates, state
        decayed = jax.tree.map(
            lambda u, p, decay: u + weight_decay * p if decay else u,
            updates,
            params,
            decay_mask(params),
        )
        return decayed, state

    return optax.GradientTransformation(optax.init_empty_state, update)


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
    "whose first argument is learning_rate (optax:lion), or an optimizers.Optimizer"
)


OPTIMIZERS: Registry[OptimizerFn | Optimizer] = Registry(
    "optimizer",
    "optim.name",
    {"adamw": adamw, "muon": muon},
    arity=2,
    shape=OPTIMIZER_SHAPE,
    contract=_optimizer_contract,
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
    kwargs, missing = {}, []
    for name, parameter in inspect.signature(fn).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name == "learning_rate":
            kwargs[name] = learning_rate
        elif name in MASK_ARGUMENTS:
            kwargs[name] = decay_mask
        elif name in optim and name not in NOT_FACTORY_ARGUMENTS:
            kwargs[name] = optim[name]
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


# ----------------------------------------------------------------------------- eval params


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

EVAL_PARAMS: Registry[EvalParams] = Registry(
    "eval-params choice",
    "optim.eval_params",
    {AUTO: EvalParams(None), "params": EvalParams(None), "ema": EMA},
    entry_class=EvalParams,
    arity=2,
    shape="a function (opt_state, params) -> params, or an optimizers.EvalParams",
)


def warmup_cosine(optim: Optim, num_steps: int) -> optax.Schedule:
    """Linear warmup from 0 to optim.lr, then cosine decay to optim.min_lr at num_steps."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=optim.lr,
        warmup_steps=optim.warmup_steps,
        decay_steps=max(num_steps, optim.warmup_steps + 1),
        end_value=optim.min_lr,
    )


def warmup_constant(optim: Optim, num_steps: int) -> optax.Schedule:
    """Linear warmup from 0 to optim.lr, then constant (min_lr unused)."""
    del num_steps
    return optax.linear_schedule(0.0, optim.lr, max(optim.warmup_steps, 1))


def warmup_stable_decay(optim: Optim, num_steps: int) -> optax.Schedule:
    """Warmup-stable-decay ("trapezoidal"; Hägele et al. 2024, the NanoGPT speedrun): linear
    warmup to optim.lr, constant, then linear decay to optim.min_lr over the last
    optim.decay_fraction of num_steps."""
    warmup = optim.warmup_steps
    decay = max(int(round(optim.decay_fraction * num_steps)), 1)
    stable_end = max(num_steps - decay, warmup)
    return optax.join_schedules(
        [
            optax.linear_schedule(0.0, optim.lr, max(warmup, 1)),
            optax.constant_schedule(optim.lr),
            optax.linear_schedule(optim.lr, optim.min_lr, decay),
        ],
        [warmup, stable_end],
    )


SCHEDULES: Registry[ScheduleFn] = Registry(
    "schedule",
    "optim.schedule",
    {"cosine": warmup_cosine, "constant": warmup_constant, "wsd": warmup_stable_decay},
    arity=2,
    shape="a function (optim, num_steps) -> optax.Schedule",
    contract=_schedule_contract,
)


class OptimizerParts(NamedTuple):
    """What `build_optimizer` makes: the transformation, its schedule, and `eval_params(opt_state)
    -> (name, select)`: which params evaluation uses for a train state of this optimizer, its
    name (recorded in checkpoints) and `select(opt_state, params) -> params` (None: the trained
    params themselves)."""

    tx: optax.GradientTransformation
    schedule: optax.Schedule
    eval_params: Callable[[optax.OptState], tuple[str, EvalParamsFn | None]]


def build_optimizer(optim: Optim, num_steps: int) -> OptimizerParts:
    """Global-norm clipping, then `optim.name`'s optimizer on `optim.schedule`'s learning rate
    (defaults: AdamW on linear warmup + cosine decay), wrapped as `optim.eval_params` needs.
    Raises RegistryError for an entry that breaks its contract (before any work)."""
    schedule = SCHEDULES[_setting(optim, "schedule")](optim, num_steps)
    key = _setting(optim, "name")
    entry = optimizer_entry(OPTIMIZERS[key])
    optimizer = call_optimizer(entry, optim, schedule, key)
    factors = parse_tag_factors(_setting(optim, "lr_multipliers"))
    if factors:  # the chain's shape (and the state's) is unchanged without multipliers
        optimizer = optax.chain(optimizer, scale_by_tags(factors))
    tx = optax.chain(optax.clip_by_global_norm(optim.grad_clip), optimizer)
    choice = _setting(optim, "eval_params")
    if choice != AUTO:
        hook = EVAL_PARAMS[choice]
        if hook.track is not None:
            tx = hook.track(tx, optim)
        return OptimizerParts(tx, schedule, lambda opt_state: (choice, hook.select))
    if entry.eval_params is not None:  # the entry's hook reads its own state: (clip, entry)[1]

        def select(state, params):
            own = state[1][0] if factors else state[1]  # (entry, scale_by_tags) with factors
            return entry.eval_params(own, params)

        return OptimizerParts(tx, schedule, lambda opt_state: (key, select))

    def auto(opt_state):
        if len(schedule_free_states(opt_state)) == 1:
            return "schedule_free", schedule_free_x
        return "params", None

    return OptimizerParts(tx, schedule, auto)


def _setting(optim: Optim, name: str) -> Any:
    """optim's `name`, or its declared default where a partial optim group leaves it out."""
    return optim.get(name, defaults(Optim)[name])


def make_optimizer(
    optim: Optim, num_steps: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(tx, schedule) of `build_optimizer`."""
    parts = build_optimizer(optim, num_steps)
    return parts.tx, parts.schedule
