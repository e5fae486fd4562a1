"""Sweeps across machines on a real PostgreSQL (issue 54, item 6): a throwaway server on a
loopback port, two sweep commands with their own OUT folders (two "machines") on one study, one
killed with SIGKILL mid-trial; the other finishes the study with every trial accounted for, and
the database password is never printed or written."""

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "tiny.py")
PASSWORD = "pw-3f9c1e7a"  # never to be seen in any output or file
TRIALS = 4
SWEEP_ARGS = [
    "--set", "num_steps=40", "--set", "eval_every=10", "--set", "checkpoint_every=10",
    "--space", "optim.lr=1e-3,2e-3,3e-3,4e-3", "--sampler", "grid", "--trials", str(TRIALS),
    "--pruner", "none", "--heartbeat", "1", "--study", "across",
]  # fmt: skip


def _server_binary(name: str) -> str | None:
    """PostgreSQL's `name` (initdb, pg_ctl): on PATH, or where Debian's postgresql puts it."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url():
    """postgresql://sweeper:PASSWORD@127.0.0.1:PORT/postgres of a server started for the
    module in a temporary folder (as `nobody` when the tests run as root: initdb refuses root)."""
    pytest.importorskip("psycopg", reason="needs psycopg 3: pip install 'minigpt-jax[postgres]'")
    initdb, pg_ctl = _server_binary("initdb"), _server_binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("needs PostgreSQL's server (initdb, pg_ctl): apt-get install postgresql")
    as_user = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
    folder = Path(tempfile.mkdtemp(prefix="minigpt-pg-"))
    (folder / "pw").write_text(PASSWORD + "\n")
    if as_user:
        for path in (folder, folder / "pw"):
            shutil.chown(path, "nobody", "nogroup")
    data, port = folder / "data", _free_port()
    subprocess.run(
        [*as_user, initdb, "-D", str(data), "-U", "sweeper", f"--pwfile={folder / 'pw'}",
         "-A", "scram-sha-256"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    (folder / "pw").unlink()
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1"
    subprocess.run(
        [*as_user, pg_ctl, "-D", str(data), "-l", str(folder / "log"), "-w", "-o", options,
         "start"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    try:
        yield f"postgresql://sweeper:{PASSWORD}@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True, timeout=120,
        )  # fmt: skip
        shutil.rmtree(folder, ignore_errors=True)


class _Sweep:
    """A sweep command in the background, its output read as it comes."""

    def __init__(self, out: Path, url: str, env: dict):
        command = [sys.executable, "-m", "minigpt_jax", "sweep", "--config", TINY, "--out"]
        self.process = subprocess.Popen(
            [*command, str(out), *SWEEP_ARGS, "--storage", url],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env,
        )  # fmt: skip
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    def output(self) -> str:
        self._reader.join(timeout=30)
        return "".join(self.lines)


def _running_trial(sweep: _Sweep, out: Path, deadline_s: float = 300) -> Path:
    """The run directory of a trial `sweep` started, once it has logged a step."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for line in list(sweep.lines):
            if "] trial " in line and ": optim.lr=" in line:
                number = int(line.split("] trial ")[1].split(":")[0])
                run_dir = out / "studies" / "across" / "trials" / f"{number:04d}"
                if (run_dir / "metrics.jsonl").exists():
                    return run_dir
        assert sweep.process.poll() is None, sweep.output()
        time.sleep(0.2)
    raise AssertionError("no trial started: " + "".join(sweep.lines))


def test_two_machines_share_a_study_and_a_killed_one_loses_no_trial(postgres_url, tmp_path):
    import optuna
    from optuna.trial import TrialState

    cache = tmp_path / "jax_cache"
    env = {**os.environ, "PYTHONPATH": str(REPO), "MINIGPT_JAX_COMPILATION_CACHE": str(cache)}
    out_a, out_b = tmp_path / "machine_a", tmp_path / "machine_b"
    first = _Sweep(out_a, postgres_url, env)
    second = _Sweep(out_b, postgres_url, env)
    killed_run = _running_trial(second, out_b)
    second.process.send_signal(signal.SIGKILL)  # the machine is lost mid-trial
    second.process.wait(timeout=60)
    assert first.process.wait(timeout=900) == 0, first.output()
    # The first machine's closing lines count the whole study; a rerun there adds nothing.
    rerun = subprocess.run(
        [sys.executable, "-m", "minigpt_jax", "sweep", "--config", TINY, "--out", str(out_a),
         *SWEEP_ARGS, "--storage", postgres_url],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=900,
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    study = optuna.load_study(study_name="across", storage=postgres_url)
    trials = study.get_trials(deepcopy=False)
    resumed = {t.user_attrs["resumes"]: t for t in trials if "resumes" in t.user_attrs}
    resumes = {t.number for t in resumed.values()}
    counted = [t for t in trials if t.number not in resumes]
    assert len(counted) == TRIALS, [(t.number, t.state) for t in trials]
    for trial in counted:  # each counted trial ended, or its resume did
        final = trial
        while final.state == TrialState.FAIL and final.number in resumed:
            final = resumed[final.number]
        assert final.state == TrialState.COMPLETE, (trial.number, trial.state, final.state)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert any(t.state == TrialState.FAIL for t in trials)  # the killed machine's trial
    assert sorted(t.params["optim.lr"] for t in counted) == [1e-3, 2e-3, 3e-3, 4e-3]
    assert killed_run.is_dir()
    # The password: never printed (masked as ***), never written under either OUT.
    printed = first.output() + second.output() + rerun.stdout + rerun.stderr
    assert PASSWORD not in printed
    assert "optuna-dashboard postgresql://sweeper:***@127.0.0.1:" in printed
    for folder in (out_a, out_b):
        for path in folder.rglob("*"):
            if path.is_file():
                assert PASSWORD.encode() not in path.read_bytes(), path
