"""The "auto" speed settings, resolved per backend (and, for the training step's matmul dtype,
per CPU) once per model config: the one door from the reference core to the speed room.

A `GPTConfig` keeps "auto" (it is saved with checkpoints and must load on any backend); what
"auto" means on `jax.default_backend()` is decided here, once per config, on its first use
(`speed_of(cfg)`, a `SpeedChoices`: after JAX's backends are up, never saved, kept in
`cfg.parts.speed` with the config's other resolved entries), and the model's layers take what
it holds: the Dense layers' `dot_general`, the LayerNorm class, the attention kernel of each
kind of call. With every speed setting plain (dense_grad and norm_grad
"autodiff", matmul_dtype "float32", attention "explicit") those are flax's and the plain
softmax path. Each choice is the same math as the plain path within float
tolerance (tests/test_backend.py checks values and gradients), but for bfloat16 matmul
operands in training, within a stated, tested one.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax

from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.speed.choices import REMAT_POLICIES
from minigpt_jax.model.speed.dense import dot_general_for
from minigpt_jax.model.speed.layernorm import DirectLayerNorm
from minigpt_jax.settings.registry import resolve_builtin

# The kernels' table, found when a config's choices are first made: the kernels' module builds
# on the attention module, which asks this one for its choices.
KERNEL_TABLE = "minigpt_jax.model.speed.kernels:kernel_table"


@dataclasses.dataclass(frozen=True)
class SpeedChoices:
    """A config's speed settings as this backend runs them, "auto" resolved (`speed_of`).

    dense_grad, norm_grad: "direct" (the hand-written VJP) or "autodiff"; matmul_dtype: the
    Dense layers' operand dtype, "float32" or "bfloat16"; dot_general: what the Dense layers
    contract with (None: flax's lax.dot_general); layer_norm: nn.LayerNorm or
    `DirectLayerNorm` (the same parameters); kernels: the attention kernel (a
    `kernels.AttentionKernel`) of each kind of call, by (weight_dropout, cached, plain_mask)
    as `kernels.choose_kernel` takes them; remat_policy: what model.remat keeps for the
    backward pass (`choices.REMAT_POLICIES`; None: everything).
    """

    dense_grad: str
    norm_grad: str
    matmul_dtype: str
    kernels: Mapping[tuple[bool, bool, bool], Any]
    dot_general: Any = None
    layer_norm: type[nn.Module] = nn.LayerNorm
    remat_policy: Any = None


def speed_of(cfg: GPTConfig) -> SpeedChoices:
    """cfg's speed choices, made on first use and kept with the config (a pickle leaves them
    out: another process, another backend, makes its own)."""
    return cfg.__dict__.get("_speed") or _choices_made(cfg)


def _choices_made(cfg: GPTConfig) -> SpeedChoices:
    """The choices `speed_of` keeps with cfg, made now."""
    dense, norm, operands = dense_grad(cfg), norm_grad(cfg), matmul_dtype(cfg)
    made = SpeedChoices(
        dense_grad=dense,
        norm_grad=norm,
        matmul_dtype=operands,
        kernels=resolve_builtin(KERNEL_TABLE)(cfg),
        dot_general=dot_general_for(dense, operands),
        layer_norm=DirectLayerNorm if norm == "direct" else nn.LayerNorm,
        remat_policy=REMAT_POLICIES[cfg.remat],
    )
    object.__setattr__(cfg, "_speed", made)  # frozen: set as cached_property would
    return made


def dense_grad(cfg: GPTConfig) -> str:
    """cfg.dense_grad resolved: "auto" is "direct" (the hand-written VJP) on XLA:CPU, where it
    saves the transposes autodiff leaves around the backward dots (benchmarks/README.md), and
    "autodiff" elsewhere."""
    return _direct_on_cpu(cfg.dense_grad)


def norm_grad(cfg: GPTConfig) -> str:
    """cfg.norm_grad resolved: "auto" is "direct" (layernorm.DirectLayerNorm's VJP) on XLA:CPU,
    where it runs the norms in fewer passes (benchmarks/README.md), and "autodiff" elsewhere."""
    return _direct_on_cpu(cfg.norm_grad)


def _direct_on_cpu(choice: str) -> str:
    """A hand-written VJP's setting resolved: "auto" is "direct" on XLA:CPU, "autodiff"
    elsewhere; any other value as it is."""
    if choice != "auto":
        return choice
    return "direct" if jax.default_backend() == "cpu" else "autodiff"


# /proc/cpuinfo flags of the CPUs whose bfloat16 dot products (float32 sums) beat float32 ones:
# AVX512-BF16's vdpbf16ps (Zen 4, Cooper Lake on), AMX-BF16 tiles (Sapphire Rapids on).
BF16_DOT_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def has_bf16_dot(cpu_flags: str) -> bool:
    """Whether a /proc/cpuinfo "flags" line (or just its value) names a bfloat16 dot unit."""
    return not BF16_DOT_FLAGS.isdisjoint(cpu_flags.replace(":", " ").split())


@functools.cache
def cpu_flags() -> str:
    """The first "flags" line of /proc/cpuinfo, read once; "" where there is none."""
    path = Path("/proc/cpuinfo")
    text = path.read_text() if path.exists() else ""
    return next((line for line in text.splitlines() if line.startswith("flags")), "")


def bf16_matmuls_pay() -> bool:
    """Whether bfloat16 matmul operands (float32 sums) run faster than float32 ones here: XLA:CPU
    on a CPU with a bfloat16 dot unit (elsewhere XLA:CPU converts them to float32)."""
    return jax.default_backend() == "cpu" and has_bf16_dot(cpu_flags())


def matmul_dtype(cfg: GPTConfig) -> str:
    """cfg.matmul_dtype resolved inside the model: "auto" is "float32", so evaluation,
    sampling, export and GPT-2 interop compute the same figures from the same weights on every
    CPU; a training step resolves "auto" before it is traced (`for_training`)."""
    if cfg.matmul_dtype != "auto":
        return cfg.matmul_dtype
    return "float32"


def for_training(cfg: GPTConfig) -> GPTConfig:
    """The config a training step is traced with, its `speed` choices made before the trace:
    matmul_dtype "auto" resolved to "bfloat16" where `bf16_matmuls_pay()` (0.87-0.91x the
    ms/step on an AMD EPYC with AVX512-BF16, its loss curve within seed noise of float32:
    docs/speed.md) and "float32" elsewhere; any other value as it is. The run's config
    keeps "auto" (checkpoints move between machines); each machine's step is the same on
    every rerun. Where "auto" trains in float32, which is what the model reads "auto" as
    (`matmul_dtype`), the run's config is the step's as it is: no second config."""
    if cfg.matmul_dtype == "auto" and training_matmul_dtype() != matmul_dtype(cfg):
        cfg = cfg.replace(matmul_dtype=training_matmul_dtype())
    cfg.parts  # noqa: B018 (its entries and speed choices made now, not while the step is traced)
    return cfg


def training_matmul_dtype() -> str:
    """What "auto" means for a training step's matmul operands here (the model's Dense layers,
    Muon's Newton-Schulz): "bfloat16" where `bf16_matmuls_pay()`, else "float32"."""
    return "bfloat16" if bf16_matmuls_pay() else "float32"
