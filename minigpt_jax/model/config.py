"""GPTConfig: the frozen, hashable model configuration that jit and the model code see.

The model group only, each field declared once with `settings.setting`; what else an experiment
config holds is declared in `settings`, and how a config file is loaded is `config_dict`'s job.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, ClassVar

import jax.numpy as jnp

from minigpt_jax.settings.groups import AUTO, MODEL, SPEED, Group, check_values, setting
from minigpt_jax.settings.registry import (
    REGISTRIES,
    Registry,
    RegistryError,
    RegistryRef,
    resolve_builtin,
)

# Fixed sets of names, checked by their registries like every other choice (no module:attr).
# The model's other registries live beside their entries (positions, attention_masks, layers,
# blocks; the speed settings' in model/speed/choices.py) and import this module: its settings
# name them by config key (`RegistryRef`).
_DTYPE_NAMES = {name: jnp.dtype(name) for name in ("float32", "bfloat16", "float16")}
DTYPES = Registry("dtype", "model.dtype", _DTYPE_NAMES, user_entries=False)
PARAM_DTYPES = Registry("dtype", "model.param_dtype", _DTYPE_NAMES, user_entries=False)
# The attention_score that applies none (attention_scores.ATTENTION_SCORES' no_score).
NO_SCORE = "none"
# The defaults of the attention mask and the parametrization, which the model runs without their
# registries' dispatch.
CAUSAL = "causal"
STANDARD = "standard"
# What the "auto" speed settings mean on this backend: the speed room's door, which imports this
# module, so it is named here rather than imported (model/speed/backend.py).
SPEED_CHOICES = "minigpt_jax.model.speed.backend:speed_of"


def takes_carry(entry: type) -> bool:
    """Whether a block entry passes state between layers: its call takes `carry=` (what the
    block before it returned; None for the first) and returns (x_BxTxD, cache, carry)."""
    return "carry" in inspect.signature(entry.__call__).parameters


@dataclasses.dataclass(frozen=True)
class ModelParts:
    """The entries a config picks, each looked up in its registry once (`GPTConfig.parts`):
    what the model's modules call, so the default model's trace reads no registry (a score, μP
    or loss terms still read theirs).

    block: the block class (model.block); carries: whether it passes state between layers (its
    call takes `carry=`); mlp, norm: their entries; activation: the MLP's activation function
    (gelu in cfg.gelu_approximate's form); position: the position scheme (model.pos_encoding);
    mask: the attention mask's entry; speed: the speed settings as this backend runs them
    (`model.speed.backend.SpeedChoices`).
    """

    block: Any
    carries: bool
    mlp: Any
    norm: Any
    activation: Any
    position: Any
    mask: Any
    speed: Any


class KernelChoices:
    """What model.attention may hold: "auto" or an ATTENTION_KERNELS key (module:attr too)."""

    def __contains__(self, key: object) -> bool:
        return key == AUTO or key in REGISTRIES["model.attention"]

    def __iter__(self):
        return iter([AUTO, *REGISTRIES["model.attention"]])

    def check(self, key: str) -> None:
        if key == AUTO:
            return
        try:
            REGISTRIES["model.attention"].check(key)
        except RegistryError as error:
            kernels = "the attention kernels are "
            raise RegistryError(str(error).replace(kernels, f"{kernels}{AUTO}, ", 1)) from None


def check_kernel(cfg: GPTConfig) -> None:
    """Raises ValueError when cfg.attention names a kernel that cannot run cfg: one that does
    not apply an attention score under a score, one that cannot drop weights out with
    dropout."""
    if cfg.attention == AUTO:
        return
    kernel = REGISTRIES["model.attention"][cfg.attention]
    if cfg.attention_score != NO_SCORE and not kernel.takes_score:
        raise ValueError(
            f"GPTConfig.attention={cfg.attention!r} does not apply attention scores "
            f"(attention_score={cfg.attention_score!r}): use model.attention=explicit (or auto, "
            f"which takes the explicit path under a score), or attention_score='none'."
        )
    if not kernel.explicit and cfg.dropout > 0:
        raise ValueError(
            f"GPTConfig.attention={cfg.attention!r} cannot drop out attention weights "
            f"(dropout={cfg.dropout}): use attention='auto' (the explicit path while "
            f"dropout is active) or 'explicit', or set dropout=0."
        )


def _divides_n_head(n_kv_head: int, values: dict[str, Any]) -> str | None:
    n_head = values.get("n_head", 1)
    if n_kv_head == 0 or n_head % n_kv_head == 0:
        return None
    divisors = [g for g in range(1, n_head + 1) if n_head % g == 0]
    return (
        f"does not divide n_head={n_head}: each key/value head serves n_head / n_kv_head "
        f"query heads; use 0 (one per query head) or one of {divisors}"
    )


@dataclasses.dataclass(frozen=True)
class GPTConfig(Group):
    """Hyperparameters of the mini-GPT, the run config's `model` group; the defaults are the
    course's model. Each field is declared once (`settings.setting`: default, doc, rules, kind).

    Names follow nanoGPT. Validated on construction: a wrong field raises a `ValueError` that
    names the field and what is allowed. Derived once then, as plain attributes: head_dim (K),
    kv_heads (G), mlp_dim (F), padded_vocab_size (Y), compute_dtype and weight_dtype.
    """

    config_group: ClassVar[str] = "model"

    vocab_size: int = setting(
        512, "V: rows of the token table W_E (the tokenizer's)", MODEL, low=1, high=1 << 24
    )
    block_size: int = setting(
        64,
        "T_max: longest context; rows of the learned position table W_P",
        MODEL,
        low=1,
        high=1 << 20,
        finetune_free=True,  # a shorter block crops the positions
    )
    n_layer: int = setting(4, "N: transformer blocks", MODEL, low=1, high=1024)
    n_head: int = setting(4, "H: attention heads per block", MODEL, low=1, high=1024)
    # Grouped-query attention (Ainslie et al. 2023; multi-query: Shazeer 2019): G key/value
    # heads, query head h reading kv head h // (H / G); the KV cache holds G heads, not H.
    n_kv_head: int = setting(
        0,
        "G: key/value heads, each shared by n_head / G query heads (1: multi-query); "
        "0: one per query head",
        MODEL,
        low=0,
        high=1024,
        requirement="0 (one per query head) or a divisor of n_head",
        gpt2=0,
        relation=_divides_n_head,
    )
    n_embd: int = setting(128, "D: residual width", MODEL, low=1, high=1 << 17)
    dropout: float = setting(
        0.1,
        "on embeddings, attention weights and residual branches",
        MODEL,
        low=0.0,
        high=1.0,
        requirement="in [0, 1)",
        finetune_free=True,
    )
    pos_encoding: str = setting(
        "learned",
        "learned | sinusoidal | rope | none: a key of positions.POSITION_ENCODINGS or module:attr",
        MODEL,
        choices=RegistryRef("model.pos_encoding"),
        gpt2="learned",
    )
    tie_embeddings: bool = setting(
        True, "logits = h @ W_E^T through embed.attend; no lm_head param", MODEL
    )
    # Vaswani et al. (2017, section 3.4) use sqrt(n_embd): with GPT-2's N(0, 0.02^2) init,
    # unscaled tokens are ~30x smaller than the ±1 sinusoids and drown
    # (experiments/pos_study.py shows it).
    embed_scale: float = setting(
        1.0,
        "token embeddings x this before positions are added; sqrt(n_embd) in Vaswani et al.",
        MODEL,
        low=0.0,
        low_open=True,
        requirement="a positive number (and finite)",
        gpt2=1.0,
    )
    causal: bool = setting(
        True, "False: bidirectional attention (used by the invariant tests)", MODEL, gpt2=True
    )
    attention_mask: str = setting(
        CAUSAL,
        "which keys a query sees: a key of attention_masks.ATTENTION_MASKS or module:attr",
        MODEL,
        choices=RegistryRef("model.attention_mask"),
        gpt2=CAUSAL,
    )
    # QK-norm (Henry et al. 2020; Dehghani et al. 2023; the NanoGPT speedrun): queries and keys
    # RMS-normalised per head, before rotary positions, so the scores cannot blow up.
    qk_norm: bool = setting(
        False,
        "RMS-normalise each head's queries and keys before their dot product",
        MODEL,
        gpt2=False,
    )
    use_bias: bool = setting(True, "biases in Dense layers and LayerNorms, as GPT-2", MODEL)
    norm: str = setting(
        "layernorm",
        "layernorm | rmsnorm: a key of layers.NORMS or module:attr",
        MODEL,
        choices=RegistryRef("model.norm"),
        gpt2="layernorm",
    )
    mlp_ratio: float = setting(
        4.0,
        "F = mlp_ratio * D, rounded to the nearest integer, then up to a multiple of mlp_multiple",
        MODEL,
        low=0.0,
        low_open=True,
        high=64.0,
        requirement="a positive number below 64 (8/3 = 2.6667 for LLaMA's SwiGLU)",
    )
    # LLaMA: F = 8/3 · D rounded up to a multiple of 256 (4096 -> 11008).
    mlp_multiple: int = setting(1, "round F up to a multiple of this", MODEL, low=1, high=1 << 16)
    mlp: str = setting(
        "mlp",
        "the MLP: mlp (GPT-2's) | swiglu | gated, a key of blocks.MLPS or module:attr",
        MODEL,
        choices=RegistryRef("model.mlp"),
        gpt2="mlp",
    )
    block: str = setting(
        "pre_ln",
        "the block: pre_ln (GPT-2's) | parallel (GPT-J / PaLM), a key of blocks.BLOCKS or "
        "module:attr",
        MODEL,
        choices=RegistryRef("model.block"),
        gpt2="pre_ln",
    )
    attention_score: str = setting(
        "none",
        "a function of the raw attention scores and positions: none | alibi | softcap | "
        "relative, a key of attention_scores.ATTENTION_SCORES or module:attr",
        MODEL,
        choices=RegistryRef("model.attention_score"),
        gpt2="none",
    )
    # The NanoGPT speedrun zero-initialises every projection into the residual stream (and its
    # untied head): each block starts as the identity, and the first steps shape the readout.
    zero_init_proj: bool = setting(
        False, "zero-init the attention/MLP output projections and an untied head", MODEL
    )
    # μP (Yang et al. 2022): the init, the learning rates, the read-out and the attention scores
    # follow the width, so what is tuned at a base width transfers (model/parametrization.py).
    parametrization: str = setting(
        STANDARD,
        "how init, learning rates and multipliers follow the width: standard | mup (μP, "
        "base width model.mup_base_width), a key of parametrization.PARAMETRIZATIONS or "
        "module:attr",
        MODEL,
        choices=RegistryRef("model.parametrization"),
        gpt2=STANDARD,
    )
    # Gemma 2 (Team et al. 2024) and the NanoGPT speedrun: logits = cap * tanh(logits / cap).
    logit_softcap: float = setting(
        0.0, "soft cap of the logits, cap * tanh(logits / cap); 0: none", MODEL, low=0.0, gpt2=0.0
    )
    activation: str = setting(
        "gelu",
        "the MLP's: gelu | gelu_tanh | relu | relu2, a key of layers.ACTIVATIONS or module:attr",
        MODEL,
        choices=RegistryRef("model.activation"),
        gpt2="gelu",  # with gelu_approximate either way
    )
    # GPT-2 used the tanh approximation of GELU; the exact erf form is PyTorch's default.
    gelu_approximate: bool = setting(
        False, "with activation gelu: True is GPT-2's tanh form, False the exact erf", MODEL
    )
    # "direct" is minigpt_jax.model.speed.dense's hand-written VJP, faster on XLA:CPU (measured
    # there only: benchmarks/README.md); "auto" picks direct on CPU, autodiff elsewhere, when the
    # model is traced (minigpt_jax.model.speed.backend), so a run's config stays portable.
    dense_grad: str = setting(
        "auto",
        "how Dense layers are differentiated: auto (direct on CPU) | autodiff | direct",
        SPEED,
        choices=RegistryRef("model.dense_grad"),
    )
    # "direct" is minigpt_jax.model.speed.layernorm.DirectLayerNorm (flax's parameters, a
    # hand-written VJP in fewer passes), faster on XLA:CPU (measured there only:
    # benchmarks/README.md); "auto" picks direct on CPU, autodiff (flax's nn.LayerNorm)
    # elsewhere, when the model is traced.
    norm_grad: str = setting(
        "auto",
        "how LayerNorms (norm layernorm) are differentiated: auto (direct on CPU) | autodiff | "
        "direct",
        SPEED,
        choices=RegistryRef("model.norm_grad"),
    )
    # bfloat16 operands with float32 accumulation in the Dense contractions (forward and both
    # backward dots); weights, optimizer state, activations and logits stay float32. Faster on
    # CPUs with AVX512-BF16 or AMX (benchmarks/README.md); the loss curve stays within seed noise
    # of float32 (docs/speed.md); "auto" is bfloat16 in the training step on such CPUs
    # and float32 elsewhere and in evaluation, sampling and export (model/speed/backend.py).
    matmul_dtype: str = setting(
        "auto",
        "Dense matmul operands: auto (bfloat16 in training on CPUs with AVX512-BF16 or AMX) | "
        "float32 | bfloat16 (float32 sums and master weights)",
        SPEED,
        choices=RegistryRef("model.matmul_dtype"),
    )
    # "explicit" is the einsum + softmax path that can return the weights and drop them out;
    # "xla" and "cudnn" are jax.nn.dot_product_attention's (cuDNN flash attention: NVIDIA GPUs,
    # bf16 or fp16, head dim a multiple of 8); "auto" takes the first kernel of
    # speed.kernels.ATTENTION_KERNELS that picks itself, once per config (speed_of).
    attention: str = setting(
        "auto",
        "the kernel of softmax(q·kᵀ/√K)·v: auto (cuDNN on NVIDIA GPUs) | explicit | xla | cudnn, "
        "or module:attr",
        SPEED,
        choices=KernelChoices(),
    )
    # (64 for GPT-2: 50,257 -> 50,304, nanoGPT's choice.) Padded ids are never looked up, sampled
    # or scored: logits keep vocab_size columns.
    vocab_multiple: int = setting(
        1,
        "pad the token table's rows (an untied head's columns) to a multiple of this",
        MODEL,
        low=1,
        high=1 << 16,
        finetune_free=True,
    )
    # n > 0: the cross-entropy n tokens at a time (recomputed in the backward pass), so the
    # float32 (B·T, V) logits of a wide vocabulary never exist at once
    # (model.chunked_cross_entropy).
    loss_chunk: int = setting(
        0,
        "tokens per chunk of the loss's read-out; 0: all at once",
        SPEED,
        low=0,
        requirement="0 (all logits at once) or a positive number of tokens per chunk",
    )
    remat: str = setting(
        "none",
        "recompute activations in the backward pass: none | dots | full",
        SPEED,
        choices=RegistryRef("model.remat"),
    )
    dtype: str = setting(
        "float32",
        "activations / compute; logits and softmax are always float32",
        MODEL,
        choices=DTYPES,
        finetune_free=True,
    )
    param_dtype: str = setting(
        "float32", "parameters", MODEL, choices=PARAM_DTYPES, finetune_free=True
    )

    def __post_init__(self):
        super().__post_init__()  # entry_settings: sorted pairs, hashable for jit
        check_values(GPTConfig, dataclasses.asdict(self), "GPTConfig")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPTConfig.n_embd={self.n_embd} is not divisible by n_head={self.n_head}: "
                f"choose n_head among the divisors of n_embd, "
                f"e.g. {[h for h in range(1, 17) if self.n_embd % h == 0]}."
            )
        # Derived once, when the config is built (not fields: never saved, never set).
        width = max(round(self.mlp_ratio * self.n_embd), 1)
        derived = {
            "head_dim": self.n_embd // self.n_head,  # K: width of one attention head
            "kv_heads": self.n_kv_head or self.n_head,  # G: key/value heads
            # F: round(mlp_ratio · D) up to a multiple of mlp_multiple (4·D by default)
            "mlp_dim": -(-width // self.mlp_multiple) * self.mlp_multiple,
            # Y: rows of the token table, V up to a multiple of vocab_multiple
            "padded_vocab_size": -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple,
            "compute_dtype": jnp.dtype(self.dtype),
            "weight_dtype": jnp.dtype(self.param_dtype),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)
        REGISTRIES["model.pos_encoding"][self.pos_encoding].validate(self)
        check_kernel(self)
        if self.attention == "cudnn" and (self.dtype == "float32" or self.head_dim % 8):
            raise ValueError(
                f"GPTConfig.attention='cudnn' needs dtype bfloat16 or float16 and a head dim "
                f"that is a multiple of 8 (got dtype={self.dtype!r}, head_dim={self.head_dim}): "
                f"use attention='auto', which falls back to XLA."
            )

    @functools.cached_property
    def parts(self) -> ModelParts:
        """The entries this config picks and its speed choices, resolved on first use and kept
        with the config (a training step's config has them before it is traced:
        `speed.backend.for_training`). An AttributeError while they are resolved is raised as a
        RuntimeError: as itself, Group.__getattr__ would answer it "no attribute 'parts'"."""
        try:
            block = REGISTRIES["model.block"][self.block]
            gelu_form = "gelu_tanh" if self.gelu_approximate else "gelu"
            return ModelParts(
                block=block,
                carries=takes_carry(block),
                mlp=REGISTRIES["model.mlp"][self.mlp],
                norm=REGISTRIES["model.norm"][self.norm],
                activation=REGISTRIES["model.activation"][
                    gelu_form if self.activation == "gelu" else self.activation
                ],
                position=REGISTRIES["model.pos_encoding"][self.pos_encoding],
                mask=REGISTRIES["model.attention_mask"][self.attention_mask],
                speed=resolve_builtin(SPEED_CHOICES)(self),
            )
        except AttributeError as error:
            raise RuntimeError(f"resolving GPTConfig.parts failed: {error!r}") from error

    def __getstate__(self) -> dict[str, Any]:
        """A pickle leaves the resolved parts and speed choices out: another process (another
        backend) makes its own (`parts`, `model.speed.backend.speed_of`)."""
        return {k: v for k, v in super().__getstate__().items() if k not in ("_speed", "parts")}

    def replace(self, **changes: Any) -> GPTConfig:
        """A copy with `changes`: fields, or settings the picked entries declare
        (`cfg.replace(rope_theta=5e5)` edits entry_settings' pairs), each checked by its
        declaration when the copy is built; the config itself when every change is a field's
        own value (nothing to build again)."""
        fields = {f.name for f in dataclasses.fields(self)}
        entry_changes = {k: v for k, v in changes.items() if k not in fields}
        if not entry_changes:
            unchanged = (
                type(value) is type(getattr(self, name)) and value == getattr(self, name)
                for name, value in changes.items()
            )
            if all(unchanged):
                return self
            return dataclasses.replace(self, **changes)
        changed = dataclasses.replace(self, **{k: v for k, v in changes.items() if k in fields})
        declared = changed.declared_entry_settings()
        values = dict(changed.entry_settings)
        for name in entry_changes:
            if name not in declared and name not in values:
                raise TypeError(
                    f"GPTConfig.replace: {name!r} is neither a field nor a setting of the picked "
                    f"entries; settings of the picked entries: {sorted({*declared, *values})}."
                )
        values.update(entry_changes)
        return dataclasses.replace(changed, entry_settings=tuple(sorted(values.items())))
