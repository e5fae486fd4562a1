"""The worked scaling study: a CPU-sized IsoFLOP grid on the embedded corpus (CPython's docs,
characters), fitted, with a run 4× the largest budget predicted and checked.

    python -m experiments.scaling                       # the grid and its estimated time only
    python -m experiments.scaling --run --workers 2     # train it (about an hour on 2 idle cores)

It is `minigpt-jax scale` with the arguments below (STUDY); --run drops --dry_run and adds
--check, and any other argument passes through (e.g. --out, --workers, --gflops). The study:
3 budgets × the ladder L = 1..6 (width 16·L, heads of 16: 5 thousand to 0.7 million weights),
each run at least 50 and at most 40,000 steps of 16 × 64 tokens (so the smallest model drops out
of the largest budget), dropout off, a cosine schedule as long as each run. Trained once (13.5 min
on the 2-core Intel Xeon with AMX): two of the three budgets have a minimum inside the ladder,
the fit needs three, so N_opt(C) and L(N, D) are not identified yet (experiments/README.md §15).
"""

from __future__ import annotations

import sys

from minigpt_apps.scale.command import main as scale

OUT = "results/scaling"
STUDY = [
    "--config", "configs/default.py",
    "--set", "data.tokenizer=char",
    "--set", "model.dropout=0.0",
    "--budgets", "5e11,1.5e12,4.5e12",
    "--depths", "1,2,3,4,5,6",
    "--aspect", "16",
    "--head_dim", "16",
    "--min_steps", "50",
    "--max_steps", "40000",
    "--schedule", "cosine",
    "--predict", "4",
]  # fmt: skip


def arguments(argv: list[str]) -> list[str]:
    """The scale command of the study: --run trains it (with --check), else a dry run."""
    rest = [a for a in argv if a != "--run"]
    mode = ["--check"] if "--run" in argv else ["--dry_run"]
    out = [] if any(a == "--out" or a.startswith("--out=") for a in rest) else ["--out", OUT]
    return [*STUDY, *out, *mode, *rest]


def main(argv: list[str] | None = None) -> int:
    return scale(arguments(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
