"""Experiment 2: token ids are arbitrary names for rows of W_E.

    python -m experiments.relabel --outdir results/relabel

Renaming every id by a permutation π (id i becomes π(i)) and moving row i of the table to row
π(i) leaves every looked-up vector unchanged (max abs diff exactly 0). Editing one row changes
the vector at every occurrence of that token and nowhere else.
"""

from __future__ import annotations

from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from experiments.common import make_parser, new_figure, print_table, save_figure
from minigpt_apps.lab.compute import lookup, rename_rows
from minigpt_jax import Embeddings, GPTConfig

EDITED_TOKEN = 299
# Where the batch holds EDITED_TOKEN, on top of random ids that avoid it.
OCCURRENCES = ((0, 1), (0, 9), (1, 4), (1, 5), (1, 22))


_lookup = jax.jit(lookup)


def run(outdir: Path | None = None, *, vocab_size: int = 512, n_embd: int = 128, seed: int = 0):
    """Relabel the vocabulary by a random permutation, then edit row EDITED_TOKEN."""
    cfg = GPTConfig(vocab_size=vocab_size, n_embd=n_embd, pos_encoding="none", dropout=0.0)
    params = nn.unbox(
        Embeddings(cfg).init(jax.random.key(seed), jnp.zeros((1, 1), jnp.int32))["params"]
    )
    table_VxD = np.asarray(params["tok"]["embedding"])
    rng = np.random.default_rng(seed)
    # Random ids that avoid EDITED_TOKEN, which then occurs only where placed.
    tokens_BxT = rng.integers(0, vocab_size - 1, (2, 32))
    tokens_BxT[tokens_BxT >= EDITED_TOKEN] += 1
    for b, t in OCCURRENCES:
        tokens_BxT[b, t] = EDITED_TOKEN
    x_BxTxD = np.asarray(_lookup(table_VxD, tokens_BxT))

    # ---- relabel: id i -> perm[i], row i -> row perm[i]
    perm_V = rng.permutation(vocab_size)
    relabelled_VxD = rename_rows(table_VxD, perm_V)
    relabelled_x = np.asarray(_lookup(relabelled_VxD, perm_V[tokens_BxT]))
    relabel_diff = float(np.abs(relabelled_x - x_BxTxD).max())
    ids_moved = int((perm_V != np.arange(vocab_size)).sum())
    sample_ids = [int(tokens_BxT[b, t]) for b, t in ((0, 0), (0, 1), (1, 7))]
    print_table(
        f"relabel the vocabulary by a random permutation ({ids_moved} of {vocab_size} ids move)",
        ["old id", "new id π(id)", "max |W_E'[π(id)] - W_E[id]|"],
        [
            [i, int(perm_V[i]), float(np.abs(relabelled_VxD[perm_V[i]] - table_VxD[i]).max())]
            for i in sample_ids
        ],
    )
    print(f"max |lookup'(π(ids)) - lookup(ids)| over the batch = {relabel_diff:g}")

    # ---- edit one row
    edited_VxD = table_VxD.copy()
    edited_VxD[EDITED_TOKEN] += np.linspace(-1.0, 1.0, n_embd, dtype=np.float32)
    change_BxT = np.abs(np.asarray(_lookup(edited_VxD, tokens_BxT)) - x_BxTxD).max(axis=-1)
    is_edited_BxT = tokens_BxT == EDITED_TOKEN
    changed = [(int(b), int(t)) for b, t in np.argwhere(change_BxT > 0)]
    row_change = float(np.abs(edited_VxD[EDITED_TOKEN] - table_VxD[EDITED_TOKEN]).max())
    change_at = float(change_BxT[is_edited_BxT].max())
    change_elsewhere = float(change_BxT[~is_edited_BxT].max())
    print_table(
        f"edit row {EDITED_TOKEN}: which of the {tokens_BxT.size} positions change",
        ["positions", "count", "max change of x"],
        [
            [f"id == {EDITED_TOKEN}", int(is_edited_BxT.sum()), change_at],
            [f"id != {EDITED_TOKEN}", int((~is_edited_BxT).sum()), change_elsewhere],
        ],
    )
    print(f"changed positions (b, t): {changed}")

    fig, axes = new_figure(1, 1, size=(8.0, 2.4))
    ax = axes[0, 0]
    image = ax.imshow(change_BxT, cmap="Reds", aspect="auto")
    fig.colorbar(image, ax=ax, label="max |Δx|")
    for b, t in OCCURRENCES:
        ax.text(t, b, str(EDITED_TOKEN), ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks([0, 1])
    ax.set_xlabel("position t")
    ax.set_ylabel("batch b")
    ax.set_title(f"Change in x after editing row {EDITED_TOKEN} of W_E (labels: its occurrences)")
    figure = save_figure(fig, outdir, "edit_one_row")

    return dict(
        relabel_max_abs_diff=relabel_diff,
        ids_moved=ids_moved,
        changed_positions=changed,
        occurrences=sorted(OCCURRENCES),
        max_change_elsewhere=change_elsewhere,
        max_change_at_occurrences=change_at,
        row_change=row_change,
        figures=[figure],
    )


def main(argv=None):
    args = make_parser("relabel", __doc__).parse_args(argv)
    run(args.outdir)


if __name__ == "__main__":
    main()
