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

from minigpt_jax.model import param_meta
from minigpt_jax.registry import ContractError, Registry, expect_shape

Params = Any
OptimizerFn = Callable[[Any, optax.Schedule], optax.GradientTransformation]
ScheduleFn = Callable[[Any, int], optax.Schedule]


def decay_mask(params: Params) -> Params:
    """Each parameter's declared weight decay (`param_meta.declare(decay=)`): the weight
    matrices and embedding tables, not the biases and norm scales."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: param_meta.lookup(path, leaf).decay, params
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


def _optimizer_contract(make: OptimizerFn, optim: Any) -> None:
    """make(optim, schedule) is an optax.GradientTransformation whose updates have the
    parameters' tree and shapes."""
    tx = make(optim, optax.constant_schedule(optim.lr))
    if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
        raise ContractError(
            f"it returned {tx!r} ({type(tx).__name__}), not an optax.GradientTransformation"
        )

    def one_update(params):
        updates, _ = tx.update(params, tx.init(params), params)
        return updates

    with param_meta.using(_PROBE_META):  # what the model's modules declare for these paths
        updates = jax.eval_shape(one_update, _PROBE_PARAMS)
    if jax.tree.structure(updates) != jax.tree.structure(_PROBE_PARAMS):
        raise ContractError("its updates do not have the parameters' tree structure")
    for update, param in zip(jax.tree.leaves(updates), jax.tree.leaves(_PROBE_PARAMS), strict=True):
        expect_shape(update, param.shape, "each update")


def _schedule_contract(make: ScheduleFn, optim: Any) -> None:
    """make(optim, num_steps) is a function of the step returning a scalar learning rate."""
    schedule = make(optim, 100)
    if not callable(schedule):
        raise ContractError(f"it returned {type(schedule).__name__}, not a function of the step")
    step = jax.ShapeDtypeStruct((), jax.numpy.int32)
    expect_shape(jax.eval_shape(schedule, step), (), "the learning rate", dtype_kind="fiu")


def muon_dimension_numbers(params: Params) -> Params:
    """Which leaves Muon orthogonalises, and how each is read as matrices (reduction -> output
    axes; the others are batch axes), as each parameter declares it (`param_meta.declare(muon=)`):
    the blocks' attention and MLP kernels. Every other leaf (embeddings, an untied head, biases,
    norm scales) is None: AdamW's, as in the speedrun."""

    def rule(path, leaf):
        muon = param_meta.lookup(path, leaf).muon
        if muon is None:
            return None
        reduction, output = muon
        return optax.contrib.MuonDimensionNumbers(reduction_axis=reduction, output_axis=output)

    return jax.tree_util.tree_map_with_path(rule, params)


def muon(optim: Any, learning_rate: optax.Schedule) -> optax.GradientTransformation:
    """Muon (Jordan et al. 2024) on the blocks' matrices, AdamW on the rest: optax.contrib.muon.

    The matrices' learning rate is optim.muon_lr on the same schedule shape as optim.lr's (the
    embeddings, head, biases and norms keep AdamW at optim.lr); Nesterov momentum
    optim.muon_momentum; decoupled decay optim.weight_decay on `decay_mask`'s leaves.
    """
    ratio = optim.muon_lr / optim.lr if optim.lr else 0.0
    return optax.contrib.muon(
        lambda step: learning_rate(step) * ratio,
        beta=optim.muon_momentum,
        weight_decay=optim.weight_decay,
        weight_decay_mask=decay_mask,
        adam_b1=optim.b1,
        adam_b2=optim.b2,
        adam_weight_decay=optim.weight_decay,
        adam_learning_rate=learning_rate,
        muon_weight_dimension_numbers=muon_dimension_numbers,
    )


OPTIMIZERS: Registry[OptimizerFn] = Registry(
    "optimizer",
    "optim.name",
    {"adamw": adamw, "muon": muon},
    arity=2,
    shape="a function (optim, learning_rate) -> optax.GradientTransformation",
    contract=_optimizer_contract,
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


def warmup_stable_decay(optim: Any, num_steps: int) -> optax.Schedule:
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


def make_optimizer(
    optim: Any, num_steps: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(tx, schedule): global-norm clipping, then `optim.name`'s optimizer on `optim.schedule`'s
    learning rate (defaults: AdamW on linear warmup + cosine decay)."""
    schedule = SCHEDULES[optim.get("schedule", "cosine")](optim, num_steps)
    optimizer = OPTIMIZERS[optim.get("name", "adamw")](optim, schedule)
    return optax.chain(optax.clip_by_global_norm(optim.grad_clip), optimizer), schedule
