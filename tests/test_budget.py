"""The memory budget sees a container's limit (issue 57, item 7): the tightest memory cgroup
limit of the process, v2 or v1, minus what it uses, bounds the host RAM a corpus may take, so a
corpus over the limit is refused with the figure before it is read (not OOM-killed)."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from helpers import REPO

from minigpt_jax import budget

GiB = 1 << 30


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_cgroup_v2_limit_is_the_tightest_over_the_path(tmp_path):
    _tree(
        tmp_path,
        {
            "proc": "0::/jobs/run\n",
            "fs/jobs/memory.max": f"{4 * GiB}\n",  # the parent: 4 GiB, 1 GiB used
            "fs/jobs/memory.current": f"{GiB}\n",
            "fs/jobs/run/memory.max": f"{2 * GiB}\n",  # the run's: 2 GiB, 1.5 used, 0.25 cache
            "fs/jobs/run/memory.current": f"{3 * GiB // 2}\n",
            "fs/jobs/run/memory.stat": f"anon 1\ninactive_file {GiB // 4}\nactive_file 7\n",
        },
    )
    found = budget.cgroup_memory_available(str(tmp_path / "fs"), str(tmp_path / "proc"))
    assert found is not None and found[0] == GiB // 2 + GiB // 4
    assert f"{tmp_path}/fs/jobs/run/memory.max: 2.0 GiB" in found[1]


def test_the_cgroup_v1_limit_is_read_and_no_limit_is_none(tmp_path):
    _tree(
        tmp_path,
        {
            "proc": "5:cpu,cpuacct:/x\n4:memory:/slurm/job_7\n0::/\n",
            "fs/memory/slurm/job_7/memory.limit_in_bytes": f"{3 * GiB}\n",
            "fs/memory/slurm/job_7/memory.usage_in_bytes": f"{GiB}\n",
            "fs/memory/memory.limit_in_bytes": "9223372036854771712\n",  # the root: no limit
            "fs/memory/memory.usage_in_bytes": f"{50 * GiB}\n",
        },
    )
    found = budget.cgroup_memory_available(str(tmp_path / "fs"), str(tmp_path / "proc"))
    assert found is not None and found[0] == 2 * GiB
    (tmp_path / "fs/memory/slurm/job_7/memory.limit_in_bytes").write_text("9223372036854771712")
    assert budget.cgroup_memory_available(str(tmp_path / "fs"), str(tmp_path / "proc")) is None
    # A container that sees only its own cgroup mounted at the root: read there.
    _tree(tmp_path, {"fs/memory/memory.limit_in_bytes": f"{GiB}\n"})
    found = budget.cgroup_memory_available(str(tmp_path / "fs"), str(tmp_path / "proc"))
    assert found is not None and found[0] == 0  # 50 GiB used of 1: nothing left


def _own_memory_cgroup() -> Path | None:
    """This process's memory cgroup directory if a child can be made in it (v1 or v2 with the
    memory controller), else None."""
    try:
        lines = Path(budget.PROC_SELF_CGROUP).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            directory = Path(budget.CGROUP_ROOT, "memory", path.strip("/"))
        elif controllers == "" and Path(budget.CGROUP_ROOT, "cgroup.controllers").exists():
            directory = Path(budget.CGROUP_ROOT, path.strip("/"))
            enabled = (directory / "cgroup.subtree_control").read_text().split()
            if "memory" not in enabled:
                continue
        else:
            continue
        if directory.is_dir() and os.access(directory, os.W_OK):
            return directory
    return None


@pytest.mark.slow
def test_a_corpus_over_the_cgroup_limit_is_refused_before_it_is_read(tmp_path):
    """Issue 57, 7: a 128 MB corpus in memory inside a cgroup limited to 2 GiB passed the
    check on the host's MemAvailable (19.7 GiB) and was OOM-killed after 25 s with no word.
    Here: 64 MiB of text (1.7 GiB to encode by char) in a cgroup limited to 1 GiB."""
    parent = _own_memory_cgroup()
    if parent is None:
        pytest.skip("no writable memory cgroup to make a child in (the fixture tests cover it)")
    child = parent / f"minigpt_test_{uuid.uuid4().hex[:8]}"
    child.mkdir()
    try:
        limit_file = "memory.limit_in_bytes" if "memory" in child.parts else "memory.max"
        (child / limit_file).write_text(str(GiB))
        corpus = tmp_path / "corpus.txt"
        with open(corpus, "wb") as file:
            file.truncate(64 << 20)  # sizes are checked before anything is read
        procs = child / "cgroup.procs"
        refused = subprocess.run(
            [sys.executable, "-m", "minigpt_jax", "train", "--config",
             str(REPO / "configs" / "tiny.py"), "--workdir", str(tmp_path / "run"),
             "--config.data.corpus=text", f"--config.data.path={corpus}", "--progress=false"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path,
            preexec_fn=lambda: procs.write_text(str(os.getpid())),
        )  # fmt: skip
    finally:
        child.rmdir()
    assert refused.returncode == 1, refused.stderr[-3000:]
    line = refused.stderr.strip().splitlines()[-1]
    assert "the corpus holds 64 MiB of text; data.format='memory' would need about 1.7 GiB" in (
        line
    ), line
    assert f"available (the memory cgroup's limit ({child / limit_file}: 1.0 GiB))" in line
    assert not (tmp_path / "run").exists()
