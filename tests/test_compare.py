"""`minigpt-jax compare`: its statistics against scipy and hand-worked values (fast), its
verdicts on recorded values, its one-line refusals that write nothing (in-process, fast); and
through the command line (slow): arms with a known answer on configs/tiny.py (two arms with the
same training give the same value at every seed and no difference; a crippled learning rate is
significantly worse), and a rerun that trains nothing twice."""

import csv
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.weightstats import ttost_paired

from minigpt_apps.compare import command, plan, report, stats
from minigpt_apps.compare.record import RunRecord
from minigpt_jax.train.metrics import read_metrics

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "tiny.py")

# ----------------------------------------------------------------------------- statistics


def test_summary_is_the_t_interval_of_the_mean():
    values = [4.10, 4.15, 4.08, 4.20, 4.12]
    summary = stats.summarize(values)
    mean = sum(values) / 5
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 4)
    half = 2.7764451051977987 * std / math.sqrt(5)  # t(0.975, 4 df), the table's 2.776
    assert summary.n == 5
    assert summary.mean == pytest.approx(mean, abs=1e-12)
    assert summary.std == pytest.approx(std, abs=1e-12)
    assert (summary.ci_low, summary.ci_high) == pytest.approx((mean - half, mean + half))
    low, high = scipy_stats.t.interval(0.95, 4, loc=np.mean(values), scale=scipy_stats.sem(values))
    assert (summary.ci_low, summary.ci_high) == pytest.approx((low, high), abs=1e-12)


def test_paired_matches_scipy_on_fixed_numbers():
    arm = [4.021, 4.105, 3.998, 4.087, 4.050, 4.012]
    baseline = [4.050, 4.121, 4.030, 4.090, 4.081, 4.040]
    paired = stats.paired(arm, baseline)
    diff = np.subtract(arm, baseline)
    sd = diff.std(ddof=1)
    t = diff.mean() / (sd / math.sqrt(6))  # the paired t statistic, by hand
    assert paired.n == 6
    assert paired.mean_diff == pytest.approx(diff.mean(), abs=1e-12)
    assert paired.std_diff == pytest.approx(sd, abs=1e-12)
    assert paired.t_p == pytest.approx(2 * scipy_stats.t.sf(abs(t), 5), rel=1e-9)
    assert paired.t_p == pytest.approx(scipy_stats.ttest_rel(arm, baseline).pvalue, rel=1e-9)
    assert paired.wilcoxon_p == pytest.approx(scipy_stats.wilcoxon(diff).pvalue, rel=1e-9)
    half = scipy_stats.t.ppf(0.975, 5) * sd / math.sqrt(6)
    assert (paired.ci_low, paired.ci_high) == pytest.approx(
        (diff.mean() - half, diff.mean() + half), abs=1e-12
    )
    assert paired.t_p < 0.05 and paired.ci_high < 0  # every seed lower: significantly better


def test_paired_without_spread_is_decided_where_scipy_says_nan():
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert math.isnan(scipy_stats.ttest_rel([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]).pvalue)
    same = stats.paired([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert same.identical and same.t_p == 1.0 and same.wilcoxon_p == 1.0
    assert (same.ci_low, same.ci_high) == (0.0, 0.0)
    shifted = stats.paired([1.5, 2.5, 3.5], [1.0, 2.0, 3.0])
    assert not shifted.identical and shifted.t_p == 0.0
    assert (shifted.ci_low, shifted.ci_high) == (0.5, 0.5)


def test_paired_refuses_unpaired_or_single_values():
    with pytest.raises(ValueError, match="same seeds"):
        stats.paired([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="at least 2"):
        stats.paired([1.0], [2.0])
    with pytest.raises(ValueError, match="at least 2"):
        stats.summarize([1.0])


def test_bonferroni_matches_statsmodels_and_the_hand_worked_values():
    from statsmodels.stats.multitest import multipletests

    p = [0.01, 0.04, 0.03, 0.005]
    assert stats.bonferroni(p) == pytest.approx([0.04, 0.16, 0.12, 0.02])  # 4 × p
    assert stats.bonferroni(p) == pytest.approx(list(multipletests(p, method="bonferroni")[1]))
    assert stats.bonferroni([0.5, 0.9]) == [1.0, 1.0]  # capped at 1
    assert stats.bonferroni([0.2]) == [0.2]


def test_power_of_the_paired_t_test_matches_the_textbook():
    # G*Power's manual, matched pairs: d_z = 0.5, alpha 0.05 two-tailed, power 0.80 -> 34
    # pairs, actual power 0.8078.
    assert stats.seeds_for_effect(0.5, 1.0) == 34
    assert stats.paired_t_power(0.5, 34) == pytest.approx(0.8078, abs=5e-5)
    assert stats.paired_t_power(0.5, 33) < 0.80
    assert stats.seeds_for_effect(-0.004, 0.008) == 34  # the sign and the units do not matter
    assert stats.seeds_for_effect(0.0, 1.0) is None
    assert stats.seeds_for_effect(1e-4, 1.0) is None  # beyond MAX_SEEDS


def test_power_agrees_with_statsmodels_at_the_arms_level():
    from statsmodels.stats.power import TTestPower

    for effect, n, alpha in [(0.5, 34, 0.05), (1.2, 6, 0.025), (2.0, 4, 0.05 / 3), (0.3, 80, 0.01)]:
        expected = TTestPower().power(effect, n, alpha, alternative="two-sided")
        assert stats.paired_t_power(effect, n, alpha) == pytest.approx(expected, abs=1e-6)
    # A stricter level needs more seeds for the same effect.
    assert stats.seeds_for_effect(0.5, 1.0, alpha=0.025) > stats.seeds_for_effect(0.5, 1.0)


def test_power_where_scipy_gives_nan_is_not_read_as_enough():
    """The issue's case: +0.6333 nats, differences' std 0.0990, 2 seeds (d_z 6.40). scipy's
    noncentral t gives nan there; the power is about 0.52 (a simulation agrees) and 3 seeds
    are needed, not 2."""
    d_z = 0.6333153247833252 / 0.09902048024107062
    critical = scipy_stats.t.ppf(0.975, 1)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = scipy_stats.nct.sf(critical, 1, d_z * math.sqrt(2)) + scipy_stats.nct.cdf(
            -critical, 1, d_z * math.sqrt(2)
        )
    assert math.isnan(raw)
    rng = np.random.default_rng(0)
    draws = rng.standard_normal((400_000, 2)) + d_z
    t = draws.mean(1) / (draws.std(1, ddof=1) / math.sqrt(2))
    simulated = float(np.mean(np.abs(t) > critical))
    assert stats.paired_t_power(d_z, 2) == pytest.approx(simulated, abs=0.005)
    assert stats.seeds_for_effect(0.6333153247833252, 0.09902048024107062) == 3


def test_minimum_detectable_effect_has_the_power_asked_for():
    from statsmodels.stats.power import TTestPower

    expected = TTestPower().solve_power(nobs=10, alpha=0.05, power=0.8)  # in d_z
    assert stats.detectable_effect(10, 0.02) == pytest.approx(expected * 0.02, rel=1e-6)
    mde = stats.detectable_effect(2, 1.0)  # where statsmodels' own search would hit nan
    assert stats.paired_t_power(mde, 2) == pytest.approx(0.80, abs=1e-6)
    assert stats.detectable_effect(34, 1.0) < 0.5 < stats.detectable_effect(33, 1.0, alpha=0.01)


def test_tost_matches_statsmodels_and_the_textbook_formula():
    from statsmodels.stats.weightstats import ttost_paired

    arm = [4.021, 4.105, 3.998, 4.087, 4.050, 4.012]
    base = [4.020, 4.100, 4.010, 4.080, 4.061, 4.000]
    result = stats.tost(arm, base, 0.03)
    assert result.p == pytest.approx(ttost_paired(np.array(arm), np.array(base), -0.03, 0.03)[0])
    # Schuirmann's two one-sided tests by hand: t = (mean ± margin) / se on n - 1 df.
    diff = np.subtract(arm, base)
    se = diff.std(ddof=1) / math.sqrt(6)
    p_low = scipy_stats.t.sf((diff.mean() + 0.03) / se, 5)
    p_high = scipy_stats.t.cdf((diff.mean() - 0.03) / se, 5)
    assert result.p == pytest.approx(max(p_low, p_high), rel=1e-9)
    half = scipy_stats.t.ppf(0.95, 5) * se  # the 90% interval of TOST at alpha 0.05
    assert (result.ci_low, result.ci_high) == pytest.approx(
        (diff.mean() - half, diff.mean() + half)
    )
    assert result.equivalent and result.confidence == pytest.approx(0.90)
    assert not stats.tost(arm, base, 0.005).equivalent


def test_tost_and_its_interval_always_agree():
    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(2, 12))
        base = rng.normal(4.0, 0.1, n)
        arm = base + rng.normal(rng.normal(0, 0.02), rng.uniform(0.001, 0.05), n)
        margin, alpha = float(rng.uniform(0.005, 0.06)), float(rng.choice([0.05, 0.025]))
        e = stats.tost(arm, base, margin, alpha)
        assert e.equivalent == (-margin < e.ci_low and e.ci_high < margin)


def test_censored_sign_test_counts_a_miss_as_slowest():
    # A textbook sign test: 9 of 10 pairs one way, p = 2 × 11/1024 = 0.0215.
    arm = [1.0] * 9 + [3.0]
    base = [2.0] * 10
    result = stats.censored_sign_test(arm, base)
    assert (result.faster, result.slower, result.ties) == (9, 1, 0)
    assert result.p == pytest.approx(2 * 11 / 1024)
    # None: never reached (censored at its training time): slower than any reached time.
    result = stats.censored_sign_test([1.0, None, None, 5.0], [2.0, 9.0, None, 4.0])
    assert (result.faster, result.slower, result.ties) == (1, 2, 1)
    assert result.p == pytest.approx(scipy_stats.binomtest(1, 3).pvalue)


def test_log_rank_matches_the_textbook_leukemia_trial():
    """Freireich's 6-MP trial (Gehan 1965; Kleinbaum & Klein, Survival Analysis, ch. 2): weeks
    in remission, + censored. 6-MP: 9 relapses where 19.25 were expected; log-rank chi-square
    16.79 on 1 df, p = 4.17e-5."""
    drug = [6, 6, 6, "6+", 7, "9+", 10, "10+", "11+", 13, 16, "17+", "19+", "20+", 22, 23,
            "25+", "32+", "32+", "34+", "35+"]  # fmt: skip
    placebo = [1, 1, 2, 2, 3, 4, 4, 5, 5, 8, 8, 8, 8, 11, 11, 12, 12, 15, 17, 22, 23]

    def reached(weeks):
        return [None if str(w).endswith("+") else float(w) for w in weeks]

    def ended(weeks):
        return [float(str(w).rstrip("+")) for w in weeks]

    result = stats.log_rank(reached(drug), ended(drug), reached(placebo), ended(placebo))
    assert result.observed == 9 and result.expected == pytest.approx(19.25, abs=0.005)
    assert result.chisq == pytest.approx(16.79, abs=0.005)
    assert result.p == pytest.approx(4.17e-5, rel=0.01)


def _log_rank_by_hand(arm_times, arm_events, base_times, base_events):
    """The textbook log-rank: over the distinct event times, O − E of the arm and the
    hypergeometric variance, chi-square (O − E)² / V on 1 df."""
    times = np.array([*arm_times, *base_times])
    events = np.array([*arm_events, *base_events], dtype=bool)
    in_arm = np.arange(times.size) < len(arm_times)
    o_minus_e = variance = 0.0
    for when in np.unique(times[events]):
        at_risk = times >= when
        n, n_arm = at_risk.sum(), (at_risk & in_arm).sum()
        d, d_arm = (events & (times == when)).sum(), (events & (times == when) & in_arm).sum()
        o_minus_e += d_arm - d * n_arm / n
        if n > 1:
            variance += d * (n_arm / n) * (1 - n_arm / n) * (n - d) / (n - 1)
    chisq = o_minus_e**2 / variance
    return chisq, scipy_stats.chi2.sf(chisq, 1)


def test_log_rank_matches_the_hand_formula_and_has_no_nan():
    # seconds to the target; None: never reached, censored at the run's training seconds
    arm, arm_seconds = [3.1, None, 2.0, 4.4, None], [9.0, 9.5, 9.0, 9.2, 8.8]
    base, base_seconds = [2.5, 1.9, 3.0, None, 2.2], [9.1, 9.0, 9.3, 9.4, 9.0]
    chisq, p = _log_rank_by_hand(
        [t or s for t, s in zip(arm, arm_seconds, strict=True)], [t is not None for t in arm],
        [t or s for t, s in zip(base, base_seconds, strict=True)], [t is not None for t in base],
    )  # fmt: skip
    result = stats.log_rank(arm, arm_seconds, base, base_seconds)
    assert (result.chisq, result.p) == pytest.approx((chisq, p))
    assert result.observed == 3 and result.expected > 3  # the arm reaches it later: fewer seen
    # No event, or no one else at risk at any event time: survdiff has no variance; p is 1.
    assert stats.log_rank([None, None], [5.0, 5.0], [None], [5.0]).p == 1.0
    assert stats.log_rank([1.0, 2.0], [5.0, 5.0], [None], [0.5]).p == 1.0


def test_proportion_interval_is_clopper_pearsons():
    # Textbook exact intervals: 0 of 10, upper 1 − 0.025^(1/10); 1 of 10, 0.0025 … 0.4450.
    assert stats.proportion_interval(0, 10) == pytest.approx((0.0, 1 - 0.025 ** (1 / 10)))
    assert stats.proportion_interval(1, 10) == pytest.approx((0.0025, 0.4450), abs=5e-5)
    with pytest.raises(ValueError, match="0 <= k <= n"):
        stats.proportion_interval(3, 2)


def test_prediction_interval_matches_statsmodels_ols():
    import statsmodels.api as sm

    values = [0.12, 0.08, 0.15, 0.11, 0.05]
    fit = sm.OLS(values, np.ones(5)).fit()
    frame = fit.get_prediction(np.ones(1)).summary_frame(alpha=0.05)
    low, high = stats.prediction_interval(values)
    assert (low, high) == pytest.approx((frame["obs_ci_lower"][0], frame["obs_ci_upper"][0]))


# ----------------------------------------------------------------------------- verdicts


def _records(arm: str, values: list, statuses: dict | None = None) -> list[RunRecord]:
    statuses = statuses or {}
    return [
        RunRecord(arm, seed, statuses.get(seed, "ok"), [(100, v)] if v is not None else [], 100)
        for seed, v in enumerate(values)
    ]


def test_verdicts_read_the_bonferroni_p_beside_its_simultaneous_interval():
    base = [4.10, 4.20, 4.15, 4.05, 4.12]
    better = [v - d for v, d in zip(base, [0.02, 0.025, 0.018, 0.022, 0.021], strict=True)]
    noisy = [v + d for v, d in zip(base, [0.01, -0.012, 0.02, -0.004, 0.006], strict=True)]
    records = _records("baseline", base) + _records("better", better) + _records("noisy", noisy)
    results = report.analyse(
        [("baseline", "-"), ("better", "a"), ("noisy", "b")], records, "final_val_loss"
    )
    raw = [scipy_stats.ttest_rel(better, base).pvalue, scipy_stats.ttest_rel(noisy, base).pvalue]
    assert [results[1].p, results[2].p] == pytest.approx([min(1, 2 * p) for p in raw])
    assert results[1].verdict.startswith("better vs baseline: -0.0212 nats (97.5% CI, ")
    assert results[1].verdict.endswith(
        "(Bonferroni-adjusted over 2 arms) over 5 paired seeds: better"
    )
    diff = np.subtract(noisy, base)
    low, high = scipy_stats.t.interval(
        0.975, 4, loc=diff.mean(), scale=diff.std(ddof=1) / math.sqrt(5)
    )
    assert f"(97.5% CI, simultaneous over 2 arms {low:+.4f} … {high:+.4f})" in results[2].verdict
    mde = stats.detectable_effect(5, diff.std(ddof=1), alpha=0.025)
    assert results[2].verdict.endswith(
        f"no difference detected at 5 seeds; at 5 seeds only a difference of ±{mde:.4f} nats or "
        "more is detected with 80% power (--sesoi X tests equivalence within ±X)"
    )
    assert "would detect" not in results[2].verdict  # no observed power


def test_the_issues_two_seed_case_never_says_two_would_detect():
    """Issue 51, item 1: +0.6333 nats at 2 seeds, p = 0.070, used to say "about 2 would
    detect 0.6333"."""
    base = [4.0, 4.1]
    half = 0.09902048024107062 / math.sqrt(2)
    slow = [4.0 + 0.6333153247833252 - half, 4.1 + 0.6333153247833252 + half]
    records = _records("baseline", base) + _records("slow", slow)
    arms = [("baseline", "-"), ("slow", "x")]
    verdict = report.analyse(arms, records, "final_val_loss")[1].verdict
    assert "p = 0.070 over 2 paired seeds: no difference detected at 2 seeds" in verdict
    assert "about 2" not in verdict
    verdict = report.analyse(arms, records, "final_val_loss", sesoi=0.6333)[1].verdict
    assert "not shown equivalent within ±0.6333 nats" in verdict
    assert verdict.endswith("about 3 seeds would detect ±0.6333 with 80% power")


def test_an_interval_excluding_zero_is_never_beside_no_difference():
    """Issue 51, item 3 (an unadjusted interval beside a Holm p), over many synthetic cases:
    better/worse exactly when the printed interval excludes 0; "equivalent" exactly when the
    printed TOST interval lies inside ±sesoi."""
    rng = np.random.default_rng(2)
    pattern = re.compile(r"CI(?:, simultaneous over \d+ arms)? ([+-][\d.]+) … ([+-][\d.]+)\)")
    for case in range(60):
        n, arms = int(rng.integers(2, 9)), int(rng.integers(1, 4))
        base = list(rng.normal(4.0, 0.1, n))
        records = _records("baseline", base)
        names = [("baseline", "-")]
        for index in range(arms):
            shift = rng.normal(0, 0.03)
            values = [b + shift + rng.normal(0, rng.uniform(0.002, 0.04)) for b in base]
            records += _records(f"a{index}", values)
            names.append((f"a{index}", "x"))
        sesoi = float(rng.uniform(0.01, 0.05)) if case % 2 else None
        for result in report.analyse(names, records, "final_val_loss", sesoi)[1:]:
            low, high = (float(x) for x in pattern.search(result.verdict).groups())
            excludes = result.paired.ci_low > 0 or result.paired.ci_high < 0
            decided = result.verdict.endswith((": better", ": worse")) or (
                " by less than ±" in result.verdict
            )
            assert decided == excludes, result.verdict
            assert (low, high) == (round(result.paired.ci_low, 4), round(result.paired.ci_high, 4))
            if sesoi is not None:
                e = result.equivalence
                inside = -sesoi < e.ci_low and e.ci_high < sesoi
                said = "equivalent within" in result.verdict and "not shown" not in result.verdict
                assert inside == e.equivalent == (said or " by less than ±" in result.verdict)


def test_equivalence_is_said_within_the_sesoi():
    base = [4.10, 4.20, 4.15, 4.05, 4.12, 4.18]
    same = [v + d for v, d in zip(base, [0.001, -0.002, 0.0015, -0.001, 0.0005, 0.0], strict=True)]
    records = _records("baseline", base) + _records("same", same)
    result = report.analyse([("baseline", "-"), ("same", "x")], records, "final_val_loss", 0.01)[1]
    e = stats.tost(same, base, 0.01)
    assert e.equivalent
    assert result.verdict.endswith(
        f"; equivalent within ±0.01 nats (TOST 90% CI {e.ci_low:+.4f} … {e.ci_high:+.4f}, "
        f"{'p < 0.001' if e.p < 0.001 else f'p = {e.p:.3f}'})"
    )


def test_time_to_target_counts_misses_as_censored_and_never_calls_the_misser_faster():
    """Issue 51, item 5: an arm that missed at 2 of 4 seeds was reported faster over its 2
    remaining pairs; one that never reached the target got "no test"."""

    def timed(arm, times, train_seconds=10.0):
        return [
            RunRecord(arm, seed, "ok", [(100, 1.0)], 100, "", t, train_seconds)
            for seed, t in enumerate(times)
        ]

    records = timed("baseline", [5.0, 5.1, 5.2, 5.3]) + timed("miss", [4.9, None, 5.0, None])
    records += timed("never", [None] * 4)
    results = report.analyse(
        [("baseline", "-"), ("miss", "x"), ("never", "y")], records, "time_to_target"
    )
    miss, never = results[1].verdict, results[2].verdict
    assert "reached within budget 2/4 (baseline 4/4); faster at 2, slower at 2, tied at 0" in miss
    assert miss.endswith(": no difference detected")
    assert "reached within budget 0/4 (baseline 4/4); faster at 0, slower at 4" in never
    assert "no test" not in never
    p = min(1.0, 2 * scipy_stats.binomtest(0, 4).pvalue)
    assert f"sign test p = {p:.3f} (Bonferroni-adjusted over 2 arms)" in never


def test_the_aa_report_states_its_false_positive_rate():
    """Issue 51, item 7: the A/A mode is there to calibrate the false-positive rate; its
    report said only one verdict."""
    rng = np.random.default_rng(5)
    base = list(rng.normal(4.0, 0.1, 13))
    same = list(np.add(base, rng.normal(0.0, 0.02, 13)))
    same[6:9] = [b + 0.05 + 0.001 * i for i, b in enumerate(base[6:9])]  # one lucky block
    records = _records("baseline", base) + _records("aa", same)
    results = report.analyse([("baseline", "-"), ("aa", "A/A")], records, "final_val_loss")
    blocks = [range(i, i + 3) for i in (0, 3, 6, 9)]  # seed 12 is left over
    called = sum(
        scipy_stats.ttest_rel([same[s] for s in b], [base[s] for s in b]).pvalue < 0.05
        for b in blocks
    )
    assert called >= 1
    low, high = scipy_stats.binomtest(called, 4).proportion_ci(method="exact")
    words = report.aa_calibration(results[1], results[0], "final_val_loss")
    assert words == (
        f"A/A calibration (the config against itself): {called} of 4 disjoint blocks of 3 "
        f"paired seeds called different by the paired t-test at 0.05: an observed "
        f"false-positive rate of {100 * called / 4:.4g}% (95% Clopper–Pearson CI "
        f"{100 * low:.4g}% … {100 * high:.4g}%), consistent with the nominal 5%."
    )
    few = report.analyse([("baseline", "-"), ("aa", "A/A")], records[:2] + records[13:15],
                         "final_val_loss")  # fmt: skip
    assert "too few paired seeds (2) for one block of 3; --seeds 30 gives 10" in (
        report.aa_calibration(few[1], few[0], "final_val_loss")
    )


def _timed(arm, times, train_seconds=10.0, statuses=None):
    statuses = statuses or {}
    return [
        RunRecord(arm, seed, statuses.get(seed, "ok"), [(100, 1.0)], 100, "", t, train_seconds)
        for seed, t in enumerate(times)
    ]


def test_time_to_target_says_the_log_rank_beside_the_sign_test_and_never_calls_a_misser_faster():
    """Issue 51, item 4: an arm first at 9 of 10 seeds (sign test p = 0.021) that misses the
    target at the tenth is not called faster; the log-rank test over the runs is said beside."""
    base = [5.0 + 0.1 * s for s in range(10)]
    arm = [t - 1.0 for t in base[:9]] + [None]
    records = _timed("baseline", base) + _timed("miss", arm)
    result = report.analyse([("baseline", "-"), ("miss", "x")], records, "time_to_target")[1]
    _, p = _log_rank_by_hand(
        [t or 10.0 for t in arm], [t is not None for t in arm], base, [True] * 10
    )
    assert result.log_rank.p == pytest.approx(p)
    assert "reached within budget 9/10 (baseline 10/10); faster at 9, slower at 1" in result.verdict
    assert f"sign test p = {scipy_stats.binomtest(9, 10).pvalue:.3f}" in result.verdict
    assert f"; log-rank over the runs (unpaired) p = {p:.3f}: reached the target 9 times, " in (
        result.verdict
    )
    assert result.verdict.endswith(
        ": not called faster: it comes first at more seeds but reaches the target less often"
    ), result.verdict
    results = report.analyse([("baseline", "-"), ("miss", "x")], records, "time_to_target")
    text = report.markdown(results, "time_to_target", list(range(10)), "t")
    assert f"| miss | 9/10 | 9 / 1 / 0 | {scipy_stats.binomtest(9, 10).pvalue:.3g} | 9 / " in text


def test_time_to_target_calls_a_diverged_arm_worse_and_notes_the_sign_tests_floor():
    records = _timed("baseline", [5.0, 5.1, 5.2]) + _timed(
        "hot", [None] * 3, statuses=dict.fromkeys(range(3), "diverged")
    )
    records += _timed("quick", [4.0, 4.1, 4.2])
    results = report.analyse(
        [("baseline", "-"), ("hot", "x"), ("quick", "y")], records, "time_to_target"
    )
    assert results[1].verdict.startswith(
        "hot vs baseline: worse (diverged at 3/3 seeds); reached within budget 0/3"
    ), results[1].verdict
    text = report.markdown(results, "time_to_target", [0, 1, 2], "t")
    assert "At 3 seeds the exact sign test's p cannot go below 0.25 (2/2^n" in text


def test_a_diverged_arm_is_worse_and_named():
    base = [4.10, 4.20, 4.15]
    records = _records("baseline", base) + _records(
        "hot", [None] * 3, dict.fromkeys(range(3), "diverged")
    )
    verdict = report.analyse([("baseline", "-"), ("hot", "x")], records, "final_val_loss")[
        1
    ].verdict
    assert verdict.startswith("hot vs baseline: worse (diverged at 3/3 seeds)"), verdict


def _figure_axes(results, metric, **kwargs):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    figure = report.draw(results, metric, **kwargs)
    plt.close(figure)
    return figure.axes  # the curves, the differences over the steps, the metric's differences


def test_the_figures_bar_is_beside_its_points_and_a_diverged_arm_is_labelled():
    """Issue 51, item 9: the mean/CI bar was drawn on the points' column, at the axes' border
    with one arm and clipped for the last; a diverged arm's tick was empty."""
    from matplotlib.collections import PathCollection

    base = [4.10, 4.20, 4.15, 4.05]
    records = _records("baseline", base) + _records(
        "hot", [None] * 4, dict.fromkeys(range(4), "diverged")
    )
    records += _records("slow", [v + d for v, d in zip(base, [0.1, 0.2, 0.15, 0.12], strict=True)])
    arms = [("baseline", "-"), ("hot", "x"), ("slow", "y")]
    for arms_drawn in (arms[::2], arms):  # one arm alone; the last of two
        results = report.analyse(arms_drawn, records, "final_val_loss")
        diffs = _figure_axes(results, "final_val_loss")[2]
        low, high = diffs.get_xlim()
        index = len(arms_drawn) - 2  # slow: the last arm
        points = [c for c in diffs.collections if isinstance(c, PathCollection)]
        assert len(points) == 1
        x_points = points[0].get_offsets()[:, 0]
        assert len(x_points) == 4 and np.all(np.abs(x_points - index) < 0.5)
        (bar,) = diffs.containers
        x_bar = bar.lines[0].get_xdata()[0]
        assert x_points.max() < x_bar < min(index + 0.5, high), (x_points, x_bar, high)
        assert x_bar - x_points.mean() < 0.4  # beside them, not off them
        assert bar.lines[0].get_ydata()[0] == pytest.approx(results[-1].paired.mean_diff)
        assert low < x_points.min()
    labels = [t.get_text() for t in diffs.get_xticklabels()]
    assert labels == ["hot\n(diverged at 4/4 seeds)", "slow"]


def test_the_figure_draws_the_target_and_the_sweeps_value():
    """Issue 51, item 9: the time-to-target figure had no target line; the recheck figure did
    not mark the sweep's value."""
    from matplotlib.collections import PathCollection

    records = _timed("baseline", [5.0, 5.1, 5.2]) + _timed("quick", [4.0, 4.1, 4.2])
    results = report.analyse([("baseline", "-"), ("quick", "y")], records, "time_to_target")
    curves = _figure_axes(results, "time_to_target", target=1.5)[0]
    lines = {line.get_label(): list(line.get_ydata()) for line in curves.lines}
    assert lines["target 1.5"] == [1.5, 1.5]
    assert "target 1.5" in [t.get_text() for t in curves.get_legend().get_texts()]

    records = _records("baseline", [4.1, 4.2, 4.15]) + _records("sweep_best", [4.0, 4.05, 4.1])
    results = report.analyse([("baseline", "-"), ("sweep_best", "y")], records, "best_val_loss")
    curves, _, diffs = _figure_axes(results, "best_val_loss", sweep_value=3.9, tuned_diff=-0.2)
    lines = {line.get_label(): list(line.get_ydata()) for line in curves.lines}
    assert lines["the sweep's value 3.9000"] == [3.9, 3.9]
    (star,) = [
        c for c in diffs.collections
        if isinstance(c, PathCollection) and c.get_label() == "at the sweep's tuned seed"
    ]  # fmt: skip
    assert star.get_offsets()[0][1] == pytest.approx(-0.2)


def test_a_diverged_run_is_named_and_left_out_of_the_pairs(tmp_path):
    base = [4.10, 4.20, 4.15]
    worse = [4.50, None, 4.60]
    records = _records("baseline", base) + _records("hot", worse, {1: "diverged"})
    records[-2].error = "non-finite training loss nan at step 3"
    lines = report.write(
        tmp_path,
        [("baseline", "unchanged"), ("hot", "optim.lr=1")],
        records,
        [0, 1, 2],
        "final_val_loss",
        {(r.arm, r.seed): f"dir-{r.arm}-{r.seed}" for r in records},
    )
    # seeds 0 and 2: differences 0.40 and 0.45, t = 0.425 / (0.0354 / sqrt 2) = 17 on 1 df
    p = 2 * scipy_stats.t.sf(0.425 / (math.sqrt(0.05**2 / 2) / math.sqrt(2)), 1)
    assert lines[0].startswith("hot vs baseline: +0.4250 nats (95% CI ")
    assert lines[0].endswith(
        f"p = {p:.3f} over 2 paired seeds: worse, and diverged at 1/3 seeds; left out of the "
        "pairs: hot seed 1 diverged"
    ), lines[0]
    text = (tmp_path / "report-final_val_loss.md").read_text()
    assert "| 1 | 4.2000 | diverged after step 100 |" in text
    assert "- hot seed 1: diverged: non-finite training loss nan at step 3" in text
    assert "At 2 seeds the exact Wilcoxon p cannot go below 0.5 (2/2^n)" in text
    rows = list(csv.DictReader((tmp_path / "results-final_val_loss.csv").open()))
    assert [(r["arm"], r["seed"], r["status"], r["value"]) for r in rows[3:]] == [
        ("hot", "0", "ok", "4.5"),
        ("hot", "1", "diverged", ""),
        ("hot", "2", "ok", "4.6"),
    ]


def test_one_report_per_metric(tmp_path):
    records = _records("baseline", [4.1, 4.2, 4.15]) + _records("x", [4.0, 4.1, 4.1])
    args = ([("baseline", "-"), ("x", "y")], records, [0, 1, 2])
    dirs = {(r.arm, r.seed): "d" for r in records}
    report.write(tmp_path, *args, "final_val_loss", dirs)
    first = (tmp_path / "report-final_val_loss.md").read_text()
    report.write(tmp_path, *args, "best_val_loss", dirs)
    assert (tmp_path / "report-final_val_loss.md").read_text() == first
    assert (tmp_path / "report-best_val_loss.md").exists()
    assert (tmp_path / "results-best_val_loss.csv").exists()


# ----------------------------------------------------------------------------- refusals


def test_arms_keep_a_comma_inside_a_value_and_the_named_baseline_comes_first(tmp_path):
    comparison, _ = command.check(
        ["--config", TINY, "--out", str(tmp_path / "out"), "--seeds", "3,7",
         "--arm", "m:step_metrics=grad_norm_by_tag,update_ratio,model.norm=rmsnorm",
         "--arm", "ln", "--baseline", "ln", "--config.optim.lr=1e-3"]
    )  # fmt: skip
    assert [(arm.name, arm.overrides) for arm in comparison.arms] == [
        ("ln", {}),
        ("m", {"step_metrics": "grad_norm_by_tag,update_ratio", "model.norm": "rmsnorm"}),
    ]
    assert comparison.fixed == {"optim.lr": 1e-3} and comparison.seeds == [3, 7]
    assert comparison.values(comparison.arms[1], 7)["seed"] == 7
    assert comparison.run_dir(comparison.arms[1], 7) == tmp_path / "out" / "m" / "seed-7"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--seeds", "3", "--arm", "x:model.nrm=rmsnorm"],
            "--arm x: unknown config key config.model.nrm (did you mean 'norm'?)",
        ),
        (
            ["--seeds", "3", "--arm", "x:optim.lr=3e-3"],
            "arms baseline and x differ in nothing (the same config once defaults are filled "
            "in); drop one or change a setting.",
        ),
        (
            ["--seeds", "1", "--arm", "x:log_every=3"],
            "--seeds 1: a paired test needs at least 2 seeds; give --seeds 5 or more.",
        ),
        (["--seeds", "0,0", "--arm", "x:log_every=3"], "--seeds 0,0 repeats 0"),
        (["--seeds", "3"], "a comparison needs two arms"),
        (["--seeds", "3", "--arm", "x:seed=1"], "--arm x sets seed"),
        (["--seeds", "3", "--arm", "x:optim.lr=1e-6"], "--arm x (optim.lr=1e-06): config."),
        (
            ["--seeds", "0,2147483648", "--arm", "x:log_every=3"],
            "--seeds: config.seed=2147483648 is out of range: it must be an integer >= 0 and "
            "< 2147483648. Give seeds the config accepts.",
        ),
        (["--seeds", "-1,2", "--arm", "x:log_every=3"], "--seeds -1,2: seeds are 0 or more"),
        (
            ["--seeds", "10000000000", "--arm", "x:log_every=3"],
            "--seeds 10000000000: 10,000,000,000 seeds is more than 100,000",
        ),
        (["--seeds", "3", "--arm", "x:log_every=3", "--sesoi", "-0.1"], "--sesoi -0.1 must be"),
        (["--seeds", "3", "--aa", "--arm", "x:log_every=3"], "--aa compares the config with"),
        *(
            (
                ["--seeds", "2", "--arm", "x:log_every=3", "--metric", "time_to_target"]
                + ["--target", target],
                f"--target {shown} must be a positive finite val loss",
            )
            for target, shown in (("-1", "-1.0"), ("nan", "nan"), ("inf", "inf"), ("0", "0.0"))
        ),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    status = command.main(["--config", TINY, "--out", str(out), *args])
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith(f"minigpt-jax compare: error: {message}"), err
    assert err.count("\n") == 1
    assert not out.exists()


def test_an_unusable_out_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "out"
    status = command.main(
        ["--config", TINY, "--out", str(out), "--seeds", "2", "--arm", "x:log_every=3"]
    )
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith(f"minigpt-jax compare: error: --out {out} cannot be written"), err


def _saved(out, arguments, code=None):
    comparison = command.check(["--config", TINY, "--out", str(out), *arguments])[0]
    out.mkdir(exist_ok=True)
    plan.write_identity(comparison, ["x"], code or plan.code_version())
    return comparison


def test_seeds_and_arms_may_grow_but_not_across_code_versions(tmp_path):
    out = tmp_path / "out"
    _saved(out, ["--seeds", "3", "--arm", "x:log_every=3"])
    grown = command.check(
        [
            "--config",
            TINY,
            "--out",
            str(out),
            "--seeds",
            "5",
            "--arm",
            "x:log_every=3",
            "--arm",
            "y:log_every=7",
        ]
    )[0]
    code = plan.code_version()
    assert plan.check_out(grown, code) == "grow"
    fewer = command.check(
        ["--config", TINY, "--out", str(out), "--seeds", "0,1", "--arm", "x:log_every=3"]
    )[0]
    with pytest.raises(plan.CompareError, match="holds another comparison: --seeds"):
        plan.check_out(fewer, code)
    with pytest.raises(plan.CompareError, match="was trained by minigpt_jax 0.1.0 at commit old"):
        _saved(out, ["--seeds", "3", "--arm", "x:log_every=3"], {**code, "commit": "old"})
        plan.check_out(grown, code)


def test_every_run_is_scored_on_one_fixed_eval_set(tmp_path):
    comparison = command.check(
        [
            "--config",
            TINY,
            "--out",
            str(tmp_path / "o"),
            "--seeds",
            "2",
            "--arm",
            "x:log_every=3",
            "--eval_tokens",
            "500",
        ]
    )[0]
    for arm in comparison.arms:
        for seed in comparison.seeds:
            values = comparison.values(arm, seed)
            assert values["eval_seed"] == 0 and values["eval_batches"] == 8  # 500 / (4 × 16)
    assert comparison.eval_tokens == {"baseline": 512, "x": 512}
    aa = command.check(["--config", TINY, "--out", str(tmp_path / "a"), "--seeds", "2", "--aa"])[0]
    assert [arm.name for arm in aa.arms] == ["baseline", "aa"]
    assert aa.run_dir(aa.arms[1], 1).name == f"seed-{1 + 2**30}"  # disjoint from the baseline's


def test_an_in_process_stop_is_said_on_the_terminal_not_in_the_runs_log(
    tmp_path, monkeypatch, capsys
):
    """Issue 51, item 9: the stop line went to the run's train.log (stdout was redirected)."""
    import types

    from minigpt_apps.compare import runs
    from minigpt_jax.train import loop

    comparison = command.check(
        ["--config", TINY, "--out", str(tmp_path / "o"), "--seeds", "2", "--arm", "x:log_every=3"]
    )[0]

    def stopped(config, workdir, progress):
        print("the run's own output")
        return types.SimpleNamespace(interrupted_by="SIGTERM", step=3)

    monkeypatch.setattr(loop, "train_and_evaluate", stopped)
    with runs.CompareStop() as stop:
        runs.run_here(comparison, comparison.runs()[:1], stop, print)  # the command's own say
    said = capsys.readouterr().out
    assert said == "baseline seed 0: stopped by SIGTERM at step 3, checkpoint kept\n"
    log = (tmp_path / "o" / "baseline" / "seed-0" / "train.log").read_text()
    assert log == "the run's own output\n"


def test_a_killed_runs_log_is_on_disk_and_a_resume_keeps_it_and_says_so(
    tmp_path, monkeypatch, capsys
):
    """Issue 51, item 9: after kill -9 of an in-process comparison the resumed train.log had
    lost its earlier lines: they sat in the log's buffer, which kill -9 never writes. Each line
    is on disk when printed; a resume appends to the log and says so on the terminal."""
    import types

    from minigpt_apps.compare import runs
    from minigpt_jax.train import loop

    comparison = command.check(
        ["--config", TINY, "--out", str(tmp_path / "o"), "--seeds", "2", "--arm", "x:log_every=3"]
    )[0]
    run_dir = tmp_path / "o" / "baseline" / "seed-0"
    on_disk = []

    def killed(config, workdir, progress):
        print("step 8: train loss 4.1")
        on_disk.append((run_dir / "train.log").read_text())  # what a kill -9 here would leave
        return types.SimpleNamespace(interrupted_by="SIGTERM", step=8)

    monkeypatch.setattr(loop, "train_and_evaluate", killed)
    with runs.CompareStop() as stop:
        runs.run_here(comparison, comparison.runs()[:1], stop, print)
    assert on_disk == ["step 8: train loss 4.1\n"]
    (run_dir / "checkpoints" / "8").mkdir(parents=True)
    capsys.readouterr()
    with runs.CompareStop() as stop:
        runs.run_here(comparison, comparison.runs()[:1], stop, print)
    assert capsys.readouterr().out.startswith("baseline seed 0: resuming from its checkpoint\n")
    assert (run_dir / "train.log").read_text() == "step 8: train loss 4.1\n" * 2


def test_another_comparison_in_out_is_refused_naming_what_differs(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    arms = ["--arm", "x:log_every=3"]
    identity = command.check(["--config", TINY, "--out", str(out), "--seeds", "3", *arms])[0]
    code = plan.code_version()
    (out / "compare.json").write_text(json.dumps({"identity": identity.identity, "code": code}))
    before = sorted(p.name for p in out.iterdir())
    status = command.main(["--config", TINY, "--out", str(out), "--seeds", "0,1", *arms])
    err = capsys.readouterr().err
    assert status == 2
    assert err == (
        f"minigpt-jax compare: error: --out {out} holds another comparison: --seeds ([0, 1, 2] "
        f"then, [0, 1] now); rerun its own command (in {out / 'compare.json'}) to resume "
        "it, or give another --out.\n"
    )
    assert sorted(p.name for p in out.iterdir()) == before


# ----------------------------------------------------------------------------- the command line

ARMS = [
    "--seeds", "3",
    "--arm", "same:log_every=4",  # bookkeeping only: the same training as the baseline
    "--arm", "lowlr:optim.lr=1e-6,optim.min_lr=0",
    "--config.num_steps=8",
    "--eval_tokens", "512",  # 8 batches of 4 × 16 tokens: quick on a CPU
]  # fmt: skip


def _compare(env, out, *extra, status=0):
    result = subprocess.run(
        [sys.executable, "-m", "minigpt_jax", "compare", "--config", TINY, "--out", str(out)]
        + ARMS
        + list(extra),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert result.returncode == status, result.stdout + result.stderr
    return result.stdout if status == 0 else result


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("jax_cache")
    return {**os.environ, "PYTHONPATH": str(REPO), "MINIGPT_JAX_COMPILATION_CACHE": str(cache)}


@pytest.fixture(scope="module")
def compared(env, tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "out"
    return out, _compare(env, out)


def _values(out):
    rows = list(csv.DictReader((Path(out) / "results-final_val_loss.csv").open()))
    return {(r["arm"], int(r["seed"])): (r["status"], float(r["value"])) for r in rows}


@pytest.mark.slow
def test_cli_identical_arms_agree_and_a_crippled_lr_is_worse(compared):
    out, stdout = compared
    assert "3 arms × 3 seeds = 9 runs" in stdout and "9 to run, 0 already ended" in stdout
    assert "same vs baseline: the same value at every one of 3 paired seeds: no difference" in (
        stdout
    )
    lowlr = next(line for line in stdout.splitlines() if line.startswith("lowlr vs baseline"))
    assert lowlr.endswith("(Bonferroni-adjusted over 2 arms) over 3 paired seeds: worse"), lowlr
    values = _values(out)
    for seed in range(3):
        for arm in ("baseline", "same", "lowlr"):
            run_dir = out / arm / f"seed-{seed}"
            last = [r["val_loss"] for r in read_metrics(run_dir) if "val_loss" in r][-1]
            assert values[(arm, seed)] == ("ok", last)
            config = (run_dir / "config.py").read_text()
            assert f"'seed': {seed}" in config
            assert "'eval_seed': 0" in config and "'eval_batches': 8" in config  # the fixed set
        assert values[("same", seed)] == values[("baseline", seed)]  # paired: the same batches
        assert values[("lowlr", seed)][1] > values[("baseline", seed)][1]
    assert len({values[("baseline", s)] for s in range(3)}) == 3  # the seeds differ
    # The report's statistics are scipy's on the recorded values.
    base = [values[("baseline", s)][1] for s in range(3)]
    low = [values[("lowlr", s)][1] for s in range(3)]
    p = 2 * scipy_stats.ttest_rel(low, base).pvalue  # Bonferroni over the 2 arms
    assert p < 0.05
    text = (out / "report-final_val_loss.md").read_text()
    assert f"| {p:.3g} | 3 |" in text
    low_ci, high_ci = scipy_stats.t.interval(
        0.975, 2, loc=np.mean(np.subtract(low, base)),
        scale=scipy_stats.sem(np.subtract(low, base)),
    )  # fmt: skip
    assert f"({low_ci:+.4f} … {high_ci:+.4f})" in text  # the simultaneous interval
    for said in ("- command: `minigpt-jax compare --config", "commit ", "jax ", "- machine: ",
                 "- date: ", "- eval set: 512 val tokens a pass"):  # fmt: skip
        assert said in text, said
    assert (out / "figure-final_val_loss.png").stat().st_size > 0


@pytest.mark.slow
def test_cli_rerun_trains_nothing_twice(compared, env):
    out, _ = compared
    metrics = {p: p.read_bytes() for p in sorted(out.glob("*/seed-*/metrics.jsonl"))}
    assert len(metrics) == 9
    again = _compare(env, out)
    assert "9 runs in" in again and "0 to run, 9 already ended" in again
    assert {p: p.read_bytes() for p in metrics} == metrics
    # One run gone, one whose end was not recorded (its worker killed after training): the
    # rerun trains the first again and only reads the second.
    values = _values(out)
    gone, unrecorded = out / "lowlr" / "seed-2", out / "same" / "seed-1"
    subprocess.run(["rm", "-r", str(gone)], check=True)
    (unrecorded / "compare_end.json").unlink()
    third = _compare(env, out)
    assert "2 to run, 7 already ended" in third
    assert (unrecorded / "metrics.jsonl").read_bytes() == metrics[unrecorded / "metrics.jsonl"]
    steps = [r["step"] for r in read_metrics(gone) if "train_loss" in r]
    assert steps == sorted(set(steps))  # each step once
    assert _values(out) == values  # the same seed trains to the same value


@pytest.mark.slow
def test_cli_kill_9_then_a_rerun_resumes_from_the_checkpoints(tmp_path, env):
    out = tmp_path / "out"
    args = ["--config", TINY, "--out", str(out), "--seeds", "2", "--arm", "same:log_every=4"]
    args += ["--config.num_steps=16", "--config.checkpoint_every=8", "--workers", "2"]
    compare = [sys.executable, "-m", "minigpt_jax", "compare", *args]
    process = subprocess.Popen(compare, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
    first = out / "baseline" / "seed-0"
    deadline = time.monotonic() + 300
    while not (first / "checkpoints" / "8").exists():
        assert time.monotonic() < deadline, "timed out waiting for the first checkpoint"
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)  # its children get SIGTERM: each saves and ends
    process.wait()
    result = subprocess.run(compare, env=env, cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 runs in" in result.stdout and "0 already ended" in result.stdout
    assert "resumed from step" in (first / "train.log").read_text()
    for run_dir in out.glob("*/seed-*"):
        steps = [r["step"] for r in read_metrics(run_dir) if "train_loss" in r]
        assert steps == sorted(set(steps)) and steps[-1] == 16, run_dir  # each step once
    values = _values(out)
    assert values[("same", 0)] == values[("baseline", 0)]  # resumed, still the same training
    assert values[("same", 1)] == values[("baseline", 1)]


@pytest.mark.slow
def test_cli_a_worker_child_killed_with_9_fails_the_command_and_a_rerun_resumes_it(tmp_path, env):
    """Issue 51, item 2 through the command line: kill -9 of one `--workers` child (the
    `minigpt-jax train` of baseline seed 0, its PID read from its run.lock) used to leave a
    verdict over the other seeds and exit 0. Now the command says the run stopped, exits 3
    naming it, and the same command resumes it from its checkpoint."""
    out = tmp_path / "out"
    args = ["--config", TINY, "--out", str(out), "--seeds", "2", "--arm", "same:log_every=4"]
    args += ["--config.num_steps=400", "--config.checkpoint_every=50", "--workers", "2"]
    args += ["--config.eval_every=200", "--eval_tokens", "512"]
    compare = [sys.executable, "-m", "minigpt_jax", "compare", *args]
    process = subprocess.Popen(
        compare, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    first = out / "baseline" / "seed-0"
    deadline = time.monotonic() + 300
    while not (first / "checkpoints" / "50").exists():
        assert time.monotonic() < deadline, "timed out waiting for the first checkpoint"
        time.sleep(0.05)
    pid = int((first / "run.lock").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 3, stdout + stderr
    assert "baseline seed 0: stopped by SIGKILL; rerun the same command" in stdout, stdout
    assert stderr.startswith("incomplete: 1 of 4 planned runs did not end well (baseline seed 0"), (
        stderr
    )
    rerun = subprocess.run(compare, env=env, cwd=REPO, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "1 to run, 3 already ended" in rerun.stdout, rerun.stdout
    assert "resumed from step" in (first / "train.log").read_text()
    steps = [r["step"] for r in read_metrics(first) if "train_loss" in r]
    assert steps[-1] == 400 and len(steps) == len(set(steps))  # each step logged once


@pytest.mark.slow
def test_cli_time_to_target_reads_the_runs_again_without_training(compared, env):
    """--metric is not the comparison's identity: the same OUT is read again, nothing trains,
    into its own report. A run that never reaches the target is censored, not dropped: the arm
    that never reaches it is slower (issue 51, item 5)."""
    out, _ = compared
    before = (out / "report-final_val_loss.md").read_text()
    values = _values(out)
    target = max(values[("baseline", s)][1] for s in range(3))  # each baseline run reaches it
    stdout = _compare(env, out, "--metric", "time_to_target", "--target", repr(target))
    assert "0 to run, 9 already ended" in stdout
    stem = f"time_to_target-{target:g}"
    rows = list(csv.DictReader((out / f"results-{stem}.csv").open()))
    for row in rows:
        assert row["metric"] == "time_to_target"
        if row["arm"] == "lowlr":  # lr 1e-6: its loss stays near ln(vocab)
            assert row["value"] == "" and float(row["train_seconds"]) > 0
        else:
            assert float(row["value"]) > 0 and row["value"] == row["seconds_to_target"]
    lowlr = next(line for line in stdout.splitlines() if line.startswith("lowlr vs baseline"))
    assert "reached within budget 0/3 (baseline 3/3); faster at 0, slower at 3, tied at 0" in (
        lowlr
    )
    assert "no test" not in lowlr
    assert "| not reached (censored at " in (out / f"report-{stem}.md").read_text()
    assert (out / "report-final_val_loss.md").read_text() == before  # not overwritten


@pytest.mark.slow
def test_cli_an_incomplete_comparison_fails_unless_partial_is_allowed(compared, env, tmp_path):
    """Issue 51, item 2: a planned run that did not end well used to leave exit 0."""
    out = tmp_path / "out"
    shutil.copytree(compared[0], out)
    (out / "same" / "seed-1" / "compare_end.json").write_text(
        json.dumps({"status": "failed", "error": "a worker died"}) + "\n"
    )
    result = _compare(env, out, status=3)
    assert "0 to run, 9 already ended" in result.stdout
    assert result.stderr.startswith(
        "incomplete: 1 of 9 planned runs did not end well (same seed 1 failed)"
    ), result.stderr
    assert "--allow_partial" in result.stderr
    _compare(env, out, "--allow_partial")


@pytest.mark.slow
def test_cli_seeds_grow_an_existing_comparison(compared, env, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(compared[0], out)
    old = _values(out)
    arms = [a if a != "3" else "4" for a in ARMS]
    result = subprocess.run(
        [sys.executable, "-m", "minigpt_jax", "compare", "--config", TINY, "--out", str(out),
         *arms],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 to run, 9 already ended (grown" in result.stdout
    grown = _values(out)
    assert {k: v for k, v in grown.items() if k[1] < 3} == old  # the old runs read, not rerun
    assert sorted(k for k in grown if k[1] == 3) == [("baseline", 3), ("lowlr", 3), ("same", 3)]
    saved = json.loads((out / "compare.json").read_text())
    assert saved["identity"]["seeds"] == [0, 1, 2, 3] and len(saved["earlier"]) == 1
    text = (out / "report-final_val_loss.md").read_text()
    assert "- grown from `minigpt-jax compare --config" in text
    assert "every arm is now judged against 2 comparisons" in text


@pytest.mark.slow
def test_cli_an_added_arm_is_judged_with_sesoi_as_statsmodels_tost_says(compared, env, tmp_path):
    """Issue 51, items 1, 3 and 8 through the command line: an arm added to an existing
    comparison trains alone (the old runs read), every arm is then judged against 3
    comparisons, and with --sesoi each verdict carries the paired TOST that statsmodels
    computes from results.csv, at the arm's Bonferroni level, its interval at 1 - 2·alpha."""
    out = tmp_path / "out"
    shutil.copytree(compared[0], out)
    old = _values(out)
    result = _compare(env, out, "--arm", "near:optim.lr=3.1e-3", "--sesoi", "0.5")
    assert "3 to run, 9 already ended (grown" in result, result
    values = _values(out)
    assert {k: v for k, v in values.items() if k[0] != "near"} == old  # read, not rerun
    text = (out / "report-final_val_loss.md").read_text()
    assert "every arm is now judged against 3 comparisons" in text
    base = np.array([values[("baseline", s)][1] for s in range(3)])
    alpha = 0.05 / 3  # each of the 3 arms at its Bonferroni level
    for arm in ("near", "lowlr"):
        line = next(x for x in result.splitlines() if x.startswith(f"{arm} vs baseline"))
        values_arm = np.array([values[(arm, s)][1] for s in range(3)])
        diff = values_arm - base
        p = ttost_paired(values_arm, base, -0.5, 0.5)[0]
        low, high = scipy_stats.t.interval(
            1 - 2 * alpha, 2, loc=diff.mean(), scale=scipy_stats.sem(diff)
        )
        said = f"(TOST {100 * (1 - 2 * alpha):.4g}% CI {low:+.4f} … {high:+.4f}, "
        said += "p < 0.001)" if p < 0.001 else f"p = {p:.3f})"
        equivalent = p < alpha
        detected = ": worse" in line or ": better" in line
        if equivalent:  # "equivalent within", or for a difference found "by less than"
            assert f"±0.5 nats {said}" in line and "not shown" not in line, line
        elif detected:  # a difference found and larger than the margin: no TOST to add
            assert "TOST" not in line, line
        else:
            assert f"not shown equivalent within ±0.5 nats {said}" in line, line
        # The verdict agrees with the interval printed beside it.
        assert equivalent == (-0.5 < low and high < 0.5), line


@pytest.mark.slow
def test_cli_aa_trains_the_config_against_itself_on_disjoint_seeds(env, tmp_path):
    out = tmp_path / "aa"
    result = subprocess.run(
        [sys.executable, "-m", "minigpt_jax", "compare", "--config", TINY, "--out", str(out),
         "--aa", "--seeds", "2", "--config.num_steps=8", "--eval_tokens", "512"],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in (out / "aa").iterdir()) == [f"seed-{2**30}", f"seed-{2**30 + 1}"]
    line = next(x for x in result.stdout.splitlines() if x.startswith("aa vs baseline: "))
    assert "over 2 paired seeds" in line, line
    assert "A/A calibration (the config against itself): too few paired seeds (2)" in (
        result.stdout
    )
    assert "A/A calibration" in (out / "report-final_val_loss.md").read_text()


def test_fresh_seeds_skip_the_ones_a_sweep_tuned_on():
    assert plan.fresh_seeds("3", frozenset({0, 2})) == [1, 3, 4]
    assert plan.fresh_seeds("5,6", frozenset({0})) == [5, 6]
    with pytest.raises(plan.CompareError, match="seed 0 is one the sweep tuned on"):
        plan.fresh_seeds("0,1", frozenset({0}))


@pytest.mark.slow
def test_cli_from_sweep_reruns_the_winner_on_fresh_seeds_beside_the_baseline(tmp_path, env):
    sweep_out, out = tmp_path / "sweep", tmp_path / "recheck"
    sweep = [sys.executable, "-m", "minigpt_jax", "sweep", "--config", TINY, "--out"]
    sweep += [str(sweep_out), "--space", "optim.lr=3e-3,1e-2", "--trials", "2", "--sampler"]
    sweep += ["grid", "--set", "num_steps=6", "--set", "eval_every=3"]
    swept = subprocess.run(sweep, capture_output=True, text=True, cwd=REPO, env=env)
    assert swept.returncode == 0, swept.stdout + swept.stderr
    rows = list(csv.DictReader((sweep_out / "trials.csv").open()))
    best = min(rows, key=lambda r: float(r["value"]))
    recheck = [sys.executable, "-m", "minigpt_jax", "compare", "--from_sweep", str(sweep_out)]
    recheck += ["--baseline", TINY, "--out", str(out), "--workers", "2", "--eval_tokens", "512"]
    refused = subprocess.run(recheck + ["--seeds", "0,1"], capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and not out.exists()
    assert "seed 0 is one the sweep tuned on" in refused.stderr  # configs/tiny.py's seed
    result = subprocess.run(recheck + ["--seeds", "2"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    # the fresh seeds 1 and 2, and the tuned seed 0 for the paired winner's-curse check
    assert sorted(p.name for p in (out / "sweep_best").iterdir()) == ["seed-0", "seed-1", "seed-2"]
    assert sorted(p.name for p in (out / "baseline").iterdir()) == ["seed-0", "seed-1", "seed-2"]
    winner = (out / "sweep_best" / "seed-1" / "config.py").read_text()
    baseline = (out / "baseline" / "seed-1" / "config.py").read_text()
    lr = best["params_optim.lr"] if "params_optim.lr" in best else best["optim.lr"]
    assert f"'optim.lr': {float(lr)!r}" in winner and "optim.lr" not in baseline
    assert "'num_steps': 6" in winner and "'num_steps': 6" in baseline  # the sweep's --set
    sweep_value = float(best["value"])
    assert f"best val loss {sweep_value:.4f} in the sweep" in result.stdout
    assert "rerun here on fresh seeds 1, 2; both arms also at its seed 0" in result.stdout
    assert "sweep_best vs baseline:" in result.stdout
    rows = {
        (r["arm"], int(r["seed"])): float(r["value"])
        for r in csv.DictReader((out / "results-best_val_loss.csv").open())
    }
    assert set(rows) == {(a, s) for a in ("baseline", "sweep_best") for s in (1, 2)}
    fresh = [rows[("sweep_best", s)] - rows[("baseline", s)] for s in (1, 2)]
    tuned = [
        min(r["val_loss"] for r in read_metrics(out / arm / "seed-0") if "val_loss" in r)
        for arm in ("sweep_best", "baseline")
    ]
    tuned_diff = tuned[0] - tuned[1]
    optimism = np.mean(fresh) - tuned_diff
    assert f"paired difference from the baseline is {tuned_diff:+.4f} nats" in result.stdout
    assert f"a paired selection optimism of {optimism:+.4f} nats" in result.stdout
    half = scipy_stats.t.ppf(0.975, 1) * np.std(fresh, ddof=1) * math.sqrt(1 + 1 / 2)
    low, high = np.mean(fresh) - half, np.mean(fresh) + half
    assert f"would lie in {low:+.4f} … {high:+.4f} (95% prediction interval)" in result.stdout


def test_arms_evaluating_at_other_cadences_are_warned_of_under_best_val_loss(tmp_path):
    comparison = command.check(
        ["--config", TINY, "--out", str(tmp_path / "o"), "--seeds", "2",
         "--arm", "often:eval_every=10", "--metric", "best_val_loss"]
    )[0]  # fmt: skip
    warned = command._warnings(comparison, "best_val_loss")
    assert warned == [
        "warning: the arms evaluate at different cadences (eval_every: baseline 20, often 10); "
        "the best val loss favours the arm that evaluates more often."
    ]
    assert command._warnings(comparison, "final_val_loss") == []
    sized = command.check(
        ["--config", TINY, "--out", str(tmp_path / "s"), "--seeds", "2",
         "--arm", "big:eval_batches=200", "--eval_tokens", "512"]
    )[0]  # fmt: skip
    assert command._warnings(sized, "final_val_loss") == [
        "warning: the arms are scored on eval sets of different sizes (baseline 512, big 12,800)."
    ]


def test_a_planned_run_that_never_ended_fails_the_command(tmp_path, monkeypatch, capsys):
    """Issue 51, item 2: a killed worker left its run without an end, and the command still
    exited 0 with a verdict over the others."""
    monkeypatch.setattr(command, "run_here", lambda *args: None)  # every worker killed
    out = tmp_path / "out"
    args = ["--config", TINY, "--out", str(out), "--seeds", "2", "--arm", "x:log_every=3"]
    assert command.main(args) == 3
    err = capsys.readouterr().err
    assert err.startswith(
        "incomplete: 4 of 4 planned runs did not end well (baseline seed 0 not run, x seed 0 "
        "not run, baseline seed 1 not run, x seed 1 not run)"
    ), err
    assert (out / "report-final_val_loss.md").exists()  # the report says what there is
    assert command.main([*args, "--allow_partial"]) == 0
