"""Short in-memory training runs of one model family at several widths, for μP's checks
(`coord_check`, `lr_transfer`): the same depth, heads and data at every width, the width and
the parametrization the only differences.

The data are the bytes of CPython's documentation topics (`pydoc_data`, which ships with
Python): real English, a vocabulary of 256, no file read or written. A run's learning rate is an
argument of its compiled step (the optimizer is built at rate 1 and its update scaled), so a
learning-rate sweep compiles once per width.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from pydoc_data.topics import topics
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.gpt import GPT, next_token_losses
from minigpt_jax.optimizers import build_optimizer
from minigpt_jax.settings.groups import Optim

VOCAB = 256  # bytes


@dataclasses.dataclass(frozen=True)
class Family:
    """The model family a check trains: everything but the width and the parametrization."""

    n_layer: int = 2
    n_head: int = 4
    block_size: int = 32
    batch_size: int = 8
    base_width: int = 64  # μP's mup_base_width

    def config(self, width: int, parametrization: str) -> GPTConfig:
        """The model at `width` under `parametrization` ("standard" or "mup"), dropout off."""
        cfg = GPTConfig(
            vocab_size=VOCAB,
            block_size=self.block_size,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_embd=width,
            dropout=0.0,
            parametrization=parametrization,
        )
        if parametrization == "mup":
            cfg = cfg.replace(mup_base_width=self.base_width)
        return cfg


DEFAULT_FAMILY = Family()


@functools.cache
def corpus_ids() -> np.ndarray:
    """ids_N (int32): the bytes of CPython's documentation topics, in sorted topic order."""
    text = "\n\n".join(topics[key] for key in sorted(topics))
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)


def batches(family: Family, steps: int, seed: int) -> np.ndarray:
    """batches_CxBxT1: `steps` batches of random windows of the corpus (seed: which windows)."""
    ids = corpus_ids()
    length = family.block_size + 1
    starts = np.random.default_rng(seed).integers(0, ids.size - length, (steps, family.batch_size))
    return ids[starts[..., None] + np.arange(length)]


def optimizer(
    cfg: GPTConfig, optim: Optim, num_steps: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(tx, schedule) of `optim` at rate 1 for `cfg` (its parametrization's per-parameter rates
    included): a run's rate multiplies the update (`make_step`)."""
    parts = build_optimizer(dataclasses.replace(optim, lr=1.0), num_steps, cfg)
    return parts.tx, parts.schedule


def make_step(cfg: GPTConfig, tx: optax.GradientTransformation):
    """jit((params, opt_state, batch_BxT1, lr) -> (params, opt_state, loss)): one step of the
    mean next-token loss, the update of `tx` (built at rate 1) times lr."""

    def loss_of(params, batch_BxT1):
        return jnp.mean(next_token_losses(params, batch_BxT1, cfg))

    @jax.jit
    def step(params, opt_state, batch_BxT1, lr):
        loss, grads = jax.value_and_grad(loss_of)(params, batch_BxT1)
        updates, opt_state = tx.update(grads, opt_state, params)
        updates = jax.tree.map(lambda u: (lr * u).astype(u.dtype), updates)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def activation_scales(params: Any, tokens_BxT: np.ndarray, cfg: GPTConfig) -> dict[str, float]:
    """{layer: mean |x|} over the coordinates of the embedding's output ("embedding"), each
    block's output ("block_i") and the logits ("logits"), of one deterministic forward."""
    scales = _scales_fn(cfg)(params, jnp.asarray(tokens_BxT))
    return {name: float(value) for name, value in scales.items()}


@functools.cache
def _scales_fn(cfg: GPTConfig):
    """jit((params, tokens_BxT) -> {layer: mean |x|}) of `activation_scales`."""

    def recorded(module, method_name):
        name = module.name or ""  # the GPT itself has none
        return method_name == "__call__" and (name in ("", "embed") or name.startswith("block_"))

    @jax.jit
    def scales(params, tokens_BxT):
        (logits_BxTxV, _), state = GPT(cfg).apply(
            {"params": params}, tokens_BxT, capture_intermediates=recorded
        )
        captured = state["intermediates"]
        outputs = {"embedding": captured["embed"]["__call__"][0]}
        for i in range(cfg.n_layer):
            outputs[f"block_{i}"] = captured[f"block_{i}"]["__call__"][0][0]
        outputs["logits"] = logits_BxTxV
        return {name: jnp.mean(jnp.abs(x.astype(jnp.float32))) for name, x in outputs.items()}

    return scales


def layer_names(family: Family) -> list[str]:
    """The layers `activation_scales` reports, in order."""
    return ["embedding", *(f"block_{i}" for i in range(family.n_layer)), "logits"]


def log_log_slope(widths: Sequence[int], values: Sequence[float]) -> float:
    """The least-squares slope of log(value) against log(width)."""
    return float(np.polyfit(np.log(widths), np.log(values), 1)[0])
