"""`minigpt-jax compare`: its statistics against scipy and hand-worked values (fast), its
verdicts on recorded values, its one-line refusals that write nothing (in-process, fast); and
through the command line (slow): arms with a known answer on configs/tiny.py (two arms with the
same training give the same value at every seed and no difference; a crippled learning rate is
significantly worse), and a rerun that trains nothing twice."""

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

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


def test_holm_on_a_hand_worked_example():
    # Sorted: 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> made
    # non-decreasing: 0.02, 0.03, 0.06, 0.06; back in the input order:
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == [1.0, 1.0]  # 2 x 0.5, capped at 1
    assert stats.holm([0.2]) == [0.2]


def test_power_of_the_paired_t_test_matches_the_textbook():
    # G*Power's manual, matched pairs: d_z = 0.5, alpha 0.05 two-tailed, power 0.80 -> 34
    # pairs, actual power 0.8078.
    assert stats.seeds_to_detect(0.5, 1.0) == 34
    assert stats.paired_t_power(0.5, 34) == pytest.approx(0.8078, abs=5e-5)
    assert stats.paired_t_power(0.5, 33) < 0.80
    assert stats.seeds_to_detect(-0.004, 0.008) == 34  # the sign and the units do not matter
    assert stats.seeds_to_detect(0.0, 1.0) is None
    assert stats.seeds_to_detect(1e-4, 1.0) is None  # beyond MAX_SEEDS


# ----------------------------------------------------------------------------- verdicts


def _records(arm: str, values: list, statuses: dict | None = None) -> list[RunRecord]:
    statuses = statuses or {}
    return [
        RunRecord(arm, seed, statuses.get(seed, "ok"), [(100, v)] if v is not None else [], 100)
        for seed, v in enumerate(values)
    ]


def test_verdicts_say_better_worse_or_how_many_seeds_with_holm():
    base = [4.10, 4.20, 4.15, 4.05, 4.12]
    better = [v - d for v, d in zip(base, [0.02, 0.025, 0.018, 0.022, 0.021], strict=True)]
    noisy = [v + d for v, d in zip(base, [0.01, -0.012, 0.02, -0.004, 0.006], strict=True)]
    records = _records("baseline", base) + _records("better", better) + _records("noisy", noisy)
    results = report.analyse(
        [("baseline", "-"), ("better", "a"), ("noisy", "b")], records, "final_val_loss"
    )
    raw = [
        scipy_stats.ttest_rel(better, base).pvalue,
        scipy_stats.ttest_rel(noisy, base).pvalue,
    ]
    # Holm by hand for two p-values: the smaller doubled, the larger max(itself, that)
    low, high = sorted(raw)
    holm = {low: 2 * low, high: max(high, 2 * low)}
    assert results[1].p == pytest.approx(holm[raw[0]])
    assert results[2].p == pytest.approx(holm[raw[1]])
    assert results[1].verdict.startswith("better vs baseline: -0.0212 nats (95% CI ")
    assert results[1].verdict.endswith("(Holm-adjusted) over 5 paired seeds: better")
    diff = np.subtract(noisy, base)
    expected_n = stats.seeds_to_detect(diff.mean(), diff.std(ddof=1))
    assert results[2].verdict.endswith(
        f": no difference detectable at 5 seeds; about {expected_n} would detect "
        f"{abs(diff.mean()):.4f}"
    )
    assert f"p = {holm[raw[1]]:.3f} (Holm-adjusted)" in results[2].verdict


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
        f"p = {p:.3f} over 2 paired seeds: worse; left out of the pairs: hot seed 1 diverged"
    ), lines[0]
    text = (tmp_path / "report.md").read_text()
    assert "| 1 | 4.2000 | diverged after step 100 |" in text
    assert "- hot seed 1: diverged: non-finite training loss nan at step 3" in text
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert [(r["arm"], r["seed"], r["status"], r["value"]) for r in rows[3:]] == [
        ("hot", "0", "ok", "4.5"),
        ("hot", "1", "diverged", ""),
        ("hot", "2", "ok", "4.6"),
    ]


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


def test_another_comparison_in_out_is_refused_naming_what_differs(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    arms = ["--arm", "x:log_every=3"]
    identity = command.check(["--config", TINY, "--out", str(out), "--seeds", "3", *arms])[0]
    (out / "compare.json").write_text(json.dumps({"identity": identity.identity}))
    before = sorted(p.name for p in out.iterdir())
    status = command.main(["--config", TINY, "--out", str(out), "--seeds", "4", *arms])
    err = capsys.readouterr().err
    assert status == 2
    assert err == (
        f"minigpt-jax compare: error: --out {out} holds another comparison: --seeds ([0, 1, 2] "
        f"then, [0, 1, 2, 3] now); rerun its own command (in {out / 'compare.json'}) to resume "
        "it, or give another --out.\n"
    )
    assert sorted(p.name for p in out.iterdir()) == before


# ----------------------------------------------------------------------------- the command line

ARMS = [
    "--seeds", "3",
    "--arm", "same:log_every=4",  # bookkeeping only: the same training as the baseline
    "--arm", "lowlr:optim.lr=1e-6,optim.min_lr=0",
    "--config.num_steps=8",
]  # fmt: skip


def _compare(env, out, *extra):
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
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("jax_cache")
    return {**os.environ, "PYTHONPATH": str(REPO), "MINIGPT_JAX_COMPILATION_CACHE": str(cache)}


@pytest.fixture(scope="module")
def compared(env, tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "out"
    return out, _compare(env, out)


def _values(out):
    rows = list(csv.DictReader((Path(out) / "results.csv").open()))
    return {(r["arm"], int(r["seed"])): (r["status"], float(r["value"])) for r in rows}


@pytest.mark.slow
def test_cli_identical_arms_agree_and_a_crippled_lr_is_worse(compared):
    out, stdout = compared
    assert "3 arms × 3 seeds = 9 runs" in stdout and "9 to run, 0 already ended" in stdout
    assert "same vs baseline: the same value at every one of 3 paired seeds: no difference" in (
        stdout
    )
    lowlr = next(line for line in stdout.splitlines() if line.startswith("lowlr vs baseline"))
    assert lowlr.endswith("(Holm-adjusted) over 3 paired seeds: worse"), lowlr
    values = _values(out)
    for seed in range(3):
        for arm in ("baseline", "same", "lowlr"):
            run_dir = out / arm / f"seed-{seed}"
            last = [r["val_loss"] for r in read_metrics(run_dir) if "val_loss" in r][-1]
            assert values[(arm, seed)] == ("ok", last)
            assert f"'seed': {seed}" in (run_dir / "config.py").read_text()
        assert values[("same", seed)] == values[("baseline", seed)]  # paired: the same batches
        assert values[("lowlr", seed)][1] > values[("baseline", seed)][1]
    assert len({values[("baseline", s)] for s in range(3)}) == 3  # the seeds differ
    # The report's statistics are scipy's on the recorded values.
    base = [values[("baseline", s)][1] for s in range(3)]
    low = [values[("lowlr", s)][1] for s in range(3)]
    p = 2 * scipy_stats.ttest_rel(low, base).pvalue  # Holm, the other comparison's p being 1
    assert p < 0.05
    assert f"| {p:.3g} |" in (out / "report.md").read_text()
    assert (out / "figure.png").stat().st_size > 0


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
def test_cli_time_to_target_reads_the_runs_again_without_training(compared, env):
    """--metric is not the comparison's identity: the same OUT is read again, nothing trains.
    A run that never reaches the target is named, not dropped silently."""
    out, _ = compared
    values = _values(out)
    target = max(values[("baseline", s)][1] for s in range(3))  # each baseline run reaches it
    stdout = _compare(env, out, "--metric", "time_to_target", "--target", repr(target))
    assert "0 to run, 9 already ended" in stdout
    rows = list(csv.DictReader((out / "results.csv").open()))
    for row in rows:
        assert row["metric"] == "time_to_target"
        if row["arm"] == "lowlr":  # lr 1e-6: its loss stays near ln(vocab)
            assert row["value"] == "" and row["seconds_to_target"] == ""
        else:
            assert float(row["value"]) > 0 and row["value"] == row["seconds_to_target"]
    lowlr = next(line for line in stdout.splitlines() if line.startswith("lowlr vs baseline"))
    assert "no test (2 needed)" in lowlr and "lowlr seed 0 did not reach the target" in lowlr
    assert "target not reached" in (out / "report.md").read_text()


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
    recheck += ["--baseline", TINY, "--out", str(out), "--workers", "2"]
    refused = subprocess.run(recheck + ["--seeds", "0,1"], capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and not out.exists()
    assert "seed 0 is one the sweep tuned on" in refused.stderr  # configs/tiny.py's seed
    result = subprocess.run(recheck + ["--seeds", "2"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in (out / "sweep_best").iterdir()) == ["seed-1", "seed-2"]
    winner = (out / "sweep_best" / "seed-1" / "config.py").read_text()
    baseline = (out / "baseline" / "seed-1" / "config.py").read_text()
    lr = best["params_optim.lr"] if "params_optim.lr" in best else best["optim.lr"]
    assert f"'optim.lr': {float(lr)!r}" in winner and "optim.lr" not in baseline
    assert "'num_steps': 6" in winner and "'num_steps': 6" in baseline  # the sweep's --set
    sweep_value = float(best["value"])
    assert f"best val loss {sweep_value:.4f} in the sweep" in result.stdout
    assert "rerun here on fresh seeds 1, 2" in result.stdout
    assert "sweep_best vs baseline:" in result.stdout
