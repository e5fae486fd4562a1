"""Experiment 3: one SGD step on one embedding row, by hand-sized numbers.

    python -m experiments.one_step --outdir results/one_step

Vocabulary of six words with 6-d vectors (`minigpt_apps.lab.compute`, the lab's table). The
input is "kamienny"; the next token should be "zamek", not "klucz". Two frozen output vectors
turn the input row into two logits; one plain SGD step (lr 0.4, gradient from `jax.grad`, in
`compute.sgd_step`) on the table moves only the "kamienny" row, and takes p(zamek) from 0.470
to 0.610 and the loss from 0.755 to 0.495.

Why: with two logits, g = logit_zamek - logit_klucz = e·Δw with Δw = w_zamek - w_klucz, and
p = σ(g). The loss -log σ(g) has gradient -(1 - p)·Δw with respect to e, so the step adds
lr·(1 - p)·Δw to e and the gap grows by lr·(1 - p)·‖Δw‖². The numbers were solved for: g = -0.12
gives p = 0.470; ‖Δw‖² = 2.67 (Δw = (1.3, -0.7, 0.7, 0, 0, 0)) then gives g' = 0.446, p' = 0.610.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.common import make_parser, new_figure, print_table, save_figure
from minigpt_apps.lab.compute import (
    LEARNING_RATE,
    STEP_INPUT,
    STEP_RIVAL,
    STEP_TARGET,
    VOCAB,
    OUTPUT_WEIGHTS_2xD,
    TABLE_VxD,
    sgd_step,
)


def _vector(row_D) -> str:
    return " ".join(f"{v + 0.0:+.3f}" for v in np.asarray(row_D))  # + 0.0: no "-0.000"


def run(outdir: Path | None = None, *, learning_rate: float = LEARNING_RATE) -> dict:
    """One SGD step on the toy table; returns p, loss and the gap before and after."""
    input_id = VOCAB.index(STEP_INPUT)
    step = sgd_step(TABLE_VxD, OUTPUT_WEIGHTS_2xD, input_id, learning_rate)
    p0, loss0, gap0 = step.p_before, step.loss_before, step.gap_before
    p1, loss1, gap1 = step.p_after, step.loss_after, step.gap_after
    delta_w_D = OUTPUT_WEIGHTS_2xD[0] - OUTPUT_WEIGHTS_2xD[1]
    delta_w_sq = float(np.sum(delta_w_D**2))
    predicted_gap_change = learning_rate * (1 - p0) * delta_w_sq

    print_table(
        f'input "{STEP_INPUT}", target "{STEP_TARGET}" vs "{STEP_RIVAL}", '
        f"one SGD step with lr={learning_rate}",
        ["", f"p({STEP_TARGET})", "loss", "gap g = logit_zamek - logit_klucz"],
        [
            [when, f"{p:.3f}", f"{loss:.3f}", f"{gap:+.4f}"]
            for when, p, loss, gap in (("before", p0, loss0, gap0), ("after", p1, loss1, gap1))
        ],
    )
    print(
        f"\nwhy: dloss/de = -(1 - p)·Δw, so g grows by lr·(1 - p)·‖Δw‖² = "
        f"{learning_rate} · {1 - p0:.4f} · {delta_w_sq:.4f} = {predicted_gap_change:.6f}"
        f"\n     measured g' - g = {gap1 - gap0:.6f}"
        f"\n     jax.grad row of {STEP_INPUT}: {_vector(step.grad_VxD[input_id])}"
        f"\n     -(1 - p)·Δw:            {_vector(-(1 - p0) * delta_w_D)}"
    )

    changed_rows = [VOCAB[i] for i in step.changed_rows]
    print_table(
        "the table before and after the step (only rows with a non-zero gradient can move)",
        ["word", "row before", "row after", "bit-identical"],
        [
            [word, _vector(TABLE_VxD[i]), _vector(step.table_VxD[i]), word not in changed_rows]
            for i, word in enumerate(VOCAB)
        ],
    )

    fig, axes = new_figure(1, 2, size=(9.0, 3.5))
    ax = axes[0, 0]
    x = np.arange(2)
    ax.bar(x - 0.2, [p0, loss0], 0.4, label="before")
    ax.bar(x + 0.2, [p1, loss1], 0.4, label="after one step")
    for xi, (before, after) in enumerate(((p0, p1), (loss0, loss1))):
        ax.text(xi - 0.2, before, f"{before:.3f}", ha="center", va="bottom")
        ax.text(xi + 0.2, after, f"{after:.3f}", ha="center", va="bottom")
    ax.set_xticks(x, [f"p({STEP_TARGET})", "loss"])
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left")
    ax.set_title(f"One SGD step, lr={learning_rate}")
    ax = axes[0, 1]
    change = step.table_VxD - TABLE_VxD
    limit = float(np.abs(change).max())
    image = ax.imshow(change, cmap="RdBu_r", vmin=-limit, vmax=limit)
    fig.colorbar(image, ax=ax)
    ax.set_yticks(range(len(VOCAB)), VOCAB)
    ax.set_xlabel("dimension")
    ax.set_title("Change of the embedding table")
    figure = save_figure(fig, outdir, "one_step")

    return dict(
        p_before=p0,
        p_after=p1,
        loss_before=loss0,
        loss_after=loss1,
        gap_before=gap0,
        gap_after=gap1,
        predicted_gap_change=predicted_gap_change,
        changed_rows=changed_rows,
        figures=[figure],
    )


def main(argv=None):
    parser = make_parser("one_step", __doc__)
    parser.add_argument("--learning-rate", type=float, default=LEARNING_RATE)
    args = parser.parse_args(argv)
    run(args.outdir, learning_rate=args.learning_rate)


if __name__ == "__main__":
    main()
