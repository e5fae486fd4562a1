"""Metrics computed at every evaluation: the registry `METRICS`.

A metric is one function `(params, batch_BxT1, intermediates, cfg) -> value`: `params` the
evaluated parameters, `batch_BxT1` one evaluation batch (inputs [:, :-1], targets [:, 1:]),
`intermediates` the model's 'intermediates' collection of a forward pass over the inputs on the
explicit attention path (what modules `sow`: `block_{i}/attn/attention_weights` (B, H, T, T),
each a tuple of the values sown), and `cfg` the GPTConfig; the value is a float scalar, the
batch's mean. A `Metric` also sets `capture_intermediates`: the forward then records every
module's output too (flax `capture_intermediates`: `<module path>/__call__`). An evaluation
averages a metric over its batches and logs it as `val_<name>` and `eval_train_<name>` beside
the losses (metrics.jsonl, TensorBoard). `config.eval.metrics` picks metrics as a comma list of
names of `METRICS` or `module:attr` of your own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import chex
import jax.numpy as jnp

from minigpt_jax.model.config import GPTConfig
from minigpt_jax.settings.registry import Registry, is_user_key

Array = chex.Array
MetricFn = Callable[[Any, Array, dict, Any], Array]

CONTRACT = (
    "a metric is a function (params, batch_BxT1, intermediates, cfg) -> a float scalar, or an "
    "eval_metrics.Metric"
)


@dataclasses.dataclass(frozen=True)
class Metric:
    """A metric function and whether it reads every module's output (`capture_intermediates`)
    rather than only what the modules sow."""

    fn: MetricFn
    capture_intermediates: bool = False


def attn_entropy(params: Any, batch_BxT1: Array, intermediates: dict, cfg: GPTConfig) -> Array:
    """The mean entropy (nats) of layer 0's attention rows: log T for uniform attention over T
    keys, 0 for a head that looks at one key."""
    del params, batch_BxT1, cfg
    weights_BxHxTxS = intermediates["block_0"]["attn"]["attention_weights"][0]
    weights_BxHxTxS = weights_BxHxTxS.astype(jnp.float32)
    logs_BxHxTxS = jnp.log(jnp.where(weights_BxHxTxS > 0, weights_BxHxTxS, 1.0))
    return -(weights_BxHxTxS * logs_BxHxTxS).sum(-1).mean()


def embed_norm(params: Any, batch_BxT1: Array, intermediates: dict, cfg: GPTConfig) -> Array:
    """The Frobenius norm of the token table (its V rows; the padding rows stay zero)."""
    del batch_BxT1, intermediates
    table_VxD = params["embed"]["tok"]["embedding"][: cfg.vocab_size].astype(jnp.float32)
    return jnp.sqrt(jnp.square(table_VxD).sum())


def split_metrics(spec: str) -> list[str]:
    """The keys of an `eval.metrics` value: its comma-separated items."""
    return [part.strip() for part in spec.split(",") if part.strip()]


METRICS: Registry[Metric] = Registry(
    "metric",
    "eval.metrics",
    {"attn_entropy": Metric(attn_entropy), "embed_norm": Metric(embed_norm)},
    entry_class=Metric,
    arity=4,
    shape="a function (params, batch_BxT1, intermediates, cfg) -> a float scalar, or an "
    "eval_metrics.Metric",
    split=split_metrics,
)


def parse_metrics(spec: str) -> tuple[str, ...]:
    """`eval.metrics` as (key, ...), every key resolved (RegistryError naming it and the fix).
    Hashable: the compiled metric step closes over it."""
    keys = tuple(split_metrics(spec))
    for key in keys:
        METRICS[key]
    names = [metric_name(key) for key in keys]
    if len(set(names)) != len(names):
        raise ValueError(
            f"config.eval.metrics={spec!r} names a metric twice: each is logged under its name "
            "(its registry key, or attr of module:attr), so names must differ."
        )
    return keys


def metric_name(key: str) -> str:
    """The name a metric is logged under: its registry key, or `attr` of `module:attr`."""
    return key.rpartition(":")[2].rpartition(".")[2] if is_user_key(key) else key


def check_value(key: str, value: Any) -> None:
    """Raises ValueError naming the key and the contract unless `value` (a jax.eval_shape
    result) is a float scalar."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape != () or dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"config.eval.metrics: {key!r} returned "
            + (f"an array of shape {shape} and dtype {dtype}" if shape is not None else repr(value))
            + f", not a float scalar: {CONTRACT}; return the batch's mean, e.g. x.mean()."
        )
