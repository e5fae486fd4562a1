"""Optimizers and learning-rate schedules: the registries `OPTIMIZERS` and `SCHEDULES`.

An optimizer entry is one function `(optim, learning_rate) -> optax.GradientTransformation`:
`optim` is the run config's optim group (read `optim.b1`, `optim.weight_decay`, ...) and
`learning_rate` the schedule (a function of the step). A schedule entry is one function
`(optim, num_steps) -> optax.Schedule`. `config.optim.name` and `config.optim.schedule` pick
them by name, or name your own as `module:attr` (minigpt_jax.registry). Gradient clipping
(`optim.grad_clip`) is applied before every optimizer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax

from minigpt_jax.registry import Registry

Params = Any
OptimizerFn = Callable[[Any, optax.Schedule], optax.GradientTransformation]
ScheduleFn = Callable[[Any, int], optax.Schedule]


def decay_mask(params: Params) -> Params:
    """True for weight matrices and embedding tables; not for biases and norm scales."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: path[-1].key in ("kernel", "embedding"), params
    )


def adamw(optim: Any, learning_rate: optax.Schedule) -> optax.GradientTransformation:
    """AdamW (Loshchilov & Hutter 2019) with decoupled decay on `decay_mask`'s leaves."""
    return optax.adamw(
        learning_rate,
        b1=optim.b1,
        b2=optim.b2,
        eps=optim.eps,
        weight_decay=optim.weight_decay,
        mask=decay_mask,
    )


def _callable_entry(what: str) -> Callable[[Any], Any]:
    def coerce(value: Any) -> Any:
        if not callable(value):
            raise TypeError(f"a {what} entry must be a function, got {type(value).__name__}.")
        return value

    return coerce


OPTIMIZERS: Registry[OptimizerFn] = Registry(
    "optimizer", "optim.name", {"adamw": adamw}, coerce=_callable_entry("optimizer")
)


def warmup_cosine(optim: Any, num_steps: int) -> optax.Schedule:
    """Linear warmup from 0 to optim.lr, then cosine decay to optim.min_lr at num_steps."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=optim.lr,
        warmup_steps=optim.warmup_steps,
        decay_steps=max(num_steps, optim.warmup_steps + 1),
        end_value=optim.min_lr,
    )


def warmup_constant(optim: Any, num_steps: int) -> optax.Schedule:
    """Linear warmup from 0 to optim.lr, then constant (min_lr unused)."""
    del num_steps
    return optax.linear_schedule(0.0, optim.lr, max(optim.warmup_steps, 1))


SCHEDULES: Registry[ScheduleFn] = Registry(
    "schedule",
    "optim.schedule",
    {"cosine": warmup_cosine, "constant": warmup_constant},
    coerce=_callable_entry("schedule"),
)


def make_optimizer(
    optim: Any, num_steps: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(tx, schedule): global-norm clipping, then `optim.name`'s optimizer on `optim.schedule`'s
    learning rate (defaults: AdamW on linear warmup + cosine decay)."""
    schedule = SCHEDULES[optim.get("schedule", "cosine")](optim, num_steps)
    optimizer = OPTIMIZERS[optim.get("name", "adamw")](optim, schedule)
    return optax.chain(optax.clip_by_global_norm(optim.grad_clip), optimizer), schedule
