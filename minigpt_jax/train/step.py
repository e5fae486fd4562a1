"""The compiled steps: the train state, the loss with its aux values, gradient accumulation,
train and eval steps and their jit-compiled, sharded forms (`train.loop` drives them)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from minigpt_jax import sharding
from minigpt_jax.data import dataset as data
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.eval_metrics import METRICS, check_value, metric_name
from minigpt_jax.model.gpt import (
    GPT,
    Params,
    init_annotated_params,
    init_params,
    next_token_loss_terms,
)
from minigpt_jax.model.losses import CROSS_ENTROPY

Array = chex.Array


class TrainState(flax.struct.PyTreeNode):
    """Everything a run needs to continue bit-exactly: data only; `tx` and `cfg` are closed over."""

    step: Array  # int32 scalar: optimizer steps taken
    params: Params
    opt_state: optax.OptState
    rng: Array  # uint32 key data of the dropout key; step n uses fold_in(rng, n)


def init_state(cfg: GPTConfig, tx: optax.GradientTransformation, rng: Array) -> TrainState:
    init_rng, dropout_rng = jax.random.split(rng)
    params = init_params(cfg, init_rng)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=tx.init(params),
        rng=jax.random.key_data(dropout_rng),
    )


# ----------------------------------------------------------------------------- steps


LossTerms = tuple[tuple[str, float], ...]  # losses.parse_terms(config.loss.terms)


def loss_fn(
    params: Params,
    batch_BxT1: Array,
    cfg: GPTConfig,
    *,
    train: bool,
    rng=None,
    terms: LossTerms = (),
) -> tuple[Array, dict[str, Array]]:
    """(objective, aux) of batch_BxT1 = inputs [:, :-1], targets [:, 1:]: the objective is the
    mean next-token cross-entropy (nats) plus each loss term's weight x mean; aux holds the
    mean of the cross-entropy and of each term by name when there are terms (none without)."""
    losses_BxT, term_values_BxT = next_token_loss_terms(
        params, batch_BxT1, cfg, terms, train=train, rng=rng
    )
    objective = losses_BxT.mean()
    aux = {}
    if terms:
        aux[CROSS_ENTROPY] = objective
        for (_, weight), (name, values_BxT) in zip(terms, term_values_BxT.items(), strict=True):
            aux[name] = values_BxT.mean()
            objective = objective + weight * aux[name]
    return objective, aux


def accumulated_value_and_grad(
    params: Params,
    batch_BxT1: Array,
    cfg: GPTConfig,
    dropout_rng: Array,
    grad_accum_steps: int,
    terms: LossTerms = (),
) -> tuple[tuple[Array, dict[str, Array]], Params]:
    """((objective, aux), grads) of the batch, from grad_accum_steps micro-batches in turn; the
    objective, every aux value and the grads are averaged over them."""
    value_and_grad = jax.value_and_grad(
        functools.partial(loss_fn, cfg=cfg, train=True, terms=terms), has_aux=True
    )
    if grad_accum_steps == 1:
        return value_and_grad(params, batch_BxT1, rng=dropout_rng)
    batch_size, width = batch_BxT1.shape
    if batch_size % grad_accum_steps:
        raise ValueError(
            f"batch of {batch_size} rows does not split into grad_accum_steps="
            f"{grad_accum_steps} micro-batches; use a batch_size divisible by it."
        )
    # Micro-batch a takes rows a, a + A, a + 2A, ...: with the batch split over devices in
    # contiguous blocks, every device holds its share of every micro-batch, so no row moves.
    rows_UxAxT1 = batch_BxT1.reshape(batch_size // grad_accum_steps, grad_accum_steps, width)
    micro_AxUxT1 = rows_UxAxT1.swapaxes(0, 1)

    def add_micro_batch(sums, inputs):
        index, micro_UxT1 = inputs
        rng = jax.random.fold_in(dropout_rng, index)
        values_and_grads = value_and_grad(params, micro_UxT1, rng=rng)
        return jax.tree_util.tree_map(jnp.add, sums, values_and_grads), None

    shapes = jax.eval_shape(value_and_grad, params, micro_AxUxT1[0], rng=dropout_rng)
    zeros = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
    sums, _ = jax.lax.scan(add_micro_batch, zeros, (jnp.arange(grad_accum_steps), micro_AxUxT1))
    # Equal micro-batches: the mean of their means is the mean over the batch.
    scale = 1.0 / grad_accum_steps
    return jax.tree_util.tree_map(lambda x: x * scale, sums)


def train_step(
    state: TrainState,
    batch_BxT1: Array,
    *,
    cfg: GPTConfig,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    grad_accum_steps: int = 1,
    terms: LossTerms = (),
) -> tuple[TrainState, dict[str, Array]]:
    """One optimizer step. Metrics: loss (the objective, before the update), grad_norm (before
    clipping), lr, and every aux value of the loss under its own name.

    grad_accum_steps > 1 splits the batch into that many micro-batches, run one after another
    (`lax.scan`), and averages their losses and gradients: the mean over the whole batch.
    """
    chex.assert_rank(batch_BxT1, 2)
    dropout_rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    (loss, aux), grads = accumulated_value_and_grad(
        state.params, batch_BxT1, cfg, dropout_rng, grad_accum_steps, terms
    )
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(
        step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
    )
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), "lr": schedule(state.step)}
    return new_state, {**aux, **metrics}


def state_shardings(cfg: GPTConfig, tx: optax.GradientTransformation, mesh: Mesh) -> Any:
    """NamedShardings of the whole train state on `mesh` (from shapes; nothing allocated), each
    parameter's from the mesh axes declared where the model creates it."""
    abstract = jax.eval_shape(functools.partial(init_state, cfg, tx), jax.random.key(0))
    annotated = jax.eval_shape(functools.partial(init_annotated_params, cfg), jax.random.key(0))
    return sharding.tree_shardings(abstract, mesh, annotated)


def make_init_state(
    cfg: GPTConfig, tx: optax.GradientTransformation, mesh: Mesh, shardings: Any = None
):
    """jit(rng -> TrainState), created directly in its sharded layout on `mesh` (`shardings`:
    `state_shardings(cfg, tx, mesh)`, worked out here when not given)."""
    if shardings is None:
        shardings = state_shardings(cfg, tx, mesh)
    return jax.jit(functools.partial(init_state, cfg, tx), out_shardings=shardings)


def make_train_chunk(
    cfg: GPTConfig,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    mesh: Mesh | None = None,
    shardings: Any = None,
    grad_accum_steps: int = 1,
    *,
    terms: LossTerms = (),
    donate: bool = True,
):
    """jit((state, batches_CxBxT1) -> (state, metrics of shape (C,))): C = steps_per_call steps
    per compiled call through `lax.scan`, the state donated (its buffers reused for the new
    state; `donate=False` only to measure what that saves). Dispatching once per C steps cuts
    per-call overhead. With a mesh, the state keeps its sharding (`shardings`, as for
    `make_init_state`) and the batches split over data × fsdp. Each step accumulates gradients
    over grad_accum_steps micro-batches of B / grad_accum_steps rows; `terms` are the loss
    terms added to the cross-entropy."""
    step = functools.partial(
        train_step,
        cfg=cfg,
        tx=tx,
        schedule=schedule,
        grad_accum_steps=grad_accum_steps,
        terms=terms,
    )

    def train_chunk(state, batches_CxBxT1):
        return jax.lax.scan(step, state, batches_CxBxT1)

    donate_argnums = (0,) if donate else ()
    if mesh is None:
        return jax.jit(train_chunk, donate_argnums=donate_argnums)
    state_sharding = state_shardings(cfg, tx, mesh) if shardings is None else shardings
    return jax.jit(
        train_chunk,
        in_shardings=(state_sharding, sharding.batch_sharding(mesh, 3)),
        out_shardings=(state_sharding, sharding.replicated(mesh)),
        donate_argnums=donate_argnums,
    )


def eval_step(
    params: Params, batch_BxT1: Array, *, cfg: GPTConfig, terms: LossTerms = ()
) -> tuple[dict[str, Array], Array]:
    """({"loss": sum of token losses, term name: sum of its values}, number of tokens): the
    host divides, so batches can be summed."""
    losses_BxT, term_values_BxT = next_token_loss_terms(params, batch_BxT1, cfg, terms)
    sums = {"loss": losses_BxT.sum(), **{k: v.sum() for k, v in term_values_BxT.items()}}
    return sums, jnp.asarray(losses_BxT.size, jnp.int32)


def make_eval_step(
    cfg: GPTConfig, mesh: Mesh | None = None, params_sharding: Any = None, terms: LossTerms = ()
):
    """jit((params, batch_BxT1) -> (sums, token count)), sharded like training on a mesh."""
    step = functools.partial(eval_step, cfg=cfg, terms=terms)
    if mesh is None:
        return jax.jit(step)
    return jax.jit(
        step,
        in_shardings=(params_sharding, sharding.batch_sharding(mesh, 2)),
        out_shardings=sharding.replicated(mesh),
    )


def metric_step(
    params: Params, batch_BxT1: Array, *, cfg: GPTConfig, metrics: tuple[str, ...]
) -> dict[str, Array]:
    """{metric name: its float32 value on the batch} of `eval_metrics.parse_metrics`' keys, from
    one deterministic forward over the inputs on the explicit attention path (which sows the
    attention weights) that keeps the 'intermediates' collection."""
    entries = [METRICS[key] for key in metrics]
    capture = any(entry.capture_intermediates for entry in entries)
    _, variables = GPT(cfg.replace(attention="explicit")).apply(
        {"params": params},
        batch_BxT1[:, :-1],
        mutable=["intermediates"],
        capture_intermediates=capture,
    )
    intermediates = flax.core.unfreeze(variables).get("intermediates", {})
    return {
        metric_name(key): jnp.asarray(entry.fn(params, batch_BxT1, intermediates, cfg))
        for key, entry in zip(metrics, entries, strict=True)
    }


def check_metrics(cfg: GPTConfig, metrics: tuple[str, ...]) -> None:
    """Runs every metric on a probe batch from shapes alone (jax.eval_shape, nothing computed)
    and raises ValueError naming the key and the contract for a value that is not a float
    scalar: before any work."""
    params = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
    batch_1xT1 = jax.ShapeDtypeStruct((1, min(cfg.block_size, 8) + 1), jnp.int32)
    for key in metrics:
        out = jax.eval_shape(
            functools.partial(metric_step, cfg=cfg, metrics=(key,)), params, batch_1xT1
        )
        check_value(key, out[metric_name(key)])


def make_metric_step(
    cfg: GPTConfig,
    metrics: tuple[str, ...],
    mesh: Mesh | None = None,
    params_sharding: Any = None,
):
    """jit((params, batch_BxT1) -> {name: value}) of `metric_step`, sharded like evaluation."""
    step = functools.partial(metric_step, cfg=cfg, metrics=metrics)
    if mesh is None:
        return jax.jit(step)
    return jax.jit(
        step,
        in_shardings=(params_sharding, sharding.batch_sharding(mesh, 2)),
        out_shardings=sharding.replicated(mesh),
    )


def evaluate(
    eval_fn,
    params: Params,
    tokens: np.ndarray,
    *,
    num_batches: int,
    batch_size: int,
    block_size: int,
    seed: int,
    split: str,
    mesh: Mesh | None = None,
    should_stop: Callable[[], bool] | None = None,
    metric_fn=None,
) -> dict[str, float] | None:
    """{"loss": mean next-token loss, term name: its mean, metric name: its mean over the
    batches} over `num_batches` fixed batches of a split (the same ones every time); eval_fn is
    `make_eval_step`'s, metric_fn (optional) `make_metric_step`'s. None when should_stop()
    turned true between two batches (a run asked to stop does not wait for a long pass)."""
    totals, count, metric_totals = {}, 0, {}
    for i in range(num_batches):
        if should_stop is not None and should_stop():
            return None
        batch = data.get_batch(tokens, batch_size, block_size, seed=seed, step=i, split=split)
        if mesh is not None:
            batch = sharding.put_batch(batch, sharding.batch_sharding(mesh, 2))
        sums, n = jax.device_get(eval_fn(params, batch))
        for key, value in sums.items():
            totals[key] = totals.get(key, 0.0) + float(value)
        count += int(n)
        if metric_fn is not None:
            for key, value in jax.device_get(metric_fn(params, batch)).items():
                metric_totals[key] = metric_totals.get(key, 0.0) + float(value)
    means = {key: total / count for key, total in totals.items()}
    # Equal batches: the mean of the batches' means.
    means.update({key: total / num_batches for key, total in metric_totals.items()})
    return means
