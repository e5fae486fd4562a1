"""Run metrics: JSON lines at WORKDIR/metrics.jsonl and TensorBoard event files (no TensorFlow)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tensorboardX import SummaryWriter

METRICS_FILENAME = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


class MetricsWriter:
    """Appends one JSON object per line; on resume, drops lines past the resumed step first,
    so the file reads as one run even after a crash between checkpoints.

    In a multi-host run only process 0 writes (`enabled=False` elsewhere makes it a no-op).
    """

    def __init__(self, workdir: str | Path, resume_step: int = 0, *, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        self.path = Path(workdir) / METRICS_FILENAME
        if resume_step and self.path.exists():
            kept = [
                line
                for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept))
        elif self.path.exists():
            self.path.unlink()
        self._file = self.path.open("a")
        self._tensorboard = SummaryWriter(
            str(Path(workdir) / TENSORBOARD_DIR),
            purge_step=resume_step + 1 if resume_step else None,
        )

    def write(self, step: int, metrics: dict[str, float], *, tensorboard: bool = True) -> None:
        if not self.enabled:
            return
        record = {"step": int(step)}
        record.update({k: _json_float(v) for k, v in metrics.items()})
        self._file.write(json.dumps(record) + "\n")
        if tensorboard:
            for key, value in metrics.items():
                self._tensorboard.add_scalar(key, value, int(step))

    def flush(self) -> None:
        if not self.enabled:
            return
        self._file.flush()
        self._tensorboard.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        self._tensorboard.close()


def _json_float(value: float) -> float | str:
    value = float(value)
    return value if math.isfinite(value) else str(value)  # JSON has no NaN/inf


def read_metrics(workdir: str | Path) -> list[dict]:
    """All records of WORKDIR/metrics.jsonl, in order."""
    path = Path(workdir) / METRICS_FILENAME
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
