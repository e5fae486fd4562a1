"""TorchGPT: the PyTorch twin of minigpt-jax's GPT, written as nanoGPT's model.py, for benchmarks.

Same architecture as `minigpt_jax.GPT` (pre-LN blocks, fused qkv, causal attention through
`F.scaled_dot_product_attention`, GELU MLP, tied or untied head, N(0, 0.02²) init with the
residual projections scaled by 1/sqrt(2N)), so a minigpt-jax params pytree loads into it
exactly (`load_jax_params`) and the two can be timed on identical work.

Run `python -m benchmarks.torch_reference` for the logit check against `minigpt_jax.forward`
and a CPU/GPU ms/step measurement. Needs the `bench` extra (torch).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from minigpt_jax.model.config import GPTConfig

# minigpt_jax.model.layers.INIT_STDDEV and minigpt_jax.model.layers.NORM_EPS (GPT-2 / nanoGPT).
INIT_STDDEV = 0.02
LAYERNORM_EPS = 1e-5
_POS_ENCODINGS = ("learned", "sinusoidal", "rope", "none")


# ----------------------------------------------------------------------------- positions


def _inverse_frequencies(dim: int, device: torch.device) -> torch.Tensor:
    """1 / 10000^(2i/dim), as minigpt_jax.model.positions (Vaswani et al. 2017, section 3.5)."""
    return 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))


def sinusoidal_positions(positions_T: torch.Tensor, dim: int) -> torch.Tensor:
    """Interleaved sin/cos table (T, dim): PE[t, 2i] = sin(t·f_i), PE[t, 2i+1] = cos(t·f_i)."""
    angles_TxR = positions_T.float()[:, None] * _inverse_frequencies(dim, positions_T.device)
    return torch.stack([angles_TxR.sin(), angles_TxR.cos()], dim=-1).reshape(-1, dim)


def apply_rope(x_BxTxHxK: torch.Tensor, positions_T: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[2i], x[2i+1]) by t·f_i (RoFormer), as minigpt_jax.model.positions."""
    head_dim = x_BxTxHxK.shape[-1]
    inv_freq = _inverse_frequencies(head_dim, x_BxTxHxK.device)
    angles_1xTx1xK2 = (positions_T.float()[:, None] * inv_freq)[None, :, None, :]
    cos, sin = angles_1xTx1xK2.cos(), angles_1xTx1xK2.sin()
    even, odd = x_BxTxHxK[..., 0::2], x_BxTxHxK[..., 1::2]
    rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
    return rotated.reshape(x_BxTxHxK.shape)


# ----------------------------------------------------------------------------- model


class CausalSelfAttention(nn.Module):
    """Fused qkv projection, SDPA (scale 1/sqrt(K), dropout on the weights), output projection."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.causal, self.dropout = cfg.n_head, cfg.causal, cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.use_bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.use_bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x_BxTxD: torch.Tensor, positions_T: torch.Tensor | None) -> torch.Tensor:
        B, T, D = x_BxTxD.shape
        q, k, v = (
            t.view(B, T, self.n_head, D // self.n_head)
            for t in self.c_attn(x_BxTxD).split(D, dim=2)
        )
        if positions_T is not None:  # rope
            q, k = apply_rope(q, positions_T), apply_rope(k, positions_T)
        y_BxHxTxK = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=self.causal,
        )
        y_BxTxD = y_BxHxTxK.transpose(1, 2).contiguous().view(B, T, D)
        return self.resid_dropout(self.c_proj(y_BxTxD))


class MLP(nn.Module):
    """D -> F -> GELU (exact or tanh, per cfg.gelu_approximate) -> D, then dropout."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, cfg.mlp_dim, bias=cfg.use_bias)
        self.gelu = nn.GELU(approximate="tanh" if cfg.gelu_approximate else "none")
        self.c_proj = nn.Linear(cfg.mlp_dim, cfg.n_embd, bias=cfg.use_bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x_BxTxD: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x_BxTxD))))


class Block(nn.Module):
    """x + Attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=LAYERNORM_EPS, bias=cfg.use_bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=LAYERNORM_EPS, bias=cfg.use_bias)
        self.mlp = MLP(cfg)

    def forward(self, x_BxTxD: torch.Tensor, positions_T: torch.Tensor | None) -> torch.Tensor:
        x_BxTxD = x_BxTxD + self.attn(self.ln_1(x_BxTxD), positions_T)
        return x_BxTxD + self.mlp(self.ln_2(x_BxTxD))


class TorchGPT(nn.Module):
    """tokens_BxT -> logits_BxTxV, float32; the module names are nanoGPT's."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.dtype != "float32" or cfg.param_dtype != "float32":
            raise ValueError(
                f"TorchGPT holds and computes float32 (got dtype={cfg.dtype!r}, "
                f"param_dtype={cfg.param_dtype!r}): build it from cfg.replace(dtype='float32', "
                f"param_dtype='float32') and run it under torch.autocast for mixed precision."
            )
        if cfg.pos_encoding not in _POS_ENCODINGS:
            raise ValueError(f"pos_encoding={cfg.pos_encoding!r}; allowed: {_POS_ENCODINGS}.")
        check_mirrored(cfg, _MODEL_PARTS)
        self.cfg = cfg
        # The table (and head) hold cfg.padded_vocab_size rows; logits keep the first V.
        modules = dict(
            wte=nn.Embedding(cfg.padded_vocab_size, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=nn.LayerNorm(cfg.n_embd, eps=LAYERNORM_EPS, bias=cfg.use_bias),
        )
        if cfg.pos_encoding == "learned":
            modules["wpe"] = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.transformer = nn.ModuleDict(modules)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.padded_vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight  # one (V, D) tensor, as nanoGPT
        self.apply(self._init_weights)
        # GPT-2 scales the residual projections' init by 1/sqrt(2N) (two per block).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=INIT_STDDEV / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STDDEV)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STDDEV)

    def forward(self, tokens_BxT: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        T = tokens_BxT.shape[1]
        if cfg.pos_encoding == "learned" and T > cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {cfg.block_size}.")
        positions_T = torch.arange(T, device=tokens_BxT.device)
        x_BxTxD = self.transformer.wte(tokens_BxT)
        if cfg.embed_scale != 1.0:
            x_BxTxD = x_BxTxD * cfg.embed_scale
        if cfg.pos_encoding == "learned":
            x_BxTxD = x_BxTxD + self.transformer.wpe(positions_T)
        elif cfg.pos_encoding == "sinusoidal":
            x_BxTxD = x_BxTxD + sinusoidal_positions(positions_T, cfg.n_embd)
        x_BxTxD = self.transformer.drop(x_BxTxD)
        rope_positions_T = positions_T if cfg.pos_encoding == "rope" else None
        for block in self.transformer.h:
            x_BxTxD = block(x_BxTxD, rope_positions_T)
        logits_BxTxY = self.lm_head(self.transformer.ln_f(x_BxTxD))
        return logits_BxTxY[..., : cfg.vocab_size]


# ----------------------------------------------------------------------------- JAX params


def _param_layout(model: TorchGPT) -> list[tuple[tuple[str, ...], torch.Tensor, tuple, bool]]:
    """(JAX path, torch tensor, JAX shape, transpose) for every parameter.

    JAX -> torch is `a.reshape(torch shape, reversed if transpose)`, then `.T` if transpose:
    flax kernels are (in..., out...), torch Linear weights (out, in); the qkv kernel (D, 3, H, K)
    flattens to nanoGPT's [q | k | v] x heads order and proj (H, K, D) to its head-major input.
    """
    cfg, t = model.cfg, model.transformer
    D, H, K, F_, V = cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.mlp_dim, cfg.padded_vocab_size
    layout = [(("embed", "tok", "embedding"), t.wte.weight, (V, D), False)]
    if cfg.pos_encoding == "learned":
        layout.append((("embed", "pos", "embedding"), t.wpe.weight, (cfg.block_size, D), False))

    def layer_norm(path, ln):
        layout.append(((*path, "scale"), ln.weight, (D,), False))
        if cfg.use_bias:
            layout.append(((*path, "bias"), ln.bias, (D,), False))

    def dense(path, linear, kernel_shape, bias_shape):
        layout.append(((*path, "kernel"), linear.weight, kernel_shape, True))
        if cfg.use_bias:
            layout.append(((*path, "bias"), linear.bias, bias_shape, False))

    for i, block in enumerate(t.h):
        name = f"block_{i}"
        layer_norm((name, "ln_1"), block.ln_1)
        dense((name, "attn", "qkv"), block.attn.c_attn, (D, 3, H, K), (3, H, K))
        dense((name, "attn", "proj"), block.attn.c_proj, (H, K, D), (D,))
        layer_norm((name, "ln_2"), block.ln_2)
        dense((name, "mlp", "fc"), block.mlp.c_fc, (D, F_), (F_,))
        dense((name, "mlp", "proj"), block.mlp.c_proj, (F_, D), (D,))
    layer_norm(("ln_f",), t.ln_f)
    if not cfg.tie_embeddings:
        layout.append((("lm_head", "kernel"), model.lm_head.weight, (D, V), True))
    return layout


def _flatten(tree: Mapping, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, (*prefix, key)))
        else:
            flat[(*prefix, key)] = value
    return flat


@torch.no_grad()
def load_jax_params(model: TorchGPT, params: Mapping) -> TorchGPT:
    """Copy a minigpt-jax params pytree (`init_params(cfg, rng)`) into `model`, in place."""
    layout = _param_layout(model)
    flat = _flatten(params)
    expected = {path for path, *_ in layout}
    if set(flat) != expected:
        missing = sorted("/".join(p) for p in expected - set(flat))
        extra = sorted("/".join(p) for p in set(flat) - expected)
        raise ValueError(
            f"params do not match TorchGPT({model.cfg}): missing {missing}, unexpected {extra}. "
            f"Build both from the same GPTConfig (tie_embeddings, use_bias, pos_encoding)."
        )
    for path, tensor, jax_shape, transpose in layout:
        array = np.asarray(flat[path], dtype=np.float32)
        if array.shape != jax_shape:
            raise ValueError(f"{'/'.join(path)} has shape {array.shape}, expected {jax_shape}.")
        array = array.reshape(tensor.shape[::-1] if transpose else tensor.shape)
        array = np.array(array.T if transpose else array, order="C")  # a writable copy
        tensor.copy_(torch.from_numpy(array).to(tensor.device))
    return model


def jax_params_from_torch(model: TorchGPT, *, grads: bool = False) -> dict:
    """The inverse of `load_jax_params`: params (or their .grad) as a minigpt-jax numpy pytree."""
    tree: dict = {}
    for path, tensor, jax_shape, transpose in _param_layout(model):
        value = tensor.grad if grads else tensor
        if value is None:
            raise ValueError(f"{'/'.join(path)} has no gradient: call backward() first.")
        array = value.detach().cpu().numpy()
        array = (array.T if transpose else array).reshape(jax_shape)
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = array
    return tree


# ----------------------------------------------------------------------------- optimization


# The registry entries this twin implements; any other choice is refused rather than silently
# trained as the defaults (a new entry of minigpt_jax needs its twin here first).
_MODEL_PARTS = {"attention_mask": ("causal",), "norm": ("layernorm",), "activation": ("gelu",)}
_OPTIM_PARTS = {"name": ("adamw",), "schedule": ("cosine",)}


def missing_parts(settings: Any, parts: dict[str, tuple[str, ...]]) -> list[str]:
    """Each registry choice of `settings` the twin lacks, as `key='value' (the twin has ...)`."""
    return [
        f"{key}={getattr(settings, key)!r} (the twin has {', '.join(allowed)})"
        for key, allowed in parts.items()
        if getattr(settings, key, allowed[0]) not in allowed
    ]


def check_mirrored(settings: Any, parts: dict[str, tuple[str, ...]]) -> None:
    """Raises ValueError naming each registry choice of `settings` the twin lacks."""
    missing = missing_parts(settings, parts)
    if missing:
        raise ValueError(
            "the PyTorch twin does not implement " + "; ".join(missing) + ": compare it with "
            "minigpt-jax only on the settings it mirrors, or add the entry's twin here."
        )


def twin_gaps(cfg: GPTConfig, optim: Any) -> list[str]:
    """What the twin lacks of a model config and its optim group, one phrase each (empty when
    TorchGPT and make_torch_optimizer mirror them)."""
    gaps = missing_parts(cfg, _MODEL_PARTS) + missing_parts(optim, _OPTIM_PARTS)
    if cfg.pos_encoding not in _POS_ENCODINGS:
        gaps.insert(
            0, f"pos_encoding={cfg.pos_encoding!r} (the twin has {', '.join(_POS_ENCODINGS)})"
        )
    return gaps


def lr_at(step: int, lr: float, warmup: int, num_steps: int, min_lr: float) -> float:
    """Linear warmup 0 -> lr over `warmup` steps, then cosine to `min_lr` at `num_steps`.

    The schedule of minigpt_jax.optimizers.make_optimizer ("cosine":
    optax.warmup_cosine_decay_schedule with decay_steps = max(num_steps, warmup + 1)); nanoGPT's
    get_lr, but warming up from 0.
    """
    if step < warmup:
        return lr * step / warmup
    decay_steps = max(num_steps, warmup + 1) - warmup
    decay_ratio = min(step - warmup, decay_steps) / decay_steps
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) * (lr - min_lr)


def make_torch_optimizer(
    model: nn.Module, optim: Any, num_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW and its `lr_at` scheduler from the `optim` ConfigDict, as train.make_optimizer.

    optim needs lr, min_lr, warmup_steps, b1, b2, eps, weight_decay; clipping at
    optim.grad_clip is `torch_train_step`'s job. Optimizers and schedules other than AdamW on
    warmup + cosine are refused (`check_mirrored`). Weight decay goes on the ≥2-D params (matrices
    and embedding tables), not on biases or LayerNorm scales (nanoGPT's configure_optimizers):
    in the JAX layout the `kernel` and `embedding` leaves, as train.decay_mask.
    """
    check_mirrored(optim, _OPTIM_PARTS)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": optim.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = all(p.is_cuda for p in params) or None  # nanoGPT: fused AdamW on CUDA
    optimizer = torch.optim.AdamW(
        groups, lr=optim.lr, betas=(optim.b1, optim.b2), eps=optim.eps, fused=fused
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_at(step, optim.lr, optim.warmup_steps, num_steps, optim.min_lr) / optim.lr,
    )
    return optimizer, scheduler


def torch_train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x_BxT: torch.Tensor,
    y_BxT: torch.Tensor,
    *,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    grad_clip: float = 1.0,
) -> float:
    """One nanoGPT step: mean cross-entropy, backward, global-norm clip, AdamW, schedule.

    Returns the loss as a float (`.item()`, so the device syncs once per step).
    """
    logits_BxTxV = model(x_BxT)
    loss = F.cross_entropy(logits_BxTxV.reshape(-1, logits_BxTxV.size(-1)), y_BxT.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return loss.item()


# ----------------------------------------------------------------------------- main


def main() -> None:
    import jax

    from configs import shakespeare_char
    from minigpt_jax import forward, init_params
    from minigpt_jax.config_dict import gpt_config_from

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="timed steps (after 5 warm-up)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    jax.config.update("jax_default_matmul_precision", "float32")  # no TF32 in the logit check
    torch.manual_seed(0)

    config = shakespeare_char.get_config()
    cfg = gpt_config_from(config, vocab_size=65)
    params = init_params(cfg, jax.random.key(config.seed))
    model = load_jax_params(TorchGPT(cfg), params).to(args.device)
    shape = (config.batch_size, cfg.block_size + 1)
    tokens_BxT1 = np.random.default_rng(0).integers(0, cfg.vocab_size, shape)
    x_BxT, y_BxT = (
        torch.from_numpy(t.copy()).to(args.device)
        for t in (tokens_BxT1[:, :-1], tokens_BxT1[:, 1:])
    )

    model.eval()
    with torch.no_grad():
        logits_torch = model(x_BxT).cpu().numpy()
    logits_jax = np.asarray(forward(params, tokens_BxT1[:, :-1], cfg))
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"{cfg}\nparams {n_params:,}  device {args.device}  torch {torch.__version__}  "
        f"threads {torch.get_num_threads()}"
    )
    print(f"max |logits_torch - logits_jax| = {np.abs(logits_torch - logits_jax).max():.3e}")

    model.train()
    optimizer, scheduler = make_torch_optimizer(model, config.optim, config.num_steps)
    times_ms = []
    for step in range(args.steps + 5):
        start = time.perf_counter()
        loss = torch_train_step(
            model, optimizer, x_BxT, y_BxT, scheduler=scheduler, grad_clip=config.optim.grad_clip
        )
        if step >= 5:  # the first steps allocate and warm caches
            times_ms.append(1e3 * (time.perf_counter() - start))
    print(
        f"train step, batch {config.batch_size}x{cfg.block_size}: median "
        f"{statistics.median(times_ms):.2f} ms over {len(times_ms)} steps "
        f"(min {min(times_ms):.2f}); loss {loss:.3f}"
    )


if __name__ == "__main__":
    main()
