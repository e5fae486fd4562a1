"""The attention kernels: `ATTENTION_KERNELS` (cuDNN's and XLA's fused attention beside the
plain softmax path of `attention.explicit_attention`) and the "auto" choice read from the
kernels' entries, once per config (`kernel_table`, in `speed_of(cfg).kernels`).

A kernel computes softmax(score(q·kᵀ/√K))·v: an `AttentionKernel` holding its function. One
that cannot apply a score (`takes_score=False`: the fused ones) is refused with any score but
"none". `config.model.attention` picks one (`module:attr` for your own; "auto": the explicit
path under a score, else the first kernel whose `picks` says yes).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp

from minigpt_jax.model.attention import explicit_attention
from minigpt_jax.model.config import NO_SCORE, GPTConfig, check_kernel
from minigpt_jax.settings.groups import AUTO
from minigpt_jax.settings.registry import Registry, expect_shape

Array = chex.Array

KernelFn = Callable[..., Array]


@dataclasses.dataclass(frozen=True)
class AttentionKernel:
    """A kernel's function and how it is called and when "auto" picks it.

    fn: (q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask | None, *, causal, score) -> out_BxTxHxK, with
    mask as `speed.kernels.fused_attention` takes it, causal the top-left triangle and score
    None or a function over the raw scores_BxHxTxS.
    explicit: the einsum + softmax path, which can return the weights and drop them out (the
    attention module runs it itself rather than calling fn).
    takes_any_mask: it reads an arbitrary mask array (the KV cache's, a custom mask entry's);
    one that cannot falls back to XLA's kernel for such calls.
    takes_score: it applies an attention score; one that does not is refused with any score
    but "none" (naming model.attention=explicit).
    picks: (cfg, weight_dropout, plain_mask) -> whether "auto" takes it; entries are asked in
    table order. plain_mask: no mask or the causal triangle over positions 0..T-1.
    """

    fn: KernelFn
    explicit: bool = False
    takes_any_mask: bool = True
    takes_score: bool = False
    picks: Callable[[GPTConfig, bool, bool], bool] = lambda cfg, dropout, plain: False


# cuDNN flash attention's head-dim limit (jax._src.cudnn.fused_attention_stablehlo
# .check_is_flash_attention): a multiple of 8, at most 128 before Hopper, 256 from Hopper on.
_CUDNN_HEAD_DIM_MAX = {8: 128, 9: 256}


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


def fused_attention(
    q_BxTxHxK: Array,
    k_BxSxHxK: Array,
    v_BxSxHxK: Array,
    mask: Array | None,
    *,
    causal: bool,
    implementation: str,
    score: Callable[[Array], Array] | None = None,
) -> Array:
    """out_BxTxHxK = softmax(q·kᵀ / sqrt(K)) · v through `jax.nn.dot_product_attention`.

    implementation "xla" or "cudnn" (flash attention: bf16/fp16, head dim a multiple of 8).
    causal: query t sees keys 0..t (the top-left-aligned triangle, what self-attention over
    positions 0..T-1 needs); mask (broadcasting to B, H, T, S; False: no weight) is for the cache
    path and for masks other than the triangle, where XLA takes it. Neither returns the weights
    nor drops them out, nor applies a score (a score raises ValueError).
    """
    if score is not None:
        raise ValueError(
            f"the {implementation!r} attention kernel cannot apply an attention score: use "
            f"model.attention=explicit (or auto)."
        )
    return jax.nn.dot_product_attention(
        q_BxTxHxK,
        k_BxSxHxK,
        v_BxSxHxK,
        mask=mask,
        is_causal=causal,
        implementation=implementation,
    )


def _as_kernel(value: Any) -> AttentionKernel:
    if isinstance(value, AttentionKernel):
        return value
    if callable(value):
        return AttentionKernel(value)
    raise TypeError(
        "an attention kernel must be a speed.kernels.AttentionKernel or a function "
        "(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask, *, causal, score) -> out_BxTxHxK, got "
        f"{type(value).__name__}."
    )


ATTENTION_KERNELS: Registry[AttentionKernel] = Registry(
    "attention kernel",
    "model.attention",
    {
        # cuDNN flash attention where it runs; never while weights are dropped out.
        "cudnn": AttentionKernel(
            functools.partial(fused_attention, implementation="cudnn"),
            takes_any_mask=False,
            picks=lambda cfg, dropout, plain: (
                plain and not dropout and cudnn_attention_supported(cfg)
            ),
        ),
        # On CPU XLA compiles the explicit path with fewer copies than dot_product_attention's
        # and runs it faster (benchmarks/README.md); only it drops out attention weights.
        "explicit": AttentionKernel(
            explicit_attention,
            explicit=True,
            takes_score=True,
            picks=lambda cfg, dropout, plain: dropout or jax.default_backend() == "cpu",
        ),
        "xla": AttentionKernel(
            functools.partial(fused_attention, implementation="xla"),
            picks=lambda cfg, dropout, plain: True,
        ),
    },
    coerce=_as_kernel,
    shape="a speed.kernels.AttentionKernel, or a function (q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, "
    "mask, *, causal, score) -> out_BxTxHxK",
    contract=lambda kernel, cfg: _kernel_contract(kernel, cfg),
)


def _kernel_contract(kernel: AttentionKernel, cfg: GPTConfig) -> None:
    """kernel.fn(q, k, v, mask, causal=, score=None) is out_BxTxHxK, with the causal triangle
    and with a mask array (S > T: the KV cache's keys)."""
    b, t, s, h, k = 2, 5, 7, cfg.n_head, cfg.head_dim
    q = jax.ShapeDtypeStruct((b, t, h, k), cfg.compute_dtype)
    kv = jax.ShapeDtypeStruct((b, t, h, k), cfg.compute_dtype)
    out = jax.eval_shape(lambda *a: kernel.fn(*a, None, causal=True, score=None), q, kv, kv)
    expect_shape(out, (b, t, h, k), "its output (q_BxTxHxK in)", dtype_kind="f")
    if kernel.takes_any_mask:
        keys = jax.ShapeDtypeStruct((b, s, h, k), cfg.compute_dtype)
        mask = jax.ShapeDtypeStruct((b, 1, t, s), jnp.bool_)
        out = jax.eval_shape(
            lambda *a: kernel.fn(*a[:3], a[3], causal=False, score=None), q, keys, keys, mask
        )
        expect_shape(out, (b, t, h, k), "its output with a mask of S keys", dtype_kind="f")


def choose_kernel(cfg: GPTConfig, *, weight_dropout: bool, cached: bool, plain_mask: bool = True):
    """The kernel a call takes: cfg.attention, or for "auto" the first entry that `picks` it
    (the explicit path under an attention score: a fused kernel would skip it).

    cached: the KV-cache path, whose mask (left padding, causality by position) cuDNN's causal
    and sequence-length masks cannot express: a kernel without `takes_any_mask` gives way to
    XLA's there, and for masks other than the triangle (a one-token decode step is bound by
    reading the cache anyway).
    """
    plain = plain_mask and not cached
    scored = cfg.attention_score != NO_SCORE
    if cfg.attention != AUTO:
        check_kernel(cfg)
        kernel = ATTENTION_KERNELS[cfg.attention]
        return cfg.attention if plain or kernel.takes_any_mask or scored else "xla"
    if scored:
        return "explicit"
    for name in ATTENTION_KERNELS:
        kernel = ATTENTION_KERNELS[name]
        if (plain or kernel.takes_any_mask) and kernel.picks(cfg, weight_dropout, plain):
            return name
    return "xla"


def kernel_table(cfg: GPTConfig) -> dict[tuple[bool, bool, bool], AttentionKernel]:
    """{(weight_dropout, cached, plain_mask): the AttentionKernel `choose_kernel` picks}: every
    kind of call, chosen once per config (`speed_of`) rather than in each layer's call."""
    kinds = itertools.product((False, True), repeat=3)
    return {
        (dropout, cached, plain): ATTENTION_KERNELS[
            choose_kernel(cfg, weight_dropout=dropout, cached=cached, plain_mask=plain)
        ]
        for dropout, cached, plain in kinds
    }
