"""Position encodings: sinusoids, RoPE, and the registry `POSITION_ENCODINGS` of every scheme.

Next to the bottom of the package: it imports only `registry`, so the model config (which
validates `pos_encoding` against the registry), the embeddings and attention all import it.
`config.model.pos_encoding` picks an entry by name, or `module:attr` names a `PositionEncoding`
of your own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp

from minigpt_jax.model.config import GPTConfig
from minigpt_jax.settings.groups import MODEL, options_of, setting
from minigpt_jax.settings.registry import Registry, declares, expect_shape

Array = chex.Array


def _inverse_frequencies(dim: int, base: float = 10000.0) -> Array:
    """1 / base^(2i/dim) for i = 0 .. dim/2 - 1 (Vaswani et al. 2017, section 3.5: 10000)."""
    return 1.0 / (base ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))


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


def apply_rope(x_BxTxHxK: Array, positions_BxT: Array, theta: float = 10000.0) -> Array:
    """Rotary embeddings (Su et al. 2021, RoFormer): rotate each pair (x[2i], x[2i+1]) of every
    head by the angle pos / theta^(2i/K). Applied to queries and keys, the score q·k then depends
    on positions only through their difference."""
    head_dim = x_BxTxHxK.shape[-1]
    inv_freq_1x1x1xR = _inverse_frequencies(head_dim, theta)[None, None, None, :]
    angles_BxTx1xR = positions_BxT.astype(jnp.float32)[:, :, None, None] * inv_freq_1x1x1xR
    cos, sin = jnp.cos(angles_BxTx1xR), jnp.sin(angles_BxTx1xR)
    x = x_BxTxHxK.astype(jnp.float32)
    even, odd = x[..., 0::2], x[..., 1::2]
    rotated = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
    return rotated.reshape(x_BxTxHxK.shape).astype(x_BxTxHxK.dtype)


@dataclasses.dataclass(frozen=True)
class PositionEncoding:
    """How a scheme tells the model where each token is.

    A new scheme is one function and one entry in `POSITION_ENCODINGS` (or a module of your own
    holding `PositionEncoding(...)`, named as `module:attr`):
      learned:  a trainable table `params['embed']['pos']['embedding']` of shape
                (block_size, D), added to the token embeddings; longer inputs are refused.
      additive: `(positions_BxT, cfg) -> (B, T, cfg.n_embd)`, fixed vectors added to the
                token embeddings.
      rotary:   `(x_BxTxHxK, positions_BxT, cfg) -> x_BxTxHxK`, applied to queries and keys
                (H may be the G key/value heads of grouped-query attention).
    Both receive the model config; settings the entry declares (`registry.declares` on the
    PositionEncoding) are read from its options object, `options_of(cfg, entry)`: the built-in
    rope's `RopeOptions`.
      even:     a GPTConfig property that the scheme needs to be even ("n_embd", "head_dim").
      per_document: with packed documents (a mask with documents=True), positions restart at 0
                at each document (True), or run on across the row (False).
    """

    learned: bool = False
    additive: Callable[[Array, GPTConfig], Array] | None = None
    rotary: Callable[[Array, Array, GPTConfig], Array] | None = None
    even: str | None = None
    per_document: bool = True  # packed documents: positions restart at each one

    def validate(self, cfg: GPTConfig) -> None:
        """Raises ValueError if `cfg` breaks the scheme's evenness need."""
        if self.even and getattr(cfg, self.even) % 2:
            raise ValueError(
                f"pos_encoding={cfg.pos_encoding!r} needs an even {self.even}, got "
                f"{getattr(cfg, self.even)}: change n_embd or n_head."
            )


def _sinusoids(positions_BxT: Array, cfg: GPTConfig) -> Array:
    return sinusoidal_at(positions_BxT, cfg.n_embd)


@dataclasses.dataclass(frozen=True)
class RopeOptions:
    """The built-in rope's own settings (`model.rope_theta`)."""

    rope_theta: float = setting(
        10000.0,
        "RoPE's base: pair i of a head turns by pos / rope_theta^(2i/K) (500000 in LLaMA 3)",
        MODEL,
        low=1.0,
        low_open=True,
        requirement="a finite number > 1",
    )


def _rope(x_BxTxHxK: Array, positions_BxT: Array, cfg: GPTConfig) -> Array:
    return apply_rope(x_BxTxHxK, positions_BxT, options_of(cfg, RopeOptions).rope_theta)


def _encoding_contract(scheme: PositionEncoding, cfg: GPTConfig) -> None:
    """additive(positions_BxT, cfg) is BxTxD; rotary(x_BxTxHxK, positions_BxT, cfg) is
    BxTxHxK."""
    positions_BxT = jax.ShapeDtypeStruct((2, 5), jnp.int32)
    if scheme.additive is not None:
        out = jax.eval_shape(lambda p: scheme.additive(p, cfg), positions_BxT)
        expect_shape(out, (2, 5, cfg.n_embd), "additive's output", dtype_kind="f")
    if scheme.rotary is not None:
        x_BxTxHxK = jax.ShapeDtypeStruct((2, 5, cfg.n_head, cfg.head_dim), jnp.float32)
        out = jax.eval_shape(lambda x, p: scheme.rotary(x, p, cfg), x_BxTxHxK, positions_BxT)
        expect_shape(out, x_BxTxHxK.shape, "rotary's output", dtype_kind="f")


POSITION_ENCODINGS: Registry[PositionEncoding] = Registry(
    "position encoding",
    "model.pos_encoding",
    {
        "learned": PositionEncoding(learned=True),
        "sinusoidal": PositionEncoding(additive=_sinusoids, even="n_embd"),
        "rope": declares(RopeOptions)(PositionEncoding(rotary=_rope, even="head_dim")),
        "none": PositionEncoding(),
    },
    entry_class=PositionEncoding,
    shape="a positions.PositionEncoding (e.g. PositionEncoding(additive=fn) or "
    "PositionEncoding(rotary=fn))",
    contract=_encoding_contract,
)
