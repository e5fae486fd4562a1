"""The statistics of a comparison (scipy.stats), pure functions over per-seed values: an arm's
mean with its t interval, a paired comparison of an arm with the baseline (the mean difference,
its interval, the paired t-test and the Wilcoxon signed-rank test), Holm's correction for several
comparisons, and the seeds a paired t-test needs to detect a difference with a given power.

Values are sequences of floats, one per seed; a paired comparison takes two of the same length,
index i of each from the same seed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
ALPHA = 0.05
POWER = 0.80
MAX_SEEDS = 1_000_000  # seeds_to_detect gives up beyond this


@dataclasses.dataclass(frozen=True)
class Summary:
    """One arm's values: their count, mean, interval of the mean, and seed-to-seed std."""

    n: int
    mean: float
    ci_low: float
    ci_high: float
    std: float


@dataclasses.dataclass(frozen=True)
class Paired:
    """An arm against the baseline over n paired seeds; `diff` = arm - baseline per seed."""

    n: int
    mean_diff: float
    ci_low: float
    ci_high: float
    std_diff: float
    t_p: float  # the paired t-test's two-sided p
    wilcoxon_p: float  # the Wilcoxon signed-rank test's two-sided p

    @property
    def identical(self) -> bool:
        """Every seed gave the baseline's own value."""
        return self.mean_diff == 0.0 and self.std_diff == 0.0


def _interval(mean: float, std: float, n: int, confidence: float) -> tuple[float, float]:
    """The t interval of a mean of n values with sample std `std` (a point when std is 0)."""
    if std == 0.0:
        return mean, mean
    low, high = stats.t.interval(confidence, n - 1, loc=mean, scale=std / math.sqrt(n))
    return float(low), float(high)


def summarize(values: Sequence[float], confidence: float = CONFIDENCE) -> Summary:
    """Mean, its `confidence` t interval (n - 1 degrees of freedom) and the std (ddof 1) of at
    least two values."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"an interval needs at least 2 values, got {x.size}.")
    mean, std = float(x.mean()), float(x.std(ddof=1))
    return Summary(x.size, mean, *_interval(mean, std, x.size, confidence), std)


def paired(
    arm: Sequence[float], baseline: Sequence[float], confidence: float = CONFIDENCE
) -> Paired:
    """The paired comparison of `arm` with `baseline` (same seeds, same order, n >= 2).

    Differences that are all equal have no spread: the tests' p is then 1 when they are all 0
    (identical arms) and 0 otherwise (a constant shift), where scipy gives nan."""
    a, b = np.asarray(arm, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired values need the same seeds: {a.shape} and {b.shape}.")
    if a.size < 2:
        raise ValueError(f"a paired test needs at least 2 seeds, got {a.size}.")
    diff = a - b
    mean, std = float(diff.mean()), float(diff.std(ddof=1))
    low, high = _interval(mean, std, diff.size, confidence)
    if std == 0.0:
        t_p = w_p = 1.0 if mean == 0.0 else 0.0
    else:
        t_p = float(stats.ttest_rel(a, b).pvalue)
        # zero differences (ties with the baseline) are dropped, as Wilcoxon's test does
        w_p = float(stats.wilcoxon(diff).pvalue) if np.any(diff != 0.0) else 1.0
    return Paired(diff.size, mean, low, high, std, t_p, w_p)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: the i-th smallest p times
    (m - i + 1), made non-decreasing, capped at 1. Reject where the adjusted p < alpha."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def paired_t_power(effect: float, n: int, alpha: float = ALPHA) -> float:
    """The power of a two-sided paired t-test at level alpha over n pairs when the true mean
    difference is `effect` standard deviations of the differences (Cohen's d_z): the
    noncentral t's mass beyond the critical values, noncentrality effect * sqrt(n)."""
    df = n - 1
    critical = stats.t.ppf(1 - alpha / 2, df)
    shift = abs(effect) * math.sqrt(n)
    return float(stats.nct.sf(critical, df, shift) + stats.nct.cdf(-critical, df, shift))


def seeds_to_detect(
    mean_diff: float, std_diff: float, power: float = POWER, alpha: float = ALPHA
) -> int | None:
    """The fewest paired seeds (>= 2) at which a two-sided paired t-test detects a true mean
    difference of `mean_diff`, with differences of std `std_diff`, with at least `power`;
    None when the difference is 0 or more than MAX_SEEDS would be needed. Power grows with n:
    the answer is found by doubling, then bisection."""
    if mean_diff == 0.0:
        return None
    if std_diff == 0.0:
        return 2
    effect = mean_diff / std_diff
    high = 2
    while paired_t_power(effect, high, alpha) < power:
        if high >= MAX_SEEDS:
            return None
        high = min(2 * high, MAX_SEEDS)
    low = max(2, high // 2)
    if paired_t_power(effect, low, alpha) >= power:
        return low
    while high - low > 1:  # power(low) < power <= power(high)
        middle = (low + high) // 2
        if paired_t_power(effect, middle, alpha) >= power:
            high = middle
        else:
            low = middle
    return high
