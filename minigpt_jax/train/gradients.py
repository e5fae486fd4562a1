"""The gradient a training step hands the optimizer: the registry `GRADIENTS`, picked by
`config.optim.gradient`.

An entry is a function `(value_and_grad, params, optim) -> ((loss, aux), grads)`:
`value_and_grad(params) -> ((objective, aux), grads)` is the step's objective on its batch (its
micro-batches, its dropout key and loss terms fixed), callable at any params and as often as
the rule needs; `optim` is config.optim (`options_of(optim, entry)` reads the entry's own
settings). It returns the loss and aux values the step logs and the gradient the optimizer
(clipping, schedule, per-tag rates) applies, a tree of the params' structure. The default,
`plain`, is one gradient at the params; sharpness-aware minimisation takes a second at
perturbed params (docs/extending/optimizers.md). The rule is picked once, when the step is
built: the step calls it and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minigpt_jax.settings.registry import Registry

Params = Any
ValueAndGrad = Callable[[Params], tuple[tuple[Any, dict[str, Any]], Params]]
GradientRule = Callable[[ValueAndGrad, Params, Any], tuple[tuple[Any, dict[str, Any]], Params]]
StepGradient = Callable[[ValueAndGrad, Params], tuple[tuple[Any, dict[str, Any]], Params]]


def plain(value_and_grad: ValueAndGrad, params: Params, optim: Any = None):
    """((objective, aux), grads) at the params: one gradient, the usual step."""
    del optim
    return value_and_grad(params)


GRADIENTS: Registry[GradientRule] = Registry(
    "gradient rule",
    "optim.gradient",
    {"plain": plain},
    arity=3,
    shape="a function (value_and_grad, params, optim) -> ((loss, aux), grads)",
)


def step_gradient(optim: Any) -> StepGradient:
    """(value_and_grad, params) -> ((loss, aux), grads) of config.optim.gradient's entry, with
    `optim` bound: what `train.step.train_step` calls."""
    rule = GRADIENTS[optim.gradient]
    if rule is plain:
        return plain

    def gradient(value_and_grad: ValueAndGrad, params: Params):
        return rule(value_and_grad, params, optim)

    return gradient
