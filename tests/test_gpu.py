"""GPU-only checks: cuDNN flash attention equals the explicit path, and "auto" picks it.

Skipped unless jax.default_backend() == "gpu" (the CPU suite covers every other kernel in
tests/test_backend.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from minigpt_jax import GPTConfig, forward, init_params, next_token_losses
from minigpt_jax.model.attention import attention_weights, causal_mask, mix_values
from minigpt_jax.model.speed import backend, kernels
from minigpt_jax.model.speed.kernels import choose_kernel, fused_attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU"),
]

# bf16 operands: both paths round q·k and the weights to bf16 at different points.
BF16_TOL = dict(atol=2e-2, rtol=2e-2)
CFG = GPTConfig(
    vocab_size=128, block_size=64, n_layer=2, n_head=4, n_embd=256, dropout=0.0, dtype="bfloat16"
)


@pytest.mark.parametrize("causal", [True, False])
def test_cudnn_kernel_equals_explicit(causal):
    """Values and gradients of softmax(q·kᵀ/√K)·v, B=2, T=S=64, H=4, K=64, in bf16."""
    if not kernels.cudnn_attention_supported(CFG):
        pytest.skip("cuDNN flash attention needs an NVIDIA GPU of compute capability >= 8.0")
    q, k, v = (
        jax.random.normal(jax.random.key(i), (2, 64, 4, 64)).astype(jnp.bfloat16) for i in range(3)
    )
    positions_1xT = jnp.arange(64)[None, :]
    mask = causal_mask(positions_1xT, positions_1xT) if causal else None

    def explicit(q, k, v):
        return mix_values(attention_weights(q, k, mask), v).astype(jnp.float32)

    def cudnn(q, k, v):
        return fused_attention(q, k, v, None, causal=causal, implementation="cudnn").astype(
            jnp.float32
        )

    cotangent = jax.random.normal(jax.random.key(9), (2, 64, 4, 64))

    def grads(f):
        return jax.jit(jax.grad(lambda *qkv: jnp.sum(f(*qkv) * cotangent), argnums=(0, 1, 2)))

    np.testing.assert_allclose(jax.jit(cudnn)(q, k, v), jax.jit(explicit)(q, k, v), **BF16_TOL)
    for got, want in zip(grads(cudnn)(q, k, v), grads(explicit)(q, k, v), strict=True):
        np.testing.assert_allclose(
            got.astype(jnp.float32), want.astype(jnp.float32), atol=5e-2, rtol=5e-2
        )


def test_auto_picks_cudnn_and_the_model_agrees():
    if not kernels.cudnn_attention_supported(CFG):
        pytest.skip("cuDNN flash attention needs an NVIDIA GPU of compute capability >= 8.0")
    assert choose_kernel(CFG, weight_dropout=False, cached=False) == "cudnn"
    assert backend.dense_grad(CFG) == "autodiff"
    assert backend.norm_grad(CFG) == "autodiff"
    params = init_params(CFG, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 33), 0, CFG.vocab_size)
    explicit = CFG.replace(attention="explicit")
    np.testing.assert_allclose(
        forward(params, tokens, CFG), forward(params, tokens, explicit), **BF16_TOL
    )
    np.testing.assert_allclose(
        next_token_losses(params, tokens, CFG),
        next_token_losses(params, tokens, explicit),
        **BF16_TOL,
    )
