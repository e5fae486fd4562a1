"""Start-up of a second identical `minigpt-jax train`, without JAX's persistent compilation
cache (before) and with it (after, the default), side by side.

    python -m benchmarks.compile_cache [--config configs/default.py] [--steps 20] [--rounds 1]

Each round trains the config twice with the cache off, then twice into a fresh cache folder,
each run a fresh process in a fresh run directory; the second run of each pair is the figure: the
process's wall time (imports, data, compilation, the few steps) and the compilation seconds the
run prints. A sweep's trials that differ only in a value the programs do not hold as a constant
hit the cache the same way; a changed lr, batch or shape is a new program and compiles again.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_once(config: str, steps: int, workdir: Path, cache: str) -> tuple[float, float]:
    """(process wall seconds, compile seconds it printed) of one `train` in a fresh process."""
    env = {**os.environ, "MINIGPT_JAX_COMPILATION_CACHE": cache}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    command = [
        sys.executable, "-m", "minigpt_jax", "train", "--config", config,
        "--workdir", str(workdir), "--progress=false", f"--config.num_steps={steps}",
        f"--config.eval_every={steps}", f"--config.checkpoint_every={steps}",
    ]  # fmt: skip
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - start
    if result.returncode:
        raise SystemExit(f"train failed: {result.stderr.strip().splitlines()[-1]}")
    compile_s = float(re.search(r"compile ([\d.]+) s", result.stdout).group(1))
    return wall, compile_s


def _machine() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next(x.split(":", 1)[1].strip() for x in lines if x.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    return f"{model}, {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/default.py")
    parser.add_argument("--steps", type=int, default=20, help="a multiple of steps_per_call")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    before, after = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for r in range(args.rounds):
            for name, cache, results in (
                ("off", "off", before),
                ("on", str(root / f"cache{r}"), after),
            ):
                run_once(args.config, args.steps, root / f"{name}{r}a", cache)
                results.append(run_once(args.config, args.steps, root / f"{name}{r}b", cache))
    print(f"{args.config}, {args.steps} steps, {args.rounds} round(s); {_machine()}")
    print(f"{'second identical run':<24}{'process wall s':>16}{'compile s':>12}")
    for label, rows in (("cache off (before)", before), ("cache on (after)", after)):
        wall = statistics.median(w for w, _ in rows)
        compile_s = statistics.median(c for _, c in rows)
        print(f"{label:<24}{wall:>16.1f}{compile_s:>12.2f}")


if __name__ == "__main__":
    main()
