"""What each trick of configs/speedrun_char.py is worth on the course's CPU track: the speedrun
with each trick removed in turn, and the course config with each added in turn.

    python -m experiments.speedrun_ablation [--target 1.88] [--out results/ablation]

Every variant trains in a fresh process and is evaluated on the whole validation split every
--eval_every steps with the clock paused (benchmarks/time_to_loss.py's worker and function),
and stops at its first evaluation at or below --target (default: 1.88, about the PyTorch
twin's final val loss on nanoGPT's recipe; benchmarks/time_to_loss.py measures it). The table
gives the wall seconds (process start, compile included) and steps to the target; a variant
that does not reach it within its config's num_steps says so. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from benchmarks.time_to_loss import REPO, first_at_or_below, run_contestant

# Each trick: its name, the settings that undo it in the speedrun, and the settings that add
# it to the course config.
TRICKS: list[tuple[str, dict, dict]] = [
    (
        "Muon (blocks' matrices)",
        {"optim.name": "adamw"},
        {"optim.name": "muon", "optim.muon_lr": 0.04},
    ),
    (
        "WSD schedule",
        {"optim.schedule": "cosine", "optim.min_lr": 0.0008},
        {"optim.schedule": "wsd", "optim.decay_fraction": 0.4},
    ),
    ("QK-norm", {"model.qk_norm": False}, {"model.qk_norm": True}),
    ("RMSNorm", {"model.norm": "layernorm"}, {"model.norm": "rmsnorm"}),
    ("ReLU²", {"model.activation": "gelu"}, {"model.activation": "relu2"}),
    ("zero-init projections", {"model.zero_init_proj": False}, {"model.zero_init_proj": True}),
    ("logit soft-cap", {"model.logit_softcap": 0.0}, {"model.logit_softcap": 15.0}),
    ("RoPE", {"model.pos_encoding": "learned"}, {"model.pos_encoding": "rope"}),
    ("untied head", {"model.tie_embeddings": True}, {"model.tie_embeddings": False}),
    ("no biases", {"model.use_bias": True}, {"model.use_bias": False}),
]


def run(name: str, overrides: dict, args) -> dict:
    records = run_contestant(name, args.data_dir, args.eval_every, overrides, args.target)
    hit = first_at_or_below(records, args.target)
    return {
        "config": name,
        "overrides": overrides,
        "seconds": hit["seconds"] if hit else None,
        "steps": hit["step"] if hit else None,
        "last_step": records[-1]["step"],
        "last_val_loss": records[-1]["val_loss"],
        "records": records,
    }


def table(rows: list[tuple[str, dict]], reference: dict) -> list[str]:
    lines = [
        "| variant | s to target | steps | x reference s |",
        "|---|---:|---:|---:|",
    ]
    for label, result in rows:
        if result["seconds"] is None:
            lines.append(
                f"| {label} | not reached ({result['last_val_loss']:.3f} at step "
                f"{result['last_step']}) | | |"
            )
            continue
        ratio = result["seconds"] / reference["seconds"] if reference["seconds"] else float("nan")
        lines.append(f"| {label} | {result['seconds']:.1f} | {result['steps']} | {ratio:.2f} |")
    return lines


def figure(panels: list[tuple[str, list]], target: float, path: Path) -> None:
    """One panel per ablation: each variant's val loss at its last evaluation (where it reached
    the target, or at the end of its budget), the target as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for axis, (title, rows) in zip(axes[0], panels, strict=True):
        losses = [r["last_val_loss"] for _, r in rows]
        colors = ["tab:blue" if r["seconds"] is not None else "tab:red" for _, r in rows]
        axis.barh(range(len(rows)), losses, color=colors)
        axis.axvline(target, color="black", linestyle="--", linewidth=0.8)
        axis.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
        axis.invert_yaxis()
        axis.set_xlim(min(losses) - 0.05, max(losses) + 0.05)
        axis.set(
            xlabel=f"val loss at the last evaluation (blue: reached {target:.4f})", title=title
        )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def one_trick_at_a_time(contestant: str, base_label: str, args, *, remove: bool) -> list:
    """[(label, result)]: `contestant` as it is, then with each trick of TRICKS on its own
    undone (remove: the speedrun) or added (the course config)."""
    rows = [(base_label, run(contestant, {}, args))]
    for label, undo, add in TRICKS:
        sign, changes = ("−", undo) if remove else ("+", add)
        rows.append((f"{sign} {label}", run(contestant, changes, args)))
        print(rows[-1][0], rows[-1][1]["seconds"], rows[-1][1]["steps"], flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data_dir",
        default=os.environ.get("MINIGPT_JAX_DATA", str(REPO.parent / "shared" / "data")),
    )
    parser.add_argument("--target", type=float, default=1.88)
    parser.add_argument("--eval_every", type=int, default=50)
    parser.add_argument("--out", default="results/ablation")
    parser.add_argument("--skip_added", action="store_true", help="only remove tricks")
    parser.add_argument("--skip_removed", action="store_true", help="only add tricks")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    removed, added, lines = [], [], []
    if not args.skip_removed:
        removed = one_trick_at_a_time("speedrun", "speedrun (all tricks)", args, remove=True)
        lines = ["Removing one trick from the speedrun:", *table(removed, removed[0][1])]
    if not args.skip_added:
        added = one_trick_at_a_time("course", "course config", args, remove=False)
        lines += ["", "Adding one trick to the course config:", *table(added, added[0][1])]
    for line in lines:
        print(line)
    (out / "ablation.md").write_text("\n".join(lines) + "\n")
    (out / "ablation.json").write_text(json.dumps({"removed": removed, "added": added}))
    panels = [("speedrun minus one trick", removed)] if removed else []
    if added:
        panels.append(("course config plus one trick", added))
    figure(panels, args.target, out / "ablation.png")
    print(f"wrote {out / 'ablation.md'}, {out / 'ablation.png'}")


if __name__ == "__main__":
    main()
