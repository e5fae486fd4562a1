"""The training step as the model sees it: inside a train step the model is applied with a
variable collection "step" (`gpt.step_variables`) holding the optimizer steps taken (int32
scalar, the value the learning-rate schedule reads), so a block, attention or MLP plug-in can
do step-dependent things (a branch faded in, a window grown); `training_step(self)` reads it in
any module. Outside
training (init, evaluation, sampling) the collection is absent and it reads None: a plug-in then
behaves as a trained model does (its schedule's end). A model that never reads it traces to the
same computation, so the default train step is unchanged.

Flax scopes a variable by module path (and `nn.remat` hands a block only its own subtree), so
the collection holds the step at every path of the params tree; a module without parameters
reads its nearest ancestor's."""

from __future__ import annotations

import chex
import flax.linen as nn

Array = chex.Array

STEP_COLLECTION = "step"
STEP_LEAF = "optimizer_step"  # not a module name: a path's submodules are its other keys


def training_step(module: nn.Module) -> Array | None:
    """The optimizer steps taken (int32 scalar, traced) when `module` runs inside a train step,
    else None (init, evaluation, sampling)."""
    scope = module.scope
    while scope is not None:
        if scope.has_variable(STEP_COLLECTION, STEP_LEAF):
            return scope.get_variable(STEP_COLLECTION, STEP_LEAF)
        scope = scope.parent
    return None
