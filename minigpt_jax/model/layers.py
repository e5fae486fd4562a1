"""Normalisation layers and MLP activations: the registries `NORMS` and `ACTIVATIONS`.

A norm entry is one function `(cfg, name) -> flax module` that normalises the last axis (D);
an activation entry is one function `x -> x`, applied elementwise to the MLP's hidden units.
`config.model.norm` and `config.model.activation` pick them by name, or `module:attr` names your
own (e.g. `--config.model.activation=jax.nn:silu`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from minigpt_jax.registry import Registry

GPTConfig = Any  # a config.GPTConfig (config imports this module, not the other way)

# PyTorch's LayerNorm epsilon, which GPT-2 and nanoGPT use; RMSNorm takes the same.
NORM_EPS = 1e-5


def layer_norm(cfg: GPTConfig, name: str) -> nn.Module:
    """(x - mean) / sqrt(var + eps) * scale + bias over D (Ba et al. 2016; GPT-2)."""
    return nn.LayerNorm(
        epsilon=NORM_EPS,
        use_bias=cfg.use_bias,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.weight_dtype,
        name=name,
    )


def rms_norm(cfg: GPTConfig, name: str) -> nn.Module:
    """x / sqrt(mean(x²) + eps) * scale over D, no centring and no bias (Zhang & Sennrich 2019)."""
    return nn.RMSNorm(
        epsilon=NORM_EPS, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype, name=name
    )


def rms_normalize(x, eps: float = 1e-6):
    """x / sqrt(mean(x²) + eps) over the last axis, in float32, without a scale (QK-norm)."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), -1, keepdims=True) + eps)).astype(x.dtype)


def _callable(what: str) -> Callable[[Any], Any]:
    def coerce(value: Any) -> Any:
        if not callable(value):
            raise TypeError(f"a {what} entry must be a function, got {type(value).__name__}.")
        return value

    return coerce


NORMS: Registry[Callable[[GPTConfig, str], nn.Module]] = Registry(
    "norm", "model.norm", {"layernorm": layer_norm, "rmsnorm": rms_norm}, coerce=_callable("norm")
)


def relu_squared(x):
    """max(x, 0)²: the speedrun's MLP activation (So et al. 2021, Primer)."""
    return jnp.square(nn.relu(x))


ACTIVATIONS: Registry[Callable[[Any], Any]] = Registry(
    "activation",
    "model.activation",
    {
        "gelu": functools.partial(nn.gelu, approximate=False),  # the exact erf form
        "gelu_tanh": functools.partial(nn.gelu, approximate=True),  # GPT-2's approximation
        "relu": nn.relu,
        "relu2": relu_squared,
    },
    coerce=_callable("activation"),
)


def activation_fn(cfg: GPTConfig) -> Callable[[Any], Any]:
    """cfg's MLP activation; "gelu" follows cfg.gelu_approximate (GPT-2's tanh form)."""
    name = "gelu_tanh" if cfg.activation == "gelu" and cfg.gelu_approximate else cfg.activation
    return ACTIVATIONS[name]
