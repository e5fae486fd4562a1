"""GPTConfig: the frozen, hashable model configuration that jit and the model code see.

The model only: what an experiment config file may hold, and how one is loaded, is
`run_config`'s job.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from minigpt_jax.positions import POSITION_ENCODINGS

_DTYPES = ("float32", "bfloat16", "float16")
_DENSE_GRADS = ("auto", "autodiff", "direct")
_ATTENTIONS = ("auto", "explicit", "xla", "cudnn")
_REMATS = ("none", "dots", "full")


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """Hyperparameters of the mini-GPT; the defaults are the course's model.

    Names follow nanoGPT. Validated on construction: a wrong field raises a `ValueError` that
    names the field and what is allowed.
    """

    vocab_size: int = 512  # V: rows of the token table W_E
    block_size: int = 64  # T_max: longest context; rows of the learned position table W_P
    n_layer: int = 4  # N: transformer blocks
    n_head: int = 4  # H: attention heads per block
    n_embd: int = 128  # D: residual width
    dropout: float = 0.1  # on embeddings, attention weights and residual branches
    pos_encoding: str = "learned"  # a key of positions.POSITION_ENCODINGS
    tie_embeddings: bool = True  # logits = h @ W_E^T through embed.attend; no lm_head param
    # Token embeddings are multiplied by this before positions are added. Vaswani et al. (2017,
    # section 3.4) use sqrt(n_embd): with GPT-2's N(0, 0.02^2) init, unscaled tokens are ~30x
    # smaller than the ±1 sinusoids and drown (experiments/pos_study.py shows it).
    embed_scale: float = 1.0
    causal: bool = True  # False: bidirectional attention (used by the invariant tests)
    use_bias: bool = True  # biases in Dense layers and LayerNorms, as GPT-2
    mlp_ratio: int = 4  # F = mlp_ratio * D
    # GPT-2 used the tanh approximation of GELU; the exact erf form is PyTorch's default.
    gelu_approximate: bool = False
    # How Dense layers are differentiated (same math, a speed choice): "autodiff" is jax.grad of
    # lax.dot_general; "direct" is minigpt_jax.dense's hand-written VJP, faster on XLA:CPU
    # (measured there only: benchmarks/README.md); "auto" picks direct on CPU, autodiff elsewhere,
    # when the model is traced (minigpt_jax.backend), so a run's config stays portable.
    dense_grad: str = "auto"
    # Which kernel computes softmax(q·kᵀ/√K)·v (same math, a speed choice): "explicit" is the
    # einsum + softmax path that can return the weights and drop them out; "xla" and "cudnn" are
    # jax.nn.dot_product_attention's implementations (cuDNN flash attention: NVIDIA GPUs, bf16 or
    # fp16, head dim a multiple of 8); "auto" picks per backend when traced (minigpt_jax.backend:
    # cuDNN on NVIDIA GPUs, explicit on CPU and while weights are dropped out, else xla).
    attention: str = "auto"
    # Rows of the token table (and columns of an untied head) are padded up to a multiple of this
    # (64 for GPT-2: 50,257 -> 50,304, nanoGPT's choice) so that the head's matmul tiles evenly.
    # Padded ids are never looked up, sampled or scored: logits keep vocab_size columns.
    vocab_multiple: int = 1
    # Tokens per chunk of the loss's read-out: 0 computes all B·T·V logits at once; n > 0
    # computes the cross-entropy n tokens at a time (recomputed in the backward pass), so the
    # float32 (B·T, V) logits of a wide vocabulary never exist at once
    # (model.chunked_cross_entropy).
    loss_chunk: int = 0
    # Activation recomputation per block, for memory (model.REMAT_POLICIES): "none" keeps every
    # activation for the backward pass; "dots" keeps the matmul outputs; "full" only the inputs.
    remat: str = "none"
    dtype: str = "float32"  # activations / compute; logits and softmax are always float32
    param_dtype: str = "float32"

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}.")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPTConfig.n_embd={self.n_embd} is not divisible by n_head={self.n_head}: "
                f"choose n_head among the divisors of n_embd, "
                f"e.g. {[h for h in range(1, 17) if self.n_embd % h == 0]}."
            )
        if not (isinstance(self.embed_scale, (int, float)) and self.embed_scale > 0):
            raise ValueError(
                f"GPTConfig.embed_scale must be a positive number, got {self.embed_scale!r}."
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}.")
        if self.pos_encoding not in POSITION_ENCODINGS:
            raise ValueError(
                f"GPTConfig.pos_encoding={self.pos_encoding!r} is unknown; "
                f"allowed: {sorted(POSITION_ENCODINGS)}."
            )
        POSITION_ENCODINGS[self.pos_encoding].validate(self)
        if not isinstance(self.vocab_multiple, int) or self.vocab_multiple < 1:
            raise ValueError(
                f"GPTConfig.vocab_multiple must be a positive integer (1: no padding), "
                f"got {self.vocab_multiple!r}."
            )
        if not isinstance(self.loss_chunk, int) or self.loss_chunk < 0:
            raise ValueError(
                f"GPTConfig.loss_chunk must be 0 (all logits at once) or a positive number of "
                f"tokens per chunk, got {self.loss_chunk!r}."
            )
        if self.remat not in _REMATS:
            raise ValueError(
                f"GPTConfig.remat={self.remat!r} is unknown; allowed: {list(_REMATS)}."
            )
        if self.attention not in _ATTENTIONS:
            raise ValueError(
                f"GPTConfig.attention={self.attention!r} is unknown; allowed: {list(_ATTENTIONS)}."
            )
        if self.attention in ("xla", "cudnn") and self.dropout > 0:
            raise ValueError(
                f"GPTConfig.attention={self.attention!r} cannot drop out attention weights "
                f"(dropout={self.dropout}): use attention='auto' (the explicit path while "
                f"dropout is active) or 'explicit', or set dropout=0."
            )
        if self.attention == "cudnn" and (self.dtype == "float32" or self.head_dim % 8):
            raise ValueError(
                f"GPTConfig.attention='cudnn' needs dtype bfloat16 or float16 and a head dim "
                f"that is a multiple of 8 (got dtype={self.dtype!r}, head_dim={self.head_dim}): "
                f"use attention='auto', which falls back to XLA."
            )
        if self.dense_grad not in _DENSE_GRADS:
            raise ValueError(
                f"GPTConfig.dense_grad={self.dense_grad!r} is unknown; "
                f"allowed: {list(_DENSE_GRADS)}."
            )
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(
                    f"GPTConfig.{name}={getattr(self, name)!r} is not supported; "
                    f"allowed: {list(_DTYPES)}."
                )

    @property
    def head_dim(self) -> int:
        """K: width of one attention head."""
        return self.n_embd // self.n_head

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the token table: vocab_size rounded up to a multiple of vocab_multiple."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def mlp_dim(self) -> int:
        """F: hidden width of the MLP."""
        return self.mlp_ratio * self.n_embd

    @property
    def compute_dtype(self) -> Any:
        return jnp.dtype(self.dtype)

    @property
    def weight_dtype(self) -> Any:
        return jnp.dtype(self.param_dtype)

    def replace(self, **changes: Any) -> GPTConfig:
        return dataclasses.replace(self, **changes)
