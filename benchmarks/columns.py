"""What the side-by-side training benchmarks time (train_throughput.py on the CPU, gpu_mfu.py on an
accelerator): a `Column` is one setting, whose `run(first_step, n)` trains steps [first_step,
first_step + n) on the benchmark's shared batches and returns per-step seconds; the compiled
minigpt-jax train chunk and the PyTorch twin (with the JAX init) are the two kinds of column."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax


@dataclasses.dataclass
class Column:
    """One timed setting: `run(first_step, n)` returns one seconds-per-step sample per compiled
    call (JAX) or per step (torch); `capped` columns time fewer steps a round than asked."""

    name: str
    run: Callable[[int, int], list[float]] | None = None
    batch_size: int = 0
    steps_per_call: int = 1
    compile_s: float | None = None
    note: str = ""
    capped: bool = False
    dtype: str = "float32"  # the matmuls' dtype, whose peak its MFU is read against
    times_s: list[float] = dataclasses.field(default_factory=list)
    losses: list[float] = dataclasses.field(default_factory=list)


def chunk_column(
    name: str,
    train_chunk: Any,
    state: Any,
    chunks: Sequence[Any],
    *,
    compile_s: float,
    note: str,
    batch_size: int = 0,
) -> Column:
    """The compiled `train_chunk` (state, batches_CxBxT1) -> (state, metrics) as a column: step s
    trains on chunk (s // C) % len(chunks), so columns see the same batches at the same step."""
    steps_per_call = chunks[0].shape[0]
    column = Column(name, None, batch_size, steps_per_call, compile_s, note)
    holder = {"state": state}

    def run(first_step: int, n: int) -> list[float]:
        times, state = [], holder["state"]
        for i in range(first_step // steps_per_call, (first_step + n) // steps_per_call):
            start = time.perf_counter()
            state, metrics = train_chunk(state, chunks[i % len(chunks)])
            loss = jax.device_get(metrics["loss"])  # waits for the call
            times.append((time.perf_counter() - start) / steps_per_call)
            column.losses.extend(float(x) for x in loss)
        holder["state"] = state
        return times

    column.run = run
    return column


def torch_twin(cfg: Any, seed: int) -> Any:
    """benchmarks.torch_reference.TorchGPT of `cfg` holding the params minigpt-jax initialises
    for key(seed) (train.step.init_state's split), in training mode."""
    from benchmarks.torch_reference import TorchGPT, load_jax_params
    from minigpt_jax import init_params

    init_rng, _ = jax.random.split(jax.random.key(seed))
    return load_jax_params(TorchGPT(cfg), init_params(cfg, init_rng)).train()


def torch_column(
    name: str,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    xs: Sequence[Any],
    ys: Sequence[Any],
    *,
    grad_clip: float,
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    note: str = "",
    batch_size: int = 0,
    max_steps: int | None = None,
) -> Column:
    """Eager or compiled torch steps as a column: step s trains on xs/ys[s % len(xs)] inside
    `context()` (autocast, an attention kernel); `max_steps` caps the steps of a round, for a
    setting too slow to time in full."""
    from benchmarks.torch_reference import torch_train_step

    column = Column(name, None, batch_size, note=note, capped=max_steps is not None)

    def run(first_step: int, n: int) -> list[float]:
        times = []
        for s in range(first_step, first_step + min(n, max_steps or n)):
            start = time.perf_counter()
            with context():
                loss = torch_train_step(
                    model,
                    optimizer,
                    xs[s % len(xs)],
                    ys[s % len(ys)],
                    scheduler=scheduler,
                    grad_clip=grad_clip,
                )  # .item(): waits for the device
            times.append(time.perf_counter() - start)
            column.losses.append(loss)
        return times

    column.run = run
    return column
