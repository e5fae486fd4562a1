"""Evaluation: the passes over a split's fixed batches (`evaluate`) with the compiled steps of
train.eval_step; the training loop's evaluation, which keeps the best params and records the
results (`evaluate_and_keep_best`, `evaluate_and_record`), its trained steps checkpointed first
when it raises (`evaluation_error`); and perplexity and bits per byte of a model on a text over
sliding windows (the GPT-2 recipe; `minigpt-jax eval`)."""

from __future__ import annotations

import dataclasses
import errno
import functools
import logging
import math
from collections.abc import Callable
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from minigpt_jax import budget, sharding
from minigpt_jax.data import dataset as data
from minigpt_jax.data.tokenizers import Tokenizer
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.gpt import Params, next_token_losses
from minigpt_jax.model_files import load_model
from minigpt_jax.runtime.signals import TrainingStop
from minigpt_jax.settings.registry import PluginError, host_callback_errors, plugin_error
from minigpt_jax.train.guard import user_keys_in_play
from minigpt_jax.train.metrics import RunLogger
from minigpt_jax.train.recovery import Recovery
from minigpt_jax.train.setup import Run

Array = chex.Array
_log = logging.getLogger(__name__)


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


def evaluate_and_keep_best(
    run: Run, recovery: Recovery, step: int, should_stop: Callable[[], bool] | None = None
) -> tuple[dict[str, float], dict[str, float]] | None:
    """(val, train) results of the eval params on the fixed eval batches, each {"loss": ...,
    term: ..., metric: ...}; saves those params to best/ when the val loss is the lowest
    yet. None, with nothing recorded, when should_stop() turned true between two batches."""
    results = []
    params = run.eval_params()
    for tokens, split in ((run.dataset.val, "val"), (run.dataset.train, "train")):
        result = evaluate(
            run.eval_fn,
            params,
            tokens,
            num_batches=run.config.eval_batches,
            batch_size=run.config.micro_batch_size,  # what fits in memory
            block_size=run.config.model.block_size,
            seed=run.config.seed if run.config.eval_seed < 0 else run.config.eval_seed,
            split=split,
            mesh=run.mesh,
            should_stop=should_stop,
            metric_fn=run.metric_fn,
        )
        if result is None:
            return None
        results.append(result)
    val, train = results
    val_loss = val["loss"]
    if not math.isfinite(val_loss):
        raise recovery.non_finite_error(f"val loss {val_loss}", step, run.terms, val)
    if val_loss < run.best_val:
        recovery.check_params_finite(step, params)
        run.best_val = val_loss
        run.checkpointer.save_best(step, params, {**run.meta, "val_loss": val_loss})
    return val, train


def evaluate_and_record(
    run: Run, recovery: Recovery, log: RunLogger, step: int, stop: TrainingStop, *, saved: bool
) -> tuple[dict[str, float], dict[str, float]] | None:
    """Evaluates at `step` and records it: (val, train) results, or None if a signal stopped it
    between batches. An evaluation that raises (a metric's or loss term's code) loses no
    trained step: they are checkpointed first unless `saved` (already in a checkpoint), and
    user code is named."""
    with host_callback_errors() as callback_errors:
        try:
            results = evaluate_and_keep_best(run, recovery, step, should_stop=stop.requested)
        except FloatingPointError:
            raise  # a non-finite val loss: nothing non-finite is saved (non_finite_error)
        except Exception as error:
            raise evaluation_error(
                run, recovery.save, step, error, callback_errors, saved
            ) from error
    if results is not None:
        log.evaluation(step, *results)
    return results


def evaluation_error(
    run: Run,
    save: Callable[..., None],
    step: int,
    error: Exception,
    callback_errors: list[BaseException],
    saved: bool,
) -> Exception:
    """The error to raise for the step-`step` evaluation of `run` that raised `error`; the
    steps trained are checkpointed first by `save(pending_evaluation=True)` (unless `saved`),
    the evaluation pending, so a rerun resumes there and evaluates first. Raised in user code
    (its own frames, or a host callback's exception in `callback_errors`): a PluginError
    naming the key. A full disk (saving best/ failed) is raised as it is: its message says
    what is kept, and another save to that disk would only add a second report of it."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return error
    kept = _keep_steps(run, save, step, saved)
    cause = callback_errors[0] if callback_errors else error
    plugin = error if isinstance(error, PluginError) else plugin_error(cause)
    if plugin is None and callback_errors:  # raised in a helper of the user's own
        plugin = plugin_error(cause, where=user_keys_in_play(run.config) or "user code")
    if plugin is None:
        _log.error("the step-%d evaluation failed; %s", step, kept)
        return error
    plugin.header += f" (in the step-{step} evaluation)"
    plugin.note = kept
    return plugin


def _keep_steps(run: Run, save: Callable[..., None], step: int, saved: bool) -> str:
    """Checkpoints the train state with its evaluation pending (unless `saved`); says
    what is kept and how to go on."""
    if not saved:
        try:
            save(pending_evaluation=True)
        except Exception as error:  # e.g. non-finite parameters: never saved as good
            good = run.checkpointer.latest_step()
            return f"the steps trained could not be saved ({error}); " + (
                f"checkpoint {good} is kept." if good else "no checkpoint was saved."
            )
    return (
        f"The {step} steps trained are kept in checkpoint {step} (its evaluation runs first "
        "when the run resumes): fix the code, then rerun the same command (with "
        "--allow_resume_changes if you edited a module the run imports) to resume from it."
    )


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
