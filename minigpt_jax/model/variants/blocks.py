"""Block and MLP variants, registered in blocks' registries by name (`Builtin`) and imported
only when a config picks one: the gated MLPs (Shazeer 2020, GLU variants: "gated" with
cfg.activation, "swiglu" LLaMA's) and the parallel block (GPT-J, PaLM).
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import flax.linen as nn

from minigpt_jax.model.attention import KVCache, MultiHeadAttention
from minigpt_jax.model.blocks import HIDDEN_INIT, MATRIX, MLP_TAGS, MLPS, norm, out_proj
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.layers import activation_fn, dense_options
from minigpt_jax.model.param_meta import declare

Array = chex.Array


class GatedMLP(nn.Module):
    """proj(act(gate·x) ⊙ up·x): gate and up each a (D, F) kernel of its own (Muon, decayed,
    F split by tensor), act cfg.activation ("gated"); no GPT-2 form."""

    cfg: GPTConfig

    def gate_activation(self) -> Callable[[Array], Array]:
        return activation_fn(self.cfg)

    @nn.compact
    def __call__(self, x_BxTxD: Array, *, deterministic: bool = True) -> Array:
        cfg = self.cfg

        def dense(name):
            kernel_init = declare(
                HIDDEN_INIT, (None, "tensor"), muon=MATRIX, decay=True, tags=MLP_TAGS
            )
            bias_init = declare(nn.initializers.zeros_init(), ("tensor",), tags=MLP_TAGS)
            return nn.Dense(
                cfg.mlp_dim,
                kernel_init=kernel_init,
                bias_init=bias_init,
                name=name,
                **dense_options(cfg),
            )

        gate_BxTxF = self.gate_activation()(dense("gate")(x_BxTxD))
        h_BxTxF = gate_BxTxF * dense("up")(x_BxTxD)
        out_BxTxD = out_proj(cfg, gpt2=False)(h_BxTxF)
        return nn.Dropout(cfg.dropout)(out_BxTxD, deterministic=deterministic)


class SwiGLU(GatedMLP):
    """`GatedMLP` with SiLU, LLaMA's (Touvron et al. 2023): proj(silu(gate·x) ⊙ up·x)."""

    def gate_activation(self) -> Callable[[Array], Array]:
        return nn.silu


class ParallelBlock(nn.Module):
    """x + Attn(LN(x)) + MLP(LN(x)), one norm `ln_1` for both (GPT-J; Chowdhery et al. 2022,
    PaLM): the two branches read the same input, so they may run at once."""

    cfg: GPTConfig

    @nn.compact
    def __call__(
        self,
        x_BxTxD: Array,
        positions_BxT: Array,
        deterministic: bool = True,
        cache: KVCache | None = None,
        segments_BxT: Array | None = None,
    ) -> tuple[Array, KVCache | None]:
        cfg = self.cfg
        n_BxTxD = norm(cfg, "ln_1")(x_BxTxD)
        a_BxTxD, cache = MultiHeadAttention(cfg, name="attn")(
            n_BxTxD,
            positions_BxT,
            deterministic=deterministic,
            cache=cache,
            segments_BxT=segments_BxT,
        )
        m_BxTxD = MLPS[cfg.mlp](cfg, name="mlp")(n_BxTxD, deterministic=deterministic)
        a_BxTxD = nn.Dropout(cfg.dropout)(a_BxTxD, deterministic=deterministic)
        return x_BxTxD + a_BxTxD + m_BxTxD, cache
