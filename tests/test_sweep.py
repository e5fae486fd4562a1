"""`minigpt-jax sweep` through the command line: bad arguments as one-line errors that leave
nothing behind; TPE and grid studies of configs/tiny.py, a pruned trial, two workers and two
commands on one SQLite study, kill -9 of a worker mid-trial and between a trial's end and its
record, a study refused when its fixed settings change, the best config trained, the plots."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minigpt_apps.sweep import command as sweep_command
from minigpt_apps.sweep import study as sweep_study
from minigpt_apps.sweep import worker as sweep_worker

# The full suite only (`python -m pytest -q`): Optuna studies of trials in subprocesses.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "tiny.py")
# 20 steps, evaluated and saved every 10: the same programs in every test (the cache hits).
SHORT = ["--set", "num_steps=20", "--set", "eval_every=10", "--set", "checkpoint_every=10"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("jax_cache")
    return {**os.environ, "PYTHONPATH": str(REPO), "MINIGPT_JAX_COMPILATION_CACHE": str(cache)}


def _command(out, *args):
    return [sys.executable, "-m", "minigpt_jax", "sweep", "--config", TINY, "--out", str(out)] + [
        *args
    ]


def _sweep(env, out, *args, extra_env=None, timeout=900):
    result = subprocess.run(
        _command(out, *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**env, **(extra_env or {})},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _trials(out):
    with open(Path(out) / "trials.csv") as file:
        return list(csv.DictReader(file))


def _study(out, name="sweep"):
    import optuna

    return optuna.load_study(study_name=name, storage=f"sqlite:///{Path(out) / 'study.db'}")


def _steps(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if "val_loss" not in line]


# ----------------------------------------------------------------------------- bad arguments

BAD = {
    "no =": (["--space", "optim.lr"], "write key=value"),
    "unknown key": (["--space", "optim.lrr=1,2"], "did you mean 'lr'"),
    "unknown set key": (["--set", "num_step=4", "--space", "optim.lr=1e-3,2e-3"], "num_steps"),
    "wrong type": (["--space", "num_steps=ten,20"], "num_steps is an integer"),
    "bad bool": (["--space", "model.qk_norm=yes,no"], "true or false"),
    "duplicate value": (["--space", "optim.lr=1e-3,0.001"], "repeats 0.001"),
    "duplicate key": (["--space", "optim.lr=1e-3,2e-3", "--space", "optim.lr=3e-3,4e-3"], "twice"),
    "set and space": (["--set", "optim.lr=1e-3", "--space", "optim.lr=2e-3,3e-3"], "both"),
    "one value": (["--space", "optim.lr=1e-3"], "use --set optim.lr=1e-3"),
    "no scale": (["--space", "optim.lr=1e-4..1e-2"], "names its scale"),
    "empty range": (["--space", "optim.lr=log:1e-2..1e-4"], "the range is empty"),
    "log from 0": (["--space", "optim.lr=log:0..1e-2"], "starts above 0"),
    "int range on a float": (["--space", "optim.lr=int:1..3"], "is a float"),
    "float range on an int": (["--space", "num_steps=float:10..20"], "is an integer"),
    "range on a string": (["--space", "model.norm=float:0..1"], "not a number"),
    "value refused": (["--space", "optim.lr=-1.0,1e-3"], "optim.lr"),
    "not a multiple": (["--set", "steps_per_call=2", "--space", "num_steps=20,21"], "multiple"),
    "grid of a range": (["--sampler", "grid", "--space", "optim.lr=log:1e-4..1e-2"], "grid"),
    "unknown sampler": (["--sampler", "bayes", "--space", "optim.lr=1e-3,2e-3"], "tpe"),
    "unknown pruner": (["--pruner", "early", "--space", "optim.lr=1e-3,2e-3"], "median"),
    "no space": ([], "at least one --space"),
    "zero trials": (["--trials", "0", "--space", "optim.lr=1e-3,2e-3"], "at least 1"),
    "bad storage": (["--storage", "study.db", "--space", "optim.lr=1e-3,2e-3"], "database URL"),
    "unknown flag": (["--trails", "3", "--space", "optim.lr=1e-3,2e-3"], "unrecognized"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_argument_is_one_line_that_leaves_nothing_behind(name, tmp_path, capsys):
    args, words = BAD[name]
    out = tmp_path / "sweep"
    assert sweep_command.main(["--config", TINY, "--out", str(out), *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minigpt-jax sweep: error: "), captured.err
    assert words in lines[0]
    assert not out.exists()


def test_a_bad_config_file_through_the_cli_is_one_line(tmp_path, env):
    out = tmp_path / "sweep"
    command = _command(out, "--space", "optim.lr=1e-3,2e-3")
    command[command.index(TINY)] = str(tmp_path / "missing.py")
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "no such file" in result.stderr
    assert not out.exists()


# ----------------------------------------------------------------------------- studies


@pytest.fixture(scope="module")
def tpe_study(tmp_path_factory, env):
    """Three TPE trials over a log range and a list; every val loss reported, none pruned."""
    out = tmp_path_factory.mktemp("tpe") / "sweep"
    args = [
        *SHORT,
        "--space", "optim.lr=log:1e-3..3e-2", "--space", "model.norm=layernorm,rmsnorm",
        "--trials", "3", "--pruner", "none", "--seed", "0",
    ]  # fmt: skip
    stdout = _sweep(env, out, *args)
    return out, args, stdout


@pytest.mark.slow
def test_a_tpe_study_records_every_trial_and_writes_table_and_plots(tpe_study):
    out, _, stdout = tpe_study
    rows = _trials(out)
    assert [r["state"] for r in rows] == ["COMPLETE"] * 3
    lrs = [float(r["params_optim.lr"]) for r in rows]
    assert all(1e-3 <= lr <= 3e-2 for lr in lrs) and len(set(lrs)) == 3
    for row in rows:  # its value is the best val loss its run directory recorded
        lines = (out / row["user_attrs_run_dir"] / "metrics.jsonl").read_text().splitlines()
        vals = [json.loads(x)["val_loss"] for x in lines if "val_loss" in x]
        assert len(vals) == 2 and float(row["value"]) == pytest.approx(min(vals), rel=1e-12)
    assert {p.name for p in (out / "plots").iterdir()} >= {
        "history.png",
        "intermediate_values.png",
        "slices.png",
        "contours.png",
    }
    assert "plot skipped: importances: needs 2 searched keys and 4 complete trials" in stdout
    assert "3 trials: 3 complete, 0 pruned, 0 failed" in stdout


@pytest.mark.slow
def test_the_best_config_file_trains_as_it_is(tpe_study, tmp_path, env):
    out, _, _ = tpe_study
    best = _study(out).best_trial
    result = subprocess.run(
        [sys.executable, "-m", "minigpt_jax", "train", "--config", str(out / "best_config.py"),
         "--workdir", str(tmp_path / "best"), "--progress=false"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"(best {best.value:.4f})" in result.stdout  # the trial's run, trained again


@pytest.mark.slow
def test_the_same_command_resumes_and_another_is_refused(tpe_study, env):
    out, args, _ = tpe_study
    again = _sweep(env, out, *args)
    assert "3 trials: 3 complete" in again and "] trial" not in again  # nothing ran again
    changed = list(args)
    changed[changed.index("num_steps=20")] = "num_steps=30"
    result = subprocess.run(_command(out, *changed), capture_output=True, text=True, env=env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "other fixed settings: --set" in result.stderr and "--study NEWNAME" in result.stderr
    assert len(_study(out).trials) == 3


@pytest.mark.slow
def test_a_hopeless_trial_is_pruned_at_its_first_evaluation_and_keeps_its_run(tmp_path, env):
    out = tmp_path / "sweep"
    # Grid seed 1 runs lr 0.003 first (checked in test_grid_order_of_the_pruning_test); after one
    # complete trial the median pruner stops lr 1e-4, whose step-10 val loss is far above it.
    # 1,000 steps: far more than the few hundred the child runs on while the worker reacts.
    long = ["--set", "num_steps=1000", "--set", "eval_every=10", "--set", "checkpoint_every=500"]
    stdout = _sweep(
        env, out, *long, "--sampler", "grid", "--seed", "1", "--space", "optim.lr=0.003,1e-4",
        "--pruner", "median", "--pruner_startup", "1",
    )  # fmt: skip
    good, bad = sorted(_study(out).trials, key=lambda t: t.number)
    assert good.params == {"optim.lr": 0.003} and good.state.name == "COMPLETE"
    assert bad.state.name == "PRUNED" and bad.user_attrs["pruned_at_step"] == 10
    assert bad.intermediate_values[10] > good.intermediate_values[10]
    assert "is above the median" in bad.user_attrs["pruned_reason"]
    assert f"trial 1: pruned at step 10: {bad.user_attrs['pruned_reason']}" in stdout
    run_dir = out / bad.user_attrs["run_dir"]
    assert max(_steps(run_dir)) == bad.user_attrs["stopped_at_step"] < 1000
    assert (run_dir / "checkpoints").exists()


def test_grid_order_of_the_pruning_test():
    import optuna

    sampler = optuna.samplers.GridSampler({"optim.lr": [0.003, 1e-4]}, seed=1)
    study = optuna.create_study(sampler=sampler)
    distribution = optuna.distributions.CategoricalDistribution([0.003, 1e-4])
    assert study.ask({"optim.lr": distribution}).params == {"optim.lr": 0.003}


def _assert_each_point_once(out, values):
    trials = sorted(_study(out).trials, key=lambda t: t.number)
    assert [t.state.name for t in trials] == ["COMPLETE"] * len(values)
    assert sorted(t.params["optim.lr"] for t in trials) == sorted(values)
    run_dirs = [t.user_attrs["run_dir"] for t in trials]
    assert len(set(run_dirs)) == len(values)
    for run_dir in run_dirs:  # trained once: every step recorded once
        assert _steps(out / run_dir) == list(range(1, 21))


@pytest.mark.slow
def test_two_workers_share_one_sqlite_study_without_losing_or_repeating_a_trial(tmp_path, env):
    out = tmp_path / "sweep"
    values = [0.003, 0.01, 0.03]
    stdout = _sweep(
        env, out, *SHORT, "--sampler", "grid", "--workers", "2", "--pruner", "none",
        "--space", "optim.lr=" + ",".join(map(str, values)),
    )  # fmt: skip
    _assert_each_point_once(out, values)
    assert "[worker 0]" in stdout and "[worker 1]" in stdout


@pytest.mark.slow
def test_two_sweep_commands_on_one_study_at_once(tmp_path, env):
    out = tmp_path / "sweep"
    values = [0.003, 0.03]
    args = [*SHORT, "--sampler", "grid", "--pruner", "none", "--space", "optim.lr=0.003,0.03"]
    processes = [
        subprocess.Popen(
            _command(out, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
        )
        for _ in range(2)
    ]
    for process in processes:
        stdout, stderr = process.communicate(timeout=900)
        assert process.returncode == 0, stdout + stderr
    _assert_each_point_once(out, values)


def _wait_for(predicate, what, timeout=600):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.slow
def test_kill_9_mid_trial_then_a_rerun_resumes_it_from_its_checkpoint(tmp_path, env):
    out = tmp_path / "sweep"
    args = [
        "--set", "num_steps=40", "--set", "eval_every=10", "--set", "checkpoint_every=10",
        "--space", "optim.lr=0.003,0.03", "--sampler", "grid", "--seed", "1", "--trials", "1",
        "--heartbeat", "1",
    ]  # fmt: skip
    worker = subprocess.Popen(_command(out, *args), env=env, cwd=REPO, stdout=subprocess.DEVNULL)
    first = out / "trials" / "0000"
    _wait_for(lambda: (first / "checkpoints" / "10").exists(), "the trial's first checkpoint")
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    stdout = _sweep(env, out, *args)
    failed, resumed = sorted(_study(out).trials, key=lambda t: t.number)
    assert failed.state.name == "FAIL" and resumed.state.name == "COMPLETE"
    assert resumed.user_attrs["resumes"] == 0 and resumed.user_attrs["run_dir"] == "trials/0000"
    assert resumed.params == failed.params and resumed.value is not None
    assert "resumed from step" in (first / "train.log").read_text()
    assert _steps(first) == list(range(1, 41))  # every step once
    assert "2 trials: 1 complete, 0 pruned, 1 failed (1 resumed later)" in stdout


@pytest.mark.slow
def test_kill_9_between_a_trials_end_and_its_record_then_a_rerun_records_it_once(tmp_path, env):
    out = tmp_path / "sweep"
    args = [*SHORT, "--space", "optim.lr=0.003,0.03", "--sampler", "grid", "--trials", "1"]
    args += ["--heartbeat", "1"]
    worker = subprocess.Popen(
        _command(out, *args),
        env={**env, sweep_worker.HOLD_ENV: "600"},
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    log = out / "trials" / "0000" / "train.log"
    _wait_for(lambda: log.exists() and " wall " in log.read_text(), "the trial's end")
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    _sweep(env, out, *args)
    trials = sorted(_study(out).trials, key=lambda t: t.number)
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    lines = (out / "trials" / "0000" / "metrics.jsonl").read_text().splitlines()
    best = min(json.loads(x)["val_loss"] for x in lines if "val_loss" in x)
    assert trials[1].value == best  # not null, not the no-op's
    assert "already trained" in log.read_text()
    assert [r["state"] for r in _trials(out)].count("COMPLETE") == 1


def test_a_study_refuses_other_fixed_settings_or_a_changed_plugin(tmp_path, monkeypatch):
    """In process, no trial trained: the identity is checked when the study is opened."""
    monkeypatch.chdir(tmp_path)
    plugin = tmp_path / "my_act.py"
    plugin.write_text("import jax\n\n\ndef act(x):\n    return jax.nn.relu(x)\n")
    out = tmp_path / "sweep"
    base = ["--config", TINY, "--out", str(out), "--space", "optim.lr=1e-3,2e-3"]
    argv = [*base, "--set", "model.activation=my_act:act"]
    sweep = sweep_command.check(argv)
    assert "my_act" in sweep.identity["plugins"]
    out.mkdir()
    sweep_study.open_study(sweep)
    sweep_study.open_study(sweep_command.check(argv))  # the same command: resumed
    with pytest.raises(sweep_study.SweepError, match=r"--set .*--study NEWNAME"):
        sweep_study.open_study(sweep_command.check([*argv, "--set", "num_steps=30"]))
    with pytest.raises(sweep_study.SweepError, match=r"--space"):
        sweep_study.open_study(sweep_command.check([*argv[:-3], "optim.lr=1e-3,3e-3", *argv[-2:]]))
    plugin.write_text(plugin.read_text() + "# edited\n")
    with pytest.raises(sweep_study.SweepError, match="the source of plug-in modules"):
        sweep_study.open_study(sweep_command.check(argv))
    with pytest.raises(sweep_study.SweepError, match="objective"):
        plugin.write_text(plugin.read_text().replace("# edited\n", ""))
        sweep_study.open_study(sweep_command.check([*argv, "--target", "3.0"]))


@pytest.mark.slow
def test_the_target_objective_scores_a_miss_instead_of_failing(tmp_path, env):
    out = tmp_path / "sweep"
    stdout = _sweep(
        env, out, *SHORT, "--sampler", "grid", "--seed", "1", "--space", "optim.lr=0.003,1e-4",
        "--pruner", "none", "--target", "3.8",
    )  # fmt: skip
    hit, miss = sorted(_study(out).trials, key=lambda t: t.number)
    assert (
        hit.params == {"optim.lr": 0.003} and [hit.state.name, miss.state.name] == ["COMPLETE"] * 2
    )
    assert (
        hit.user_attrs["step_at_target"] == 20 and 0 < hit.value <= hit.user_attrs["train_seconds"]
    )
    assert miss.user_attrs["missed_target"] and miss.value == 2 * miss.user_attrs["train_seconds"]
    assert "training seconds to val loss 3.8" in stdout


@pytest.mark.parametrize("sampler", sweep_study.SAMPLERS)
@pytest.mark.parametrize("pruner", sweep_study.PRUNERS)
def test_every_sampler_and_pruner_proposes_values_of_the_space(sampler, pruner, tmp_path):
    """In process, values told by hand: each sampler draws from the space's distributions."""
    import optuna

    space = ["--space", "optim.lr=0.001,0.003", "--space", "model.norm=layernorm,rmsnorm"]
    if sampler != "grid":
        space += [
            "--space",
            "optim.warmup_steps=int:0..50",
            "--space",
            "optim.min_lr=log:1e-5..1e-4",
        ]
    sweep = sweep_command.check(
        ["--config", TINY, "--out", str(tmp_path), "--sampler", sampler, "--pruner", pruner, *space]
    )
    study = optuna.create_study(
        sampler=sweep_study.make_sampler(sweep, 0), pruner=sweep_study.make_pruner(sweep)
    )
    distributions = {d.key: d.distribution() for d in sweep.space}
    for value in (3.0, 2.0, 2.5, 1.0):
        trial = study.ask(distributions)
        for key, distribution in distributions.items():
            assert distribution._contains(distribution.to_internal_repr(trial.params[key]))
        trial.report(value, 10)
        trial.should_prune()
        study.tell(trial, value)
    assert study.best_value == 1.0


def test_an_entrys_own_setting_is_set_and_swept_as_a_number(tmp_path, env):
    """An entry-owned setting (EMA's ema_decay, declared by the eval-params entry that a --set
    picks; `--config tiny` by name) is searched as a float range like any built-in setting
    (it was `unknown config key config.optim.ema_decay`)."""
    out = tmp_path / "sweep"
    command = _command(out, *SHORT, "--set", "optim.eval_params=ema", "--trials", "2")
    command[command.index("--config") + 1] = "tiny"
    command += ["--space", "optim.ema_decay=float:0.9..0.99"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    trials = _study(out).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    assert all(0.9 <= t.params["optim.ema_decay"] <= 0.99 for t in trials)
    assert "ema_decay" in (out / "best_config.py").read_text()
