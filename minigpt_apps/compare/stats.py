"""The statistics of a comparison (scipy.stats and statsmodels), pure functions over per-seed
values: an arm's mean with its t interval, a paired comparison of an arm with the baseline at a
given confidence (the mean difference, its interval, the paired t-test and the Wilcoxon
signed-rank test), Bonferroni's adjustment for several comparisons (whose simultaneous intervals
agree with it), the paired t-test's power, minimum detectable effect and seeds needed, the paired
equivalence test (TOST), a paired sign test and a log-rank test for censored times, a
prediction interval, and the exact interval of a proportion (an A/A false-positive rate).

Values are sequences of floats, one per seed; a paired comparison takes two of the same length,
index i of each from the same seed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import integrate, optimize, special, stats

CONFIDENCE = 0.95
ALPHA = 0.05
POWER = 0.80
MAX_SEEDS = 1_000_000  # seeds_for_effect gives up beyond this


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
    """An arm against the baseline over n paired seeds; `diff` = arm - baseline per seed; the
    interval at `confidence` (1 - alpha/m for m comparisons: Bonferroni's simultaneous one)."""

    n: int
    mean_diff: float
    ci_low: float
    ci_high: float
    std_diff: float
    t_p: float  # the paired t-test's two-sided p
    wilcoxon_p: float  # the Wilcoxon signed-rank test's two-sided p
    confidence: float = CONFIDENCE

    @property
    def identical(self) -> bool:
        """Every seed gave the baseline's own value."""
        return self.mean_diff == 0.0 and self.std_diff == 0.0

    @property
    def d_z(self) -> float:
        """Cohen's d_z: the mean difference in standard deviations of the differences."""
        if self.std_diff == 0.0:
            return 0.0 if self.mean_diff == 0.0 else math.copysign(math.inf, self.mean_diff)
        return self.mean_diff / self.std_diff


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


def _diff(arm: Sequence[float], baseline: Sequence[float]) -> np.ndarray:
    a, b = np.asarray(arm, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired values need the same seeds: {a.shape} and {b.shape}.")
    if a.size < 2:
        raise ValueError(f"a paired test needs at least 2 seeds, got {a.size}.")
    return a - b


def paired(
    arm: Sequence[float], baseline: Sequence[float], confidence: float = CONFIDENCE
) -> Paired:
    """The paired comparison of `arm` with `baseline` (same seeds, same order, n >= 2).

    Differences that are all equal have no spread: the tests' p is then 1 when they are all 0
    (identical arms) and 0 otherwise (a constant shift), where scipy gives nan."""
    diff = _diff(arm, baseline)
    mean, std = float(diff.mean()), float(diff.std(ddof=1))
    low, high = _interval(mean, std, diff.size, confidence)
    if std == 0.0:
        t_p = w_p = 1.0 if mean == 0.0 else 0.0
    else:
        t_p = float(stats.ttest_1samp(diff, 0.0).pvalue)
        # zero differences (ties with the baseline) are dropped, as Wilcoxon's test does
        w_p = float(stats.wilcoxon(diff).pvalue) if np.any(diff != 0.0) else 1.0
    return Paired(diff.size, mean, low, high, std, t_p, w_p, confidence)


def bonferroni(p_values: Sequence[float]) -> list[float]:
    """Bonferroni-adjusted p-values (p times m, capped at 1): an adjusted p < alpha exactly when
    the arm's 1 - alpha/m interval excludes 0, so verdict and interval cannot disagree."""
    m = len(p_values)
    return [min(1.0, m * p) for p in p_values]


def wilcoxon_floor(n: int) -> float:
    """The smallest two-sided p the exact Wilcoxon signed-rank test can give over n pairs."""
    return min(1.0, 2.0 / 2**n)


# ----------------------------------------------------------------------------- power


def _power_by_integration(effect: float, df: int, critical: float) -> float:
    """P(|T| > critical) for T = (Z + effect·sqrt(n)) / sqrt(V/df), V ~ chi²(df): the
    noncentral t's tails integrated over V, where scipy's nct gives nan (large noncentrality).
    scipy.special's functions, not scipy.stats', keep the integrand cheap."""
    shift = abs(effect) * math.sqrt(df + 1)
    log_norm = -(df / 2) * math.log(2) - special.gammaln(df / 2)

    def tails(v: float) -> float:
        if v <= 0.0:
            return 0.0
        edge = critical * math.sqrt(v / df)
        density = math.exp(log_norm + (df / 2 - 1) * math.log(v) - v / 2)  # chi²(df) pdf
        return (special.ndtr(shift - edge) + special.ndtr(-edge - shift)) * density

    value, _ = integrate.quad(tails, 0.0, math.inf, limit=200)
    return min(1.0, float(value))


def paired_t_power(effect: float, n: int, alpha: float = ALPHA) -> float:
    """The power of a two-sided paired t-test at level alpha over n pairs when the true mean
    difference is `effect` standard deviations of the differences (Cohen's d_z): the
    noncentral t's mass beyond the critical values (integrated directly where scipy's
    noncentral t gives nan, never read as enough)."""
    df = n - 1
    critical = float(stats.t.ppf(1 - alpha / 2, df))
    shift = abs(effect) * math.sqrt(n)
    power = float(stats.nct.sf(critical, df, shift) + stats.nct.cdf(-critical, df, shift))
    if not math.isfinite(power) or not 0.0 <= power <= 1.0:
        power = _power_by_integration(effect, df, critical)
    return power


def seeds_for_effect(
    effect: float, std_diff: float, power: float = POWER, alpha: float = ALPHA
) -> int | None:
    """The fewest paired seeds (>= 2) at which a two-sided paired t-test at level `alpha`
    detects a true mean difference `effect`, with differences of std `std_diff`, with at least
    `power`; None when the effect is 0 or more than MAX_SEEDS would be needed. Power grows with
    n: found by doubling, then bisection."""
    if effect == 0.0:
        return None
    if std_diff == 0.0:
        return 2
    d_z = effect / std_diff
    high = 2
    while paired_t_power(d_z, high, alpha) < power:
        if high >= MAX_SEEDS:
            return None
        high = min(2 * high, MAX_SEEDS)
    low = max(2, high // 2)
    if paired_t_power(d_z, low, alpha) >= power:
        return low
    while high - low > 1:  # power(low) < power <= power(high)
        middle = (low + high) // 2
        if paired_t_power(d_z, middle, alpha) >= power:
            high = middle
        else:
            low = middle
    return high


def detectable_effect(n: int, std_diff: float, power: float = POWER, alpha: float = ALPHA):
    """The minimum detectable effect: the smallest true mean difference (in the values' units)
    a two-sided paired t-test at level `alpha` over n seeds detects with `power`, the
    differences having std `std_diff`."""
    if std_diff == 0.0:
        return 0.0
    d_z = optimize.brentq(lambda d: paired_t_power(d, n, alpha) - power, 1e-9, 1e4, xtol=1e-10)
    return float(d_z) * std_diff


# ----------------------------------------------------------------------------- equivalence


@dataclasses.dataclass(frozen=True)
class Equivalence:
    """The paired TOST of |mean difference| < margin at level alpha: its p (the larger of the
    two one-sided tests') and the 1 - 2·alpha interval that decides it the same way."""

    margin: float
    alpha: float
    p: float
    ci_low: float
    ci_high: float

    @property
    def equivalent(self) -> bool:
        return self.p < self.alpha

    @property
    def confidence(self) -> float:
        return 1 - 2 * self.alpha


def tost(
    arm: Sequence[float], baseline: Sequence[float], margin: float, alpha: float = ALPHA
) -> Equivalence:
    """Two one-sided paired t-tests (statsmodels' ttost_paired) that the mean difference lies
    within ±margin; equivalent when p < alpha, exactly when the 1 - 2·alpha interval lies
    inside ±margin. Without spread, the difference itself decides."""
    from statsmodels.stats.weightstats import ttost_paired

    diff = _diff(arm, baseline)
    mean, std = float(diff.mean()), float(diff.std(ddof=1))
    low, high = _interval(mean, std, diff.size, 1 - 2 * alpha)
    if std == 0.0:
        p = 0.0 if abs(mean) < margin else 1.0
    else:
        a, b = np.asarray(arm, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
        p = float(ttost_paired(a, b, -margin, margin)[0])
    return Equivalence(margin, alpha, p, low, high)


# ----------------------------------------------------------------------------- censored times


@dataclasses.dataclass(frozen=True)
class SignTest:
    """A paired sign test on censored times: the pairs the arm was faster in, slower in, and
    tied (both never reached the target, or equal times), and the exact binomial two-sided p
    over the untied pairs."""

    faster: int
    slower: int
    ties: int
    p: float


def censored_sign_test(arm: Sequence[float | None], baseline: Sequence[float | None]) -> SignTest:
    """Paired times where None is a run that never reached the target (censored at its
    training time, so later than any time that reached it): which of each pair came first, and
    scipy's exact binomial test of faster against slower (the sign test; ties left out)."""
    if len(arm) != len(baseline):
        raise ValueError(f"paired values need the same seeds: {len(arm)} and {len(baseline)}.")
    faster = slower = ties = 0
    for mine, base in zip(arm, baseline, strict=True):
        mine_t = math.inf if mine is None else mine
        base_t = math.inf if base is None else base
        if mine_t < base_t:
            faster += 1
        elif mine_t > base_t:
            slower += 1
        else:
            ties += 1
    decided = faster + slower
    p = float(stats.binomtest(faster, decided, 0.5).pvalue) if decided else 1.0
    return SignTest(faster, slower, ties, p)


@dataclasses.dataclass(frozen=True)
class LogRank:
    """The log-rank test of two groups' censored times: the arm's observed events (runs that
    reached the target) beside those expected were both groups alike, the chi-square (1 df)
    and its p. observed > expected: the arm reaches the target sooner (a higher hazard)."""

    observed: int
    expected: float
    chisq: float
    p: float


def log_rank(
    arm: Sequence[float | None],
    arm_seconds: Sequence[float],
    baseline: Sequence[float | None],
    baseline_seconds: Sequence[float],
) -> LogRank:
    """The (unpaired) log-rank test of the arm's times against the baseline's, where None is a
    run that never reached the target, censored at its training time (`*_seconds`, one per
    run): statsmodels' survdiff for the chi-square and p, and the textbook sum over event
    times of events × the arm's share of those at risk for its expected events. No event, or
    no variance (nothing to compare at any event time): p 1, where survdiff gives nan."""
    from statsmodels.duration.survfunc import survdiff

    if len(arm) != len(arm_seconds) or len(baseline) != len(baseline_seconds):
        raise ValueError("each run needs its time and its training seconds.")
    times, seconds = [*arm, *baseline], [*arm_seconds, *baseline_seconds]
    time_n = np.asarray(
        [s if t is None else t for t, s in zip(times, seconds, strict=True)], dtype=np.float64
    )
    event_n = np.asarray([t is not None for t in times])
    in_arm_n = np.arange(time_n.size) < len(arm)
    observed = int(np.sum(event_n & in_arm_n))
    expected = 0.0
    for when in np.unique(time_n[event_n]):
        at_risk_n = time_n >= when
        events = np.sum(event_n & (time_n == when))
        expected += events * np.sum(at_risk_n & in_arm_n) / np.sum(at_risk_n)
    if not event_n.any():
        return LogRank(observed, expected, 0.0, 1.0)
    try:
        with np.errstate(divide="ignore", invalid="ignore"):
            chisq, p = survdiff(time_n, event_n.astype(np.float64), in_arm_n.astype(np.int64))
    except np.linalg.LinAlgError:
        chisq = p = math.nan
    if not math.isfinite(chisq):  # no variance: at every event time one group alone at risk
        chisq, p = 0.0, 1.0
    return LogRank(observed, float(expected), float(chisq), float(p))


# ----------------------------------------------------------------------------- prediction


def prediction_interval(
    values: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """The t prediction interval for one more value drawn like `values` (n >= 2): the mean
    ± t(n-1) · std · sqrt(1 + 1/n)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"a prediction interval needs at least 2 values, got {x.size}.")
    mean, std = float(x.mean()), float(x.std(ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, x.size - 1)) * std * math.sqrt(1 + 1 / x.size)
    return mean - half, mean + half


def proportion_interval(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The exact (Clopper–Pearson) interval of a proportion seen k times in n (scipy's
    binomtest), as an A/A calibration's observed false-positive rate."""
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"a proportion needs 0 <= k <= n and n >= 1, got {k} of {n}.")
    interval = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    return float(interval.low), float(interval.high)
