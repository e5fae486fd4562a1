"""What a person reads of a comparison: a verdict line per arm against the baseline, then the
tables, in OUT/report-METRIC.md (one per metric: another --metric never overwrites it); one row
per arm and seed in OUT/results-METRIC.csv; the curves and the paired differences in
OUT/figure-METRIC.png when matplotlib is installed. A run that failed, diverged or has not run is
named in the verdicts and the tables, never dropped silently. The report starts with how it was
made: the command, the versions, the commit, the machine and the date.

With m arms against the baseline each is judged at level alpha/m (Bonferroni): its p is adjusted
by m and printed beside its simultaneous 1 - alpha/m interval, so the verdict and the interval
always agree. A non-significant arm gets the minimum detectable effect at its seeds (not the
observed power), and, with a smallest effect of interest (--sesoi X), the paired equivalence
test (TOST) and the seeds that would detect X. time_to_target counts a run that never reached
the target as censored at its training time (slower than any that reached it): a paired sign
test decides, a log-rank test over the arms' runs (Kaplan–Meier style) stands beside it, and
"reached within budget k/n" per arm; an arm that reaches the target less often is never called
faster."""

from __future__ import annotations

import csv
import dataclasses
import datetime
import importlib.metadata
import io
import os
import platform
import shlex
from pathlib import Path

from minigpt_apps.compare import stats
from minigpt_apps.compare.record import RunRecord

METRIC_WORDS = {
    "final_val_loss": "final val loss",
    "best_val_loss": "best val loss",
    "time_to_target": "training seconds to the target val loss",
}
UNITS = {"final_val_loss": "nats", "best_val_loss": "nats", "time_to_target": "s"}


@dataclasses.dataclass
class ArmResult:
    """An arm's values over its seeds and, for an arm other than the baseline, its paired
    comparison with the baseline at its level `alpha` (ALPHA / m): `p` is the adjusted p the
    verdict reads, `detectable` the minimum detectable effect at its seeds, `seeds_for_sesoi`
    the seeds that detect the smallest effect of interest, `equivalence` its TOST."""

    name: str
    settings: str
    records: list[RunRecord]
    summary: stats.Summary | None = None
    paired: stats.Paired | None = None
    paired_seeds: list[int] = dataclasses.field(default_factory=list)
    alpha: float = stats.ALPHA
    p: float | None = None
    detectable: float | None = None
    seeds_for_sesoi: int | None = None
    equivalence: stats.Equivalence | None = None
    sign: stats.SignTest | None = None  # time_to_target
    log_rank: stats.LogRank | None = None  # time_to_target, its p adjusted in log_rank_p
    log_rank_p: float | None = None
    verdict: str = ""

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.records)

    def reached(self) -> int:
        """Runs that trained to the end and reached the target (time_to_target)."""
        return sum(r.time_to_target is not None for r in self.records)


def file_stem(metric: str, target: float | None) -> str:
    """The metric's part of its files' names: report-STEM.md, results-STEM.csv, figure-STEM.png."""
    return metric if target is None else f"{metric}-{target:g}"


def _ok_values(records: list[RunRecord], metric: str) -> dict[int, float]:
    return {r.seed: r.value(metric) for r in records if r.value(metric) is not None}


def _why_left_out(record: RunRecord, metric: str) -> str | None:
    """Why a run's value is not in its arm's figures (None when it is)."""
    if record.status != "ok":
        return record.status
    if metric == "time_to_target":
        return None  # censored, not left out
    return "did not reach the target" if record.value(metric) is None else None


def analyse(
    arms: list[tuple[str, str]],
    records: list[RunRecord],
    metric: str,
    sesoi: float | None = None,
) -> list[ArmResult]:
    """The arms' results, the baseline first. `arms`: (name, its settings in words), the
    baseline first; `records`: every arm at every seed of the pairs."""
    by_arm = {name: [r for r in records if r.arm == name] for name, _ in arms}
    results = [ArmResult(name, words, by_arm[name]) for name, words in arms]
    m = max(1, len(arms) - 1)  # the comparisons planned, whatever ended
    for result in results:
        values = list(_ok_values(result.records, metric).values())
        result.summary = stats.summarize(values) if len(values) >= 2 else None
        result.alpha = stats.ALPHA / m
    if metric == "time_to_target":
        _analyse_times(results, m)
    else:
        _analyse_values(results, metric, m, sesoi)
    for result in results[1:]:
        result.verdict = _verdict(result, results[0], m, metric, sesoi)
    return results


def _analyse_values(results: list[ArmResult], metric: str, m: int, sesoi: float | None):
    base = _ok_values(results[0].records, metric)
    for result in results[1:]:
        mine = _ok_values(result.records, metric)
        result.paired_seeds = [seed for seed in mine if seed in base]
        if len(result.paired_seeds) < 2:
            continue
        arm_values = [mine[s] for s in result.paired_seeds]
        base_values = [base[s] for s in result.paired_seeds]
        paired = stats.paired(arm_values, base_values, confidence=1 - result.alpha)
        result.paired = paired
        result.p = stats.bonferroni([paired.t_p] * m)[0]
        if sesoi is not None:
            result.equivalence = stats.tost(arm_values, base_values, sesoi, alpha=result.alpha)
        if result.p < stats.ALPHA or paired.identical:
            continue  # decided: no power to report
        result.detectable = stats.detectable_effect(paired.n, paired.std_diff, alpha=result.alpha)
        if sesoi is not None and not result.equivalence.equivalent:
            result.seeds_for_sesoi = stats.seeds_for_effect(
                sesoi, paired.std_diff, alpha=result.alpha
            )


def _analyse_times(results: list[ArmResult], m: int):
    ok = {r.seed: r for r in results[0].records if r.status == "ok"}
    for result in results[1:]:
        pairs = [(r, ok[r.seed]) for r in result.records if r.status == "ok" and r.seed in ok]
        result.paired_seeds = [mine.seed for mine, _ in pairs]
        mine = [r for r in result.records if r.status == "ok"]
        if mine and ok:
            result.log_rank = stats.log_rank(
                [r.time_to_target for r in mine],
                [r.train_seconds for r in mine],
                [r.time_to_target for r in ok.values()],
                [r.train_seconds for r in ok.values()],
            )
            result.log_rank_p = stats.bonferroni([result.log_rank.p] * m)[0]
        if not pairs:
            continue
        result.sign = stats.censored_sign_test(
            [mine.time_to_target for mine, _ in pairs], [base.time_to_target for _, base in pairs]
        )
        result.p = stats.bonferroni([result.sign.p] * m)[0]


def _number(value: float) -> str:
    return f"{value:+.4f}"


def _p(value: float) -> str:
    return "p < 0.001" if value < 0.001 else f"p = {value:.3f}"


def _percent(level: float) -> str:
    return f"{100 * level:.4g}%"


def _left_out(result: ArmResult, baseline: ArmResult, metric: str) -> str:
    """Words for the seeds left out of the pairs, and why."""
    why = []
    for records in (baseline.records, result.records):
        for record in records:
            reason = _why_left_out(record, metric)
            if reason:
                why.append(f"{record.arm} seed {record.seed} {reason}")
    return f"; left out of the pairs: {', '.join(why)}" if why else ""


def _adjusted(p: float, m: int) -> str:
    return _p(p) + (f" (Bonferroni-adjusted over {m} arms)" if m > 1 else "")


def _diverged(result: ArmResult, baseline: ArmResult) -> str:
    k, n = result.count("diverged"), len(result.records)
    return f"diverged at {k}/{n} seeds" if k > baseline.count("diverged") else ""


def _verdict(
    result: ArmResult, baseline: ArmResult, m: int, metric: str, sesoi: float | None
) -> str:
    head = f"{result.name} vs {baseline.name}: "
    left_out = _left_out(result, baseline, metric)
    diverged = _diverged(result, baseline)
    if metric == "time_to_target":
        return head + _time_verdict(result, baseline, m, diverged) + left_out
    paired, n = result.paired, len(result.paired_seeds)
    if paired is None:
        if diverged:
            return head + f"worse ({diverged})" + left_out
        return (
            head + f"{n} paired seed{'s' * (n != 1)} trained to the end: no test (2 needed)"
        ) + left_out
    if paired.identical:
        return head + f"the same value at every one of {n} paired seeds: no difference" + left_out
    unit = UNITS[metric]
    simultaneous = f", simultaneous over {m} arms" if m > 1 else ""
    text = head + (
        f"{_number(paired.mean_diff)} {unit} ({_percent(paired.confidence)} CI"
        f"{simultaneous} {_number(paired.ci_low)} … {_number(paired.ci_high)}), "
        f"{_adjusted(result.p, m)} over {n} paired seeds"
    )
    if result.p < result.alpha * m:  # the adjusted p against alpha: the interval excludes 0
        text += ": better" if paired.mean_diff < 0 else ": worse"
        if diverged:
            text += f", and {diverged}"
        if result.equivalence is not None and result.equivalence.equivalent:
            text += f" by less than ±{sesoi:g} {unit} ({_equivalence(result.equivalence)})"
        return text + left_out
    text += f": no difference detected at {n} seeds"
    if diverged:
        text += f", but {diverged}"
    if result.equivalence is None:
        text += (
            f"; at {n} seeds only a difference of ±{result.detectable:.4f} {unit} or more is "
            "detected with 80% power (--sesoi X tests equivalence within ±X)"
        )
        return text + left_out
    e = result.equivalence
    if e.equivalent:
        text += f"; equivalent within ±{sesoi:g} {unit} ({_equivalence(e)})"
    else:
        text += f"; not shown equivalent within ±{sesoi:g} {unit} ({_equivalence(e)})"
        needed = result.seeds_for_sesoi
        if needed is None:
            text += f"; more than {stats.MAX_SEEDS:,} seeds would be needed to detect ±{sesoi:g}"
        elif needed > n:
            text += f"; about {needed} seeds would detect ±{sesoi:g} with 80% power"
        else:
            text += f"; these {n} seeds had 80% power to detect ±{sesoi:g}"
    return text + left_out


def _equivalence(e: stats.Equivalence) -> str:
    return f"TOST {_percent(e.confidence)} CI {_number(e.ci_low)} … {_number(e.ci_high)}, {_p(e.p)}"


def _log_rank_words(result: ArmResult, m: int) -> str:
    r = result.log_rank
    if r is None:
        return ""
    return (
        f"; log-rank over the runs (unpaired) {_adjusted(result.log_rank_p, m)}: reached the "
        f"target {r.observed} times, {r.expected:.2f} expected were the arms alike"
    )


def _time_verdict(result: ArmResult, baseline: ArmResult, m: int, diverged: str) -> str:
    """The sign test decides; the log-rank test is said beside it; an arm that reaches the
    target less often than the baseline is never called faster."""
    n_arm, n_base = len(result.records), len(baseline.records)
    reached = (
        f"reached within budget {result.reached()}/{n_arm} (baseline {baseline.reached()}/{n_base})"
    )
    sign, n = result.sign, len(result.paired_seeds)
    if sign is None:
        if diverged:
            return f"worse ({diverged}); {reached}"
        return reached + "; no seed where both trained to the end: no test"
    text = (
        f"{reached}; faster at {sign.faster}, slower at {sign.slower}, tied at {sign.ties} of "
        f"{n} paired seeds (a run that never reached the target is censored at its training "
        f"time, slower than any that did), sign test {_adjusted(result.p, m)}"
        + _log_rank_words(result, m)
    )
    if result.p >= result.alpha * m:
        text += ": no difference detected"
    elif sign.slower > sign.faster:
        text += ": slower"
    elif result.reached() < baseline.reached():
        text += (
            ": not called faster: it comes first at more seeds but reaches the target less often"
        )
    else:
        text += ": faster"
    return text + (f", and {diverged}" if diverged else "")


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _exact(value: float | None) -> str:
    return "" if value is None else repr(value)


def _run_cell(record: RunRecord, metric: str) -> str:
    if record.value(metric) is not None:
        return f"{record.value(metric):.4f}"
    if record.status == "ok":
        return f"not reached (censored at {record.train_seconds:.1f} s)"
    step = f" after step {record.last_step}" if record.last_step else ""
    return f"{record.status}{step}"


def _compact_row(r: ArmResult, baseline: ArmResult, metric: str) -> list[str]:
    """arm | Δ (CI) | % of baseline | d_z | p_adj | n for a loss metric."""
    d = r.paired
    if d is None:
        return [r.name, _diverged(r, baseline) or "no test", "", "", "", str(len(r.paired_seeds))]
    base = _ok_values(baseline.records, metric)
    base_mean = sum(base[s] for s in r.paired_seeds) / len(r.paired_seeds)
    percent = f"{100 * d.mean_diff / base_mean:+.2f}%" if base_mean else ""
    return [
        r.name,
        f"{_number(d.mean_diff)} ({_number(d.ci_low)} … {_number(d.ci_high)})",
        percent,
        f"{d.d_z:+.2f}",
        f"{r.p:.3g}",
        str(d.n),
    ]


def markdown(
    results: list[ArmResult],
    metric: str,
    seeds: list[int],
    title: str,
    head: list[str] = (),
) -> str:
    """The report: `head` (provenance, notes, warnings), the verdicts, the compact table, the
    table of arms, the table of runs, failures' errors."""
    m = max(1, len(results) - 1)
    words, unit = METRIC_WORDS[metric], UNITS[metric]
    lines = [f"# {title}", "", *head, f"Metric: {words} ({unit}; lower is better).", ""]
    lines += [f"- {r.verdict}" for r in results[1:]]
    level = _percent(1 - stats.ALPHA / m)
    if metric == "time_to_target":
        lines += [
            "",
            "| arm | reached within budget | faster / slower / tied | p_adj (sign test) | "
            "reached / expected | p_adj (log-rank) | n |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in results:
            s, k = r.sign, r.log_rank
            lines.append(
                f"| {r.name} | {r.reached()}/{len(r.records)} | "
                + (f"{s.faster} / {s.slower} / {s.ties} | {r.p:.3g} |" if s else " | |")
                + (f" {k.observed} / {k.expected:.2f} | {r.log_rank_p:.3g} |" if k else " | |")
                + f" {len(r.paired_seeds) if r is not results[0] else ''} |"
            )
        small = min((len(r.paired_seeds) for r in results[1:] if r.sign), default=None)
        lines += [
            "",
            "A run that trained to its end without reaching the target is censored at its "
            "training time: slower than every run that reached it, tied with another that did "
            "not. The paired sign test (scipy's exact binomial test) counts the seeds where the "
            f"arm came first; p_adj is Bonferroni's over the {m} arm{'s' * (m != 1)}, significant "
            "below 0.05; it decides the verdict, and an arm that reaches the target less often "
            "than the baseline is never called faster. Beside it, the log-rank test "
            "(statsmodels' survdiff) compares the arms' runs as Kaplan–Meier curves, unpaired: "
            "the arm's runs that reached the target against those expected were the arms alike."
            + (
                f" At {small} seeds the exact sign test's p cannot go below "
                f"{stats.wilcoxon_floor(small):.4g} (2/2^n, as Wilcoxon's): no verdict at 5 or "
                "fewer seeds whatever the effect; the log-rank test has no such floor."
                if small is not None and small <= 5
                else ""
            ),
        ]
    else:
        lines += [
            "",
            f"| arm | Δ vs baseline ({level} CI) | % of baseline | d_z | p_adj | n |",
            "|---|---|---|---|---|---|",
        ]
        rows = [_compact_row(r, results[0], metric) for r in results[1:]]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        small = min((r.paired.n for r in results[1:] if r.paired), default=None)
        floor = (
            f" At {small} seeds the exact Wilcoxon p cannot go below "
            f"{stats.wilcoxon_floor(small):.4g} (2/2^n), so it cannot be significant at 5 or "
            "fewer seeds whatever the effect."
            if small is not None and small <= 5
            else ""
        )
        lines += [
            "",
            f"Δ: the arm's mean paired difference from the baseline, with its {level} t interval"
            + (f" (simultaneous over the {m} arms: Bonferroni's 1 − 0.05/{m})" if m > 1 else "")
            + "; p_adj: the paired t-test's two-sided p"
            + (f" times {m} (Bonferroni)" if m > 1 else "")
            + ", significant below 0.05 exactly when the interval excludes 0; d_z: Δ in "
            "standard deviations of the paired differences. Not significant: the minimum "
            "detectable effect is the smallest true difference a paired t-test at the arm's "
            "level detects with 80% power at the seeds run and the spread seen; with --sesoi "
            "X, TOST (two one-sided paired t-tests, statsmodels' ttost_paired) shows "
            "equivalence within ±X when its 1 − 2α interval lies inside ±X." + floor,
            "",
            "| arm | settings | runs ok | mean | 95% CI | seed std | p (t, unadjusted) | "
            "p (Wilcoxon) | min. detectable Δ | seeds for ±sesoi |",
            "|---" * 10 + "|",
        ]
        for r in results:
            ok = sum(rec.value(metric) is not None for rec in r.records)
            s, d = r.summary, r.paired
            row = [
                r.name + (" (baseline)" if r is results[0] and r.name != "baseline" else ""),
                r.settings,
                f"{ok}/{len(r.records)}",
                _cell(s.mean if s else None),
                f"{s.ci_low:.4f} … {s.ci_high:.4f}" if s else "",
                _cell(s.std if s else None),
                f"{d.t_p:.3g}" if d else "",
                f"{d.wilcoxon_p:.3g}" if d else "",
                _cell(r.detectable),
                str(r.seeds_for_sesoi or "") if r.equivalence else "",
            ]
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"{words} of each run:", "", "| seed | " + " | ".join(r.name for r in results)]
    lines[-1] += " |"
    lines.append("|---" * (len(results) + 1) + "|")
    for seed in seeds:
        cells = [_run_cell(next(x for x in r.records if x.seed == seed), metric) for r in results]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    errors = [rec for r in results for rec in r.records if rec.error]
    if errors:
        lines += ["", "Runs that did not end well:", ""]
        lines += [f"- {e.arm} seed {e.seed}: {e.status}: {e.error}" for e in errors]
    return "\n".join(lines) + "\n"


def results_csv(results: list[ArmResult], metric: str, run_dirs: dict) -> str:
    """results-METRIC.csv: one row per arm and seed, its status and values (exact; empty unless
    ok)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        [
            "arm",
            "seed",
            "status",
            "metric",
            "value",
            "final_val_loss",
            "best_val_loss",
            "seconds_to_target",
            "train_seconds",
            "last_step",
            "run_dir",
            "error",
        ]
    )
    for r in results:
        for rec in r.records:
            writer.writerow(
                [
                    rec.arm,
                    rec.seed,
                    rec.status,
                    metric,
                    _exact(rec.value(metric)),
                    _exact(rec.final_val_loss),
                    _exact(rec.best_val_loss),
                    _exact(rec.time_to_target),
                    _exact(rec.train_seconds if rec.status == "ok" else None),
                    rec.last_step,
                    run_dirs[(rec.arm, rec.seed)],
                    rec.error,
                ]
            )
    return buffer.getvalue()


# ----------------------------------------------------------------------------- provenance


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _accelerator() -> str:
    import jax

    devices = jax.devices()
    return f"{len(devices)} × {devices[0].device_kind} ({jax.default_backend()})"


def provenance_lines(command: list[str], code: dict[str, str]) -> list[str]:
    """report.md's provenance: one line each for the command, versions, commit, machine, date."""
    versions = ", ".join(
        f"{name} {_version(name)}" for name in ("jax", "flax", "optax", "numpy", "scipy")
    )
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return [
        f"- command: `{shlex.join(command)}`",
        f"- minigpt_jax {code['minigpt_jax']}, commit {code['commit'] or 'unknown'}; {versions}",
        f"- machine: {_cpu()}; devices {_accelerator()}; python {platform.python_version()}",
        f"- date: {now}",
    ]


def _atomic_write(path: Path, data: str | bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    tmp.write_bytes(data) if isinstance(data, bytes) else tmp.write_text(data)
    os.replace(tmp, path)


POINTS_AT, BAR_AT = -0.12, 0.22  # an arm's jittered points and its mean/CI bar, beside them
JITTER = 0.08


def draw(
    results: list[ArmResult],
    metric: str,
    target: float | None = None,
    sweep_value: float | None = None,
    tuned_diff: float | None = None,
):
    """The comparison's matplotlib Figure (raises ImportError without matplotlib), three axes:
    the val-loss curves (mean and one std over the seeds that trained to the end; the target
    and a sweep's own value as labelled lines), each seed's paired val-loss difference from the
    baseline over the steps, and the metric's per-seed paired differences: for arm i, jittered
    points around x = i + POINTS_AT, their mean and interval beside them at i + BAR_AT, a
    diverged arm's tick saying so, a sweep winner's tuned-seed difference as a star."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figure, (curves, over_steps, diffs) = plt.subplots(1, 3, figsize=(15, 4.4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    base_evals = {rec.seed: dict(rec.evals) for rec in results[0].records if rec.status == "ok"}
    for index, r in enumerate(results):
        color = colors[index % len(colors)]
        ok = [rec for rec in r.records if rec.status == "ok"]
        steps = sorted({s for rec in ok for s, _ in rec.evals})
        if steps:
            at = [[v for rec in ok for s, v in rec.evals if s == step] for step in steps]
            mean_a = np.asarray([np.mean(a) for a in at])
            std_a = np.asarray([np.std(a, ddof=1) if len(a) > 1 else 0.0 for a in at])
            label = f"{r.name} ({len(ok)} seeds)"
            curves.plot(steps, mean_a, marker="o", ms=3, color=color, label=label)
            curves.fill_between(steps, mean_a - std_a, mean_a + std_a, alpha=0.2, color=color)
        if index == 0:
            continue
        for rec in ok:
            base = base_evals.get(rec.seed, {})
            both = [(s, v - base[s]) for s, v in rec.evals if s in base]
            if both:
                over_steps.plot(
                    *zip(*both, strict=True), color=color, alpha=0.6, lw=1, marker="o", ms=3
                )
    if target is not None:
        curves.axhline(target, color="k", ls="--", lw=0.8, label=f"target {target:g}")
    if sweep_value is not None and metric != "time_to_target":
        curves.axhline(
            sweep_value, color="k", ls=":", lw=1, label=f"the sweep's value {sweep_value:.4f}"
        )
    curves.set(xlabel="step", ylabel="val loss (nats)", title="val loss: mean ± 1 std over seeds")
    if curves.get_legend_handles_labels()[0]:  # no run evaluated yet: no legend
        curves.legend(fontsize=8)
    over_steps.axhline(0.0, color="grey", lw=0.8)
    over_steps.set(
        xlabel="step", ylabel="arm − baseline, val loss (nats)", title="per-seed paired differences"
    )
    rng = np.random.default_rng(0)  # the same jitter on every redraw
    labels = []
    for index, r in enumerate(results[1:]):
        color = colors[(index + 1) % len(colors)]
        diverged = _diverged(r, results[0])
        labels.append(r.name + (f"\n({diverged})" if diverged else ""))
        base = _ok_values(results[0].records, metric)
        mine = _ok_values(r.records, metric)
        d = [mine[s] - base[s] for s in r.paired_seeds if s in mine and s in base]
        if d:
            jitter = rng.uniform(-JITTER, JITTER, len(d))
            diffs.scatter(index + POINTS_AT + jitter, d, s=16, color=color, alpha=0.8)
        if r.paired is not None:
            low, high = r.paired.mean_diff - r.paired.ci_low, r.paired.ci_high - r.paired.mean_diff
            diffs.errorbar([index + BAR_AT], [r.paired.mean_diff], yerr=[[low], [high]],
                           fmt="k_", ms=14, capsize=4)  # fmt: skip
    if tuned_diff is not None:
        diffs.scatter([len(results) - 2 + POINTS_AT], [tuned_diff], marker="*", s=120, color="k",
                      label="at the sweep's tuned seed", zorder=3)  # fmt: skip
        diffs.legend(fontsize=8)
    diffs.axhline(0.0, color="grey", lw=0.8)
    diffs.set_xticks(range(len(results) - 1), labels, rotation=20)
    diffs.set_xlim(-0.5, len(results) - 1.5)
    m = max(1, len(results) - 1)
    diffs.set(
        ylabel=f"{METRIC_WORDS[metric]} − baseline's ({UNITS[metric]})",
        title=f"per-seed paired differences, mean and {_percent(1 - stats.ALPHA / m)} CI",
    )
    figure.tight_layout()
    return figure


def figures(
    results: list[ArmResult],
    metric: str,
    path: Path,
    target: float | None = None,
    sweep_value: float | None = None,
    tuned_diff: float | None = None,
) -> tuple[list[Path], str]:
    """(the PNGs written, a note when they were skipped): `draw`'s figure at `path`."""
    try:
        figure = draw(results, metric, target, sweep_value, tuned_diff)
    except ImportError:
        return [], "figures skipped: matplotlib is not installed (pip install matplotlib)"
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    _atomic_write(path, buffer.getvalue())
    return [path], ""


AA_BLOCK = 3  # seeds in each A/A calibration comparison


def aa_calibration(aa: ArmResult, baseline: ArmResult, metric: str) -> str:
    """The words of an A/A comparison's calibration: its paired seeds in disjoint blocks of
    AA_BLOCK (in seed order), each an independent A/A comparison judged by the paired t-test at
    alpha 0.05; how many were called different, the observed false-positive rate and its exact
    95% interval beside the nominal 5%."""
    head = "A/A calibration (the config against itself): "
    if metric == "time_to_target":
        return head + "a loss metric calibrates the paired t-test; time_to_target has none."
    base, mine = _ok_values(baseline.records, metric), _ok_values(aa.records, metric)
    seeds = sorted(aa.paired_seeds)
    blocks = [seeds[i : i + AA_BLOCK] for i in range(0, len(seeds) - AA_BLOCK + 1, AA_BLOCK)]
    if not blocks:
        return head + (
            f"too few paired seeds ({len(seeds)}) for one block of {AA_BLOCK}; --seeds "
            f"{10 * AA_BLOCK} gives 10 disjoint A/A comparisons."
        )
    called = sum(
        stats.paired([mine[s] for s in b], [base[s] for s in b]).t_p < stats.ALPHA for b in blocks
    )
    low, high = stats.proportion_interval(called, len(blocks))
    verdict = (
        "above the nominal 5%: the paired t-test calls identical arms different too often"
        if low > stats.ALPHA
        else "consistent with the nominal 5%"
        if high >= stats.ALPHA
        else "below the nominal 5%"
    )
    return head + (
        f"{called} of {len(blocks)} disjoint blocks of {AA_BLOCK} paired seeds called "
        f"different by the paired t-test at 0.05: an observed false-positive rate of "
        f"{_percent(called / len(blocks))} (95% Clopper–Pearson CI {_percent(low)} … "
        f"{_percent(high)}), {verdict}."
    )


def recheck(
    winner: ArmResult, baseline: ArmResult, metric: str, sweep_value: float, tuned: list[RunRecord]
) -> tuple[str, float | None]:
    """(the words, the tuned-seed paired difference) of a sweep winner's paired winner's-curse
    check: at the sweep's tuned seed both arms were trained here too; the paired selection
    optimism is the fresh seeds' mean paired difference minus the tuned seed's, and the tuned
    seed's difference is judged against the 95% prediction interval of one fresh seed's."""
    unit = UNITS[metric]
    head = f"{winner.name}: {METRIC_WORDS[metric]} {sweep_value:.4f} in the sweep"
    mine = {r.seed: r.value(metric) for r in tuned if r.arm == winner.name}
    base = {r.seed: r.value(metric) for r in tuned if r.arm == baseline.name}
    seeds = [s for s in mine if mine[s] is not None and base.get(s) is not None]
    if winner.paired is None or not seeds or metric == "time_to_target":
        return head + "; too few runs ended well for the paired winner's-curse check", None
    tuned_diff = sum(mine[s] - base[s] for s in seeds) / len(seeds)
    base_values = _ok_values(baseline.records, metric)
    arm_values = _ok_values(winner.records, metric)
    fresh = [arm_values[s] - base_values[s] for s in winner.paired_seeds]
    p = winner.paired
    optimism = stats.summarize(fresh)  # the fresh mean's interval, shifted by the tuned diff
    low, high = stats.prediction_interval(fresh)
    inside = low <= tuned_diff <= high
    words = (
        head + f"; at its tuned seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))} the "
        f"paired difference from the baseline is {_number(tuned_diff)} {unit}, on the fresh "
        f"seeds {_number(p.mean_diff)} (95% CI {_number(optimism.ci_low)} … "
        f"{_number(optimism.ci_high)}): a paired selection optimism of "
        f"{_number(p.mean_diff - tuned_diff)} {unit} (95% CI "
        f"{_number(optimism.ci_low - tuned_diff)} … {_number(optimism.ci_high - tuned_diff)}); "
        f"one fresh seed's difference would lie in {_number(low)} … {_number(high)} (95% "
        "prediction interval), which "
        + ("holds" if inside else "does not hold")
        + " the tuned seed's"
        + ("" if inside else " (the win held luck of the tuned seed)")
    )
    return words, tuned_diff


def write(
    out: Path,
    arms: list[tuple[str, str]],
    records: list[RunRecord],
    seeds: list[int],
    metric: str,
    run_dirs: dict,
    notes: tuple[str, ...] = (),
    sweep_value: float | None = None,
    *,
    target: float | None = None,
    sesoi: float | None = None,
    head: list[str] = (),
    tuned: list[RunRecord] = (),
    aa: bool = False,
) -> list[str]:
    """Writes report-STEM.md, results-STEM.csv and the figure (STEM: the metric, and the
    target); returns the lines to print: `notes` (what the comparison is of), the verdicts,
    then what was written. `head`: provenance and warnings, for the report only; `tuned`: both
    arms' records at a sweep winner's tuned seed; `aa`: the second arm is the config against
    itself (--aa), calibrated block by block."""
    results = analyse(arms, records, metric, sesoi)
    if aa:
        notes = (*notes, aa_calibration(results[1], results[0], metric))
    tuned_diff = None
    if sweep_value is not None:
        words, tuned_diff = recheck(results[-1], results[0], metric, sweep_value, list(tuned))
        notes = (*notes, words)
    stem = file_stem(metric, target)
    title = f"Comparison in {out}: {len(arms)} arms × {len(seeds)} seeds"
    written, note = figures(
        results, metric, out / f"figure-{stem}.png", target, sweep_value, tuned_diff
    )
    text = markdown(results, metric, seeds, title, [*head, *(f"{n}\n" for n in notes)])
    text += "".join(f"\n![{p.stem}]({p.name})\n" for p in written) or f"\n({note})\n"
    report, table = out / f"report-{stem}.md", out / f"results-{stem}.csv"
    _atomic_write(report, text)
    _atomic_write(table, results_csv(results, metric, run_dirs))
    lines = [*notes, *(r.verdict for r in results[1:])]
    lines.append(
        f"wrote {report}, {table}"
        + "".join(f", {p}" for p in written)
        + (f" ({note})" if note else "")
    )
    return lines
