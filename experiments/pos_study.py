"""Experiment 8: position encodings trained side by side, and evaluated past block_size.

    python -m experiments.pos_study --outdir results/pos_study --data ../shared/data

Trains learned, sinusoidal, rope and no positions on character-level Tiny Shakespeare
(configs/shakespeare_char.py) with the same seed, batches and budget (default 300 steps), each
the way its paper uses it: sinusoidal positions with the token embeddings scaled by sqrt(D)
(Vaswani et al. 2017, section 3.4), the others unscaled (GPT-2, RoFormer). Beside them runs the
lesson, "sinusoidal unscaled": sinusoids of norm sqrt(D/2) added to token rows of norm ~0.23
drown them. Each final model is evaluated on validation windows of 1x, 2x and 4x block_size
through `forward`. Learned positions refuse anything longer than block_size (the model's
ValueError, reported as "n/a (refuses)"); the other schemes run, and show how well what they
learned carries past the trained length. Figures: validation loss curves, and loss by position
on 4x block_size windows. Measured numbers: experiments/README.md, section 8.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jax
import numpy as np

from experiments.common import make_parser, new_figure, print_table, save_figure
from experiments.training import (
    add_training_args,
    describe_budget,
    runs_root,
    study_config,
    train_fresh,
    val_curve,
)
from minigpt_jax import GPTConfig
from minigpt_jax.data.dataset import get_batch
from minigpt_jax.data.formats import dataset_from
from minigpt_jax.model.gpt import next_token_losses
from minigpt_jax.runtime.checkpoint import load_params

SCHEMES = ("learned", "sinusoidal", "rope", "none")
# The same scheme trained without its paper's sqrt(D) token scale, shown beside the fair runs.
UNSCALED = "sinusoidal unscaled"
VARIANTS = (*SCHEMES, UNSCALED)


def variant_model(name: str, n_embd: int) -> dict[str, Any]:
    """The model keys a study variant sets: its pos_encoding, and embed_scale = sqrt(D) for
    sinusoids as Vaswani et al. use them (1.0, GPT-2's and RoFormer's, otherwise)."""
    if name == UNSCALED:
        return dict(pos_encoding="sinusoidal", embed_scale=1.0)
    scale = math.sqrt(n_embd) if name == "sinusoidal" else 1.0
    return dict(pos_encoding=name, embed_scale=scale)


MULTIPLES = (1, 2, 4)  # evaluation lengths, in units of block_size
REFUSED = "n/a (refuses)"

# One compile per (scheme, length); learned positions raise their ValueError at trace time.
losses_fn = jax.jit(next_token_losses, static_argnums=2)


def _per_position_losses(params, windows_BxT1: np.ndarray, cfg: GPTConfig) -> np.ndarray:
    """Next-token loss at every position, averaged over windows: shape (T,)."""
    return np.asarray(losses_fn(params, windows_BxT1, cfg)).mean(axis=0)


def long_context_losses(
    params, cfg: GPTConfig, val: np.ndarray, *, windows: int, seed: int
) -> tuple[dict[int, float | str], dict[int, np.ndarray]]:
    """Mean loss on `windows` val windows of m x block_size tokens, for m in MULTIPLES.

    The windows are the first m x block_size (+1 target) tokens of the same longest windows,
    a pure function of `seed`: every scheme and length sees the same text.
    Returns ({m: mean loss, or the refusal message}, {m: per-position losses} where it ran).
    """
    longest = MULTIPLES[-1] * cfg.block_size
    windows_BxT1 = get_batch(val, windows, longest, seed=seed, step=0, split="val")
    losses, per_position = {}, {}
    for multiple in MULTIPLES:
        length = multiple * cfg.block_size
        try:
            per_position[multiple] = _per_position_losses(
                params, windows_BxT1[:, : length + 1], cfg
            )
        except ValueError as error:  # learned positions: raised at trace time
            losses[multiple] = str(error)
        else:
            losses[multiple] = float(per_position[multiple].mean())
    return losses, per_position


def unigram_loss(train: np.ndarray, val: np.ndarray, vocab_size: int) -> float:
    """Val loss of the best context-free model: train-split token frequencies (add-one)."""
    counts = np.bincount(train, minlength=vocab_size) + 1.0
    return float(-np.log(counts / counts.sum())[val].mean())


def run(
    outdir: Path | None = None,
    *,
    steps: int = 300,
    data: str | Path | None = None,
    config: Any = None,
    schemes: tuple[str, ...] = VARIANTS,
    windows: int = 64,
) -> dict:
    """Trains one run per variant (see `variant_model`) and evaluates it at 1x, 2x, 4x
    block_size.

    config: the base experiment config (default configs/shakespeare_char.py); only
    model.pos_encoding and model.embed_scale differ between runs. windows: val windows per
    evaluation length.
    """
    base = study_config(config, steps=steps, data=data)
    block = base.model.block_size
    print(describe_budget(base))
    results = {}
    with runs_root(outdir) as root:
        for scheme in schemes:
            config = study_config(base, steps=steps)
            config.model.update(variant_model(scheme, base.model.n_embd))
            workdir = root / f"pos_{scheme.replace(' ', '_')}"
            summary = train_fresh(config, workdir, scheme)
            params, meta = load_params(workdir, "latest")
            cfg = GPTConfig(**meta["gpt_config"])
            # The run's own tokenizer and split (its tokens.npy cache, nothing re-encoded).
            dataset = dataset_from(config, workdir)
            losses, per_position = long_context_losses(
                params, cfg, dataset.val, windows=windows, seed=config.seed
            )
            results[scheme] = dict(
                unigram=unigram_loss(dataset.train, dataset.val, cfg.vocab_size),
                # Mean norm of a token vector as positions meet it (the row times embed_scale);
                # sinusoidal vectors have norm sqrt(D/2).
                token_norm=cfg.embed_scale
                * float(np.linalg.norm(params["embed"]["tok"]["embedding"], axis=1).mean()),
                n_embd=cfg.n_embd,
                val_loss=summary.val_loss,
                curve=val_curve(workdir),
                long=losses,
                per_position=per_position,
                vocab_size=cfg.vocab_size,
                wall_time_s=summary.wall_time_s,
            )
    first = results[schemes[0]]
    vocab, unigram, width = first["vocab_size"], first["unigram"], first["n_embd"]

    def cell(value):
        return value if isinstance(value, float) else REFUSED

    def beyond_block(r):
        """Mean loss at positions >= block_size of the longest windows."""
        longest = r["per_position"].get(MULTIPLES[-1])
        return None if longest is None else float(longest[block:].mean())

    lengths = [f"{m * block} ({m}x)" for m in MULTIPLES]
    print_table(
        f"loss (nats/token) after {steps} steps; log(V) = {math.log(vocab):.3f}, unigram "
        f"(no context) {unigram:.3f}; long-context columns: mean over {windows} val windows",
        [
            "positions",
            "final val loss",
            *lengths,
            f"positions >= {block} at {MULTIPLES[-1]}x",
            "mean |scale x token row|",
        ],
        [
            [
                scheme,
                r["val_loss"],
                *(cell(r["long"][m]) for m in MULTIPLES),
                cell(beyond_block(r)),
                r["token_norm"],
            ]
            for scheme, r in results.items()
        ],
    )
    for scheme, r in results.items():
        refused = [m * block for m, v in r["long"].items() if not isinstance(v, float)]
        if refused:
            message = r["long"][refused[-1] // block]
            print(f"{scheme} at {refused} tokens -> ValueError, e.g. {message}")

    print(
        f"a sinusoidal position vector has norm sqrt(D/2) = {math.sqrt(width / 2):.2f}; "
        f"'sinusoidal' scales token rows by sqrt(D) = {math.sqrt(width):.2f}"
    )

    figures = _plot(results, block, steps, unigram, outdir)
    return dict(
        budget=describe_budget(base),
        block_size=block,
        vocab_size=vocab,
        unigram_loss=unigram,
        token_norm={s: r["token_norm"] for s, r in results.items()},
        final_val_loss={s: r["val_loss"] for s, r in results.items()},
        curves={s: r["curve"] for s, r in results.items()},
        long_loss={s: r["long"] for s, r in results.items()},
        beyond_block={s: beyond_block(r) for s, r in results.items()},
        per_position={s: r["per_position"] for s, r in results.items()},
        figures=figures,
    )


def _label(scheme: str) -> str:
    return "sinusoidal (tokens x sqrt(D))" if scheme == "sinusoidal" else scheme


def _style(scheme: str) -> str:
    return "--" if scheme == UNSCALED else "-"


def _plot(results: dict, block: int, steps: int, unigram: float, outdir: Path | None) -> list:
    fig, axes = new_figure(1, 2, size=(12.0, 4.2))
    ax = axes[0, 0]
    for scheme, r in results.items():
        ax.plot(*r["curve"], marker="o", ms=3, label=_label(scheme), ls=_style(scheme))
    ax.set_xlabel("step")
    ax.set_ylabel("val loss (nats/token)")
    ax.axhline(unigram, color="gray", ls=":", label="unigram (no context)")
    ax.set_title(f"Validation loss, same seed and batches, {steps} steps")
    ax.legend(fontsize=8)
    ax = axes[0, 1]
    bin_width = max(1, block // 8)
    for scheme, r in results.items():
        # The longest windows the scheme accepts: learned positions stop at block_size.
        longest = max(r["per_position"])
        per_position = r["per_position"][longest]
        usable = len(per_position) // bin_width * bin_width
        bins = per_position[:usable].reshape(-1, bin_width).mean(axis=1)
        label = _label(scheme)
        if longest != MULTIPLES[-1]:
            label += f" (refuses > {block})"
        ax.plot(
            np.arange(len(bins)) * bin_width + bin_width / 2, bins, label=label, ls=_style(scheme)
        )
    ax.axvline(block, color="k", ls="--", lw=1, label=f"block_size {block}")
    ax.axhline(unigram, color="gray", ls=":", label="unigram (no context)")
    ax.set_xlabel(f"position in a {MULTIPLES[-1] * block}-token window (bins of {bin_width})")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title("Loss by position, past the trained length")
    ax.legend(fontsize=8, loc="center right")
    return [save_figure(fig, outdir, "pos_study")]


def main(argv=None):
    parser = add_training_args(make_parser("pos_study", __doc__), steps=300)
    args = parser.parse_args(argv)
    run(args.outdir, steps=args.steps, data=args.data)


if __name__ == "__main__":
    main()
