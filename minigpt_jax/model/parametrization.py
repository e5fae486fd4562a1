"""Parametrizations: how the init, the learning rates and two multipliers follow the width
(`model.parametrization`, the registry `PARAMETRIZATIONS`).

A `Parametrization` holds four rules, each None (nothing changes) or a function:
  init           (meta, shape, cfg) -> the factor on a parameter's initial value
  learning_rate  (meta, shape, cfg, orthogonalised) -> the factor on its update (the whole
                 update: decoupled weight decay too, as a per-group rate in PyTorch's AdamW);
                 orthogonalised: Muon orthogonalises it (the built-in `muon`, a matrix that
                 declares Muon dimension numbers)
  attention      cfg -> the factor on the scores q·kᵀ/√K (put on the queries, so every kernel
                 applies it)
  readout        cfg -> the factor on the features h before the read-out h·W (mup's MuReadout)
`meta` is the parameter's `param_meta.ParamMeta`, `shape` its shape. "standard" has no rule: the
model is GPT-2's, step for step, bit for bit. Name your own as `module:attr`.

"mup" is μP (Yang et al. 2022, "Tensor Programs V", arXiv:2203.03466; microsoft/mup), for Adam,
with the width multiplier m = n_embd / mup_base_width:
  hidden matrices  (those declaring Muon dimension numbers: the blocks' attention and MLP
                   kernels, every matrix whose fan-in and fan-out both grow with the width):
                   init std x 1/√m (fan-in init, relative to the base), Adam's rate x 1/m
  embeddings       (the token and position tables), biases, norm gains: unchanged
  read-out         h x 1/m before the logits (tied or untied: the tied table is then both an
                   input and mup's MuSharedReadout, and keeps its init and rate; an untied head
                   keeps them too, and `zero_init_proj` zero-inits it, as mup recommends)
  attention        scores q·kᵀ · √K_base / K in place of q·kᵀ / √K: 1/K as μP asks, equal to the
                   standard scale at K = K_base (K_base: mup_base_head_dim, or
                   mup_base_width / n_head)
At m = 1 (and K = K_base) every factor is 1, and the model is the standard one.
Under Muon (optim.name=muon) the orthogonalised matrices keep their rate: their update is
orthogonalised (singular values near 1) and scaled by sqrt(max(1, fan_out / fan_in)), so its
spectral norm does not grow with the width, which is the spectral condition for feature learning
(Yang, Simon & Bernstein 2023, arXiv:2310.17813) that μP's Adam rate of 1/m secures; their init
follows the rule above, and the AdamW leaves (embeddings, head, biases, norms) Adam's rules.
Another optimizer is given Adam's rules.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from minigpt_jax.model.config import STANDARD as STANDARD_KEY
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.param_meta import VECTOR, Declared, ParamMeta
from minigpt_jax.settings.groups import MODEL, options_of, setting
from minigpt_jax.settings.registry import REGISTRIES, Registry, declares

Array = chex.Array
Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Parametrization:
    """The rules of a parametrization (see the module docstring); None: no change."""

    init: Callable[[ParamMeta, Shape, GPTConfig], float] | None = None
    learning_rate: Callable[[ParamMeta, Shape, GPTConfig, bool], float] | None = None
    attention: Callable[[GPTConfig], float] | None = None
    readout: Callable[[GPTConfig], float] | None = None


@dataclasses.dataclass(frozen=True)
class MupOptions:
    """The mup entry's own settings (`model.mup_base_width`, `model.mup_base_head_dim`)."""

    mup_base_width: int = setting(
        128,
        "mup: the base width d_base; the width multiplier is m = n_embd / d_base, and at "
        "n_embd = d_base the model is the standard one (a base tuned there transfers)",
        MODEL,
        low=1,
        high=1 << 17,
    )
    mup_base_head_dim: int = setting(
        0,
        "mup: K_base, the head width where attention's √K_base/K equals 1/√K; 0: "
        "mup_base_width / n_head (the base keeps n_head); set it to the head width of a ladder "
        "that keeps the head width and adds heads",
        MODEL,
        low=0,
        high=1 << 17,
    )


def width_multiplier(cfg: GPTConfig) -> float:
    """m = n_embd / mup_base_width of a mup config."""
    return cfg.n_embd / options_of(cfg, MupOptions).mup_base_width


def is_hidden(meta: ParamMeta) -> bool:
    """Whether μP treats the parameter as a hidden matrix: it declares Muon dimension numbers,
    the package's mark of a matrix from width to width (embeddings and head declare none)."""
    return meta.muon is not None


def _mup_init(meta: ParamMeta, shape: Shape, cfg: GPTConfig) -> float:
    return width_multiplier(cfg) ** -0.5 if is_hidden(meta) else 1.0


def _mup_learning_rate(
    meta: ParamMeta, shape: Shape, cfg: GPTConfig, orthogonalised: bool
) -> float:
    return 1.0 / width_multiplier(cfg) if is_hidden(meta) and not orthogonalised else 1.0


def _mup_attention(cfg: GPTConfig) -> float:
    options = options_of(cfg, MupOptions)
    base_head_dim = options.mup_base_head_dim or options.mup_base_width / cfg.n_head
    return math.sqrt(base_head_dim / cfg.head_dim)


def _mup_readout(cfg: GPTConfig) -> float:
    return 1.0 / width_multiplier(cfg)


STANDARD = Parametrization()
MUP = declares(MupOptions)(
    Parametrization(
        init=_mup_init,
        learning_rate=_mup_learning_rate,
        attention=_mup_attention,
        readout=_mup_readout,
    )
)

PARAMETRIZATIONS: Registry[Parametrization] = Registry(
    "parametrization",
    "model.parametrization",
    {STANDARD_KEY: STANDARD, "mup": MUP},
    entry_class=Parametrization,
    shape="a minigpt_jax.model.parametrization.Parametrization",
)


def parametrization_of(cfg: GPTConfig) -> Parametrization:
    """cfg.parametrization's entry."""
    return REGISTRIES["model.parametrization"][cfg.parametrization]


def scale_init(annotated_params: Any, cfg: GPTConfig) -> Any:
    """The boxed params (`init_annotated_params`') with each value times its init factor; the
    tree itself where the parametrization has no init rule."""
    rule = parametrization_of(cfg).init
    if rule is None:
        return annotated_params

    def scaled(leaf):
        boxed = isinstance(leaf, nn.Partitioned)
        value = leaf.value if boxed else leaf
        meta = leaf.meta if isinstance(leaf, Declared) else VECTOR
        factor = rule(meta, tuple(value.shape), cfg)
        if factor == 1.0:
            return leaf
        value = value * jnp.asarray(factor, value.dtype)
        return leaf.replace_boxed(value) if boxed else value

    return jax.tree_util.tree_map(
        scaled, annotated_params, is_leaf=lambda x: isinstance(x, nn.Partitioned)
    )


def scale_queries(q_BxTxHxK: Array, cfg: GPTConfig) -> Array:
    """The queries times the parametrization's attention factor (the scores' factor, for every
    kernel alike); the queries themselves without a rule."""
    rule = parametrization_of(cfg).attention
    factor = 1.0 if rule is None else rule(cfg)
    return q_BxTxHxK if factor == 1.0 else q_BxTxHxK * jnp.asarray(factor, q_BxTxHxK.dtype)


def scale_readout(h_xD: Array, cfg: GPTConfig) -> Array:
    """The features before the read-out times the parametrization's readout factor; the
    features themselves without a rule."""
    rule = parametrization_of(cfg).readout
    factor = 1.0 if rule is None else rule(cfg)
    return h_xD if factor == 1.0 else h_xD * jnp.asarray(factor, h_xD.dtype)
