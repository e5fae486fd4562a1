"""Experiment 4: the same token gets a different vector once attention mixes in its context.

    python -m experiments.context --outdir results/context

"oto kamienny zamek" vs "oto metalowy zamek" on the six-word toy table (`minigpt_apps.lab.compute`)
with sinusoidal positions: at "zamek" the input (embedding + position) is identical in both
sentences. One causal attention head with identity Q, K, V projections gives different outputs
there, because "zamek" attends to "kamienny" in one and to "metalowy" in the other. With the
same sentence twice, the outputs are identical again. Heatmaps of the attention weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.common import make_parser, new_figure, print_table, save_figure
from minigpt_apps.lab.compute import SENTENCES, VOCAB, TABLE_VxD, one_head, parse_sentence


def _one_head(sentence: str):
    """(inputs_TxD, weights_TxT, outputs_TxD) of the lab's identity-QKV causal head."""
    return one_head(TABLE_VxD, parse_sentence(sentence, VOCAB))


def run(outdir: Path | None = None, *, sentences: tuple[str, str] = SENTENCES) -> dict:
    """Inputs and outputs at the last word of two sentences, and the attention weights."""
    (x_a, w_a, out_a), (x_b, w_b, out_b) = (_one_head(s) for s in sentences)
    _, _, out_same = _one_head(sentences[0])
    last = len(sentences[0].split()) - 1
    word = sentences[0].split()[last]
    input_diff = float(np.abs(x_a[last] - x_b[last]).max())
    output_diff = float(np.abs(out_a[last] - out_b[last]).max())
    same_diff = float(np.abs(out_a - out_same).max())

    for sentence, weights in zip(sentences, (w_a, w_b), strict=True):
        words = sentence.split()
        print_table(
            f'attention weights, "{sentence}" (row: query, column: key; causal)',
            ["query", *words],
            [[q, *(f"{float(v):.3f}" for v in weights[i])] for i, q in enumerate(words)],
        )
    print_table(
        f'at "{word}" (position {last}): max |difference| between the two sentences',
        ["compared", "max abs diff"],
        [
            ["input x = embedding + sinusoidal position", input_diff],
            ["attention output (identity Q, K, V)", output_diff],
            ["attention output, same sentence twice", same_diff],
        ],
    )

    fig, axes = new_figure(1, 2, size=(8.0, 3.6))
    for ax, sentence, weights in zip(axes[0], sentences, (w_a, w_b), strict=True):
        words = sentence.split()
        ax.imshow(np.asarray(weights), cmap="Blues", vmin=0, vmax=1)
        for i in range(len(words)):
            for j in range(len(words)):
                ax.text(j, i, f"{float(weights[i, j]):.2f}", ha="center", va="center")
        ax.set_xticks(range(len(words)), words)
        ax.set_yticks(range(len(words)), words)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
        ax.set_title(f'"{sentence}"')
    fig.suptitle(f'Causal attention, Q = K = V = embedding + position; "{word}" row differs')
    figure = save_figure(fig, outdir, "attention_weights")

    return dict(
        input_diff=input_diff,
        output_diff=output_diff,
        same_sentence_diff=same_diff,
        weights=(np.asarray(w_a), np.asarray(w_b)),
        vocab=VOCAB,
        figures=[figure],
    )


def main(argv=None):
    args = make_parser("context", __doc__).parse_args(argv)
    run(args.outdir)


if __name__ == "__main__":
    main()
