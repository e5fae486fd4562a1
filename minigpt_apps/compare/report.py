"""What a person reads of a comparison: a verdict line per arm against the baseline, then the
tables, in OUT/report.md; one row per arm and seed in OUT/results.csv; the val-loss curves
(mean and a band of one seed-to-seed std per arm) and the per-seed paired differences as
figures when matplotlib is installed. A run that failed, diverged or has not run is named in
the verdicts and the tables, never dropped silently: the paired statistics use the seeds at
which both the arm and the baseline trained to their end."""

from __future__ import annotations

import csv
import dataclasses
import io
import os
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
    comparison with the baseline: `p` is the p-value the verdict reads (Holm-adjusted when
    there are several comparisons), `seeds_needed` the seeds for 80% power when not
    significant."""

    name: str
    settings: str
    records: list[RunRecord]
    summary: stats.Summary | None = None
    paired: stats.Paired | None = None
    paired_seeds: list[int] = dataclasses.field(default_factory=list)
    p: float | None = None
    seeds_needed: int | None = None
    verdict: str = ""


def _ok_values(records: list[RunRecord], metric: str) -> dict[int, float]:
    return {r.seed: r.value(metric) for r in records if r.value(metric) is not None}


def _why_left_out(record: RunRecord, metric: str) -> str | None:
    """Why a run's value is not in its arm's figures (None when it is)."""
    if record.status != "ok":
        return record.status
    return "did not reach the target" if record.value(metric) is None else None


def analyse(arms: list[tuple[str, str]], records: list[RunRecord], metric: str) -> list[ArmResult]:
    """The arms' results, the baseline first. `arms`: (name, its settings in words), the
    baseline first; `records`: every arm at every seed."""
    by_arm = {name: [r for r in records if r.arm == name] for name, _ in arms}
    results = [ArmResult(name, words, by_arm[name]) for name, words in arms]
    for result in results:
        values = list(_ok_values(result.records, metric).values())
        result.summary = stats.summarize(values) if len(values) >= 2 else None
    base = _ok_values(results[0].records, metric)
    for result in results[1:]:
        mine = _ok_values(result.records, metric)
        result.paired_seeds = [seed for seed in mine if seed in base]
        if len(result.paired_seeds) >= 2:
            result.paired = stats.paired(
                [mine[s] for s in result.paired_seeds], [base[s] for s in result.paired_seeds]
            )
    tested = [r for r in results[1:] if r.paired is not None]
    adjusted = stats.holm([r.paired.t_p for r in tested]) if len(tested) >= 2 else None
    for index, result in enumerate(tested):
        result.p = adjusted[index] if adjusted else result.paired.t_p
        if result.p >= stats.ALPHA:
            result.seeds_needed = stats.seeds_to_detect(
                result.paired.mean_diff, result.paired.std_diff
            )
    for result in results[1:]:
        result.verdict = _verdict(result, results[0], adjusted is not None, metric)
    return results


def _number(value: float) -> str:
    return f"{value:+.4f}"


def _p(value: float) -> str:
    return "p < 0.001" if value < 0.001 else f"p = {value:.3f}"


def _left_out(result: ArmResult, baseline: ArmResult, metric: str) -> str:
    """Words for the seeds left out of the pairs, and why."""
    why = []
    for records in (baseline.records, result.records):
        for record in records:
            reason = _why_left_out(record, metric)
            if reason:
                why.append(f"{record.arm} seed {record.seed} {reason}")
    return f"; left out of the pairs: {', '.join(why)}" if why else ""


def _verdict(result: ArmResult, baseline: ArmResult, holm: bool, metric: str) -> str:
    head = f"{result.name} vs {baseline.name}: "
    paired, n = result.paired, len(result.paired_seeds)
    left_out = _left_out(result, baseline, metric)
    if paired is None:
        return (
            head + f"{n} paired seed{'s' * (n != 1)} trained to the end: no test (2 needed)"
        ) + left_out
    if paired.identical:
        return head + f"the same value at every one of {n} paired seeds: no difference" + left_out
    corrected = " (Holm-adjusted)" if holm else ""
    text = (
        head + f"{_number(paired.mean_diff)} {UNITS[metric]} (95% CI {_number(paired.ci_low)} … "
        f"{_number(paired.ci_high)}), {_p(result.p)}{corrected} over {n} paired seeds"
    )
    if result.p < stats.ALPHA:
        return text + (": better" if paired.mean_diff < 0 else ": worse") + left_out
    size = f"{abs(paired.mean_diff):.4f}"
    needed = (
        f"about {result.seeds_needed} would detect {size}"
        if result.seeds_needed is not None
        else f"more than {stats.MAX_SEEDS:,} would be needed to detect {size}"
    )
    return text + f": no difference detectable at {n} seeds; {needed}" + left_out


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _exact(value: float | None) -> str:
    return "" if value is None else repr(value)


def _run_cell(record: RunRecord, metric: str) -> str:
    if record.value(metric) is not None:
        return f"{record.value(metric):.4f}"
    if record.status == "ok":
        return "target not reached"
    step = f" after step {record.last_step}" if record.last_step else ""
    return f"{record.status}{step}"


def _seeds_needed(result: ArmResult) -> str:
    if result.paired is None or result.p < stats.ALPHA:
        return ""
    if result.paired.identical:
        return "none differ"
    return str(result.seeds_needed or f"> {stats.MAX_SEEDS:,}")


def markdown(results: list[ArmResult], metric: str, seeds: list[int], title: str) -> str:
    """report.md: the verdicts, the table of arms, the table of runs, failures' errors."""
    holm = sum(r.paired is not None for r in results[1:]) >= 2
    words = METRIC_WORDS[metric]
    lines = [f"# {title}", "", f"Metric: {words} ({UNITS[metric]}; lower is better).", ""]
    lines += [f"- {r.verdict}" for r in results[1:]]
    lines += [
        "",
        "p: the paired t-test's two-sided p"
        + (
            f", Holm-adjusted for the {sum(r.paired is not None for r in results[1:])} "
            "comparisons with the baseline"
            if holm
            else ""
        )
        + "; significant below 0.05. Seeds for 80% power: a paired t-test at alpha 0.05 "
        "detecting the observed mean difference with the observed spread.",
        "",
        "| arm | settings | runs ok | mean | 95% CI | seed std | diff vs baseline | diff 95% CI "
        "| p (t) | " + ("p (Holm) | " if holm else "") + "p (Wilcoxon) | seeds for 80% power |",
        "|---" * (11 + holm) + "|",
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
            _number(d.mean_diff) if d else "",
            f"{_number(d.ci_low)} … {_number(d.ci_high)}" if d else "",
            f"{d.t_p:.3g}" if d else "",
            *([f"{r.p:.3g}" if d else ""] if holm else []),
            f"{d.wilcoxon_p:.3g}" if d else "",
            _seeds_needed(r),
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
    """results.csv: one row per arm and seed, its status and values (exact; empty unless ok)."""
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
                    rec.last_step,
                    run_dirs[(rec.arm, rec.seed)],
                    rec.error,
                ]
            )
    return buffer.getvalue()


def _atomic_write(path: Path, data: str | bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    tmp.write_bytes(data) if isinstance(data, bytes) else tmp.write_text(data)
    os.replace(tmp, path)


def figures(results: list[ArmResult], metric: str, out: Path) -> tuple[list[Path], str]:
    """(the PNGs written, a note when they were skipped): the val-loss curves, mean and a band
    of one std over the seeds that trained to the end, per arm; and each arm's per-seed
    difference from the baseline."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "figures skipped: matplotlib is not installed (pip install matplotlib)"
    import numpy as np

    figure, (curves, diffs) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, r in enumerate(results):
        color = colors[index % len(colors)]
        ok = [rec for rec in r.records if rec.status == "ok"]
        steps = sorted({s for rec in ok for s, _ in rec.evals})
        mean, std = [], []
        for step in steps:
            at = [v for rec in ok for s, v in rec.evals if s == step]
            mean.append(float(np.mean(at)))
            std.append(float(np.std(at, ddof=1)) if len(at) > 1 else 0.0)
        if steps:
            mean_a, std_a = np.asarray(mean), np.asarray(std)
            label = f"{r.name} ({len(ok)} seeds)"
            curves.plot(steps, mean_a, marker="o", ms=3, color=color, label=label)
            curves.fill_between(steps, mean_a - std_a, mean_a + std_a, alpha=0.2, color=color)
    curves.set(xlabel="step", ylabel="val loss (nats)", title="val loss: mean ± 1 std over seeds")
    curves.legend(fontsize=8)
    for index, r in enumerate(results[1:]):
        if r.paired is None:
            continue
        color = colors[(index + 1) % len(colors)]
        base = _ok_values(results[0].records, metric)
        mine = _ok_values(r.records, metric)
        d = [mine[s] - base[s] for s in r.paired_seeds]
        diffs.scatter([index] * len(d), d, s=14, color=color)
        diffs.errorbar(
            [index + 0.15],
            [r.paired.mean_diff],
            fmt="k_",
            ms=12,
            yerr=[[r.paired.mean_diff - r.paired.ci_low], [r.paired.ci_high - r.paired.mean_diff]],
        )
    diffs.axhline(0.0, color="grey", lw=0.8)
    diffs.set_xticks(range(len(results) - 1), [r.name for r in results[1:]], rotation=20)
    diffs.set(
        ylabel=f"{METRIC_WORDS[metric]} − baseline's ({UNITS[metric]})",
        title="per-seed paired differences, mean and 95% CI",
    )
    figure.tight_layout()
    path = out / "figure.png"
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    _atomic_write(path, buffer.getvalue())
    return [path], ""


def _recheck(winner: ArmResult, metric: str, sweep_value: float) -> str:
    """A sweep winner's value in the sweep next to its value on fresh seeds."""
    head = f"{winner.name}: {METRIC_WORDS[metric]} {sweep_value:.4f} in the sweep"
    s = winner.summary
    if s is None:
        return head + "; too few fresh seeds ended well to say what it is on others"
    below = s.mean > sweep_value
    inside = s.ci_low <= sweep_value <= s.ci_high
    return (
        head + f", {s.mean:.4f} (95% CI {s.ci_low:.4f} … {s.ci_high:.4f}) over {s.n} fresh "
        f"seeds: the sweep's figure is {abs(s.mean - sweep_value):.4f} {UNITS[metric]} "
        + ("below" if below else "above")
        + " their mean, "
        + ("inside their interval" if inside else "outside their interval")
        + (" (the win held luck of the tuned seed)" if below and not inside else "")
    )


def write(
    out: Path,
    arms: list[tuple[str, str]],
    records: list[RunRecord],
    seeds: list[int],
    metric: str,
    run_dirs: dict,
    notes: tuple[str, ...] = (),
    sweep_value: float | None = None,
) -> list[str]:
    """Writes report.md, results.csv and the figure; returns the lines to print: the
    verdicts (after `notes`, lines that say what the comparison is of), then what was
    written."""
    results = analyse(arms, records, metric)
    if sweep_value is not None:
        notes = (*notes, _recheck(results[-1], metric, sweep_value))
    title = f"Comparison in {out}: {len(arms)} arms × {len(seeds)} seeds"
    written, note = figures(results, metric, out)
    text = markdown(results, metric, seeds, title)
    if notes:
        head, rest = text.split("\n\n", 1)
        text = head + "\n\n" + "".join(f"{line}\n\n" for line in notes) + rest
    text += "".join(f"\n![{p.stem}]({p.name})\n" for p in written) or f"\n({note})\n"
    _atomic_write(out / "report.md", text)
    _atomic_write(out / "results.csv", results_csv(results, metric, run_dirs))
    lines = [*notes, *(r.verdict for r in results[1:])]
    lines.append(
        f"wrote {out / 'report.md'}, {out / 'results.csv'}"
        + "".join(f", {p}" for p in written)
        + (f" ({note})" if note else "")
    )
    return lines
