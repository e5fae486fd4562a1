"""The train step: the train state, the loss with its aux values, gradient accumulation, the
optimizer update, and its jit-compiled, sharded form over a chunk of steps (`train.loop`
drives it)."""

from __future__ import annotations

import functools
from typing import Any

import chex
import flax
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from minigpt_jax import sharding
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.gpt import (
    Params,
    init_annotated_params,
    init_params,
    next_token_loss_terms,
    next_token_losses,
    target_weights,
)
from minigpt_jax.model.loss_terms import CROSS_ENTROPY, PickedTerm
from minigpt_jax.model.speed import backend
from minigpt_jax.train.gradients import StepGradient, plain
from minigpt_jax.train.step_metrics import step_metric_values

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


LossTerms = tuple[PickedTerm, ...]  # loss_terms.parse_terms(config.loss.terms, config.loss)


def loss_fn(
    params: Params,
    batch_BxT1: Array,
    cfg: GPTConfig,
    *,
    train: bool,
    rng=None,
    terms: LossTerms = (),
    step: Array | None = None,
) -> tuple[Array, dict[str, Array]]:
    """(objective, aux) of batch_BxT1 = inputs [:, :-1], targets [:, 1:]: the objective is the
    mean next-token cross-entropy (nats) plus each loss term's weight x mean; aux holds the
    mean of the cross-entropy and of each term by name when there are terms (none without).
    With packed documents a target across a boundary is left out of every mean
    (`target_weights`). `step` (optimizer steps taken) is what a term's `TermContext` reads."""
    if terms or cfg.parts.mask.documents:
        return _loss_with_terms(
            params, batch_BxT1, cfg, train=train, rng=rng, terms=terms, step=step
        )
    losses_BxT = next_token_losses(params, batch_BxT1, cfg, train=train, rng=rng, step=step)
    return losses_BxT.mean(), {}  # the plain objective: every target counts


def _loss_with_terms(
    params: Params,
    batch_BxT1: Array,
    cfg: GPTConfig,
    *,
    train: bool,
    rng: Array | None,
    terms: LossTerms,
    step: Array | None,
) -> tuple[Array, dict[str, Array]]:
    """`loss_fn` with loss terms or packed documents: the weighted means of the cross-entropy
    and of each term, over the targets `target_weights` keeps."""
    losses_BxT, term_values_BxT = next_token_loss_terms(
        params, batch_BxT1, cfg, terms, train=train, rng=rng, step=step
    )
    weights_BxT = target_weights(batch_BxT1, cfg)
    total = weights_BxT.sum()

    def mean(values_BxT):
        return (values_BxT * weights_BxT).sum() / total

    objective = mean(losses_BxT)
    aux = {}
    if terms:
        aux[CROSS_ENTROPY] = objective
        for term, (name, values_BxT) in zip(terms, term_values_BxT.items(), strict=True):
            aux[name] = mean(values_BxT)
            objective = objective + term.weight * aux[name]
    return objective, aux


def micro_batched(value_and_grad, grad_accum_steps: int):
    """`value_and_grad(params, batch_BxT1, rng)`'s ((objective, aux), grads) from
    grad_accum_steps micro-batches of B / grad_accum_steps rows run in turn (`lax.scan`), each
    with its own dropout key; the objective, every aux value and the grads are averaged."""

    def accumulated(params: Params, batch_BxT1: Array, rng: Array):
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
            values_and_grads = value_and_grad(params, micro_UxT1, jax.random.fold_in(rng, index))
            return jax.tree_util.tree_map(jnp.add, sums, values_and_grads), None

        shapes = jax.eval_shape(value_and_grad, params, micro_AxUxT1[0], rng)
        zeros = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
        steps = (jnp.arange(grad_accum_steps), micro_AxUxT1)
        sums, _ = jax.lax.scan(add_micro_batch, zeros, steps)
        # Equal micro-batches: the mean of their means is the mean over the batch.
        scale = 1.0 / grad_accum_steps
        return jax.tree_util.tree_map(lambda x: x * scale, sums)

    return accumulated


def accumulated_value_and_grad(
    params: Params,
    batch_BxT1: Array,
    cfg: GPTConfig,
    dropout_rng: Array,
    grad_accum_steps: int,
    terms: LossTerms = (),
    step: Array | None = None,
) -> tuple[tuple[Array, dict[str, Array]], Params]:
    """((objective, aux), grads) of the batch, from grad_accum_steps micro-batches in turn, as
    the train step computes them."""
    value_and_grad = _objective_value_and_grad(cfg, terms, step)
    if grad_accum_steps > 1:
        value_and_grad = micro_batched(value_and_grad, grad_accum_steps)
    return value_and_grad(params, batch_BxT1, dropout_rng)


def _objective_value_and_grad(cfg: GPTConfig, terms: LossTerms, step: Array | None):
    """(params, batch_BxT1, rng) -> ((objective, aux), grads) of `loss_fn` in training."""

    def objective(params, batch_BxT1, rng):
        return loss_fn(params, batch_BxT1, cfg, train=True, rng=rng, terms=terms, step=step)

    return jax.value_and_grad(objective, has_aux=True)


def train_step(
    state: TrainState,
    batch_BxT1: Array,
    *,
    cfg: GPTConfig,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    grad_accum_steps: int = 1,
    terms: LossTerms = (),
    step_metrics: tuple[str, ...] = (),
    gradient: StepGradient = plain,
) -> tuple[TrainState, dict[str, Array]]:
    """One optimizer step. Metrics: loss (the objective, before the update), grad_norm (before
    clipping), lr, every aux value of the loss under its own name, and the values of the
    `step_metrics` entries (`step_metrics.STEP_METRICS`: of the gradients, updates and params).

    grad_accum_steps > 1 splits the batch into that many micro-batches, run one after another
    (`micro_batched`), and averages their losses and gradients: the mean over the whole batch.
    `gradient` (config.optim.gradient's rule, `gradients.step_gradient`) takes the step's
    value_and_grad and returns the loss and the gradient the optimizer applies; `plain` (the
    default) is the value_and_grad at the params.
    """
    chex.assert_rank(batch_BxT1, 2)
    dropout_rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)

    def objective(params):
        return loss_fn(
            params, batch_BxT1, cfg, train=True, rng=dropout_rng, terms=terms, step=state.step
        )

    if grad_accum_steps == 1 and gradient is plain:
        (loss, aux), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
    else:  # micro-batches in turn, or a gradient rule (sharpness-aware: a second gradient)
        value_and_grad = functools.partial(
            accumulated_value_and_grad,
            batch_BxT1=batch_BxT1,
            cfg=cfg,
            dropout_rng=dropout_rng,
            grad_accum_steps=grad_accum_steps,
            terms=terms,
            step=state.step,
        )
        (loss, aux), grads = gradient(value_and_grad, state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(
        step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
    )
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), "lr": schedule(state.step)}
    metrics.update(aux)
    if step_metrics:
        metrics.update(step_metric_values(step_metrics, grads, updates, state.params, set(metrics)))
    return new_state, metrics


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
    step_metrics: tuple[str, ...] = (),
    gradient: StepGradient = plain,
    donate: bool = True,
):
    """jit((state, batches_CxBxT1) -> (state, metrics of shape (C,))): C = steps_per_call steps
    per compiled call through `lax.scan`, the state donated (its buffers reused for the new
    state; `donate=False` only to measure what that saves). Dispatching once per C steps cuts
    per-call overhead. With a mesh, the state keeps its sharding (`shardings`, as for
    `make_init_state`) and the batches split over data × fsdp. Each step accumulates gradients
    over grad_accum_steps micro-batches of B / grad_accum_steps rows; `terms` are the loss
    terms added to the cross-entropy, `step_metrics` the per-step metrics' keys, `gradient`
    the rule of the gradient applied (`gradients.step_gradient(optim)`). The step is
    traced with cfg's "auto" speed settings resolved for this backend and CPU before the trace
    (`backend.for_training`)."""
    step = functools.partial(
        train_step,
        cfg=backend.for_training(cfg),
        tx=tx,
        schedule=schedule,
        grad_accum_steps=grad_accum_steps,
        terms=terms,
        step_metrics=step_metrics,
        gradient=gradient,
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
