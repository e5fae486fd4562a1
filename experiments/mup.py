"""μP's two checks on a 2-layer, 4-head byte-level GPT on CPython's documentation topics:

    python -m experiments.mup --outdir results/mup                 # the coordinate check
    python -m experiments.mup --outdir results/mup --transfer      # and the lr transfer check

The coordinate check (`minigpt_apps.scale.coord_check`): 4 AdamW updates at lr 1e-2 at widths
64–512 (base width 64), mean |x| of the embedding's output, each block's output and the logits,
with the log-log slope against the width per layer: flat under μP, growing under the standard
parametrization. The transfer check (`minigpt_apps.scale.lr_transfer`): a sweep of learning
rates at widths 32 and 128 (base width 32), 3 paired seeds, the verdict of its module's rule.
"""

from __future__ import annotations

from experiments.common import make_parser, new_figure, print_table, save_figure
from minigpt_apps.scale.coord_check import CoordCheck, coord_check
from minigpt_apps.scale.lr_transfer import Transfer, lr_transfer
from minigpt_apps.scale.width_runs import Family

TRANSFER_FAMILY = Family(base_width=32)


def plot_coord_check(check: CoordCheck, outdir):
    """One panel per parametrization: mean |x| after the last step against the width, log-log,
    one line per layer."""
    fig, axes = new_figure(1, len(check.scales), size=(5.0 * len(check.scales), 4.0))
    for ax, (name, by_layer) in zip(axes[0], check.scales.items(), strict=True):
        for layer, values in by_layer.items():
            slope = check.slopes[name][layer]
            ax.plot(check.widths, values[-1], marker="o", label=f"{layer} (slope {slope:+.2f})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("width (n_embd)")
        ax.set_ylabel(f"mean |x| after {check.steps} steps")
        ax.set_title(f"{name}, AdamW lr {check.lr:g}")
        ax.legend(fontsize=8)
    return save_figure(fig, outdir, "mup_coord_check")


def plot_transfer(result: Transfer, outdir):
    """One panel per parametrization: the seed-mean loss against the learning rate, per width."""
    fig, axes = new_figure(1, len(result.losses), size=(5.0 * len(result.losses), 4.0))
    for ax, (name, by_width) in zip(axes[0], result.losses.items(), strict=True):
        for width, losses_SxR in by_width.items():
            ax.plot(result.lrs, losses_SxR.mean(axis=0), marker="o", label=f"width {width}")
        verdict = result.verdicts[name]
        words = "transfers" if verdict.transfers else "does not transfer"
        ax.set_xscale("log", base=2)
        ax.set_xlabel("learning rate")
        ax.set_ylabel(f"train loss, last steps of {result.steps} (mean of {len(result.seeds)})")
        ax.set_title(f"{name}: {words} (shift {verdict.shift_log2:+.0f} in log2)")
        ax.legend(fontsize=8)
    return save_figure(fig, outdir, "mup_lr_transfer")


def run(outdir=None, *, transfer: bool = False) -> dict:
    check = coord_check()
    print_table(
        f"mean |x| after {check.steps} AdamW steps at lr {check.lr:g}, and its log-log slope",
        ["parametrization", "layer", *(f"D={w}" for w in check.widths), "slope"],
        check.table(),
    )
    figures = [plot_coord_check(check, outdir)]
    result = {"coord_check": check}
    if transfer:
        sweep = lr_transfer(32, family=TRANSFER_FAMILY)
        rows = [
            [
                name,
                *(v.best_lr[w] for w in sweep.widths),
                v.shift_log2,
                v.penalty.mean_diff,
                v.penalty.ci_low,
                v.penalty.ci_high,
                v.transfers,
            ]
            for name, v in sweep.verdicts.items()
        ]
        print_table(
            f"best learning rate at widths {sweep.widths} over seeds {list(sweep.seeds)}",
            ["parametrization", *(f"best D={w}" for w in sweep.widths), "shift log2",
             "penalty", "95% low", "95% high", "transfers"],
            rows,
        )  # fmt: skip
        figures.append(plot_transfer(sweep, outdir))
        result["transfer"] = sweep
    result["figures"] = [path for path in figures if path is not None]
    return result


def main() -> None:
    parser = make_parser("mup", __doc__)
    parser.add_argument("--transfer", action="store_true", help="also the lr transfer check")
    args = parser.parse_args()
    run(args.outdir, transfer=args.transfer)


if __name__ == "__main__":
    main()
