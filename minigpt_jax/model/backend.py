"""The "auto" speed settings, resolved per backend when the model is traced.

A `GPTConfig` keeps "auto" (it is saved with checkpoints and must load on any backend); the
model asks here, at trace time, what "auto" means on `jax.default_backend()`. Each choice
is the same math as the plain path (tests/test_backend.py checks values and gradients).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax

if TYPE_CHECKING:  # the type only: this module imports nothing of the package when it runs
    from minigpt_jax.model.config import GPTConfig


# cuDNN flash attention's head-dim limit (jax._src.cudnn.fused_attention_stablehlo
# .check_is_flash_attention): a multiple of 8, at most 128 before Hopper, 256 from Hopper on.
_CUDNN_HEAD_DIM_MAX = {8: 128, 9: 256}


def dense_grad(cfg: GPTConfig) -> str:
    """cfg.dense_grad resolved: "auto" is "direct" (the hand-written VJP) on XLA:CPU, where it
    saves the transposes autodiff leaves around the backward dots (benchmarks/README.md), and
    "autodiff" elsewhere."""
    if cfg.dense_grad != "auto":
        return cfg.dense_grad
    return "direct" if jax.default_backend() == "cpu" else "autodiff"


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
