"""Token embeddings plus positions (see `positions.POSITION_ENCODINGS`), and the tied read-out."""

from __future__ import annotations

import chex
import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from minigpt_jax.model.config import STANDARD, GPTConfig
from minigpt_jax.model.layers import INIT_STDDEV
from minigpt_jax.model.param_meta import declare
from minigpt_jax.model.parametrization import scale_readout

Array = chex.Array


# ----------------------------------------------------------------------------- token ids


def check_token_ids(tokens: np.ndarray | Array, vocab_size: int) -> None:
    """Host-side check that ids are integers in [0, vocab_size).

    JAX gathers never fail: under jit an out-of-range id silently reads a clamped row (or NaN
    for `nn.Embed`). Call this eagerly on untrusted ids before they enter the model.
    """
    tokens = np.asarray(tokens)
    if not np.issubdtype(tokens.dtype, np.integer):
        raise TypeError(f"token ids must have an integer dtype, got {tokens.dtype}.")
    bad = (tokens < 0) | (tokens >= vocab_size)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"token id {int(tokens[where])} at index {where} is outside the vocabulary "
            f"[0, {vocab_size}); {int(bad.sum())} id(s) out of range. Encode the text with the "
            f"tokenizer the model was trained with, or raise vocab_size."
        )


# ----------------------------------------------------------------------------- module


def read_out(h_xD: Array, weight: Array, cfg: GPTConfig) -> Array:
    """logits_xY (float32) = h · W for h of any leading shape: W is the token table W_E (Y, D)
    when tied, the head kernel (D, Y) when not; Y = cfg.padded_vocab_size columns.

    The matmul runs in the compute dtype and accumulates in float32 (bf16 tensor cores on an
    accelerator, float32 logits out); the loss and sampling keep the first vocab_size columns.
    With cfg.logit_softcap = c > 0 the logits are c · tanh(logits / c) (Gemma 2). h is first
    scaled as cfg.parametrization says (μP: by 1/m, mup's MuReadout).
    """
    spec = "...d,yd->...y" if cfg.tie_embeddings else "...d,dy->...y"
    compute = cfg.compute_dtype
    if cfg.parametrization != STANDARD:  # the parametrization's factor (μP's 1/m)
        h_xD = scale_readout(h_xD, cfg)
    logits_xY = jnp.einsum(
        spec, h_xD.astype(compute), weight.astype(compute), preferred_element_type=jnp.float32
    )
    if cfg.logit_softcap:
        logits_xY = cfg.logit_softcap * jnp.tanh(logits_xY / cfg.logit_softcap)
    return logits_xY


class Embeddings(nn.Module):
    """Token table W_E (Y, D) plus positions, then dropout; `attend` is the tied read-out.

    Y = cfg.padded_vocab_size: rows from vocab_size on pad the table (cfg.vocab_multiple) and are
    never looked up.
    """

    cfg: GPTConfig

    def setup(self):
        cfg = self.cfg
        init = nn.initializers.normal(stddev=INIT_STDDEV)
        # float32 lookup, cast to the compute dtype after positions are added.
        self.tok = nn.Embed(
            cfg.padded_vocab_size,
            cfg.n_embd,
            jnp.float32,
            cfg.weight_dtype,
            # The mesh's tensor axis splits the vocabulary (minigpt_jax/sharding.py).
            embedding_init=declare(
                init, ("tensor", None), decay=True, gpt2="wte.weight", tags=("embedding",)
            ),
        )
        if cfg.parts.position.learned:
            self.pos = nn.Embed(
                cfg.block_size,
                cfg.n_embd,
                jnp.float32,
                cfg.weight_dtype,
                embedding_init=declare(init, decay=True, gpt2="wpe.weight", tags=("embedding",)),
            )
        self.drop = nn.Dropout(cfg.dropout)

    def __call__(
        self, tokens_BxT: Array, positions_BxT: Array | None = None, *, deterministic: bool = True
    ) -> Array:
        """Ids (B, T) -> activations x_BxTxD in cfg.dtype.

        positions_BxT defaults to 0 .. T-1; with learned positions T may not exceed block_size.
        Ids must lie in [0, V): see `check_token_ids`.
        """
        cfg = self.cfg
        scheme = cfg.parts.position
        chex.assert_rank(tokens_BxT, 2)
        chex.assert_type(tokens_BxT, int)
        length = tokens_BxT.shape[1]
        if positions_BxT is None:
            if scheme.learned and length > cfg.block_size:
                raise ValueError(
                    f"sequence length {length} exceeds block_size {cfg.block_size}: learned "
                    f"positions have only {cfg.block_size} rows. Crop the input to the last "
                    f"{cfg.block_size} tokens, or use pos_encoding='sinusoidal', 'rope' or 'none'."
                )
            positions_BxT = jnp.arange(length)[None, :]
        x_BxTxD = self.tok(tokens_BxT)
        if cfg.embed_scale != 1.0:
            x_BxTxD = x_BxTxD * cfg.embed_scale
        if scheme.learned:
            x_BxTxD = x_BxTxD + self.pos(positions_BxT)
        if scheme.additive is not None:
            x_BxTxD = x_BxTxD + scheme.additive(positions_BxT, cfg)
        x_BxTxD = self.drop(x_BxTxD, deterministic=deterministic)
        chex.assert_shape(x_BxTxD, (*tokens_BxT.shape, cfg.n_embd))
        return x_BxTxD.astype(cfg.compute_dtype)

    def attend(self, h_BxTxD: Array) -> Array:
        """Tied read-out: logits_BxTxY = h · W_Eᵀ (`read_out`), float32, padded columns included."""
        return read_out(h_BxTxD, self.tok.embedding, self.cfg)
