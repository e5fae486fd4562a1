"""What many test files share: the repository, the pydoc corpus text, the tiny config on it, the
CLI in a subprocess, and the crash tests' run settings and run-directory readers. The fixtures
built from these live in conftest.py."""

import os
import re
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from pydoc_data.topics import topics

from configs import tiny
from minigpt_jax.train.loop import train_and_evaluate
from minigpt_jax.train.metrics import read_metrics
from minigpt_jax.typed_config import build_experiment

REPO = Path(__file__).resolve().parents[1]
# The pages of docs/extending/, one a seam; their ```python blocks that open with `# name.py` are
# files of a researcher's own, which the extending tests write into a folder outside the package.
EXTENDING_PAGES = sorted((REPO / "docs" / "extending").glob("*.md"))

# Saves every 4 steps keep the crash tests' kill targets dense; 2 kept checkpoints leave one to
# fall back to (the reference run: checkpoints 36 and 40).
CRASH_SETTINGS = {
    "num_steps": 40,
    "steps_per_call": 2,
    "eval_every": 8,
    "checkpoint_every": 4,
    "keep_checkpoints": 2,
}


# `minigpt-jax train` of 3 steps of the tiny config on a user's folder's corpus.txt (`user_dir`),
# evaluated and saved at step 3, into its folder "run".
THREE_TINY_STEPS = (
    "train", "--config", "tiny", "--workdir", "run", "--config.data.corpus=text",
    "--config.data.path=corpus.txt", "--progress=false", "--config.num_steps=3",
    "--config.eval_every=3", "--config.checkpoint_every=3",
)  # fmt: skip


def pydoc_text(chars: int | None = 40_000) -> str:
    """The first `chars` characters (None: all) of CPython's own documentation topics: real
    English text that ships with Python."""
    return "\n\n".join(topics[k] for k in sorted(topics))[:chars]


def tiny_config(corpus_file, **overrides):
    """configs/tiny.py on a .txt corpus; overrides by dotted key ("data.format": ...)."""
    config = tiny.get_config()
    config.data.corpus = "text"
    config.data.path = str(corpus_file)
    for key, value in overrides.items():
        node = config
        *parents, leaf = key.split(".")
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    return config


def crash_config(corpus_file, **overrides):
    """tiny_config with CRASH_SETTINGS."""
    return tiny_config(corpus_file, **{**CRASH_SETTINGS, **overrides})


def trained_tiny(workdir: Path, corpus_file, steps: int) -> Path:
    """`workdir` with tiny_config trained `steps` steps in process, evaluated and saved at the
    last one."""
    config = tiny_config(corpus_file, num_steps=steps, eval_every=steps, checkpoint_every=steps)
    train_and_evaluate(build_experiment(config), workdir, progress=False)
    return workdir


def resume(workdir, corpus_file, **overrides):
    """crash_config trained in process in `workdir` (resuming what is there)."""
    return train_and_evaluate(
        build_experiment(crash_config(corpus_file, **overrides)), workdir, progress=False
    )


def train_args(workdir, corpus_file, *extra) -> list[str]:
    """`python -m minigpt_jax train` of configs/tiny.py on `corpus_file`."""
    return [
        sys.executable,
        "-m",
        "minigpt_jax",
        "train",
        "--config",
        str(REPO / "configs" / "tiny.py"),
        "--workdir",
        str(workdir),
        "--config.data.corpus=text",
        f"--config.data.path={corpus_file}",
        "--progress=false",
        *extra,
    ]


def crash_train_args(workdir, corpus_file) -> list[str]:
    """train_args with CRASH_SETTINGS."""
    return train_args(
        workdir, corpus_file, *(f"--config.{k}={v}" for k, v in CRASH_SETTINGS.items())
    )


def run(args, **kwargs) -> subprocess.CompletedProcess:
    """A command from the repository root, its output captured as text (5 min at most)."""
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO, **kwargs)


def cli_in(folder: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m minigpt_jax ARGS` run from a user's folder (on PYTHONPATH beside this
    checkout), as a researcher would; check: assert it exits 0."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(folder)])}
    env.pop("MINIGPT_JAX_TRACEBACK", None)
    result = subprocess.run(
        [sys.executable, "-m", "minigpt_jax", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
        env=env,
    )
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def write_module(folder: Path, name: str, source: str) -> None:
    """Writes a user's module (a plug-in), dedented, to folder/name."""
    (folder / name).write_text(textwrap.dedent(source))


def error_lines(stderr: str) -> list[str]:
    """stderr without absl's log lines (W1203 ..., I1203 ...)."""
    return [line for line in stderr.splitlines() if not re.match(r"[WIEF]\d{4} ", line)]


def assert_one_plugin_error(stderr: str, header: str, frame: str, kept: str) -> list[str]:
    """A plug-in error as one header line, the user's frame (and its source line) and what was
    kept, nothing else: no traceback of JAX's callback frames."""
    lines = error_lines(stderr)
    assert lines[0] == header, stderr
    assert lines[1].endswith(frame), stderr
    assert lines[3].startswith(kept), stderr
    assert len(lines) == 4 and "CpuCallback" not in stderr, stderr
    return lines


def steps(directory: Path) -> list[int]:
    """The step folders of a checkpoints/ or best/ directory."""
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def trajectory(workdir, upto_step=None) -> list[dict]:
    """Every metrics record without its timing (tokens_per_sec), which differs run to run."""
    return [
        {k: v for k, v in record.items() if k != "tokens_per_sec"}
        for record in read_metrics(workdir, upto_step)
    ]


def snapshot(directory: Path) -> dict | None:
    """Every path under `directory` with its mtime and contents (None: not there)."""
    if not directory.exists():
        return None
    return {
        str(p.relative_to(directory)): (
            p.stat().st_mtime_ns,
            p.read_bytes() if p.is_file() else b"",
        )
        for p in sorted(directory.rglob("*"))
    }


def largest_file(directory: Path) -> Path:
    return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def tensorboard_scalars(workdir: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of every event file (TFRecord frames of Event protos)."""
    from tensorboardX.proto import event_pb2  # tensorboardX imports torch where it is installed

    scalars = {}
    for path in (workdir / "tensorboard").glob("events.out.tfevents.*"):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = value.simple_value
            offset += 12 + length + 4
    return scalars


def extending_files() -> dict[str, str]:
    """{file name: source} of every ```python block of docs/extending/'s pages that opens with
    `# name.py`, as written there."""
    files = {}
    for page in EXTENDING_PAGES:
        for name, source in re.findall(r"```python\n# (\w+\.py)\n(.*?)```", page.read_text(), re.S):
            assert name not in files, f"{name} is shown twice in docs/extending/"
            files[name] = source
    return files


def decoded_one_token_at_a_time(params, tokens_BxT, cfg):
    """logits_BxTxV of tokens_BxT fed through the KV cache one token at a time (positions
    0..T-1): what the full forward must equal."""
    import jax.numpy as jnp

    from minigpt_jax.model.gpt import forward_with_cache, init_cache

    batch, length = tokens_BxT.shape
    cache, steps = init_cache(cfg, batch, length), []
    for t in range(length):
        positions_Bx1 = jnp.full((batch, 1), t)
        token_Bx1 = tokens_BxT[:, t : t + 1]
        logits, cache = forward_with_cache(params, token_Bx1, positions_Bx1, cache, cfg)
        steps.append(logits)
    return jnp.concatenate(steps, 1)
