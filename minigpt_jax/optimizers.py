"""The default optimizer and schedule, and the registries that pick them: `OPTIMIZERS`
(`optim.name`: AdamW by default), `SCHEDULES` (`optim.schedule`: warmup + cosine) and
`EVAL_PARAMS` (`optim.eval_params`: the params evaluation, the "best" checkpoint, sampling and
export use). `build_optimizer` makes the run's transformation: global-norm clipping
(`optim.grad_clip`), then the picked optimizer on the picked schedule.

The other built-in entries live beside this file and are imported only when picked:
Muon and the constant and warmup-stable-decay schedules (optimizer_entries.py); the entry forms
a plug-in may take (a wrapper, an optax factory as it is: `optax:lion`, an `Optimizer` with an
eval-params hook), their probes and contracts (optimizer_plugins.py); the per-tag learning-rate
multipliers and the eval-params choices (optimizer_wrappers.py). Name your own entry as
`module:attr` (minigpt_jax.settings.registry).

`optim.eval_params`: `auto` (the optimizer's own hook; schedule-free's x for any optimizer
whose state holds an optax.contrib.ScheduleFreeState; else the trained params), `params` (the
trained params), `ema` (a moving average of the params, `optim.ema_decay`, kept in the
optimizer state), or `module:attr` (an `EvalParams`, or a function `(opt_state, params) ->
params` over the whole optimizer's state).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import optax

from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.param_meta import ParamMeta, decay_mask
from minigpt_jax.optimizer_plugins import (
    OPTIMIZER_SHAPE,
    Optimizer,
    ScheduleFn,
    call_optimizer,
    optim_setting,
    optimizer_contract,
    optimizer_entry,
    schedule_contract,
)
from minigpt_jax.optimizer_wrappers import (
    EMA,
    EvalParams,
    EvalParamsFn,
    scale_by_parametrization,
    scale_by_tags,
    schedule_free_states,
    schedule_free_x,
    zero_frozen,
)
from minigpt_jax.settings.groups import (
    AUTO,  # eval_params: the optimizer's own choice (its hook, schedule-free's x, the params)
    Optim,
    parse_frozen_tags,
    parse_tag_factors,
)
from minigpt_jax.settings.registry import Builtin, Registry

OptimizerFn = Callable[[Any, optax.Schedule], optax.GradientTransformation]


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


def warmup_cosine(optim: Optim, num_steps: int) -> optax.Schedule:
    """Linear warmup from 0 to optim.lr, then cosine decay to optim.min_lr at num_steps."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=optim.lr,
        warmup_steps=optim.warmup_steps,
        decay_steps=max(num_steps, optim.warmup_steps + 1),
        end_value=optim.min_lr,
    )


OPTIMIZERS: Registry[OptimizerFn | Optimizer] = Registry(
    "optimizer",
    "optim.name",
    {"adamw": adamw, "muon": Builtin("minigpt_jax.optimizer_entries:muon")},
    arity=2,
    shape=OPTIMIZER_SHAPE,
    contract=optimizer_contract,
)

SCHEDULES: Registry[ScheduleFn] = Registry(
    "schedule",
    "optim.schedule",
    {
        "cosine": warmup_cosine,
        "constant": Builtin("minigpt_jax.optimizer_entries:warmup_constant"),
        "wsd": Builtin("minigpt_jax.optimizer_entries:warmup_stable_decay"),
    },
    arity=2,
    shape="a function (optim, num_steps) -> optax.Schedule",
    contract=schedule_contract,
)

EVAL_PARAMS: Registry[EvalParams] = Registry(
    "eval-params choice",
    "optim.eval_params",
    {AUTO: EvalParams(None), "params": EvalParams(None), "ema": EMA},
    entry_class=EvalParams,
    arity=2,
    shape="a function (opt_state, params) -> params, or an optimizer_wrappers.EvalParams",
)


class OptimizerParts(NamedTuple):
    """What `build_optimizer` makes: the transformation, its schedule, and `eval_params(opt_state)
    -> (name, select)`: which params evaluation uses for a train state of this optimizer, its
    name (recorded in checkpoints) and `select(opt_state, params) -> params` (None: the trained
    params themselves)."""

    tx: optax.GradientTransformation
    schedule: optax.Schedule
    eval_params: Callable[[optax.OptState], tuple[str, EvalParamsFn | None]]


def build_optimizer(optim: Optim, num_steps: int, model: GPTConfig | None = None) -> OptimizerParts:
    """Global-norm clipping, then `optim.name`'s optimizer on `optim.schedule`'s learning rate
    (defaults: AdamW on linear warmup + cosine decay), its updates scaled per tag
    (`optim.lr_multipliers`) and as `model.parametrization` says (μP's per-parameter rates;
    None: the standard parametrization's, none), those of `optim.frozen_tags` zeroed before
    the clip and after everything (`zero_frozen`), wrapped as `optim.eval_params` needs.
    Raises RegistryError for an entry that breaks its contract (before any work)."""
    schedule = SCHEDULES[optim_setting(optim, "schedule")](optim, num_steps)
    key = optim_setting(optim, "name")
    entry = optimizer_entry(OPTIMIZERS[key])
    optimizer = call_optimizer(entry, optim, schedule, key)
    scalings = []  # the chain's shape (and the state's) is unchanged without any
    factors = parse_tag_factors(optim_setting(optim, "lr_multipliers"))
    if factors:
        scalings.append(scale_by_tags(factors))
    by_width = None if model is None else scale_by_parametrization(model, _orthogonalised(key))
    if by_width is not None:
        scalings.append(by_width)
    clip = optax.clip_by_global_norm(optim.grad_clip)
    frozen = parse_frozen_tags(optim_setting(optim, "frozen_tags"))
    if frozen:  # zeroed gradients in, zeroed updates out: weight decay cannot move them either
        scalings.append(zero_frozen(frozen))
        clip = optax.chain(zero_frozen(frozen), clip)
    if scalings:
        optimizer = optax.chain(optimizer, *scalings)
    tx = optax.chain(clip, optimizer)
    choice = optim_setting(optim, "eval_params")
    if choice != AUTO:
        hook = EVAL_PARAMS[choice]
        if hook.track is not None:
            tx = hook.track(tx, optim)
        return OptimizerParts(tx, schedule, lambda opt_state: (choice, hook.select))
    if entry.eval_params is not None:  # the entry's hook reads its own state: (clip, entry)[1]

        def select(state, params):
            own = state[1][0] if scalings else state[1]  # (entry, *scalings) with scalings
            return entry.eval_params(own, params)

        return OptimizerParts(tx, schedule, lambda opt_state: (key, select))

    def auto(opt_state):
        if len(schedule_free_states(opt_state)) == 1:
            return "schedule_free", schedule_free_x
        return "params", None

    return OptimizerParts(tx, schedule, auto)


def _orthogonalised(key: str) -> Callable[[ParamMeta], bool]:
    """Whether optimizer `key` orthogonalises a parameter of this metadata: the built-in Muon
    does each that declares Muon dimension numbers; any other optimizer none."""
    return lambda meta: key == "muon" and meta.muon is not None


def make_optimizer(
    optim: Optim, num_steps: int, model: GPTConfig | None = None
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(tx, schedule) of `build_optimizer`."""
    parts = build_optimizer(optim, num_steps, model)
    return parts.tx, parts.schedule
