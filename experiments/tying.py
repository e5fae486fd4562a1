"""Experiment 7: weight tying — what it saves, what the shared table's gradient is, which rows move.

    python -m experiments.tying --outdir results/tying
    python -m experiments.tying --outdir results/tying_gpt2 --pretrained path/to/gpt2

GPT-2 small's token table is 38,597,376 of its 124,439,808 parameters; untying the head adds
that many again. On the mini-GPT, the tied table's gradient equals the sum of its two uses
(measured on an untied twin whose lm_head kernel is the table transposed). "Only the rows of
tokens in the batch are updated" holds for an untied input table under plain SGD (absent rows
move by exactly 0), but not with a tied head (every row gets gradient through the softmax) nor
under AdamW with weight decay (decay moves every row even with zero gradient).
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import numpy as np
import optax

from configs import gpt2_small
from experiments.common import (
    add_pretrained_arg,
    load_pretrained,
    make_parser,
    new_figure,
    print_table,
    save_figure,
)
from minigpt_jax import GPTConfig, count_params, init_params, next_token_losses
from minigpt_jax.config_dict import gpt_config_from

# configs/gpt2_small.py's model, at GPT-2's vocabulary (its data.vocab_size).
_GPT2_SMALL_RUN = gpt2_small.get_config()
GPT2_SMALL = gpt_config_from(_GPT2_SMALL_RUN, _GPT2_SMALL_RUN.data.vocab_size)


def loss_fn(params, tokens_BxT1, cfg: GPTConfig):
    """Mean next-token cross-entropy."""
    return next_token_losses(params, tokens_BxT1, cfg).mean()


def untied_twin(params, cfg: GPTConfig):
    """(cfg, params) of the untied model that computes the same function: lm_head = W_Eᵀ."""
    twin = {**params, "lm_head": {"kernel": params["embed"]["tok"]["embedding"].T}}
    return cfg.replace(tie_embeddings=False), twin


def table_size(cfg: GPTConfig) -> int:
    """V·D of the token table, from shapes alone: its first V rows (the rows from V on pad it to
    cfg.vocab_multiple and are counted apart, by `model.vocab_padding_params`)."""
    shapes = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
    return cfg.vocab_size * shapes["embed"]["tok"]["embedding"].shape[1]


# One compile per model (tied, untied twin) costs less than the backward pass op by op.
grad_fn = jax.jit(jax.grad(loss_fn), static_argnums=2)


def rows_changed(old_VxD, new_VxD) -> int:
    return int(np.any(np.asarray(new_VxD) != np.asarray(old_VxD), axis=1).sum())


def rows_moved(tx: optax.GradientTransformation, table_VxD, grad_VxD) -> int:
    """Rows of the table that one step of `tx` changes.

    SGD and AdamW act on each leaf independently, so stepping the table alone is the same as
    stepping the whole model and looking at the table.
    """
    updates, _ = tx.update(grad_VxD, tx.init(table_VxD), table_VxD)
    return rows_changed(table_VxD, optax.apply_updates(table_VxD, updates))


def run(
    outdir: Path | None = None,
    *,
    cfg: GPTConfig | None = None,
    batch: int = 8,
    length: int = 33,
    id_range: int = 100,
    seed: int = 0,
    params=None,
) -> dict:
    """Parameter counts, the summed gradient, and rows changed by one step per optimizer.

    The batch draws ids from [0, id_range) only, so most of the vocabulary is absent.
    cfg defaults to the mini-GPT with dropout 0; `params` (e.g. GPT-2's, with its cfg) replace
    the fresh init.
    """
    if params is not None and cfg is None:
        raise ValueError("run(params=...) needs the cfg those params belong to.")
    if cfg is not None and not cfg.tie_embeddings:
        raise ValueError("the tying study needs a tied model (tie_embeddings=True).")
    cfg = (cfg or GPTConfig()).replace(dropout=0.0)

    # ---- parameter counts
    counts = {}
    for name, model_cfg in (
        ("GPT-2 small", GPT2_SMALL),
        ("mini-GPT" if params is None else "loaded model", cfg),
    ):
        tied = count_params(model_cfg)
        untied = count_params(model_cfg.replace(tie_embeddings=False))
        counts[name] = dict(table=table_size(model_cfg), tied=tied, untied=untied)
    print_table(
        "parameters (count_params)",
        ["model", "token table V·D", "tied", "untied", "untied - tied", "table share (tied)"],
        [
            [
                name,
                *(c[k] for k in ("table", "tied", "untied")),
                c["untied"] - c["tied"],
                f"{c['table'] / c['tied']:.1%}",
            ]
            for name, c in counts.items()
        ],
    )

    # ---- the shared table's gradient is the sum of both uses
    params = init_params(cfg, jax.random.key(seed)) if params is None else params
    tokens_BxT = np.random.default_rng(seed).integers(0, id_range, (batch, length))
    twin_cfg, twin = untied_twin(params, cfg)
    tied_grad_VxD = np.asarray(grad_fn(params, tokens_BxT, cfg)["embed"]["tok"]["embedding"])
    twin_grads = grad_fn(twin, tokens_BxT, twin_cfg)
    input_grad_VxD = np.asarray(twin_grads["embed"]["tok"]["embedding"])
    head_grad_VxD = np.asarray(twin_grads["lm_head"]["kernel"]).T
    sum_diff = float(np.abs(tied_grad_VxD - (input_grad_VxD + head_grad_VxD)).max())
    print_table(
        "gradient of the loss w.r.t. the token table (untied twin: lm_head kernel = W_Eᵀ)",
        ["", "‖grad‖", "rows with non-zero grad"],
        [
            [name, float(np.linalg.norm(g)), int(np.any(g != 0, axis=1).sum())]
            for name, g in (
                ("input use (twin's embedding)", input_grad_VxD),
                ("output use (twin's lm_head, transposed)", head_grad_VxD),
                ("tied table", tied_grad_VxD),
            )
        ],
    )
    print(f"max |tied grad - (input grad + head grad)| = {sum_diff:.3g}")

    # ---- which rows does one step change?
    present = int(np.unique(tokens_BxT[:, :-1]).size)
    vocab = cfg.vocab_size
    sgd, adamw = optax.sgd(0.1), optax.adamw(1e-3, weight_decay=0.1)
    adam = optax.adamw(1e-3, weight_decay=0.0)
    table_VxD = params["embed"]["tok"]["embedding"]
    cases = {
        # The twin's input table starts equal to the tied table, and its lm_head to the transpose.
        "untied input table, SGD": rows_moved(sgd, table_VxD, input_grad_VxD),
        "untied lm_head (columns), SGD": rows_moved(sgd, table_VxD, head_grad_VxD),
        "tied table, SGD": rows_moved(sgd, table_VxD, tied_grad_VxD),
        "untied input table, AdamW wd=0.1": rows_moved(adamw, table_VxD, input_grad_VxD),
        "untied input table, Adam (wd=0)": rows_moved(adam, table_VxD, input_grad_VxD),
    }
    print_table(
        f"rows of V={vocab} changed by one step; {present} distinct ids in the batch's inputs",
        ["case", "rows changed", "of V"],
        [[name, n, vocab] for name, n in cases.items()],
    )

    fig, axes = new_figure(1, 2, size=(12.0, 4.0))
    ax = axes[0, 0]
    gpt2 = counts["GPT-2 small"]
    labels = ["tied", "untied"]
    rest = gpt2["tied"] - gpt2["table"]
    ax.bar(labels, [rest, rest], label="everything else")
    ax.bar(labels, [gpt2["table"], gpt2["table"]], bottom=[rest, rest], label="token table")
    ax.bar(["untied"], [gpt2["table"]], bottom=[rest + gpt2["table"]], label="lm_head")
    for x, total in enumerate((gpt2["tied"], gpt2["untied"])):
        ax.text(x, total, f"{total:,}", ha="center", va="bottom")
    ax.set_ylabel("parameters")
    ax.set_title("GPT-2 small: tying saves one V×D matrix")
    ax.legend(loc="lower right")
    ax = axes[0, 1]
    ax.barh(list(cases), list(cases.values()))
    ax.axvline(present, color="k", ls="--", label=f"ids in the batch ({present})")
    ax.invert_yaxis()
    ax.set_xlim(0, vocab * 1.05)
    ax.set_xlabel(f"rows changed by one step (V = {vocab})")
    ax.set_title("Which rows move")
    ax.legend(loc="lower right")
    figure = save_figure(fig, outdir, "tying")

    return dict(
        counts=counts,
        grad_sum_max_abs_diff=sum_diff,
        present_ids=present,
        vocab_size=vocab,
        rows_changed=cases,
        figures=[figure],
    )


def main(argv=None):
    args = add_pretrained_arg(make_parser("tying", __doc__)).parse_args(argv)
    if args.pretrained is None:
        run(args.outdir)
    else:
        cfg, params, _ = load_pretrained(args.pretrained)
        run(args.outdir, cfg=cfg, params=params, batch=4, length=17)


if __name__ == "__main__":
    main()
