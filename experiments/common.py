"""Helpers shared by the experiments: command line, result tables, figures, timing.

The six-word toy table of `one_step` and `context` lives in `minigpt_apps.lab.compute`, which the
lab page shares.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")  # figures are only ever written to files

from matplotlib.figure import Figure  # noqa: E402

# The figures committed under experiments/figures/ stay small at this resolution.
FIGURE_DPI = 100

# ----------------------------------------------------------------------------- command line


def make_parser(name: str, description: str | None) -> argparse.ArgumentParser:
    """A parser with `--outdir`, defaulting to results/NAME."""
    parser = argparse.ArgumentParser(
        prog=f"python -m experiments.{name}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--outdir", type=Path, default=Path("results") / name, help="where figures go"
    )
    return parser


def add_pretrained_arg(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds `--pretrained DIR`: study a Hugging Face GPT-2 checkpoint's own weights."""
    parser.add_argument(
        "--pretrained",
        type=Path,
        default=None,
        help="a Hugging Face GPT-2 directory (config.json, model.safetensors, tokenizer files) "
        "or a run directory whose weights to study",
    )
    return parser


def load_pretrained(path: str | Path):
    """`minigpt_jax.model_files.load_model(path)`, with a line saying what was loaded."""
    from minigpt_jax.model_files import load_model

    model = load_model(path)
    cfg = model.cfg
    print(
        f"loaded {path}: V={cfg.vocab_size:,}, D={cfg.n_embd}, block_size={cfg.block_size}, "
        f"{cfg.n_layer} layers, {cfg.n_head} heads"
    )
    return model


# ----------------------------------------------------------------------------- tables


def _cell(value: Any) -> str:
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, int | np.integer):
        return f"{int(value):,}"
    if isinstance(value, float | np.floating):
        return f"{float(value):.4g}"
    return str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table: left-aligned text, right-aligned numbers."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    numeric = [
        all(isinstance(row[i], int | float | np.number) for row in rows)
        for i in range(len(headers))
    ]

    def line(values):
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in cells)])


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    print(f"\n{title}\n{format_table(headers, rows)}")


# ----------------------------------------------------------------------------- figures


def new_figure(nrows: int = 1, ncols: int = 1, *, size: tuple[float, float] = (6.0, 4.0)):
    """(figure, axes) without pyplot's global state."""
    fig = Figure(figsize=size, layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def save_figure(fig: Figure, outdir: Path | None, name: str) -> Path | None:
    """Write outdir/name.png (nothing when outdir is None) and return its path."""
    if outdir is None:
        return None
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / f"{name}.png"
    fig.savefig(path, dpi=FIGURE_DPI)
    print(f"saved {path}")
    return path
