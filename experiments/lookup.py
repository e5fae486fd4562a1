"""Experiment 1: an embedding lookup is a row gather, and equals one-hot(ids) · W_E.

    python -m experiments.lookup --outdir results/lookup
    python -m experiments.lookup --outdir results/lookup_gpt2 --pretrained path/to/gpt2

Uses the model's `Embeddings` module (positions off) and its initializer: ids
[[76, 299, 412]] with V=512, D=128 give x (1, 3, 128), identical to the one-hot product. The
product costs 2·B·T·V·D FLOPs, the gather none; both are timed under jit at a few vocab sizes.
"""

from __future__ import annotations

from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from experiments.common import (
    add_pretrained_arg,
    load_pretrained,
    make_parser,
    new_figure,
    print_table,
    save_figure,
)
from minigpt_apps.lab.compute import lookup, one_hot_lookup
from minigpt_jax import Embeddings, GPTConfig
from minigpt_jax.runtime.timing import median_seconds

IDS = ((76, 299, 412),)
# (V, D): the mini-GPT's vocab, then GPT-2's vocab at the mini-GPT's width.
SIZES = ((512, 128), (50257, 128))


def _init_table(cfg: GPTConfig, seed: int):
    """A fresh token table W_E (V, D) from the Embeddings module's own initializer."""
    params = nn.unbox(
        Embeddings(cfg).init(jax.random.key(seed), jnp.zeros((1, 1), jnp.int32))["params"]
    )
    return params["tok"]["embedding"]


def _compile(fn, *args):
    """(compiled fn, the FLOPs that XLA's cost analysis counts for it)."""
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, int(compiled.cost_analysis()["flops"])


def run(
    outdir: Path | None = None,
    *,
    sizes=SIZES,
    tokens: int = 1024,
    repeats: int = 20,
    seed: int = 0,
    table: np.ndarray | None = None,
) -> dict:
    """Lookup vs one-hot product: equality on IDS, then FLOPs and median times at `sizes`.

    `tokens` is B·T of the timed batch (B=1). A given `table` (V, D), e.g. GPT-2's, replaces
    the fresh tables: the equality and the timing then use it alone.
    """
    # ---- the lookup through the model's Embeddings module
    vocab, dim = (512, 128) if table is None else np.shape(table)
    cfg = GPTConfig(vocab_size=vocab, n_embd=dim, n_head=1, pos_encoding="none", dropout=0.0)
    ids_BxT = jnp.array(IDS, jnp.int32) % vocab
    table_VxD = _init_table(cfg, seed) if table is None else jnp.asarray(table)
    x_BxTxD = np.asarray(lookup(table_VxD, ids_BxT))
    via_one_hot = np.asarray(one_hot_lookup(table_VxD, ids_BxT))
    max_diff = float(np.abs(x_BxTxD - via_one_hot).max())
    rows_diff = float(np.abs(x_BxTxD[0] - np.asarray(table_VxD)[ids_BxT[0]]).max())
    print(f"ids {ids_BxT[0].tolist()} with V={cfg.vocab_size}, D={cfg.n_embd} -> x {x_BxTxD.shape}")
    print(
        f"max |lookup - one_hot @ W_E| = {max_diff:g};  max |x[0, t] - W_E[id_t]| = {rows_diff:g}"
    )

    # ---- cost at a few sizes
    rows = []
    for vocab, dim in sizes if table is None else [np.shape(table)]:
        size_cfg = GPTConfig(vocab_size=vocab, n_embd=dim, n_head=1, pos_encoding="none")
        size_table = _init_table(size_cfg, seed) if table is None else table_VxD
        tokens_1xT = jnp.asarray(np.random.default_rng(seed).integers(0, vocab, (1, tokens)))
        gather, gather_flops = _compile(lookup, size_table, tokens_1xT)
        matmul, matmul_flops = _compile(one_hot_lookup, size_table, tokens_1xT)
        rows.append(
            dict(
                V=vocab,
                D=dim,
                BT=tokens,
                matmul_flops=2 * tokens * vocab * dim,
                xla_gather_flops=gather_flops,
                xla_matmul_flops=matmul_flops,
                gather_s=median_seconds(gather, size_table, tokens_1xT, repeats=repeats),
                matmul_s=median_seconds(matmul, size_table, tokens_1xT, repeats=repeats),
            )
        )
    print_table(
        f"cost of x = W_E[ids] vs one_hot(ids) @ W_E (B·T={tokens}, median of {repeats}, jit)",
        [
            "V",
            "D",
            "2·BT·V·D",
            "XLA flops gather",
            "XLA flops one-hot",
            "gather ms",
            "one-hot ms",
            "ratio",
        ],
        [
            [
                r["V"],
                r["D"],
                r["matmul_flops"],
                r["xla_gather_flops"],
                r["xla_matmul_flops"],
                1e3 * r["gather_s"],
                1e3 * r["matmul_s"],
                r["matmul_s"] / r["gather_s"],
            ]
            for r in rows
        ],
    )

    fig, axes = new_figure(1, 2, size=(9.0, 3.5))
    labels = [f"V={r['V']:,}" for r in rows]
    positions = np.arange(len(rows))
    for ax, gather_key, matmul_key, title in (
        (axes[0, 0], "xla_gather_flops", "xla_matmul_flops", "FLOPs (XLA cost analysis)"),
        (axes[0, 1], "gather_s", "matmul_s", "median time under jit (s)"),
    ):
        ax.bar(positions - 0.2, [r[gather_key] for r in rows], 0.4, label="gather W_E[ids]")
        ax.bar(positions + 0.2, [r[matmul_key] for r in rows], 0.4, label="one_hot(ids) @ W_E")
        ax.set_yscale("log")
        ax.set_xticks(positions, labels)
        ax.set_title(title)
    axes[0, 0].legend()
    fig.suptitle(f"Embedding lookup, B·T={tokens}, D={rows[0]['D']}")
    figure = save_figure(fig, outdir, "lookup_cost")

    return dict(
        shape=tuple(x_BxTxD.shape),
        max_abs_diff=max_diff,
        rows_max_abs_diff=rows_diff,
        costs=rows,
        figures=[figure],
    )


def main(argv=None):
    parser = add_pretrained_arg(make_parser("lookup", __doc__))
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per size")
    args = parser.parse_args(argv)
    table = None
    if args.pretrained is not None:
        table = load_pretrained(args.pretrained).params["embed"]["tok"]["embedding"]
    run(args.outdir, repeats=args.repeats, table=table)


if __name__ == "__main__":
    main()
