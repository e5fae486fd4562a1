"""`minigpt-jax sweep` against bad input and interruptions (issue 40): an unknown group named
with its valid keys, a seed out of range, studies apart in one folder, a storage it cannot
write or a damaged study.db, --heartbeat inf, an unknown command's --help, a signal while a
trial starts. Each refusal is one line, and nothing is written before it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The full suite only (`python -m pytest -q`): sweep commands in subprocesses.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "tiny.py")
SPACE = ["--space", "optim.lr=1e-3,2e-3"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("jax_cache")
    return {**os.environ, "PYTHONPATH": str(REPO), "MINIGPT_JAX_COMPILATION_CACHE": str(cache)}


def _run(env, *args, timeout=600):
    """`minigpt-jax ARGS` in a subprocess: the CompletedProcess."""
    command = [sys.executable, "-m", "minigpt_jax", *args]
    return subprocess.run(
        command, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout
    )


def _sweep(env, out, *args, timeout=600):
    return _run(env, "sweep", "--config", TINY, "--out", str(out), *args, timeout=timeout)


def _one_line_error(result) -> str:
    """The refusal's one line (exit 2, nothing on stdout)."""
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minigpt-jax sweep: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "args",
    [["--space", "nosuch.key=1,2"], [*SPACE, "--set", "train.steps=2"]],
    ids=["space", "set"],
)
def test_a_key_of_an_unknown_group_lists_the_valid_keys(args, env, tmp_path):
    out = tmp_path / "sweep"
    line = _one_line_error(_sweep(env, out, *args, "--trials", "1"))
    group = args[-1].split(".")[0] if args[0] == "--space" else "train"
    assert f"unknown config key config.{group}" in line, line
    assert "valid keys of config: seed, batch_size" in line and "optim" in line, line
    assert not out.exists()


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_seed_numpy_cannot_take_is_refused_before_anything_is_written(seed, env, tmp_path):
    out = tmp_path / "sweep"
    line = _one_line_error(_sweep(env, out, *SPACE, "--trials", "1", "--seed", seed))
    assert f"--seed {seed} is out of range; give one of 0..4294967295" in line, line
    assert not out.exists()  # no study.db


@pytest.mark.parametrize("sampler", ["tpe", "random", "cmaes"])
def test_the_largest_seed_varied_per_worker_and_rerun_still_seeds_a_sampler(sampler, tmp_path):
    from minigpt_apps.sweep import command as sweep_command
    from minigpt_apps.sweep import study as sweep_study

    argv = ["--config", TINY, "--out", str(tmp_path), *SPACE, "--sampler", sampler]
    sweep = sweep_command.check([*argv, "--seed", str(2**32 - 1), "--worker_index", "3"])
    sampler_made = sweep_study.make_sampler(sweep, existing=10**6)  # seed + 1009*3 + 7919e6
    assert type(sampler_made).__name__.lower().startswith(sampler[:3]), sampler_made


# ----------------------------------------------------------------------------- studies apart

# 4 steps, evaluated and saved every 2: one tiny trial.
TINY_TRIAL = [
    "--set", "num_steps=4", "--set", "eval_every=2", "--set", "checkpoint_every=2",
    *SPACE, "--trials", "1", "--pruner", "none",
]  # fmt: skip


def _contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def two_studies(tmp_path_factory, env):
    """The default study of one tiny trial, then `--study other` of the same settings in the
    same OUT (as the identity refusal advises): (OUT, the first study's files before, after)."""
    out = tmp_path_factory.mktemp("two") / "sweep"
    first = _sweep(env, out, *TINY_TRIAL)
    assert first.returncode == 0, first.stdout + first.stderr
    before = {**_contents(out / "trials"), "trials.csv": (out / "trials.csv").read_bytes()}
    second = _sweep(env, out, *TINY_TRIAL, "--study", "other")
    assert second.returncode == 0, second.stdout + second.stderr
    after = {**_contents(out / "trials"), "trials.csv": (out / "trials.csv").read_bytes()}
    return out, before, after, first.stdout, second.stdout


def test_a_second_study_in_one_out_trains_in_its_own_folder(two_studies):
    out, before, after, first, second = two_studies
    assert after == before  # the first study's runs and table untouched
    own = out / "studies" / "other"
    assert (own / "trials" / "0000" / "metrics.jsonl").is_file()
    assert (own / "trials.csv").is_file() and (own / "best_config.py").is_file()
    assert f"wrote {own / 'trials.csv'}" in second
    # a fresh trial of equal settings: the same val loss as the first study's trial 0
    loss = [line for line in first.splitlines() if "trial 0: best val loss" in line]
    assert loss and loss[0] in second, (first, second)


def test_a_study_made_before_study_folders_keeps_its_trials_in_out(tmp_path):
    import optuna

    from minigpt_apps.sweep import command as sweep_command
    from minigpt_apps.sweep import study as sweep_study

    out = tmp_path / "sweep"
    out.mkdir()
    argv = ["--config", TINY, "--out", str(out), *TINY_TRIAL]
    old = sweep_command.check([*argv, "--study", "lr"])
    made = optuna.create_study(study_name="lr", storage=old.storage_url)
    made.set_user_attr("identity", old.digest)  # what an older version recorded: no folder
    made.set_user_attr("fixed_settings", old.identity)
    sweep_study.open_study(old)
    assert old.folder == out
    new = sweep_command.check([*argv, "--study", "fresh"])
    sweep_study.open_study(new)
    assert new.folder == out / "studies" / "fresh"


@pytest.mark.parametrize("name", ["a/b", "..", "."])
def test_a_study_name_that_is_no_folder_name_is_refused(name, tmp_path, capsys):
    from minigpt_apps.sweep import command as sweep_command

    out = tmp_path / "sweep"
    assert sweep_command.main(["--config", TINY, "--out", str(out), *SPACE, "--study", name]) == 2
    assert "names its folder OUT/studies/NAME" in capsys.readouterr().err
    assert not out.exists()


def test_an_unknown_commands_help_is_an_error_naming_it(env):
    result = _run(env, "nosuch", "--help")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "minigpt-jax: error: unknown command 'nosuch'; the commands: train, prepare, sample, "
    ), result.stderr


def test_an_infinite_heartbeat_is_refused_as_such_before_anything_is_written(env, tmp_path):
    out = tmp_path / "sweep"
    line = _one_line_error(_sweep(env, out, *SPACE, "--trials", "1", "--heartbeat", "inf"))
    assert "--heartbeat inf must be a positive number of seconds, at most 3600" in line, line
    assert not out.exists()  # no study.db, no .ask.lock


def test_a_0_byte_study_db_beside_old_runs_is_refused_not_a_new_study_on_them(
    two_studies, env, tmp_path
):
    import shutil

    out = tmp_path / "sweep"
    shutil.copytree(two_studies[0] / "trials", out / "trials")  # runs of a study now lost
    (out / "study.db").write_bytes(b"")
    before = _contents(out / "trials")
    line = _one_line_error(_sweep(env, out, *TINY_TRIAL))
    assert f"study 'sweep' is not in sqlite:///{out / 'study.db'}" in line, line
    assert f"move {out / 'trials'} aside" in line, line
    assert _contents(out / "trials") == before


def test_two_commands_making_one_study_at_once_refuse_by_identity_not_integrity_error(
    tmp_path, monkeypatch
):
    """Both find the study without an identity, both insert it: the second insert hits the
    unique key (simulated here, as the real race is rare), and is refused by identity."""
    import optuna
    import sqlalchemy.exc

    from minigpt_apps.sweep import command as sweep_command
    from minigpt_apps.sweep import study as sweep_study

    argv = ["--config", TINY, "--out", str(tmp_path), "--storage", f"sqlite:///{tmp_path}/s.db"]
    mine = sweep_command.check([*argv, *SPACE])
    theirs = sweep_command.check([*argv, "--space", "optim.lr=3e-3,4e-3"])
    original = optuna.Study.set_user_attr

    def the_other_writes_first(study, key, value):
        monkeypatch.setattr(optuna.Study, "set_user_attr", original)
        sweep_study.open_study(theirs)
        raise sqlalchemy.exc.IntegrityError("INSERT INTO study_user_attributes", {}, None)

    monkeypatch.setattr(optuna.Study, "set_user_attr", the_other_writes_first)
    with pytest.raises(sweep_study.SweepError, match=r"other fixed settings: --space"):
        sweep_study.open_study(mine)


# ----------------------------------------------------------------------------- storage


@pytest.fixture
def read_only(tmp_path):
    """make(*paths): each path read-only, for root too (chattr +i), undone at the end."""
    made = []

    def make(*paths):
        for path in paths:
            path.chmod(0o555 if path.is_dir() else 0o444)
            if os.geteuid() == 0:
                subprocess.run(["chattr", "+i", str(path)], check=True)
            made.append(path)

    yield make
    for path in made:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o755 if path.is_dir() else 0o644)


def test_a_complete_study_in_a_read_only_study_db_is_one_line(
    two_studies, env, tmp_path, read_only
):
    import shutil

    out = tmp_path / "sweep"
    shutil.copytree(two_studies[0], out)
    read_only(out / "study.db", out)
    line = _one_line_error(_sweep(env, out, *TINY_TRIAL))
    assert f"the study's storage {out / 'study.db'} cannot be used (attempt to write a " in line
    assert "make it and its folder writable" in line, line


def test_another_programs_database_as_storage_is_one_line(env, tmp_path):
    import sqlite3

    out = tmp_path / "sweep"
    out.mkdir()
    with sqlite3.connect(out / "study.db") as other:  # tables of the same names, its own columns
        other.execute("create table studies (id text, name text)")
        other.execute("create table alembic_version (version_num text)")
    line = _one_line_error(_sweep(env, out, *TINY_TRIAL))
    assert f"the study's storage {out / 'study.db'} cannot be used (no such column: " in line
    assert "not another program's" in line, line


# ----------------------------------------------------------------------------- signals


def _started_sweep(env, out) -> subprocess.Popen:
    """The sweep of TINY_TRIAL started in the background, its output piped."""
    command = [sys.executable, "-m", "minigpt_jax", "sweep", "--config", TINY, "--out", str(out)]
    return subprocess.Popen(
        [*command, *TINY_TRIAL], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=REPO, env=env,
    )  # fmt: skip


def test_a_signal_while_a_trial_starts_is_one_line_and_the_rerun_resumes(env, tmp_path):
    import signal
    import time

    out = tmp_path / "sweep"
    worker = _started_sweep(env, out)
    first = worker.stdout.readline()  # "[worker 0] trial 0: ...": its child is starting
    assert "trial 0:" in first, first + worker.stderr.read()
    time.sleep(0.5)
    assert not (out / "trials" / "0000" / "metrics.jsonl").exists()  # still starting
    worker.send_signal(signal.SIGTERM)
    stdout, stderr = worker.communicate(timeout=300)
    assert worker.returncode == 143, first + stdout + stderr  # as train's, 128 + SIGTERM
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    assert "trial 0: stopped before its first step; rerun the same command" in stdout, stdout
    assert "minigpt-jax sweep: stopped by SIGTERM" in stderr, stderr
    rerun = _sweep(env, out, *TINY_TRIAL)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "trial 1: optim.lr=" in rerun.stdout and "(resumes trial 0)" in rerun.stdout
    assert "1 complete" in rerun.stdout, rerun.stdout


@pytest.mark.parametrize("out_existed", [False, True], ids=["new_out", "empty_out"])
def test_a_refusal_at_the_study_s_opening_leaves_out_as_it_was(out_existed, tmp_path, capsys):
    """Issue 40: a refusal by the storage or the study (here another program's database as
    --storage) left OUT/.ask.lock behind, in an OUT this command had made."""
    import sqlite3

    from minigpt_apps.sweep import command as sweep_command

    with sqlite3.connect(tmp_path / "other.db") as other:
        other.execute("create table studies (id text, name text)")
    out = tmp_path / "sweep"
    if out_existed:
        out.mkdir()
    storage = f"sqlite:///{tmp_path / 'other.db'}"
    argv = ["--config", TINY, "--out", str(out), *SPACE, "--storage", storage]
    assert sweep_command.main(argv) == 2
    assert "cannot be used (no such column: " in capsys.readouterr().err
    assert (sorted(out.iterdir()) if out.exists() else None) == ([] if out_existed else None)


def test_a_signal_while_the_sweep_starts_is_answered(env, tmp_path):
    """Issue 54: Ctrl-C in a sweep's first second (0.72-0.75 s: while optuna imports) was
    recorded by minigpt_jax.__main__ and never read; the study ran to its end, rc 0."""
    import signal
    import time

    out = tmp_path / "sweep"
    sweep = _started_sweep(env, out)
    time.sleep(0.7)
    sweep.send_signal(signal.SIGINT)
    stdout, stderr = sweep.communicate(timeout=300)
    assert sweep.returncode == 130, stdout + stderr
    assert "minigpt-jax sweep: stopped by SIGINT" in stderr, stderr
    assert not (out / "trials").exists(), stdout  # no trial ran


def test_a_sweep_with_no_complete_trial_exits_non_zero(env, tmp_path):
    """Issue 54: `2 trials: 0 complete, 0 pruned, 2 failed`, no best_config.py, rc 0."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "broken_act.py").write_text("def act(x):\n    return x * float('nan')\n")
    env = {**env, "PYTHONPATH": os.pathsep.join([str(REPO), str(user)])}
    out = tmp_path / "sweep"
    args = [*TINY_TRIAL, "--set", "model.activation=broken_act:act"]
    result = _run(env, "sweep", "--config", TINY, "--out", str(out), *args, "--trials", "2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "0 complete, 0 pruned, 2 failed" in result.stdout, result.stdout
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("minigpt-jax sweep: error: no trial of study 'sweep' completed")
    ), result.stderr


def test_a_range_in_the_wrong_syntax_is_shown_the_range_syntax(tmp_path):
    """Issue 54: `--space optim.lr=1e-4:1e-2:log` said "optim.lr is a number; give one."."""
    from minigpt_apps.sweep import command as sweep_command
    from minigpt_apps.sweep.study import SweepError

    argv = ["--config", TINY, "--out", str(tmp_path / "sweep"), "--space"]
    with pytest.raises(SweepError) as refused:
        sweep_command.check([*argv, "optim.lr=1e-4:1e-2:log"])
    assert "e.g. --space optim.lr=log:1e-4..1e-2 (log:A..B, float:A..B, int:A..B" in str(
        refused.value
    )
    with pytest.raises(SweepError, match=r"e\.g\. --space num_steps=int:200\.\.2000"):
        sweep_command.check([*argv, "num_steps=10-20"])


def test_a_postgres_url_without_its_driver_names_the_extra_and_masks_the_password(
    tmp_path, monkeypatch
):
    """Issue 54: "Failed to import DB access module ... Please install appropriate one.; check
    the URL." without naming the package, and the URL's password shown."""
    from minigpt_apps.sweep import command as sweep_command
    from minigpt_apps.sweep import study as sweep_study

    for driver in ("psycopg", "psycopg2"):
        monkeypatch.setitem(sys.modules, driver, None)  # `import psycopg` raises ImportError
    url = "postgresql://sweeper:s3cret@127.0.0.1:1/studies"
    argv = ["--config", TINY, "--out", str(tmp_path / "sweep"), *SPACE, "--storage", url]
    with pytest.raises(sweep_study.SweepError) as refused:
        sweep_study._storage(sweep_command.check(argv))
    assert str(refused.value) == (
        "--storage postgresql://sweeper:***@127.0.0.1:1/studies: the driver of postgresql:// "
        "is not installed; install psycopg (3): pip install 'minigpt-jax[postgres]'."
    )


@pytest.mark.parametrize(
    "child_code, want",
    [
        # a train that saves its checkpoint on SIGTERM exits 128 + SIGTERM: ended as asked
        ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
         "print('up', flush=True)\ntime.sleep(60)", 0),
        # one the SIGTERM reaches after its last step, its handler gone, dies by the signal:
        # ended as asked too (a trial that reached its target at its last step was failed so)
        ("import time\nprint('up', flush=True)\ntime.sleep(60)", 0),
        # anything else is the child's own failure
        ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\n"
         "print('up', flush=True)\ntime.sleep(60)", 3),
    ],
)  # fmt: skip
def test_stopping_a_trials_child_reads_its_end_by_the_signal_as_asked(child_code, want):
    from minigpt_apps.sweep import trial

    child = subprocess.Popen([sys.executable, "-c", child_code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "up\n"  # its handler (if any) is installed
    assert trial.stop(child) == want
