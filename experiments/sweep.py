"""A sweep over config values: a grid, or a random sample of it, one run after another,
resumable, with every result in one table (JSON lines and CSV) and a plot.

    python -m experiments.sweep --config configs/speedrun_char.py --out results/sweep_lr \
        --grid optim.lr=0.004,0.008,0.016 --grid optim.muon_lr=0.02,0.04 \
        [--random 4 --seed 0] [--set num_steps=400] [--target 1.88]

Each trial is `train_and_evaluate` of the config with its values, in OUT/trials/<name>/ (a run
directory: an interrupted sweep reruns the same command and resumes the trial in flight from
its checkpoint, and skips the trials already in OUT/results.jsonl). A trial records its final
and best val loss, its wall time, and the step of its first evaluation at or below --target.
Values are Python literals (1e-3, True, 'rope'); anything else is a string.
"""

from __future__ import annotations

import argparse
import ast
import csv
import itertools
import json
import random
from pathlib import Path
from typing import Any

from minigpt_jax.train.metrics import read_metrics


def parse_values(text: str) -> tuple[str, list[Any]]:
    """'optim.lr=1e-3,2e-3' -> ('optim.lr', [0.001, 0.002])."""
    key, sep, values = text.partition("=")
    if not sep or not key or not values:
        raise ValueError(f"{text!r}: write key=value[,value...], e.g. optim.lr=1e-3,2e-3.")
    return key.strip(), [_literal(v.strip()) for v in values.split(",")]


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def trials(grid: dict[str, list[Any]], sample: int | None, seed: int) -> list[dict[str, Any]]:
    """Every combination of the grid, or `sample` distinct ones drawn with `seed`."""
    combos = [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]
    if sample is not None and sample < len(combos):
        combos = random.Random(seed).sample(combos, sample)
    return combos


def trial_name(values: dict[str, Any]) -> str:
    return "_".join(f"{k.rpartition('.')[2]}={v}" for k, v in values.items()) or "base"


def apply(config, values: dict[str, Any]):
    """config with each dotted key set (an unknown key is the config's own error)."""
    for dotted, value in values.items():
        group, _, key = dotted.rpartition(".")
        node = config[group] if group else config
        if key not in node:
            raise ValueError(f"unknown config key config.{dotted}.")
        node[key] = value
    return config


def run_trial(config_path: str, base: dict, values: dict, workdir: Path, target) -> dict:
    from minigpt_jax.run_config import load_config_file
    from minigpt_jax.train.loop import train_and_evaluate

    config = apply(apply(load_config_file(config_path), base), values)
    summary = train_and_evaluate(config, workdir, progress=False)
    if summary.interrupted_by:  # saved, not finished: the rerun resumes it, nothing recorded
        raise SystemExit(
            f"{summary.interrupted_by}: trial {trial_name(values)} stopped at step "
            f"{summary.step} with a checkpoint; rerun the same command to resume the sweep."
        )
    evals = [(r["step"], r["val_loss"]) for r in read_metrics(workdir) if "val_loss" in r]
    hit = next((step for step, loss in evals if target is not None and loss <= target), None)
    return {
        "trial": trial_name(values),
        **values,
        "val_loss": summary.val_loss,
        "best_val_loss": summary.best_val_loss,
        "wall_s": round(summary.wall_time_s, 2),
        "median_step_ms": summary.median_step_ms,
        "steps_to_target": hit,
        "evals": evals,
    }


def read_results(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_table(results: list[dict], keys: list[str], out: Path) -> list[str]:
    """OUT/results.csv and the printed table, best val loss first."""
    columns = ["trial", *keys, "val_loss", "best_val_loss", "steps_to_target", "wall_s"]
    rows = sorted(results, key=lambda r: r["best_val_loss"] or float("inf"))
    with open(out / "results.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    lines = ["  ".join(f"{c:>14}" for c in columns[1:])]
    for row in rows:
        lines.append("  ".join(f"{_cell(row.get(c)):>14}" for c in columns[1:]))
    return lines


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def plot(results: list[dict], keys: list[str], path: Path) -> None:
    """Best val loss against each swept value (one panel a key)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, max(len(keys), 1), figsize=(4 * max(len(keys), 1), 3.2))
    axes = [axes] if len(keys) <= 1 else list(axes)
    for axis, key in zip(axes, keys, strict=False):
        values = [r[key] for r in results]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        positions = (
            values if numeric else [sorted(map(str, set(values))).index(str(v)) for v in values]
        )
        axis.scatter(positions, [r["best_val_loss"] for r in results])
        if numeric and min(values) > 0 and max(values) / min(values) > 10:
            axis.set_xscale("log")
        if not numeric:
            axis.set_xticks(range(len(set(values))), sorted(map(str, set(values))))
        axis.set(xlabel=key, ylabel="best val loss")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="config file, e.g. configs/tiny.py")
    parser.add_argument("--out", required=True, help="sweep folder: trials/, results.*")
    parser.add_argument("--grid", action="append", default=[], help="key=v1,v2,... (repeat)")
    parser.add_argument("--set", action="append", default=[], help="key=value for every trial")
    parser.add_argument("--random", type=int, default=None, help="sample this many combinations")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random sample")
    parser.add_argument("--target", type=float, default=None, help="val loss to time trials to")
    args = parser.parse_args(argv)

    grid = dict(parse_values(g) for g in args.grid)
    base = {k: v[0] for k, v in (parse_values(s) for s in args.set)}
    out = Path(args.out)
    (out / "trials").mkdir(parents=True, exist_ok=True)
    results_path = out / "results.jsonl"
    done = {r["trial"] for r in read_results(results_path)}
    todo = trials(grid, args.random, args.seed)
    for index, values in enumerate(todo, start=1):
        name = trial_name(values)
        if name in done:
            print(f"[{index}/{len(todo)}] {name}: done before, skipped")
            continue
        result = run_trial(args.config, base, values, out / "trials" / name, args.target)
        with open(results_path, "a") as file:
            file.write(json.dumps(result) + "\n")
        print(
            f"[{index}/{len(todo)}] {name}: val {_cell(result['val_loss'])}, best "
            f"{_cell(result['best_val_loss'])}, {result['wall_s']:.1f} s"
            + (f", target at step {result['steps_to_target']}" if args.target else ""),
            flush=True,
        )
    results = [r for r in read_results(results_path) if r["trial"] in map(trial_name, todo)]
    for line in write_table(results, list(grid), out):
        print(line)
    plot(results, list(grid), out / "results.png")
    print(f"wrote {out / 'results.jsonl'}, {out / 'results.csv'}, {out / 'results.png'}")


if __name__ == "__main__":
    main()
