"""Run metrics: JSON lines at WORKDIR/metrics.jsonl and TensorBoard event files (no TensorFlow).

Each record is appended with one write() of one whole line, unbuffered, so a process killed at
any moment leaves at most a torn trailing line; `read_metrics` drops such a tail.
"""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path

from tensorboardX import SummaryWriter

from minigpt_jax.runtime.run_dir import RunDir


class MetricsWriter:
    """Appends one JSON object per line; on resume, first drops a torn tail and every record past
    the resumed step, so the file reads as one run even after a crash between checkpoints.

    In a multi-host run only process 0 writes (`enabled=False` elsewhere makes it a no-op).
    """

    def __init__(self, workdir: str | Path, resume_step: int = 0, *, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        run_dir = RunDir(workdir)
        self.path = run_dir.metrics
        if resume_step and self.path.exists():
            kept = read_metrics(workdir, upto_step=resume_step)
            tmp = self.path.with_name(self.path.name + ".part")
            tmp.write_text("".join(_line(record) for record in kept))
            os.replace(tmp, self.path)  # atomic: a crash here keeps the old file, still readable
        elif self.path.exists():
            self.path.unlink()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._tensorboard = SummaryWriter(
            str(run_dir.tensorboard),
            purge_step=resume_step + 1 if resume_step else None,
        )

    def write(self, step: int, metrics: dict[str, float], *, tensorboard: bool = True) -> None:
        if not self.enabled:
            return
        record = {"step": int(step)}
        record.update({k: _json_float(v) for k, v in metrics.items()})
        data = _line(record).encode()
        written = os.write(self._fd, data)  # O_APPEND: one write, one whole line
        if written != len(data):  # a full disk; never leave half a line in the middle
            # (read_metrics drops the torn tail this leaves)
            raise OSError(
                errno.ENOSPC, f"wrote {written} of {len(data)} bytes of a record", str(self.path)
            )
        if tensorboard:
            for key, value in metrics.items():
                self._tensorboard.add_scalar(key, value, int(step))

    def flush(self) -> None:
        if not self.enabled:
            return
        self._tensorboard.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        os.close(self._fd)
        self._tensorboard.close()


def _line(record: dict) -> str:
    return json.dumps(record) + "\n"


def _json_float(value: float) -> float | str:
    value = float(value)
    return value if math.isfinite(value) else str(value)  # JSON has no NaN/inf


def read_metrics(workdir: str | Path, upto_step: int | None = None) -> list[dict]:
    """The records of WORKDIR/metrics.jsonl in order, up to `upto_step` (default: all).

    A torn last line (a crash while appending) is dropped; an unreadable line elsewhere raises a
    ValueError naming the file and the line.
    """
    path = RunDir(workdir).metrics
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("not a JSON object with an integer 'step'")
        except ValueError as error:
            if number == len(lines):  # no newline after it: the tail of an interrupted write
                break
            raise ValueError(
                f"{path}, line {number}, is not a metrics record ({error}): {line[:80]!r}. "
                "Delete that line (or the file, to keep no history) and rerun."
            ) from None
        if upto_step is None or record["step"] <= upto_step:
            records.append(record)
    return records
