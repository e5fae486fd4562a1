"""Token embeddings, the position-encoding registry, and the tied read-out `Embeddings.attend`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import chex
import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from minigpt_jax.config import GPTConfig

Array = chex.Array

# Everything in the model is initialised N(0, 0.02^2), as GPT-2 / nanoGPT.
INIT_STDDEV = 0.02


# ----------------------------------------------------------------------------- position schemes


def _inverse_frequencies(dim: int) -> Array:
    """1 / 10000^(2i/dim) for i = 0 .. dim/2 - 1 (Vaswani et al. 2017, section 3.5)."""
    return 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))


def sinusoidal_at(positions: Array, dim: int) -> Array:
    """Sinusoids at integer `positions` (any shape S): shape S + (dim,), float32.

    Interleaved form: PE[pos, 2i] = sin(pos / 10000^(2i/dim)), PE[pos, 2i+1] = cos(same).
    """
    inv_freq = _inverse_frequencies(dim).reshape((1,) * positions.ndim + (-1,))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(*angles.shape[:-1], dim)


def sinusoidal_positions(length: int, dim: int) -> Array:
    """The fixed sinusoidal table for positions 0 .. length-1: shape (length, dim), float32."""
    if dim % 2:
        raise ValueError(f"sinusoidal positions need an even dim, got {dim}.")
    return sinusoidal_at(jnp.arange(length), dim)


def apply_rope(x_BxTxHxK: Array, positions_BxT: Array) -> Array:
    """Rotary embeddings (Su et al. 2021, RoFormer): rotate each pair (x[2i], x[2i+1]) of every
    head by the angle pos / 10000^(2i/K). Applied to queries and keys, the score q·k then depends
    on positions only through their difference."""
    head_dim = x_BxTxHxK.shape[-1]
    inv_freq_1x1x1xK2 = _inverse_frequencies(head_dim)[None, None, None, :]
    angles_BxTx1xK2 = positions_BxT.astype(jnp.float32)[:, :, None, None] * inv_freq_1x1x1xK2
    cos, sin = jnp.cos(angles_BxTx1xK2), jnp.sin(angles_BxTx1xK2)
    x = x_BxTxHxK.astype(jnp.float32)
    even, odd = x[..., 0::2], x[..., 1::2]
    rotated = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
    return rotated.reshape(x_BxTxHxK.shape).astype(x_BxTxHxK.dtype)


@dataclasses.dataclass(frozen=True)
class PositionEncoding:
    """How a scheme tells the model where each token is.

    A new scheme is one function and one entry in `POSITION_ENCODINGS`:
      learned:  a trainable table `params['embed']['pos']['embedding']` of shape
                (block_size, D), added to the token embeddings; longer inputs are refused.
      additive: `(positions, dim) -> positions.shape + (dim,)`, fixed vectors added to the
                token embeddings.
      rotary:   `(x_BxTxHxK, positions_BxT) -> x_BxTxHxK`, applied to queries and keys.
      even:     a GPTConfig property that the scheme needs to be even ("n_embd", "head_dim").
    """

    learned: bool = False
    additive: Callable[[Array, int], Array] | None = None
    rotary: Callable[[Array, Array], Array] | None = None
    even: str | None = None

    def validate(self, cfg: GPTConfig) -> None:
        if self.even and getattr(cfg, self.even) % 2:
            raise ValueError(
                f"pos_encoding={cfg.pos_encoding!r} needs an even {self.even}, got "
                f"{getattr(cfg, self.even)}: change n_embd or n_head."
            )


POSITION_ENCODINGS: dict[str, PositionEncoding] = {
    "learned": PositionEncoding(learned=True),
    "sinusoidal": PositionEncoding(additive=sinusoidal_at, even="n_embd"),
    "rope": PositionEncoding(rotary=apply_rope, even="head_dim"),
    "none": PositionEncoding(),
}


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


class Embeddings(nn.Module):
    """Token table W_E (V, D) plus positions, then dropout; `attend` is the tied read-out."""

    cfg: GPTConfig

    def setup(self):
        cfg = self.cfg
        init = nn.initializers.normal(stddev=INIT_STDDEV)
        # float32 lookup and read-out, so logits stay float32 when the model computes in bf16.
        self.tok = nn.Embed(
            cfg.vocab_size, cfg.n_embd, jnp.float32, cfg.weight_dtype, embedding_init=init
        )
        if POSITION_ENCODINGS[cfg.pos_encoding].learned:
            self.pos = nn.Embed(
                cfg.block_size, cfg.n_embd, jnp.float32, cfg.weight_dtype, embedding_init=init
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
        scheme = POSITION_ENCODINGS[cfg.pos_encoding]
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
            x_BxTxD = x_BxTxD + scheme.additive(positions_BxT, cfg.n_embd)
        x_BxTxD = self.drop(x_BxTxD, deterministic=deterministic)
        chex.assert_shape(x_BxTxD, (*tokens_BxT.shape, cfg.n_embd))
        return x_BxTxD.astype(cfg.compute_dtype)

    def attend(self, h_BxTxD: Array) -> Array:
        """Tied read-out: logits_BxTxV = h · W_Eᵀ, in float32."""
        return self.tok.attend(h_BxTxD.astype(jnp.float32))
