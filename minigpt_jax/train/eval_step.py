"""The compiled evaluation steps that a run builds at its setup (train.setup), beside the train
step (train.step): the eval step (the loss and every loss term, summed so batches add up) and the
metric step (config.eval.metrics over the model's intermediates), sharded like training."""

from __future__ import annotations

import functools
from typing import Any

import chex
import flax
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from minigpt_jax import sharding
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.gpt import GPT, Params, init_params, next_token_loss_terms, target_weights
from minigpt_jax.model.loss_terms import PickedTerm
from minigpt_jax.train.eval_metrics import METRICS, check_value, metric_name

Array = chex.Array
LossTerms = tuple[PickedTerm, ...]  # loss_terms.parse_terms(config.loss.terms, config.loss)


def eval_step(
    params: Params, batch_BxT1: Array, *, cfg: GPTConfig, terms: LossTerms = ()
) -> tuple[dict[str, Array], Array]:
    """({"loss": sum of token losses, term name: sum of its values}, number of tokens): the
    host divides, so batches can be summed."""
    losses_BxT, term_values_BxT = next_token_loss_terms(params, batch_BxT1, cfg, terms)
    weights_BxT = target_weights(batch_BxT1, cfg)  # 0: a target across packed documents
    sums = {
        "loss": (losses_BxT * weights_BxT).sum(),
        **{k: (v * weights_BxT).sum() for k, v in term_values_BxT.items()},
    }
    return sums, weights_BxT.sum().astype(jnp.int32)


def make_eval_step(
    cfg: GPTConfig, mesh: Mesh | None = None, params_sharding: Any = None, terms: LossTerms = ()
):
    """jit((params, batch_BxT1) -> (sums, token count)), sharded like training on a mesh."""
    return _jit_over_batches(
        functools.partial(eval_step, cfg=cfg, terms=terms), mesh, params_sharding
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
    return _jit_over_batches(step, mesh, params_sharding)


def _jit_over_batches(step, mesh: Mesh | None, params_sharding: Any):
    """jit(step(params, batch_BxT1)): on a mesh, params as training holds them, the batch split
    over the batch axes, the result replicated."""
    if mesh is None:
        return jax.jit(step)
    return jax.jit(
        step,
        in_shardings=(params_sharding, sharding.batch_sharding(mesh, 2)),
        out_shardings=sharding.replicated(mesh),
    )
