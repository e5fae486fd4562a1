"""Wall-clock timing of device work: the one median timer of the experiments and benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax


def call_seconds(
    fn: Callable[..., Any],
    *args: Any,
    repeats: int,
    warm_up: Callable[[], Any] | None = None,
) -> list[float]:
    """Wall time of each of `repeats` calls fn(*args), each waited on (`jax.block_until_ready`).

    First, untimed, one warm-up call (it compiles): `warm_up()` if given, else fn(*args).
    """
    jax.block_until_ready(warm_up() if warm_up is not None else fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return times


def median_seconds(
    fn: Callable[..., Any],
    *args: Any,
    repeats: int = 10,
    warm_up: Callable[[], Any] | None = None,
) -> float:
    """Median of `call_seconds(fn, *args, repeats=repeats, warm_up=warm_up)`."""
    return statistics.median(call_seconds(fn, *args, repeats=repeats, warm_up=warm_up))
