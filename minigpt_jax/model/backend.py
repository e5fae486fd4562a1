"""The "auto" speed settings, resolved per backend (and, for the training step's matmul dtype,
per CPU) once per model config.

A `GPTConfig` keeps "auto" (it is saved with checkpoints and must load on any backend); what
"auto" means on `jax.default_backend()` is decided here, once per config, on its first use
(`GPTConfig.speed`, a `SpeedChoices`: after JAX's backends are up, never saved), and the
model's layers read that. Each choice is the same math as the plain path within float
tolerance (tests/test_backend.py checks values and gradients), but for bfloat16 matmul
operands in training, within a stated, tested one.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax

if TYPE_CHECKING:  # the type only: this module imports nothing of the package when it runs
    from minigpt_jax.model.config import GPTConfig


@dataclasses.dataclass(frozen=True)
class SpeedChoices:
    """A config's speed settings as this backend runs them, "auto" resolved (`GPTConfig.speed`).

    dense_grad, norm_grad: "direct" (the hand-written VJP) or "autodiff"; matmul_dtype: the
    Dense layers' operand dtype, "float32" or "bfloat16"; kernels: the attention kernel
    (an `attention_fns.AttentionKernel`) of each kind of call, by (weight_dropout, cached,
    plain_mask) as `attention_fns.choose_kernel` takes them.
    """

    dense_grad: str
    norm_grad: str
    matmul_dtype: str
    kernels: Mapping[tuple[bool, bool, bool], Any]


# cuDNN flash attention's head-dim limit (jax._src.cudnn.fused_attention_stablehlo
# .check_is_flash_attention): a multiple of 8, at most 128 before Hopper, 256 from Hopper on.
_CUDNN_HEAD_DIM_MAX = {8: 128, 9: 256}


def dense_grad(cfg: GPTConfig) -> str:
    """cfg.dense_grad resolved: "auto" is "direct" (the hand-written VJP) on XLA:CPU, where it
    saves the transposes autodiff leaves around the backward dots (benchmarks/README.md), and
    "autodiff" elsewhere."""
    return _direct_on_cpu(cfg.dense_grad)


def norm_grad(cfg: GPTConfig) -> str:
    """cfg.norm_grad resolved: "auto" is "direct" (layers.DirectLayerNorm's VJP) on XLA:CPU,
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
    every rerun."""
    if cfg.matmul_dtype == "auto":
        cfg = cfg.replace(matmul_dtype=training_matmul_dtype())
    cfg.speed  # noqa: B018 (made now, once, rather than while the step is traced)
    return cfg


def training_matmul_dtype() -> str:
    """What "auto" means for a training step's matmul operands here (the model's Dense layers,
    Muon's Newton-Schulz): "bfloat16" where `bf16_matmuls_pay()`, else "float32"."""
    return "bfloat16" if bf16_matmuls_pay() else "float32"


@functools.cache
def _cuda_compute_capability() -> tuple[int, int] | None:
    """(major, minor) of the first device when it is an NVIDIA GPU (a CUDA client that reports a
    compute capability), else None (CPU, TPU, ROCm)."""
    device = jax.devices()[0]
    version = str(getattr(getattr(device, "client", None), "platform_version", "")).lower()
    capability = getattr(device, "compute_capability", None)
    if device.platform != "gpu" or "cuda" not in version or capability is None:
        return None
    major, minor = str(capability).split(".")[:2]
    return int(major), int(minor)


def cudnn_attention_supported(cfg: GPTConfig) -> bool:
    """Whether cuDNN flash attention runs `cfg`'s attention here: an NVIDIA GPU of compute
    capability 8.0 or later (Ampere+), bf16/fp16 activations, a head dim that is a multiple of 8
    within the limit of that GPU generation."""
    if cfg.dtype not in ("bfloat16", "float16") or cfg.head_dim % 8:
        return False
    capability = _cuda_compute_capability() if jax.default_backend() == "gpu" else None
    if capability is None or capability < (8, 0):
        return False
    return cfg.head_dim <= _CUDNN_HEAD_DIM_MAX[min(max(capability[0], 8), 9)]
