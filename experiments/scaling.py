"""The worked scaling study: a CPU-sized IsoFLOP grid on a corpus larger than its runs read
(CPython's standard library source, characters), fitted, with a run 2× the largest budget
predicted and checked.

    python -m experiments.scaling                       # the grid and its estimated time only
    python -m experiments.scaling --run --workers 2     # train it (see experiments/README.md §15)

It is `minigpt-jax scale` with the arguments below (STUDY); --run drops --dry_run and adds
--check, and any other argument passes through (e.g. --out, --workers, --gflops). The study:
3 budgets (1e12, 3e12, 9e12 FLOPs) × 11 shapes L×D, heads of 16, 10 thousand to 0.4 million
weights, spaced about ×1.3 to ×2 in N around the minima a first grid found (every depth 1..5 at
width 16·L, and the shapes between them); each run at least 50 and at most 40,000 steps of
16 × 64 tokens (so the smallest models drop out of the largest budget), dropout off, a cosine
schedule as long as each run. The check trains the predicted size at 2× the largest budget.

The corpus is the standard library's .py files of the Python that runs this, in sorted order
(`stdlib_corpus`, about 31 million characters for 3.11: its sha256 is in each run's data
digest), so the runs, which read up to 36 million tokens, see their training text about once.
The package's embedded corpus (465 thousand characters) would be read up to 85 times: a first
study on it measured repetition, not scale (experiments/README.md §15).
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from minigpt_apps.scale.command import main as scale

OUT = "results/scaling_stdlib"
CORPUS = Path("results/stdlib_corpus.txt")
STUDY = [
    "--config", "configs/default.py",
    "--set", "data.tokenizer=char",
    "--set", "data.corpus=text",
    "--set", f"data.path={CORPUS}",
    "--set", "model.dropout=0.0",
    "--budgets", "1e12,3e12,9e12",
    "--sizes", "1x16,2x16,1x32,2x32,3x32,2x48,3x48,4x48,3x64,4x64,5x80",
    "--head_dim", "16",
    "--min_steps", "50",
    "--max_steps", "40000",
    "--schedule", "cosine",
    "--predict", "2",
]  # fmt: skip


def stdlib_corpus(path: Path = CORPUS) -> Path:
    """Writes the standard library's .py files (site-packages left out), sorted by path, one
    after another, as `path` (once: an existing file is kept)."""
    if path.exists():
        return path
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    with part.open("w", encoding="utf-8") as out:
        for file in files:
            out.write(file.read_text(encoding="utf-8", errors="replace"))
    part.replace(path)
    return path


def arguments(argv: list[str]) -> list[str]:
    """The scale command of the study: --run trains it (with --check), else a dry run."""
    rest = [a for a in argv if a != "--run"]
    mode = ["--check"] if "--run" in argv else ["--dry_run"]
    out = [] if any(a == "--out" or a.startswith("--out=") for a in rest) else ["--out", OUT]
    return [*STUDY, *out, *mode, *rest]


def main(argv: list[str] | None = None) -> int:
    stdlib_corpus()
    return scale(arguments(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
