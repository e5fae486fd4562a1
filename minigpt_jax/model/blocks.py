"""The transformer block and its MLP: the registries `BLOCKS` and `MLPS`.

An MLP entry is a flax module class with a `cfg` field, called `mlp(x_BxTxD, deterministic=)
-> out_BxTxD` (dropout on its output included); a block entry likewise, called `block(x_BxTxD,
positions_BxT, deterministic, cache) -> (x_BxTxD, cache)` (deterministic positional, so that
`nn.remat` can hold it static); a block that passes state between layers (the first layer's
values, a residual stream of its own) also takes `carry=` (the block before it's, None for the
first) and returns `(x_BxTxD, cache, carry)`, under remat and with the KV cache alike.
`config.model.mlp` and `config.model.block` pick them by name,
or `module:attr` names your own. Each parameter is created with `param_meta.declare`: its mesh
axes, optimizer group (Muon or AdamW), weight decay and GPT-2 name beside its init.

MLPs: "mlp" D -> F -> activation -> D (GPT-2); the variants "swiglu" proj(silu(gate·x) ⊙ up·x)
and "gated" the same with cfg.activation (Shazeer 2020, GLU variants; LLaMA's SwiGLU at mlp_ratio
8/3). Blocks: "pre_ln" x + attn(ln_1(x)), then + mlp(ln_2(x)) (GPT-2); the variant "parallel"
x + attn(ln_1(x)) + mlp(ln_1(x)) (GPT-J, PaLM). The variants live in model/variants/blocks.py,
named here (`Builtin`) and imported only when picked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chex
import flax.linen as nn
import jax

from minigpt_jax.model import param_meta
from minigpt_jax.model.attention import KVCache, MultiHeadAttention
from minigpt_jax.model.attention_masks import ATTENTION_MASKS
from minigpt_jax.model.config import GPTConfig, takes_carry
from minigpt_jax.model.layers import INIT_STDDEV, dense_options, residual_init
from minigpt_jax.model.param_meta import declare
from minigpt_jax.settings.registry import Builtin, ContractError, Registry, expect_shape

Array = chex.Array

# Muon reads a (D, F) or (F, D) kernel as one matrix: inputs then outputs.
MATRIX = (0, 1)
MLP_TAGS = ("mlp",)  # the tag of every parameter of the MLPs (param_meta)


def norm(cfg: GPTConfig, name: str) -> nn.Module:
    """cfg.norm's layer (layers.NORMS): LayerNorm by default."""
    return cfg.parts.norm(cfg, name)


# The init of a D -> F kernel, whose F the mesh's tensor axis splits.
HIDDEN_INIT = nn.initializers.normal(INIT_STDDEV)


def out_proj(cfg: GPTConfig, gpt2: bool) -> nn.Dense:
    """The F -> D projection into the residual stream (`proj`), its F split by tensor."""
    return nn.Dense(
        cfg.n_embd,
        kernel_init=declare(
            residual_init(cfg),
            ("tensor", None),
            muon=MATRIX,
            decay=True,
            gpt2="h.{i}.mlp.c_proj.weight" if gpt2 else None,
            tags=MLP_TAGS,
        ),
        bias_init=declare(
            nn.initializers.zeros_init(),
            gpt2="h.{i}.mlp.c_proj.bias" if gpt2 else None,
            tags=MLP_TAGS,
        ),
        name="proj",
        **dense_options(cfg),
    )


class MLP(nn.Module):
    """Position-wise D -> F -> activation (cfg.activation, GELU by default) -> D."""

    cfg: GPTConfig

    @nn.compact
    def __call__(self, x_BxTxD: Array, *, deterministic: bool = True) -> Array:
        cfg = self.cfg
        # The mesh's tensor axis splits the hidden units F (minigpt_jax/sharding.py).
        h_BxTxF = nn.Dense(
            cfg.mlp_dim,
            kernel_init=declare(
                HIDDEN_INIT,
                (None, "tensor"),
                muon=MATRIX,
                decay=True,
                gpt2="h.{i}.mlp.c_fc.weight",
                tags=MLP_TAGS,
            ),
            bias_init=declare(
                nn.initializers.zeros_init(),
                ("tensor",),
                gpt2="h.{i}.mlp.c_fc.bias",
                tags=MLP_TAGS,
            ),
            name="fc",
            **dense_options(cfg),
        )(x_BxTxD)
        h_BxTxF = cfg.parts.activation(h_BxTxF)
        out_BxTxD = out_proj(cfg, gpt2=True)(h_BxTxF)
        return nn.Dropout(cfg.dropout)(out_BxTxD, deterministic=deterministic)


def _module_class(what: str, call: str) -> Callable[[Any], Any]:
    def coerce(value: Any) -> Any:
        if not (isinstance(value, type) and issubclass(value, nn.Module)):
            raise TypeError(
                f"a {what} entry must be a flax module class with a `cfg` field, called "
                f"{call}, got {type(value).__name__}."
            )
        return value

    return coerce


def _declared(variables: Any, prefix: tuple[str, ...]) -> None:
    try:
        param_meta.metadata(variables.get("params", {}), prefix)
    except param_meta.UndeclaredParameterError as error:
        raise ContractError(str(error).rstrip(".")) from None


def _mlp_contract(entry: type[nn.Module], cfg: GPTConfig) -> None:
    """entry(cfg)(x_BxTxD) is x_BxTxD's shape, and each of its matrices declares metadata."""
    x_BxTxD = jax.ShapeDtypeStruct((2, 3, cfg.n_embd), cfg.compute_dtype)
    out, variables = jax.eval_shape(
        lambda x: entry(cfg).init_with_output(jax.random.key(0), x), x_BxTxD
    )
    expect_shape(out, x_BxTxD.shape, "its output (x_BxTxD in)", dtype_kind="f")
    _declared(variables, ("block_0", "mlp"))


MLPS: Registry[type[nn.Module]] = Registry(
    "MLP",
    "model.mlp",
    {
        "mlp": MLP,
        "swiglu": Builtin("minigpt_jax.model.variants.blocks:SwiGLU"),
        "gated": Builtin("minigpt_jax.model.variants.blocks:GatedMLP"),
    },
    coerce=_module_class("MLP", "(x_BxTxD, deterministic=) -> out_BxTxD"),
    shape="a flax module class with a cfg field, called (x_BxTxD, deterministic=) -> out_BxTxD",
    contract=_mlp_contract,
)


class Block(nn.Module):
    """x + Attn(LN(x)), then x + MLP(LN(x)) (pre-LayerNorm, GPT-2; LN is cfg.norm, MLP
    cfg.mlp)."""

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
        """`(x_BxTxD, cache)`: the layer's updated KV cache, or None when given none;
        `segments_BxT`: packed documents, for the attention's mask."""
        cfg = self.cfg
        h_BxTxD, cache = MultiHeadAttention(cfg, name="attn")(
            norm(cfg, "ln_1")(x_BxTxD),
            positions_BxT,
            deterministic=deterministic,
            cache=cache,
            segments_BxT=segments_BxT,
        )
        x_BxTxD = x_BxTxD + nn.Dropout(cfg.dropout)(h_BxTxD, deterministic=deterministic)
        mlp = cfg.parts.mlp(cfg, name="mlp")
        h_BxTxD = mlp(norm(cfg, "ln_2")(x_BxTxD), deterministic=deterministic)
        return x_BxTxD + h_BxTxD, cache


def _block_contract(entry: type[nn.Module], cfg: GPTConfig) -> None:
    """entry(cfg)(x_BxTxD, positions_BxT) is (x_BxTxD's shape, None) — (x_BxTxD's shape, None,
    carry) for a block that takes `carry=` —, and each of its matrices declares metadata; with
    a mask that packs documents it takes `segments_BxT=` too."""
    x_BxTxD = jax.ShapeDtypeStruct((2, 3, cfg.n_embd), cfg.compute_dtype)
    positions_BxT = jax.ShapeDtypeStruct((2, 3), jax.numpy.int32)
    documents = ATTENTION_MASKS[cfg.attention_mask].documents
    carries = takes_carry(entry)

    def init(x, p):
        extra = {"segments_BxT": p} if documents else {}
        if carries:
            extra["carry"] = None
        return entry(cfg).init_with_output(jax.random.key(0), x, p, **extra)

    try:
        out, variables = jax.eval_shape(init, x_BxTxD, positions_BxT)
    except TypeError as error:
        if documents and "segments_BxT" in str(error):
            raise ContractError(
                f"model.attention_mask={cfg.attention_mask!r} packs documents, so a block is "
                "called with segments_BxT= and hands it to its attention "
                "(MultiHeadAttention(...)(..., segments_BxT=segments_BxT)); this one takes none"
            ) from None
        raise
    size, returns = (3, "(x_BxTxD, cache, carry)") if carries else (2, "(x_BxTxD, cache)")
    if not (isinstance(out, tuple) and len(out) == size):
        raise ContractError(f"it returned {type(out).__name__} of {_length(out)}, not {returns}")
    expect_shape(out[0], x_BxTxD.shape, "its output (x_BxTxD in)", dtype_kind="f")
    _declared(variables, ("block_0",))


def _length(out: Any) -> str:
    return f"{len(out)} values" if isinstance(out, tuple) else "one value"


BLOCKS: Registry[type[nn.Module]] = Registry(
    "block",
    "model.block",
    {"pre_ln": Block, "parallel": Builtin("minigpt_jax.model.variants.blocks:ParallelBlock")},
    coerce=_module_class(
        "block",
        "(x_BxTxD, positions_BxT, deterministic, cache[, segments_BxT][, carry]) -> (x_BxTxD, "
        "cache[, carry])",
    ),
    shape="a flax module class with a cfg field, called (x_BxTxD, positions_BxT, "
    "deterministic, cache[, segments_BxT=][, carry=]) -> (x_BxTxD, cache[, carry])",
    contract=_block_contract,
)
