"""The mini-GPT: pre-LayerNorm transformer blocks over tied token embeddings.

Shape letters, used as array-name suffixes throughout the package (`x_BxTxD`); each means one
thing everywhere:
  B  batch                      T  sequence (queries)      T1 T + 1: inputs and next target
  S  keys / KV-cache slots      D  width (n_embd)          H  heads
  K  head width (D / H)         R  sin-cos pairs (K/2, D/2)
  F  MLP width                  V  vocabulary              N  layers (n_layer)
  C  steps per compiled call    P  prompt slots            G  new-token slots (sampling)
  L  P + G (sampling buffer)    W  recomputed window       M, I, O  rows, in and out features
  A  micro-batches per step (grad_accum_steps)             U  rows of a micro-batch (B / A)

References: Vaswani et al. 2017 (arXiv:1706.03762); Radford et al. 2019, GPT-2;
Press & Wolf 2017, tied input/output embeddings (arXiv:1608.05859); nanoGPT's model.py.
"""

from __future__ import annotations

import functools
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from minigpt_jax.attention import KVCache, MultiHeadAttention
from minigpt_jax.config import GPTConfig
from minigpt_jax.dense import INIT_STDDEV, dense_options, residual_init
from minigpt_jax.embeddings import Embeddings, check_token_ids

Array = chex.Array
Params = Any  # a nested dict of arrays: the 'params' collection of `GPT`

# PyTorch's LayerNorm epsilon, which GPT-2 and nanoGPT use.
LAYERNORM_EPS = 1e-5


def _layer_norm(cfg: GPTConfig, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(
        epsilon=LAYERNORM_EPS,
        use_bias=cfg.use_bias,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.weight_dtype,
        name=name,
    )


class MLP(nn.Module):
    """Position-wise D -> F -> GELU -> D."""

    cfg: GPTConfig

    @nn.compact
    def __call__(self, x_BxTxD: Array, *, deterministic: bool = True) -> Array:
        cfg = self.cfg
        dense = dense_options(cfg)
        h_BxTxF = nn.Dense(
            cfg.mlp_dim, kernel_init=nn.initializers.normal(INIT_STDDEV), name="fc", **dense
        )(x_BxTxD)
        h_BxTxF = nn.gelu(h_BxTxF, approximate=cfg.gelu_approximate)
        out_BxTxD = nn.Dense(cfg.n_embd, kernel_init=residual_init(cfg), name="proj", **dense)(
            h_BxTxF
        )
        return nn.Dropout(cfg.dropout)(out_BxTxD, deterministic=deterministic)


class Block(nn.Module):
    """x + Attn(LN(x)), then x + MLP(LN(x)) (pre-LayerNorm, GPT-2)."""

    cfg: GPTConfig

    @nn.compact
    def __call__(
        self,
        x_BxTxD: Array,
        positions_BxT: Array,
        *,
        deterministic: bool = True,
        cache: KVCache | None = None,
    ) -> tuple[Array, KVCache | None]:
        """`(x_BxTxD, cache)`: the layer's updated KV cache, or None when given none."""
        cfg = self.cfg
        h_BxTxD, cache = MultiHeadAttention(cfg, name="attn")(
            _layer_norm(cfg, "ln_1")(x_BxTxD),
            positions_BxT,
            deterministic=deterministic,
            cache=cache,
        )
        x_BxTxD = x_BxTxD + nn.Dropout(cfg.dropout)(h_BxTxD, deterministic=deterministic)
        h_BxTxD = MLP(cfg, name="mlp")(
            _layer_norm(cfg, "ln_2")(x_BxTxD), deterministic=deterministic
        )
        x_BxTxD = x_BxTxD + h_BxTxD
        return x_BxTxD, cache


class GPT(nn.Module):
    """tokens_BxT -> `(logits_BxTxV, caches)`: logits in float32, and the updated per-layer KV
    caches, or None when called without caches (`forward` returns the logits alone).

    Params: `embed/tok/embedding` (V, D), `embed/pos/embedding` (block_size, D) for learned
    positions, `block_{i}/...`, `ln_f`, and `lm_head/kernel` (D, V) only when untied.
    """

    cfg: GPTConfig

    def setup(self):
        cfg = self.cfg
        self.embed = Embeddings(cfg)
        self.blocks = [Block(cfg, name=f"block_{i}") for i in range(cfg.n_layer)]
        self.ln_f = _layer_norm(cfg, "ln_f")
        if not cfg.tie_embeddings:
            self.lm_head = nn.Dense(
                cfg.vocab_size,
                use_bias=False,
                dtype=jnp.float32,
                param_dtype=cfg.weight_dtype,
                kernel_init=nn.initializers.normal(INIT_STDDEV),
            )

    def __call__(
        self,
        tokens_BxT: Array,
        positions_BxT: Array | None = None,
        *,
        deterministic: bool = True,
        cache: list[KVCache] | None = None,
    ) -> tuple[Array, list[KVCache] | None]:
        """`(logits_BxTxV, caches)`; caches is None unless one KV cache per layer is given.

        With caches, positions_BxT is required and a negative position marks left padding: the
        token is embedded at position 0 and never attended to.
        """
        cfg = self.cfg
        if cache is not None:
            chex.assert_shape(positions_BxT, tokens_BxT.shape)
            chex.assert_equal(len(cache), cfg.n_layer)
            embed_positions_BxT = jnp.maximum(positions_BxT, 0)
        else:
            embed_positions_BxT = positions_BxT
        x_BxTxD = self.embed(tokens_BxT, embed_positions_BxT, deterministic=deterministic)
        if positions_BxT is None:
            positions_BxT = jnp.arange(tokens_BxT.shape[1])[None, :]
        new_cache = []
        for i, block in enumerate(self.blocks):
            x_BxTxD, layer_cache = block(
                x_BxTxD,
                positions_BxT,
                deterministic=deterministic,
                cache=None if cache is None else cache[i],
            )
            new_cache.append(layer_cache)
        h_BxTxD = self.ln_f(x_BxTxD)
        if cfg.tie_embeddings:
            logits_BxTxV = self.embed.attend(h_BxTxD)
        else:
            logits_BxTxV = self.lm_head(h_BxTxD.astype(jnp.float32))
        chex.assert_shape(logits_BxTxV, (*tokens_BxT.shape, cfg.vocab_size))
        return logits_BxTxV, None if cache is None else new_cache


# ----------------------------------------------------------------------------- pure functions


def init_params(cfg: GPTConfig, rng: Array) -> Params:
    """Fresh parameters for `cfg` (their shapes do not depend on the sequence length)."""
    return GPT(cfg).init(rng, jnp.zeros((1, 1), jnp.int32))["params"]


def forward(
    params: Params,
    tokens_BxT: Array,
    cfg: GPTConfig,
    *,
    train: bool = False,
    rng: Array | None = None,
) -> Array:
    """logits_BxTxV (float32) for ids tokens_BxT.

    With `train=True` dropout is on and its randomness comes only from `rng`. Ids must lie in
    [0, V): under jit an out-of-range id is not an error but a garbage row, so validate
    untrusted ids with `checked_forward` or `embeddings.check_token_ids`.
    """
    if train and cfg.dropout > 0 and rng is None:
        raise ValueError("forward(train=True) with dropout > 0 needs an `rng` for dropout.")
    rngs = {"dropout": rng} if train and rng is not None else {}
    logits_BxTxV, _ = GPT(cfg).apply(
        {"params": params}, tokens_BxT, deterministic=not train, rngs=rngs
    )
    return logits_BxTxV


def init_cache(cfg: GPTConfig, batch: int, length: int) -> list[KVCache]:
    """One empty KV cache of `length` slots per layer, for `forward_with_cache`."""
    return [KVCache.empty(cfg, batch, length) for _ in range(cfg.n_layer)]


def forward_with_cache(
    params: Params, tokens_BxT: Array, positions_BxT: Array, cache: list[KVCache], cfg: GPTConfig
) -> tuple[Array, list[KVCache]]:
    """(logits_BxTxV, cache): the tokens attend to the cache's filled slots and to each other
    (causally, by position), and their keys and values are written at the cache index.

    A negative position marks left padding, which is never attended to.
    """
    return GPT(cfg).apply({"params": params}, tokens_BxT, positions_BxT, cache=cache)


def next_token_losses(
    params: Params,
    tokens_BxT1: Array,
    cfg: GPTConfig,
    *,
    train: bool = False,
    rng: Array | None = None,
) -> Array:
    """losses_BxT (float32, nats): the cross-entropy of each next token, for inputs
    tokens_BxT1[:, :-1] and targets tokens_BxT1[:, 1:] (T1 = T + 1). `train` and `rng` as in
    `forward`. The one loss of the package: training takes its mean, evaluation its sum."""
    logits_BxTxV = forward(params, tokens_BxT1[:, :-1], cfg, train=train, rng=rng)
    return optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, tokens_BxT1[:, 1:])


def checked_forward(params: Params, tokens_BxT: Array, cfg: GPTConfig, **kwargs) -> Array:
    """`forward` after a host-side check that every id lies in [0, V) (not jit-able)."""
    check_token_ids(tokens_BxT, cfg.vocab_size)
    return forward(params, tokens_BxT, cfg, **kwargs)


def forward_with_attention(
    params: Params, tokens_BxT: Array, cfg: GPTConfig
) -> tuple[Array, list[Array]]:
    """Deterministic forward that also returns each layer's attention weights_BxHxTxT."""
    (logits_BxTxV, _), state = GPT(cfg).apply(
        {"params": params}, tokens_BxT, mutable=["intermediates"]
    )
    inter = state["intermediates"]
    weights = [inter[f"block_{i}"]["attn"]["attention_weights"][0] for i in range(cfg.n_layer)]
    return logits_BxTxV, weights


def count_params(cfg: GPTConfig) -> int:
    """Number of parameters of `cfg`, from shapes alone (`jax.eval_shape`, nothing allocated)."""
    shapes = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
    return sum(x.size for x in jax.tree_util.tree_leaves(shapes))


def flops_per_token(cfg: GPTConfig) -> int:
    """Training FLOPs per token (forward + backward), nanoGPT's / PaLM's estimate for MFU.

    6 per weight for the matmuls against the weights (the position table is a lookup, not
    counted), plus 12·N·H·K·T (N layers) for attention's scores and mixing over a full block of T
    positions. (nanoGPT writes 6·N + 12·L·H·K·T with N the weights and L the layers.)
    """
    n = count_params(cfg)
    if cfg.pos_encoding == "learned":
        n -= cfg.block_size * cfg.n_embd
    return 6 * n + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * cfg.block_size
