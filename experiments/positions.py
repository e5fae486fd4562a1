"""Experiment 5: sinusoidal positions, their similarity, and the length limit of learned ones.

    python -m experiments.positions --outdir results/positions
    python -m experiments.positions --outdir results/positions_gpt2 --pretrained path/to/gpt2

The sinusoidal table (Vaswani et al. 2017) as a heatmap: each (sin, cos) pair of dimensions
oscillates at its own rate ω_k = 10000^(-2k/D), from 1 radian per position down to ~1e-4. The dot
product P[i]·P[j] = Σ_k cos((i - j)·ω_k) depends on the offset i - j only and decays with it.
A learned position table with block_size 64 refuses 100 tokens (the model's ValueError);
sinusoidal positions accept them.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from experiments.common import (
    add_pretrained_arg,
    load_pretrained,
    make_parser,
    new_figure,
    print_table,
    save_figure,
)
from minigpt_apps.lab.compute import position_similarity
from minigpt_jax import GPTConfig, forward, init_params, sinusoidal_positions

OFFSETS = (0, 1, 2, 4, 8, 16, 32, 64, 127)


def run(
    outdir: Path | None = None,
    *,
    length: int = 128,
    dim: int = 128,
    cfg: GPTConfig | None = None,
    too_long: int = 100,
) -> dict:
    """Similarity of sinusoidal positions; learned vs sinusoidal on `too_long` tokens.

    cfg is the model for the length check (default: the mini-GPT, block_size 64, no dropout).
    """
    table_TxD = np.asarray(sinusoidal_positions(length, dim))
    similarity_TxT = position_similarity(length, dim)
    offsets = np.arange(length)
    # Every diagonal i - j = k should be constant: mean and spread per offset.
    per_offset = np.array([np.diagonal(similarity_TxT, k).mean() for k in offsets])
    spread = np.array([np.ptp(np.diagonal(similarity_TxT, k)) for k in offsets])
    inv_freq = 1.0 / 10000.0 ** (np.arange(0, dim, 2) / dim)
    analytic = np.cos(offsets[:, None] * inv_freq[None, :]).sum(axis=1)
    bands = [(lo, hi) for lo, hi in ((1, 16), (16, 64), (64, length)) if lo < length]
    band_means = [float(per_offset[lo:hi].mean()) for lo, hi in bands]
    print_table(
        f"sinusoidal P[i]·P[j] ({length} positions, D={dim}) by offset k = |i - j|",
        ["offset k", "mean P[i]·P[i+k]", "spread over i", "Σ cos(k·ω)"],
        [
            [int(k), float(per_offset[k]), float(spread[k]), float(analytic[k])]
            for k in OFFSETS
            if k < length
        ],
    )
    print(
        f"largest spread along any diagonal: {spread.max():.2e} (float32 rounding; the values "
        f"reach {dim // 2})\nmean similarity by offset band: "
        + ", ".join(
            f"k in [{lo}, {hi}): {m:.1f}" for (lo, hi), m in zip(bands, band_means, strict=True)
        )
    )

    # ---- learned positions have block_size rows; sinusoidal ones have no limit
    cfg = cfg or GPTConfig(dropout=0.0)
    tokens_1xT = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, too_long))
    accepts = {}
    for scheme in ("learned", "sinusoidal"):
        scheme_cfg = cfg.replace(pos_encoding=scheme)
        params = init_params(scheme_cfg, jax.random.key(0))
        # jit: one compile at the new length instead of one per op; the length check runs
        # at trace time, so it raises the same ValueError.
        attempt = f"\n{scheme} positions, block_size {cfg.block_size}, {too_long} tokens ->"
        try:
            logits = jax.jit(forward, static_argnums=2)(params, tokens_1xT, scheme_cfg)
        except ValueError as error:
            accepts[scheme] = False
            print(f"{attempt} ValueError: {error}")
        else:
            accepts[scheme] = True
            print(f"{attempt} logits {logits.shape}")

    fig, axes = new_figure(1, 3, size=(14.0, 4.0))
    ax = axes[0, 0]
    image = ax.imshow(
        table_TxD, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest"
    )
    fig.colorbar(image, ax=ax)
    ax.set_xlabel("dimension (pairs 2i, 2i+1: sin, cos)")
    ax.set_ylabel("position")
    ax.set_title("Sinusoidal position table")
    ax = axes[0, 1]
    image = ax.imshow(similarity_TxT, cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=ax)
    ax.set_xlabel("position j")
    ax.set_ylabel("position i")
    ax.set_title("P[i]·P[j]: constant along diagonals")
    ax = axes[0, 2]
    for i in (0, length // 4, length // 2):
        ax.plot(offsets[: length - i], similarity_TxT[i, i:], label=f"i = {i}", alpha=0.8)
    ax.set_xlabel("offset k")
    ax.set_ylabel("P[i]·P[i+k]")
    ax.set_title("Similarity vs offset (same curve for every i)")
    ax.legend()
    figure = save_figure(fig, outdir, "sinusoidal")

    fig, axes = new_figure(1, 1, size=(7.0, 3.2))
    ax = axes[0, 0]
    for pair in sorted({0, dim // 32, dim // 8, dim // 2 - 1}):
        ax.plot(table_TxD[:, 2 * pair], label=f"dim {2 * pair} (ω = {inv_freq[pair]:.2g})")
    ax.set_xlabel("position")
    ax.set_ylabel("sin(position·ω)")
    ax.set_title("Each pair of dimensions oscillates at its own rate")
    ax.legend(fontsize=8)
    waves = save_figure(fig, outdir, "sinusoidal_rates")

    return dict(
        similarity_at_offset=per_offset,
        max_diagonal_spread=float(spread.max()),
        max_analytic_diff=float(np.abs(per_offset - analytic).max()),
        band_means=dict(zip(bands, band_means, strict=True)),
        accepts=accepts,
        figures=[figure, waves],
    )


def run_learned(path: str | Path, outdir: Path | None = None, *, offsets=OFFSETS) -> dict:
    """The same questions of a pretrained model's learned position table W_P (e.g. GPT-2's
    1024 x 768): is P[i]·P[j] a function of the offset i - j alone, how smooth is the table (is a
    position's nearest row its neighbour), how many directions hold it (PCA), and does the model
    refuse block_size + 1 tokens."""
    cfg, params, _ = load_pretrained(path)
    if "pos" not in params["embed"]:
        raise ValueError(f"{path} has no learned position table (pos_encoding={cfg.pos_encoding}).")
    table_TxD = np.asarray(params["embed"]["pos"]["embedding"], np.float64)
    length = table_TxD.shape[0]
    unit_TxD = table_TxD / np.linalg.norm(table_TxD, axis=1, keepdims=True)
    cosine_TxT = unit_TxD @ unit_TxD.T
    per_offset = np.array([np.diagonal(cosine_TxT, k).mean() for k in range(length)])
    spread = np.array([np.diagonal(cosine_TxT, k).std() for k in range(length)])
    print_table(
        f"learned positions: cos(P[i], P[i+k]) by offset k ({length} positions, D={cfg.n_embd})",
        ["offset k", "mean over i", "std over i"],
        [[int(k), float(per_offset[k]), float(spread[k])] for k in offsets if k < length],
    )
    others_TxT = cosine_TxT - 2 * np.eye(length)
    nearest_T = others_TxT.argmax(axis=1)
    adjacent = float(np.mean(np.abs(nearest_T - np.arange(length)) == 1))
    centred_TxD = table_TxD - table_TxD.mean(axis=0)
    _, singular, vt_DxD = np.linalg.svd(centred_TxD, full_matrices=False)
    share = singular**2 / np.sum(singular**2)
    print(
        f"nearest other row is an adjacent position for {adjacent:.1%} of positions; "
        f"variance share of the first 3 principal components: "
        + ", ".join(f"{x:.1%}" for x in share[:3])
    )
    too_long = np.zeros((1, cfg.block_size + 1), np.int32)
    try:
        jax.eval_shape(lambda p, t: forward(p, t, cfg), params, too_long)
        refuses = False
    except ValueError as error:
        refuses = True
        print(f"{cfg.block_size + 1} tokens -> ValueError: {error}")

    fig, axes = new_figure(1, 3, size=(14.0, 4.0))
    image = axes[0, 0].imshow(cosine_TxT, cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=axes[0, 0])
    axes[0, 0].set_title("cos(P[i], P[j]) of the learned table")
    axes[0, 0].set_xlabel("position j")
    axes[0, 0].set_ylabel("position i")
    axes[0, 1].plot(per_offset, label="mean over i")
    axes[0, 1].fill_between(
        np.arange(length), per_offset - spread, per_offset + spread, alpha=0.3, label="± std"
    )
    axes[0, 1].set_xlabel("offset k")
    axes[0, 1].set_ylabel("cos(P[i], P[i+k])")
    axes[0, 1].set_title("Similarity vs offset")
    axes[0, 1].legend()
    coords_Tx2 = centred_TxD @ vt_DxD[:2].T
    points = axes[0, 2].scatter(coords_Tx2[:, 0], coords_Tx2[:, 1], c=np.arange(length), s=4)
    fig.colorbar(points, ax=axes[0, 2], label="position")
    axes[0, 2].set_xlabel(f"PC1 ({share[0]:.0%})")
    axes[0, 2].set_ylabel(f"PC2 ({share[1]:.0%})")
    axes[0, 2].set_title("Positions on the first two components")
    figure = save_figure(fig, outdir, "learned_positions")
    return dict(
        cosine_at_offset=per_offset,
        spread_at_offset=spread,
        nearest_is_adjacent=adjacent,
        pca_share=share[:3],
        refuses_block_size_plus_one=refuses,
        figures=[figure],
    )


def main(argv=None):
    args = add_pretrained_arg(make_parser("positions", __doc__)).parse_args(argv)
    if args.pretrained is not None:
        run_learned(args.pretrained, args.outdir)
    else:
        run(args.outdir)


if __name__ == "__main__":
    main()
