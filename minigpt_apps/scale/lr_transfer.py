"""μP's transfer check: does the best learning rate at width w stay best at width k·w?

Each parametrization sweeps a grid of learning rates at both widths, over paired seeds (seed s
has the same init key and batches at every rate); a run's value is its mean training loss over
its last `tail` steps. Per width the best rate is the grid's lowest seed-mean value. The
verdict at the wide width compares the rate the narrow width picked with the wide width's own
best, paired over seeds with the compare app's statistics (`minigpt_apps.compare.stats.paired`,
a paired t interval at 95%): the rate **transfers** when the two best rates are the same grid
point, or when the wide width's loss at the narrow width's rate is not worse than at its own
best by more than the interval allows (the interval of the difference reaches 0); else it does
**not transfer**, and the shift in log2(lr) says by how much. Under μP the best rates agree;
under the standard parametrization with Adam the wide width's best rate is smaller (about 1/k).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np

from minigpt_apps.compare import stats
from minigpt_apps.scale.coord_check import PARAMETRIZATIONS
from minigpt_apps.scale.width_runs import (
    DEFAULT_FAMILY,
    Family,
    batches,
    make_step,
    optimizer,
)
from minigpt_jax.model.gpt import init_params
from minigpt_jax.settings.groups import Optim


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One parametrization's transfer: each width's best rate, the shift between them (in
    log2), and the wide width's paired penalty for using the narrow width's best rate."""

    parametrization: str
    best_lr: dict[int, float]  # {width: its best rate}
    shift_log2: float  # log2(best at the wide width / best at the narrow one)
    penalty: stats.Paired  # wide width: loss at narrow's best - loss at its own best
    transfers: bool


@dataclasses.dataclass(frozen=True)
class Transfer:
    """losses[parametrization][width]: seeds x rates (mean loss of each run's last steps)."""

    widths: tuple[int, int]
    lrs: tuple[float, ...]
    seeds: tuple[int, ...]
    steps: int
    losses: dict[str, dict[int, np.ndarray]]
    verdicts: dict[str, Verdict]


def best_rate_index(losses_SxR: np.ndarray) -> int:
    """The rate whose seed mean is lowest (a diverged run, nan or inf, counts as the worst)."""
    means_R = np.where(np.isfinite(losses_SxR), losses_SxR, np.inf).mean(axis=0)
    return int(np.argmin(means_R))


def verdict(
    name: str, widths: tuple[int, int], lrs: Sequence[float], losses: dict[int, np.ndarray]
) -> Verdict:
    """The transfer verdict of one parametrization (see the module docstring)."""
    narrow, wide = widths
    best = {width: best_rate_index(losses[width]) for width in widths}
    wide_SxR = np.where(np.isfinite(losses[wide]), losses[wide], np.finfo(np.float64).max)
    penalty = stats.paired(wide_SxR[:, best[narrow]], wide_SxR[:, best[wide]])
    same = best[narrow] == best[wide]
    return Verdict(
        parametrization=name,
        best_lr={width: float(lrs[best[width]]) for width in widths},
        shift_log2=math.log2(lrs[best[wide]] / lrs[best[narrow]]),
        penalty=penalty,
        transfers=same or penalty.ci_low <= 0.0,
    )


def lr_transfer(
    width: int = 64,
    *,
    factor: int = 4,
    lrs: Sequence[float] = tuple(2.0**k for k in range(-12, -3)),
    family: Family = DEFAULT_FAMILY,
    steps: int = 200,
    warmup_steps: int = 20,
    tail: int = 20,
    seeds: Sequence[int] = (0, 1, 2),
    parametrizations: Sequence[str] = PARAMETRIZATIONS,
) -> Transfer:
    """The transfer check at widths `width` and `factor`·width (μP's base width: family's),
    each run `steps` AdamW steps (no weight decay) at peak rate lr on a warmup + cosine
    schedule (to a tenth of it), valued by the mean training loss over its last `tail` steps."""
    if len(seeds) < 2:
        raise ValueError(f"lr_transfer needs two or more seeds (a paired verdict), got {seeds}.")
    if len(lrs) < 2 or not 0 < tail <= steps:
        raise ValueError("lr_transfer needs two or more rates and 0 < tail <= steps.")
    widths = (width, factor * width)
    optim = Optim(min_lr=0.1, warmup_steps=warmup_steps, weight_decay=0.0)
    losses: dict[str, dict[int, np.ndarray]] = {}
    for name in parametrizations:
        losses[name] = {}
        for w in widths:
            cfg = family.config(w, name)
            tx, _ = optimizer(cfg, optim, steps)
            step = make_step(cfg, tx)
            table_SxR = np.zeros((len(seeds), len(lrs)))
            for s, seed in enumerate(seeds):
                data = batches(family, steps, seed)
                for r, lr in enumerate(lrs):
                    params = init_params(cfg, jax.random.key(seed))
                    opt_state = tx.init(params)
                    run_losses = []
                    for t in range(steps):
                        params, opt_state, loss = step(params, opt_state, data[t], lr)
                        run_losses.append(loss)
                    table_SxR[s, r] = float(np.mean(np.asarray(run_losses[-tail:])))
            losses[name][w] = table_SxR
    verdicts = {name: verdict(name, widths, lrs, losses[name]) for name in losses}
    return Transfer(widths, tuple(lrs), tuple(seeds), steps, losses, verdicts)
