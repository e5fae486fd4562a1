"""Evaluation: the compiled eval step (the loss and every loss term, summed so batches add up)
and metric step (config.eval.metrics over the model's intermediates), the passes over a split's
fixed batches that the training loop runs (`evaluate`), and perplexity and bits per byte of a
model on a text over sliding windows (the GPT-2 recipe; `minigpt-jax eval`)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from minigpt_jax import budget, sharding
from minigpt_jax.data import dataset as data
from minigpt_jax.data.tokenizers import Tokenizer
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.eval_metrics import METRICS, check_value, metric_name
from minigpt_jax.model.gpt import (
    GPT,
    Params,
    init_params,
    next_token_loss_terms,
    next_token_losses,
    target_weights,
)
from minigpt_jax.model.loss_terms import PickedTerm
from minigpt_jax.model_files import load_model

Array = chex.Array
LossTerms = tuple[PickedTerm, ...]  # loss_terms.parse_terms(config.loss.terms, config.loss)


def eval_step(
    params: Params, batch_BxT1: Array, *, cfg: GPTConfig, terms: LossTerms = ()
) -> tuple[dict[str, Array], Array]:
    """({"loss": sum of token losses, term name: sum of its values}, number of tokens): the
    host divides, so batches can be summed."""
    losses_BxT, term_values_BxT = next_token_loss_terms(params, batch_BxT1, cfg, terms)
    weights_BxT = target_weights(batch_BxT1, cfg)  # 0: a target across packed documents
    sums = {
        "loss": (losses_BxT * weights_BxT).sum(),
        **{k: (v * weights_BxT).sum() for k, v in term_values_BxT.items()},
    }
    return sums, weights_BxT.sum().astype(jnp.int32)


def make_eval_step(
    cfg: GPTConfig, mesh: Mesh | None = None, params_sharding: Any = None, terms: LossTerms = ()
):
    """jit((params, batch_BxT1) -> (sums, token count)), sharded like training on a mesh."""
    return _jit_over_batches(
        functools.partial(eval_step, cfg=cfg, terms=terms), mesh, params_sharding
    )


def metric_step(
    params: Params, batch_BxT1: Array, *, cfg: GPTConfig, metrics: tuple[str, ...]
) -> dict[str, Array]:
    """{metric name: its float32 value on the batch} of `eval_metrics.parse_metrics`' keys, from
    one deterministic forward over the inputs on the explicit attention path (which sows the
    attention weights) that keeps the 'intermediates' collection."""
    entries = [METRICS[key] for key in metrics]
    capture = any(entry.capture_intermediates for entry in entries)
    _, variables = GPT(cfg.replace(attention="explicit")).apply(
        {"params": params},
        batch_BxT1[:, :-1],
        mutable=["intermediates"],
        capture_intermediates=capture,
    )
    intermediates = flax.core.unfreeze(variables).get("intermediates", {})
    return {
        metric_name(key): jnp.asarray(entry.fn(params, batch_BxT1, intermediates, cfg))
        for key, entry in zip(metrics, entries, strict=True)
    }


def check_metrics(cfg: GPTConfig, metrics: tuple[str, ...]) -> None:
    """Runs every metric on a probe batch from shapes alone (jax.eval_shape, nothing computed)
    and raises ValueError naming the key and the contract for a value that is not a float
    scalar: before any work."""
    params = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
    batch_1xT1 = jax.ShapeDtypeStruct((1, min(cfg.block_size, 8) + 1), jnp.int32)
    for key in metrics:
        out = jax.eval_shape(
            functools.partial(metric_step, cfg=cfg, metrics=(key,)), params, batch_1xT1
        )
        check_value(key, out[metric_name(key)])


def make_metric_step(
    cfg: GPTConfig,
    metrics: tuple[str, ...],
    mesh: Mesh | None = None,
    params_sharding: Any = None,
):
    """jit((params, batch_BxT1) -> {name: value}) of `metric_step`, sharded like evaluation."""
    step = functools.partial(metric_step, cfg=cfg, metrics=metrics)
    return _jit_over_batches(step, mesh, params_sharding)


def _jit_over_batches(step, mesh: Mesh | None, params_sharding: Any):
    """jit(step(params, batch_BxT1)): on a mesh, params as training holds them, the batch split
    over the batch axes, the result replicated."""
    if mesh is None:
        return jax.jit(step)
    return jax.jit(
        step,
        in_shardings=(params_sharding, sharding.batch_sharding(mesh, 2)),
        out_shardings=sharding.replicated(mesh),
    )


def evaluate(
    eval_fn,
    params: Params,
    tokens: np.ndarray,
    *,
    num_batches: int,
    batch_size: int,
    block_size: int,
    seed: int,
    split: str,
    mesh: Mesh | None = None,
    should_stop: Callable[[], bool] | None = None,
    metric_fn=None,
) -> dict[str, float] | None:
    """{"loss": mean next-token loss, term name: its mean, metric name: its mean over the
    batches} over `num_batches` fixed batches of a split (the same ones every time); eval_fn is
    `make_eval_step`'s, metric_fn (optional) `make_metric_step`'s. None when should_stop()
    turned true between two batches (a run asked to stop does not wait for a long pass)."""
    totals, count, metric_totals = {}, 0, {}
    for i in range(num_batches):
        if should_stop is not None and should_stop():
            return None
        batch = data.get_batch(tokens, batch_size, block_size, seed=seed, step=i, split=split)
        if mesh is not None:
            batch = sharding.put_batch(batch, sharding.batch_sharding(mesh, 2))
        sums, n = jax.device_get(eval_fn(params, batch))
        for key, value in sums.items():
            totals[key] = totals.get(key, 0.0) + float(value)
        count += int(n)
        if metric_fn is not None:
            for key, value in jax.device_get(metric_fn(params, batch)).items():
                metric_totals[key] = metric_totals.get(key, 0.0) + float(value)
    means = {key: total / count for key, total in totals.items()}
    # Equal batches: the mean of the batches' means.
    means.update({key: total / num_batches for key, total in metric_totals.items()})
    return means


@dataclasses.dataclass(frozen=True)
class Perplexity:
    """What `perplexity` measured."""

    tokens: int  # tokens in the text
    tokens_scored: int  # tokens predicted (all but the first, which has no context)
    bytes_scored: int  # UTF-8 bytes those tokens spell
    loss: float  # mean next-token cross-entropy over the scored tokens, nats
    window: int  # model inputs per window
    stride: int  # tokens the window moves each time

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    @property
    def bits_per_byte(self) -> float:
        return self.loss * self.tokens_scored / (math.log(2) * self.bytes_scored)

    def summary(self) -> str:
        return (
            f"tokens seen {self.tokens_scored:,} (of {self.tokens:,}; window {self.window}, "
            f"stride {self.stride}): loss {self.loss:.4f} nats/token, perplexity "
            f"{self.perplexity:.3f}, bits per byte {self.bits_per_byte:.4f}"
        )


def sliding_windows(num_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first_scored) of each window over token ids 0 .. num_tokens-1.

    A window feeds ids [begin, end) and predicts ids [begin+1, end+1) ∩ [0, num_tokens); it
    scores only the targets from `first_scored` on, those no earlier window scored, so every
    target 1 .. num_tokens-1 is scored once, with at least window - stride tokens of context
    after the first window (the Hugging Face perplexity recipe for fixed-length models).
    """
    if not 1 <= stride <= window:
        raise ValueError(f"stride={stride} must be between 1 and the window ({window}).")
    windows, scored_up_to, begin = [], 1, 0  # targets below scored_up_to are done
    while scored_up_to < num_tokens:
        end = min(begin + window, num_tokens - 1)
        windows.append((begin, end, scored_up_to))
        scored_up_to = end + 1
        begin += stride
    return windows


@functools.partial(jax.jit, static_argnames="cfg")
def _window_loss_sum(params: Params, tokens_BxT1, weights_BxT, *, cfg: GPTConfig):
    """Summed next-token cross-entropy (nats) of the targets tokens_BxT1[:, 1:] weighted 1."""
    return jnp.sum(next_token_losses(params, tokens_BxT1, cfg) * weights_BxT)


def perplexity(
    params: Params,
    cfg: GPTConfig,
    tokenizer: Tokenizer,
    text: str,
    *,
    stride: int | None = None,
    batch_size: int = 8,
) -> Perplexity:
    """Perplexity of the model on `text` with windows of cfg.block_size tokens moved by `stride`
    (default: the whole window, no overlap). A smaller stride gives each prediction more context
    and costs window/stride times the compute."""
    ids = np.asarray(tokenizer.encode(text), np.int32)
    if ids.size < 2:
        raise ValueError(
            f"the text encodes to {ids.size} token(s); perplexity needs at least 2 (one to "
            f"condition on, one to predict). Give a longer text."
        )
    window = cfg.block_size
    stride = window if stride is None else stride
    windows = sliding_windows(ids.size, window, stride)
    total = 0.0
    # Every batch is (batch_size, window): one compile whatever the text's length.
    for first in range(0, len(windows), batch_size):
        tokens_BxT1 = np.zeros((batch_size, window + 1), np.int32)
        weights_BxT = np.zeros((batch_size, window), np.float32)
        for row, (begin, end, scored) in enumerate(windows[first : first + batch_size]):
            tokens_BxT1[row, : end + 1 - begin] = ids[begin : end + 1]
            weights_BxT[row, scored - begin - 1 : end - begin] = 1.0
        total += float(_window_loss_sum(params, tokens_BxT1, weights_BxT, cfg=cfg))
    scored = ids.size - 1
    # The first token is context only; its bytes are not among those predicted.
    first_bytes = len(tokenizer.decode(ids[:1]).encode("utf-8", errors="surrogatepass"))
    return Perplexity(
        tokens=int(ids.size),
        tokens_scored=scored,
        bytes_scored=len(text.encode("utf-8", errors="surrogatepass")) - first_bytes,
        loss=total / scored,
        window=window,
        stride=stride,
    )


def perplexity_of(
    model: str | Path,
    text_path: str | Path,
    *,
    stride: int | None = None,
    checkpoint: str = "latest",
    batch_size: int = 8,
) -> Perplexity:
    """`perplexity` of a run directory or a Hugging Face GPT-2 directory on a UTF-8 text file."""
    text_path = Path(text_path)
    if not text_path.is_file():
        raise FileNotFoundError(f"no text file at {text_path}: give a UTF-8 .txt file.")
    cfg, params, tokenizer = load_model(model, checkpoint)
    check_fits_in_memory(text_path, tokenizer.kind)
    try:
        text = text_path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{text_path} is not UTF-8 text ({error}); convert it first.") from None
    return perplexity(params, cfg, tokenizer, text, stride=stride, batch_size=batch_size)


def check_fits_in_memory(text_path: Path, tokenizer_kind: str) -> None:
    """Refuses, before reading it, a text whose in-memory encoding would not fit in RAM (the
    same account as a data.format=memory corpus: budget.text_shortfall)."""
    text_bytes = text_path.stat().st_size
    shortfall = budget.text_shortfall(text_bytes, tokenizer_kind)
    if shortfall is not None:
        needed, available = shortfall
        part = max(budget.text_bytes_that_fit(available, tokenizer_kind) // 2, 1)
        raise ValueError(
            f"{text_path} holds {text_bytes / 2**20:,.0f} MiB of text; reading and encoding it "
            f"at once would need about {needed / 2**30:,.1f} GiB of RAM, but "
            f"{available / 2**30:,.1f} GiB are available; score a part of it, e.g. "
            f"`head -c {part // 2**20 or 1}M {text_path} > part.txt`, then --text part.txt."
        )
