"""The model's layers: the Dense layers' options and init, normalisation layers and MLP
activations (the registries `NORMS` and `ACTIVATIONS`).

Dense layers are flax's, differentiated by autodiff; where a faster contraction of the same
math stands in (a hand-written VJP, bfloat16 operands: `GPTConfig.dense_grad`, `matmul_dtype`),
it comes from the speed room in one read, `cfg.parts.speed.dot_general` (model/speed/dense.py).

A norm entry is one function `(cfg, name) -> flax module` that normalises the last axis (D);
an activation entry is one function `x -> x`, applied elementwise to the MLP's hidden units.
`config.model.norm` and `config.model.activation` pick them by name, or `module:attr` names your
own (e.g. `--config.model.activation=jax.nn:silu`).

LayerNorm is flax's likewise; where a faster layer of the same math and
parameters stands in (a hand-written VJP: `GPTConfig.norm_grad`), it comes from the speed room
in one read, `cfg.parts.speed` (minigpt_jax/model/speed/).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from minigpt_jax.model.config import GPTConfig
from minigpt_jax.settings.registry import ContractError, Registry, expect_shape

Array = chex.Array

# Every weight of the model is initialised N(0, 0.02^2), as GPT-2 / nanoGPT; the projections
# into the residual stream are scaled down further (`residual_init`).
INIT_STDDEV = 0.02


def dense_options(cfg: GPTConfig) -> dict:
    """Keyword arguments every Dense / DenseGeneral layer of the model shares: bias, dtypes and
    the `dot_general` the speed room stands in with (None: flax's `lax.dot_general`)."""
    return dict(
        use_bias=cfg.use_bias,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.weight_dtype,
        dot_general=cfg.parts.speed.dot_general,
    )


def residual_init(cfg: GPTConfig):
    """Init of the projections into the residual stream: GPT-2 scales N(0, 0.02²) by
    1/sqrt(2N), two per block; zeros with cfg.zero_init_proj (the NanoGPT speedrun)."""
    if cfg.zero_init_proj:
        return nn.initializers.zeros_init()
    return nn.initializers.normal(stddev=INIT_STDDEV / (2 * cfg.n_layer) ** 0.5)


# PyTorch's LayerNorm epsilon, which GPT-2 and nanoGPT use; RMSNorm takes the same.
NORM_EPS = 1e-5


def layer_norm(cfg: GPTConfig, name: str) -> nn.Module:
    """(x - mean) / sqrt(var + eps) * scale + bias over D (Ba et al. 2016; GPT-2): flax's
    nn.LayerNorm, or the speed room's layer of the same parameters and math."""
    return cfg.parts.speed.layer_norm(
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


def _norm_contract(make: Callable[[GPTConfig, str], nn.Module], cfg: GPTConfig) -> None:
    """make(cfg, name) is a flax module mapping x_BxTxD to an output of the same shape."""
    module = make(cfg, "ln_probe")
    if not isinstance(module, nn.Module):
        raise ContractError(f"it returned {type(module).__name__}, not a flax module")
    x_BxTxD = jax.ShapeDtypeStruct((2, 3, cfg.n_embd), cfg.compute_dtype)
    out, _ = jax.eval_shape(lambda x: module.init_with_output(jax.random.key(0), x), x_BxTxD)
    expect_shape(out, x_BxTxD.shape, "its module's output (x_BxTxD in)", dtype_kind="f")


NORMS: Registry[Callable[[GPTConfig, str], nn.Module]] = Registry(
    "norm",
    "model.norm",
    {"layernorm": layer_norm, "rmsnorm": rms_norm},
    arity=2,
    shape="a function (cfg, name) -> flax module normalising the last axis (D)",
    contract=_norm_contract,
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
    arity=1,
    shape="a function x -> x applied elementwise (output shape = input shape)",
    contract=lambda fn, cfg: _activation_contract(fn, cfg),
)


def _activation_contract(fn: Callable[[Any], Any], cfg: GPTConfig) -> None:
    """fn maps the MLP's hidden units h_BxTxF to an array of the same shape."""
    h_BxTxF = jax.ShapeDtypeStruct((2, 3, cfg.mlp_dim), cfg.compute_dtype)
    expect_shape(jax.eval_shape(fn, h_BxTxF), h_BxTxF.shape, "its output", dtype_kind="f")


def activation_fn(cfg: GPTConfig) -> Callable[[Any], Any]:
    """cfg's MLP activation; "gelu" follows cfg.gelu_approximate (GPT-2's tanh form)."""
    return cfg.parts.activation
