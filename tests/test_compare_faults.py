"""`minigpt-jax compare` under faults (issue 54, item 7): the machine's failures are never a run's
result, damaged records are found before they are scored, and a lost compare.json is rebuilt
from the runs. The runs' training is stood in for where only its outcome matters (fast)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from minigpt_apps.compare import command, plan, recovery, runs
from minigpt_apps.compare.record import END_FILE, damage, has_ended, read_record, write_end
from minigpt_jax.train import loop

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "tiny.py")


def _args(out: Path) -> list[str]:
    return ["--config", TINY, "--out", str(out), "--seeds", "2", "--arm", "x:log_every=3"]


def _training_raises(monkeypatch, error: Exception) -> None:
    def train_and_evaluate(*args, **kwargs):
        raise error

    monkeypatch.setattr(loop, "train_and_evaluate", train_and_evaluate)


def _end_files(out: Path) -> list[Path]:
    return sorted(out.glob(f"*/seed-*/{END_FILE}"))


def test_a_full_disk_or_a_missing_input_is_never_a_runs_result(tmp_path, monkeypatch, capsys):
    """Issue 54: ENOSPC (or a data.path created later) was written into each run's end as a
    permanent failure; after freeing space the same command said "0 to run, 4 already ended"."""
    out = tmp_path / "out"
    full = OSError(errno.ENOSPC, "No space left on device", str(out / "x"))
    _training_raises(monkeypatch, full)
    assert command.main(_args(out)) == 3
    stdout = capsys.readouterr().out
    assert "baseline seed 0: not run: OSError: [Errno 28] No space left on device" in stdout
    assert "the machine's failure, not the run's result: nothing is recorded" in stdout
    assert _end_files(out) == []

    _training_raises(monkeypatch, FileNotFoundError("corpus 'text': /d.txt does not exist"))
    assert command.main(_args(out)) == 3
    stdout = capsys.readouterr().out
    assert "4 to run, 0 already ended" in stdout
    assert _end_files(out) == []

    # The run's own failure is its result: recorded, and not run again.
    _training_raises(monkeypatch, ValueError("config.optim.lr is too large"))
    assert command.main(_args(out)) == 3
    assert "4 to run, 0 already ended" in capsys.readouterr().out
    ends = [json.loads(p.read_text()) for p in _end_files(out)]
    assert [e["status"] for e in ends] == ["failed"] * 4
    assert command.main(_args(out)) == 3
    assert "0 to run, 4 already ended" in capsys.readouterr().out


def test_a_train_childs_error_line_tells_the_machines_failure_from_the_runs():
    for line in (
        "minigpt-jax train: error: no space left on the device (/o/x/seed-0/metrics.jsonl); "
        "free some space, then rerun the same command",
        "minigpt-jax train: error: corpus 'text': /data/c.txt does not exist; pass a .txt file",
        "minigpt-jax train: error: [Errno 13] Permission denied: '/o/x/seed-0/train.log'",
    ):
        assert runs.environmental(line), line
    assert runs.environmental("no output")  # a child whose log could not be written either
    for line in (
        "minigpt-jax train: error: non-finite training loss nan (grad norm nan) at step 3",
        "minigpt-jax train: error: config.model.n_layer=0 must be at least 1.",
    ):
        assert not runs.environmental(line), line
    assert runs.environmental(FileNotFoundError("x")) and not runs.environmental(ValueError("x"))


def test_an_end_that_cannot_be_written_leaves_the_run_to_the_next_command(tmp_path, monkeypatch):
    """Issue 54: a full disk while writing a run's end record was a 58-line traceback."""
    said = []

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runs, "write_end", full)
    assert runs._record_end(tmp_path, "ok", "", said.append, "x seed 0") == "not run"
    assert said == [
        "x seed 0: ok, but its end could not be recorded (No space left on device); free some "
        "space, then rerun the same command (it resumes from its checkpoint)"
    ]


def test_an_end_record_overwritten_with_garbage_is_a_run_not_ended(tmp_path):
    """Issue 54: a JSONDecodeError traceback (27 lines); the run is now resumed or run again."""
    (tmp_path / END_FILE).write_text("\x00garbage{")
    assert not has_ended(tmp_path)
    assert read_record(tmp_path, "x", 0).status == "not run"
    (tmp_path / END_FILE).write_text('["ok"]')
    assert not has_ended(tmp_path)


def _ended_run(run_dir: Path, steps: int) -> None:
    run_dir.mkdir(parents=True)
    lines = [
        json.dumps({"step": s, "train_loss": 4.0 - s / 10, "tokens_per_sec": 1000.0})
        for s in range(1, steps + 1)
    ]
    lines += [json.dumps({"step": steps, "val_loss": 3.5})]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    write_end(run_dir, "ok")


def test_a_metrics_file_cut_mid_line_after_the_run_ended_is_trained_again(tmp_path):
    """Issue 54: metrics.jsonl cut mid-line (its end intact) was scored on step 13's value."""
    out = tmp_path / "out"
    comparison = command.check(_args(out))[0]
    arm, seed = comparison.runs()[0]
    run_dir = comparison.run_dir(arm, seed)
    _ended_run(run_dir, 20)
    assert damage(run_dir) is None
    metrics = run_dir / "metrics.jsonl"
    text = metrics.read_text()
    metrics.write_text(text[: len(text) // 2])  # mid-line
    assert damage(run_dir) == (
        "its metrics.jsonl no longer matches the sha256 recorded when it ended (cut or edited)"
    )
    said = []
    recovery.retrain_damaged(comparison, said.append)
    assert len(said) == 1
    assert said[0].startswith("baseline seed 0: its metrics.jsonl no longer matches")
    assert said[0].endswith("its values are not scored; training it again")
    assert not run_dir.exists()


def test_a_run_folder_replaced_by_a_file_is_one_line(tmp_path, monkeypatch, capsys):
    """Issue 54: a 20-line traceback."""
    monkeypatch.setattr(command, "run_here", lambda *args: None)  # the runs are not the point
    out = tmp_path / "out"
    assert command.main(_args(out)) == 3
    capsys.readouterr()
    (out / "x").mkdir(exist_ok=True)
    (out / "x" / "seed-1").write_text("")
    assert command.main(_args(out)) == 2
    err = capsys.readouterr().err
    assert err == (
        f"minigpt-jax compare: error: {out / 'x' / 'seed-1'} is a file where the run x seed 1 "
        "keeps its folder; move it aside (the run then trains again), then rerun the same "
        "command.\n"
    )


def test_a_lost_or_unreadable_compare_json_is_rebuilt_from_the_runs(tmp_path, monkeypatch, capsys):
    """Issue 54: "give another --out", abandoning the finished runs."""
    monkeypatch.setattr(command, "run_here", lambda *args: None)  # the runs are not the point
    out = tmp_path / "out"
    assert command.main(_args(out)) == 3
    comparison = command.check(_args(out))[0]
    for arm, seed in comparison.runs():
        runs.prepare(comparison, arm, seed)
    identity = out / plan.IDENTITY_FILE
    saved = json.loads(identity.read_text())["identity"]
    capsys.readouterr()

    identity.unlink()
    assert command.main(_args(out)) == 3
    stdout = capsys.readouterr().out
    assert f"{identity} was deleted: rebuilt from this command and the run folders" in stdout
    assert json.loads(identity.read_text())["identity"] == saved

    identity.write_text("{not json")
    assert command.main(_args(out)) == 3
    assert f"{identity} was unreadable: rebuilt" in capsys.readouterr().out
    assert json.loads(identity.read_text())["identity"] == saved
    assert (out / "compare.json.unreadable").read_text() == "{not json"

    # Runs of another command are never adopted.
    identity.unlink()
    other = [*_args(out)[:-1], "x:log_every=7"]
    assert command.main(other) == 2
    err = capsys.readouterr().err
    assert err == (
        f"minigpt-jax compare: error: --out {out} lost its compare.json (deleted) and "
        f"{out / 'x' / 'seed-0'} holds another config.py than this command writes for it: "
        "rerun the command that made the comparison (its runs' config.py say how they were "
        "set) to rebuild it from its runs, or give another --out.\n"
    )


@pytest.mark.parametrize("lost", ["deleted", "unreadable"])
def test_an_out_with_no_runs_is_not_rebuilt(tmp_path, lost):
    comparison = command.check(_args(tmp_path / "out"))[0]
    comparison.out.mkdir()
    if lost == "unreadable":
        (comparison.out / plan.IDENTITY_FILE).write_text("?")
    assert recovery.lost_identity(comparison) is None


@pytest.mark.slow
def test_a_train_child_missing_its_data_is_run_again_by_the_next_command(tmp_path, capsys):
    """--workers 2: each `train` child fails at once on a data.path that is not there yet; no
    end is recorded, so the next command (the path created) runs them again."""
    out, corpus = tmp_path / "out", tmp_path / "later.txt"
    args = [*_args(out), "--workers", "2", "--set", "data.corpus=text"]
    args += ["--set", f"data.path={corpus}"]
    assert command.main(args) == 3
    stdout = capsys.readouterr().out
    assert stdout.count(f"{corpus} does not exist") == 4, stdout
    assert stdout.count("the machine's failure, not the run's result") == 4, stdout
    assert _end_files(out) == []
    assert command.main(args) == 3
    assert "4 to run, 0 already ended" in capsys.readouterr().out
