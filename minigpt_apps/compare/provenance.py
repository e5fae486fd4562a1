"""How a comparison was made: the code version its runs were trained by (recorded in its identity,
so a resume across an upgrade is refused) and the lines report.md starts with (the command,
the versions, the commit, the machine and the date)."""

from __future__ import annotations

import datetime
import importlib.metadata
import platform
import shlex
import subprocess
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(_REPO), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def code_version() -> dict[str, str]:
    """{"minigpt_jax": its version, "commit": the checkout's commit ("+changes" when the
    library or the apps differ from it; "" outside a git checkout)}."""
    from minigpt_jax import __version__

    commit = _git("rev-parse", "HEAD")
    if commit and _git("status", "--porcelain", "--untracked-files=no", "--", "minigpt_jax",
                       "minigpt_apps"):  # fmt: skip
        commit += "+changes"
    return {"minigpt_jax": __version__, "commit": commit}


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


def lines(command: list[str], code: dict[str, str]) -> list[str]:
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
