"""Time to a target validation loss: the PyTorch twin on nanoGPT's CPU recipe, the course
config and the speedrun config, side by side in one run.

    python -m benchmarks.time_to_loss                       # all three, one round
    python -m benchmarks.time_to_loss --rounds 2 --plot results/time_to_loss.png

The track (configs/speedrun_char.py states the rules): Tiny Shakespeare, character level, the
first 90% of the tokens for training and the last 10% for validation, context 64, CPU, one
process. Each contestant trains in a fresh subprocess (its clock starts when the process does,
so imports, data and compilation count) and is evaluated every --eval_every steps on the whole
validation split, with the clock paused: non-overlapping windows of 64 tokens, every position
scored, by one JAX function for all three (the twin's weights are read into the JAX layout).
The target is the twin's final val loss; for each contestant the table gives the wall seconds,
steps and tokens to its first evaluation at or below it, and the ratio to the twin's seconds.
Once the twin has run (it runs first in the first round), the project's configs are also
evaluated after every chunk of steps_per_call steps as soon as their val loss is within --near
nats of the target, so their crossing is timed to the chunk rather than to --eval_every (the
twin's time is to its final step, as nanoGPT's recipe ends there: its final loss is the target).
Contestants run one after another (rounds alternate the order), never beside each other:
run it alone on the machine, as every framework comparison here. Every contestant compiles from
a cold cache: JAX's persistent compilation cache, which `minigpt-jax train` turns on, is off in
the workers (MINIGPT_JAX_COMPILATION_CACHE=off), so compilation counts in full every time.
"""

from __future__ import annotations

import time

PROCESS_START = time.perf_counter()  # before the heavy imports: they count

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONTESTANTS = ("twin", "course", "speedrun")
CONFIGS = {
    "twin": "configs/shakespeare_char.py:nanogpt",
    "course": "configs/shakespeare_char.py",
    "speedrun": "configs/speedrun_char.py",
}


# ----------------------------------------------------------------------------- evaluation


def make_val_loss(cfg, val_tokens):
    """(params -> mean next-token loss over every position of the validation split), cut into
    non-overlapping windows of block_size (+1 for the last target); the same for everyone."""
    import jax
    import numpy as np

    from minigpt_jax.model.gpt import next_token_losses

    length = cfg.block_size
    count = (len(val_tokens) - 1) // length
    windows_NxT1 = np.stack(
        [np.asarray(val_tokens[i * length : i * length + length + 1]) for i in range(count)]
    ).astype(np.int32)
    batches = np.array_split(windows_NxT1, max(1, count // 256))

    @jax.jit
    def loss_sum(params, batch_BxT1):
        return next_token_losses(params, batch_BxT1, cfg).sum()

    def val_loss(params) -> float:
        total = sum(float(loss_sum(params, batch)) for batch in batches)
        return total / (count * length)

    return val_loss


# ----------------------------------------------------------------------------- workers


class Clock:
    """Seconds since the process started, with evaluation time taken out."""

    def __init__(self):
        self.paused = 0.0

    def now(self) -> float:
        return time.perf_counter() - PROCESS_START - self.paused

    def pause(self):
        return _Paused(self)


class _Paused:
    def __init__(self, clock: Clock):
        self.clock = clock

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self.clock.paused += time.perf_counter() - self.start


def _load(name: str, data_dir: str, overrides: dict | None = None):
    from minigpt_jax.config_dict import check_experiment_config, load_config_file
    from minigpt_jax.data.formats import dataset_from

    config = load_config_file(str(REPO / CONFIGS[name]))
    for dotted, value in (overrides or {}).items():
        group, _, key = dotted.rpartition(".")
        (config[group] if group else config)[key] = value
    config = check_experiment_config(config)
    config.data.path = str(Path(data_dir) / "tinyshakespeare.txt")
    workdir = Path(tempfile.mkdtemp(prefix=f"ttl_{name}_"))
    return config, dataset_from(config, workdir)


def run_jax(
    name: str, data_dir: str, eval_every: int, overrides=None, stop_below=None, fine_below=None
) -> list[dict]:
    """Trains config `name` (with `overrides`, {dotted key: value}) with the project's compiled
    chunks; evaluates every eval_every steps, and after every chunk once an evaluation has read
    at most fine_below (near the target: the crossing is then timed to the chunk); stops early
    once val loss <= stop_below."""
    import jax
    import numpy as np

    from minigpt_jax.config_dict import gpt_config_from
    from minigpt_jax.data.dataset import get_batch
    from minigpt_jax.model.loss_terms import parse_terms
    from minigpt_jax.optimizers import make_optimizer
    from minigpt_jax.train.step import init_state, make_train_chunk

    clock = Clock()
    config, dataset = _load(name, data_dir, overrides)
    cfg = gpt_config_from(config, dataset.tokenizer.vocab_size)
    tx, schedule = make_optimizer(config.optim, config.num_steps)
    chunk = config.steps_per_call
    train_chunk = make_train_chunk(
        cfg,
        tx,
        schedule,
        grad_accum_steps=config.grad_accum_steps,
        terms=parse_terms(config.loss.terms),
    )
    state = jax.jit(lambda rng: init_state(cfg, tx, rng))(jax.random.key(config.seed))
    with clock.pause():
        val_loss = make_val_loss(cfg.replace(dropout=0.0), dataset.val)
    records, fine = [], False

    def batches(first):
        return np.stack(
            [
                get_batch(
                    dataset.train, config.batch_size, cfg.block_size, seed=config.seed, step=s
                )
                for s in range(first, first + chunk)
            ]
        )

    for first in range(0, config.num_steps, chunk):
        state, metrics = train_chunk(state, batches(first))
        step = first + chunk
        if fine or step % eval_every == 0 or step == config.num_steps:
            jax.block_until_ready(state)
            seconds = clock.now()
            with clock.pause():
                loss = val_loss(state.params)
            records.append(_record(step, config, seconds, loss, float(metrics["loss"][-1])))
            fine = fine or (fine_below is not None and loss <= fine_below)
            if stop_below is not None and loss <= stop_below:
                break
    return records


def run_twin(name: str, data_dir: str, eval_every: int) -> list[dict]:
    """nanoGPT's CPU recipe on the project's PyTorch twin (benchmarks/torch_reference.py)."""
    import torch

    from benchmarks.torch_reference import (
        TorchGPT,
        jax_params_from_torch,
        make_torch_optimizer,
        torch_train_step,
    )
    from minigpt_jax.config_dict import gpt_config_from
    from minigpt_jax.data.dataset import get_batch

    clock = Clock()
    torch.manual_seed(0)
    config, dataset = _load(name, data_dir)
    cfg = gpt_config_from(config, dataset.tokenizer.vocab_size)
    model = TorchGPT(cfg)
    model.train()
    optimizer, scheduler = make_torch_optimizer(model, config.optim, config.num_steps)
    with clock.pause():
        val_loss = make_val_loss(cfg, dataset.val)
    records = []
    for step in range(1, config.num_steps + 1):
        batch = torch.from_numpy(
            get_batch(
                dataset.train, config.batch_size, cfg.block_size, seed=config.seed, step=step - 1
            ).astype("int64")
        )
        loss = torch_train_step(
            model,
            optimizer,
            batch[:, :-1],
            batch[:, 1:],
            scheduler=scheduler,
            grad_clip=config.optim.grad_clip,
        )
        if step % eval_every == 0 or step == config.num_steps:
            seconds = clock.now()
            with clock.pause():
                value = val_loss(jax_params_from_torch(model))
            records.append(_record(step, config, seconds, value, loss))
    return records


def _record(step, config, seconds, val_loss, train_loss) -> dict:
    return {
        "step": step,
        "tokens": step * config.batch_size * config.model.block_size,
        "seconds": round(seconds, 3),
        "val_loss": val_loss,
        "train_loss": train_loss,
    }


# ----------------------------------------------------------------------------- driver


def run_contestant(
    name: str, data_dir: str, eval_every: int, overrides=None, stop_below=None, fine_below=None
) -> list[dict]:
    """One contestant in a fresh process: its records (its clock starts with that process);
    `overrides` ({dotted key: value}), `stop_below` and `fine_below` as for `run_jax`."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        path = out.name
    command = [
        sys.executable, "-m", "benchmarks.time_to_loss", "--worker", name,
        "--data_dir", data_dir, "--eval_every", str(eval_every), "--out", path,
        "--overrides", json.dumps(overrides or {}),
    ]  # fmt: skip
    if stop_below is not None:
        command += ["--stop_below", str(stop_below)]
    if fine_below is not None:
        command += ["--fine_below", str(fine_below)]
    cold = {**os.environ, "MINIGPT_JAX_COMPILATION_CACHE": "off"}  # compilation counts in full
    cold.pop("JAX_COMPILATION_CACHE_DIR", None)
    subprocess.run(command, check=True, cwd=REPO, env=cold)
    records = json.loads(Path(path).read_text())
    os.unlink(path)
    return records


def first_at_or_below(records: list[dict], target: float) -> dict | None:
    return next((r for r in records if r["val_loss"] <= target), None)


def report(runs: dict[str, list[list[dict]]]) -> list[str]:
    """The table: per contestant the median over rounds of seconds to the target."""
    target = statistics.median(rounds[-1]["val_loss"] for rounds in runs["twin"])
    twin_seconds = statistics.median(first_at_or_below(r, target)["seconds"] for r in runs["twin"])
    lines = [
        f"target: the twin's final val loss, {target:.4f} (median of {len(runs['twin'])} "
        "round(s)); seconds exclude evaluation",
        f"{'contestant':<10} {'final val':>9} {'s total':>8} {'s to target':>11} "
        f"{'steps':>6} {'tokens':>10} {'x twin':>7}",
    ]
    for name, rounds in runs.items():
        hits = [first_at_or_below(r, target) for r in rounds]
        final = statistics.median(r[-1]["val_loss"] for r in rounds)
        total = statistics.median(r[-1]["seconds"] for r in rounds)
        if any(h is None for h in hits):
            lines.append(f"{name:<10} {final:>9.4f} {total:>8.1f} {'not reached':>11}")
            continue
        seconds = statistics.median(h["seconds"] for h in hits)
        lines.append(
            f"{name:<10} {final:>9.4f} {total:>8.1f} {seconds:>11.1f} "
            f"{statistics.median(h['step'] for h in hits):>6.0f} "
            f"{statistics.median(h['tokens'] for h in hits):>10,.0f} "
            f"{seconds / twin_seconds:>7.2f}"
        )
    return lines


def plot(runs: dict[str, list[list[dict]]], path: str, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2))
    for name, rounds in runs.items():
        for i, records in enumerate(rounds):
            axes.plot(
                [r["seconds"] for r in records],
                [r["val_loss"] for r in records],
                marker=".",
                label=name if i == 0 else None,
                color={"twin": "tab:gray", "course": "tab:blue", "speedrun": "tab:red"}[name],
            )
    axes.axhline(target, color="black", linestyle="--", linewidth=0.8, label="target")
    axes.set(
        xlabel="wall seconds (evaluation excluded)",
        ylabel="val loss (nats/token)",
        ylim=(target - 0.25, target + 1.0),
        title="Tiny Shakespeare (char), context 64",
    )
    axes.legend()
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=CONTESTANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--overrides", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--stop_below", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--fine_below", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--near",
        type=float,
        default=0.1,
        help="the project's configs are evaluated after every chunk (steps_per_call) once their "
        "val loss is within this many nats of the target (known once the twin has run), so "
        "their crossing is timed to the chunk, not to --eval_every; the twin's time is to its "
        "final step, whose loss is the target (negative: off)",
    )
    parser.add_argument(
        "--data_dir",
        default=os.environ.get("MINIGPT_JAX_DATA", str(REPO.parent / "shared" / "data")),
        help="folder holding tinyshakespeare.txt (default $MINIGPT_JAX_DATA, ../shared/data)",
    )
    parser.add_argument("--eval_every", type=int, default=100, help="steps between evaluations")
    parser.add_argument("--rounds", type=int, default=1, help="rounds; each alternates order")
    parser.add_argument("--only", action="append", choices=CONTESTANTS, help="run only these")
    parser.add_argument("--plot", default="results/time_to_loss.png", help="PNG to write")
    parser.add_argument("--json", default=None, help="also write every record here")
    args = parser.parse_args(argv)
    if args.worker:
        if args.worker == "twin":
            records = run_twin(args.worker, args.data_dir, args.eval_every)
        else:
            overrides = json.loads(args.overrides)
            records = run_jax(
                args.worker,
                args.data_dir,
                args.eval_every,
                overrides,
                args.stop_below,
                args.fine_below,
            )
        Path(args.out).write_text(json.dumps(records))
        return
    names = args.only or list(CONTESTANTS)
    if "twin" not in names:
        parser.error("the target is the twin's final val loss: include --only twin")
    from benchmarks import machine

    cpu = machine.this_cpu()
    cores = len(os.sched_getaffinity(0))
    print("\n".join(machine.describe(cpu, cores, machine.peaks(cpu, cores))))
    print(f"python {platform.python_version()}", flush=True)
    runs: dict[str, list[list[dict]]] = {name: [] for name in names}
    for round_index in range(args.rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            fine_below = None
            if name != "twin" and runs["twin"] and args.near >= 0:
                finals = [twin_records[-1]["val_loss"] for twin_records in runs["twin"]]
                fine_below = statistics.median(finals) + args.near
            records = run_contestant(name, args.data_dir, args.eval_every, fine_below=fine_below)
            runs[name].append(records)
            last = records[-1]
            print(
                f"round {round_index + 1} {name}: step {last['step']}, val "
                f"{last['val_loss']:.4f} at {last['seconds']:.1f} s",
                flush=True,
            )
    for line in report(runs):
        print(line)
    target = statistics.median(rounds[-1]["val_loss"] for rounds in runs["twin"])
    plot(runs, args.plot, target)
    print(f"wrote {args.plot}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs))


if __name__ == "__main__":
    main()
