"""docs/api.md's script, as it is written, from a folder outside the package: a model built,
trained by the library's jit-compiled step and sampled, in plain Python."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a subprocess that trains 200 steps (~20 s)

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def test_the_documented_script_trains_and_samples(tmp_path):
    [script] = re.findall(r"```python\n(# train_script\.py.*?)```", DOC.read_text(), re.DOTALL)
    (tmp_path / "train_script.py").write_text(script)
    result = subprocess.run(
        [sys.executable, "train_script.py"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    losses = [float(x) for x in re.findall(r"^step \d+: loss (\d+\.\d+)$", result.stdout, re.M)]
    assert len(losses) == 4, result.stdout
    # ln(V) ≈ 4.4 for the ~80 characters at the start; 200 steps of a small model reach < 3
    assert losses[-1] < 3.0 and losses[-1] < losses[0], losses
    sample = result.stdout.split("step 200: ")[1].split("\n", 1)[1]  # may hold newlines
    assert sample.startswith("The ") and len(sample) == len("The ") + 80 + 1, result.stdout
