"""What a run logs: JSON lines at WORKDIR/metrics.jsonl and TensorBoard event files (no
TensorFlow), written by `MetricsWriter`; `RunLogger` fetches each chunk's metrics, times the
chunks and drives the progress bar.

Each record is appended with one write() of one whole line, unbuffered, so a process killed at
any moment leaves at most a torn trailing line; `read_metrics` drops such a tail.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import jax
from tqdm.auto import tqdm

from minigpt_jax.runtime.run_dir import RunDir
from minigpt_jax.settings.shape_schedule import ShapeSchedule

if TYPE_CHECKING:  # a low layer: the type only
    from minigpt_jax.typed_config import Experiment

_log = logging.getLogger(__name__)

# The keys a record writes of its own: the step, the training step's values (its loss is
# recorded as train_loss) and the timing; an evaluation's are val_<name> and eval_train_<name>.
# A plug-in's value (a step metric, a loss term) may take none of them: it would overwrite the
# run's own record, or be overwritten by it.
RECORD_KEYS = ("step", "train_loss", "loss", "cross_entropy", "grad_norm", "lr", "tokens_per_sec")
EVALUATION_PREFIXES = ("val_", "eval_train_")


def reserved_key(name: str) -> str | None:
    """What the run's own record writes under `name` (in words), or None when it is free."""
    if name in RECORD_KEYS:
        return "the training step's own value" if name != "step" else "the step number"
    if name.startswith(EVALUATION_PREFIXES):
        return "an evaluation's value (val_<name>, eval_train_<name>)"
    return None


def _tensorboardx():
    """The tensorboardX modules this writes with (its event protos and its synchronous
    EventsWriter), imported without torch: the package imports its SummaryWriter, whose module
    imports torch only to accept torch tensors (this writes Python floats), and where torch is
    installed that import alone costs a `train` 1-2 s of start-up. Where torch is already
    imported, as it is."""
    if "torch" not in sys.modules and "tensorboardX" not in sys.modules:
        sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX allows
        try:
            import tensorboardX  # noqa: F401
        finally:
            del sys.modules["torch"]  # a later `import torch` imports it as usual
    from tensorboardX import event_file_writer
    from tensorboardX.proto import event_pb2, summary_pb2

    return event_file_writer, event_pb2, summary_pb2


class EventFile:
    """TensorBoard's event file, written in the calling thread: tensorboardX's SummaryWriter
    writes from a thread of its own, which dies on a full disk while the training thread
    blocks for ever on its full queue, deaf to signals; here a failed write raises an OSError
    naming the file where the run can answer it (a checkpoint, one line).

    purge_step: a resumed run's first step; TensorBoard hides the older file's events from it
    on (the events a crash left past the checkpoint)."""

    def __init__(self, logdir: Path, purge_step: int | None = None):
        event_file_writer, self._event_pb2, self._summary_pb2 = _tensorboardx()
        self.logdir = logdir
        self._broken = False
        logdir.mkdir(parents=True, exist_ok=True)
        with self._naming_the_file():
            # Opens events.out.tfevents.<time>.<host> and writes the file-version event.
            self._writer = event_file_writer.EventsWriter(str(logdir / "events"))
            if purge_step is not None:
                event_pb2 = self._event_pb2
                self._writer.write_event(
                    event_pb2.Event(step=purge_step, file_version="brain.Event:2")
                )
                start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
                self._writer.write_event(event_pb2.Event(step=purge_step, session_log=start))

    @contextlib.contextmanager
    def _naming_the_file(self):
        """An OSError of a write names the event file (a buffered write names none); the file
        takes no more writes after one."""
        try:
            yield
        except OSError as error:
            self._broken = True
            path = getattr(getattr(self, "_writer", None), "_file_name", str(self.logdir))
            raise OSError(error.errno, error.strerror, path) from error

    def add_scalars(self, step: int, scalars: dict[str, float]) -> None:
        """One event holding every scalar of `step`."""
        if self._broken or not scalars:
            return
        summary = self._summary_pb2.Summary(
            value=[
                self._summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()
            ]
        )
        with self._naming_the_file():
            self._writer.write_event(
                self._event_pb2.Event(wall_time=time.time(), step=step, summary=summary)
            )

    def flush(self) -> None:
        if not self._broken:
            with self._naming_the_file():
                self._writer.flush()

    def close(self) -> None:
        """Flushes and closes; after a failed write, only closes (the error was raised)."""
        if self._broken:
            with contextlib.suppress(OSError):
                self._writer.close()
            return
        with self._naming_the_file():
            self._writer.close()


class MetricsWriter:
    """Appends one JSON object per line; on resume, first drops a torn tail and every record past
    the resumed step, so the file reads as one run even after a crash between checkpoints.

    In a multi-host run only process 0 writes (`enabled=False` elsewhere makes it a no-op).
    """

    def __init__(self, workdir: str | Path, resume_step: int = 0, *, enabled: bool = True):
        self.enabled = enabled
        self.failed = False  # a write failed (a full disk): the run keeps its steps and ends
        if not enabled:
            return
        run_dir = RunDir(workdir)
        self.path = run_dir.metrics
        if resume_step and self.path.exists():
            kept = read_metrics(workdir, upto_step=resume_step)
            tmp = self.path.with_name(self.path.name + ".part")
            tmp.write_text("".join(json.dumps(record) + "\n" for record in kept))
            os.replace(tmp, self.path)  # atomic: a crash here keeps the old file, still readable
        elif self.path.exists():
            self.path.unlink()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._tensorboard = EventFile(
            run_dir.tensorboard, purge_step=resume_step + 1 if resume_step else None
        )

    def write(self, step: int, metrics: dict[str, float], *, tensorboard: bool = True) -> None:
        """Appends {"step": step, **metrics} as one line (a non-finite value as its name, e.g.
        "nan": JSON has none) and, with `tensorboard`, the finite values to TensorBoard."""
        if not self.enabled:
            return
        record = {"step": int(step)}
        for key, value in metrics.items():
            value = float(value)
            record[key] = value if math.isfinite(value) else str(value)
        data = (json.dumps(record) + "\n").encode()
        self.failed = True  # until both writes are done
        try:
            written = os.write(self._fd, data)  # O_APPEND: one write, one whole line
        except OSError as error:  # os.write names no file: name metrics.jsonl
            raise OSError(error.errno, error.strerror, str(self.path)) from error
        if written != len(data):  # a full disk; never leave half a line in the middle
            # (read_metrics drops the torn tail this leaves)
            raise OSError(
                errno.ENOSPC, f"wrote {written} of {len(data)} bytes of a record", str(self.path)
            )
        if tensorboard:  # TensorBoard logs a NaN with lines naming nothing: finite values only
            finite = {k: float(v) for k, v in metrics.items() if math.isfinite(v)}
            self._tensorboard.add_scalars(int(step), finite)
        self.failed = False

    def flush(self) -> None:
        if not self.enabled:
            return
        self.failed = True
        self._tensorboard.flush()
        self.failed = False

    def close(self) -> None:
        if not self.enabled:
            return
        os.close(self._fd)
        self._tensorboard.close()


# (what, where it comes from) of a value, for the warning of a non-finite one.
EVALUATION_VALUES = ("evaluation value", "a metric of config.eval.metrics or a loss term's value")
STEP_VALUES = ("step value", "a metric of config.step_metrics")


class RunLogger:
    """Per-chunk bookkeeping: fetches each chunk's metrics (refusing non-finite ones), times the
    chunks, writes metrics.jsonl / TensorBoard rows and drives the progress bar.

    A chunk's metrics are fetched when the next chunk has been dispatched (`dispatched`), so the
    host never waits on the device in between, or at once before an evaluation or checkpoint
    (`drain`). In a multi-host run only process 0 writes and shows the bar.
    """

    def __init__(
        self,
        config: Experiment,
        workdir: Path,
        step: int,
        on_non_finite: Callable[[int, dict[str, float]], None],
        *,
        progress: bool,
    ):
        """step: where the run stands; on_non_finite(step, values) raises the error for a step
        whose loss or grad norm is not finite (values: the step's metrics by name)."""
        self.steps_per_call, self.log_every = config.steps_per_call, config.log_every
        self.shapes = ShapeSchedule.of(config)  # each chunk's tokens, for tokens_per_sec
        # A chunk's tokens where every step has one shape (0: they follow the schedule).
        self.chunk_tokens = self.shapes.tokens(0, self.steps_per_call) if self.shapes.fixed else 0
        self.on_non_finite = on_non_finite
        is_main_process = jax.process_index() == 0
        self.writer = MetricsWriter(workdir, resume_step=step, enabled=is_main_process)
        self.bar = tqdm(
            total=config.num_steps,
            initial=step,
            disable=not (progress and is_main_process),
            unit="step",
            dynamic_ncols=True,
        )
        self.chunk_seconds: list[float] = []
        self.train_loss: float | None = None
        self.val_loss: float | None = None
        self.evaluated_step: int | None = None  # the step of the last evaluation recorded
        self.eval_train_loss: float | None = None
        self._warned_non_finite: set[str] = set()  # keys already warned of
        self._pending = None  # (first_step, device metrics, dispatched_at) of the chunk in flight
        self._ready_at = time.perf_counter()  # when the device last finished (or was last idle)

    def dispatched(self, first_step: int, metrics: dict, dispatched_at: float) -> None:
        """Notes the chunk just dispatched; records the one before it, done by now."""
        if self._pending is not None:
            self._record(*self._pending)
        self._pending = (first_step, metrics, dispatched_at)

    def drain(self) -> None:
        """Records the chunk in flight, if any (blocks until it is done)."""
        if self._pending is not None:
            self._record(*self._pending)
            self._pending = None

    def _record(self, first_step: int, metrics_C: dict, dispatched_at: float) -> None:
        """Writes a row per step of the chunk from `first_step` (metrics_C: its metrics (C,) by
        name, fetched now), refusing a non-finite loss or grad norm."""
        metrics_C = jax.device_get(metrics_C)
        # The chunk ran from the later of its dispatch and the previous chunk's end until now.
        now = time.perf_counter()
        seconds = now - max(dispatched_at, self._ready_at)
        self._ready_at = now
        self.chunk_seconds.append(seconds)
        tokens = self.chunk_tokens or self.shapes.tokens(first_step, self.steps_per_call)
        tokens_per_sec = tokens / seconds
        for i in range(self.steps_per_call):
            step = first_step + i + 1
            values = {k: float(v[i]) for k, v in metrics_C.items()}
            if not (math.isfinite(values["loss"]) and math.isfinite(values["grad_norm"])):
                self.on_non_finite(step, values)
            # Every metric the step returns (the loss's aux values too), under its own name.
            loss = values.pop("loss")
            if not all(map(math.isfinite, values.values())):
                self._warn_non_finite(step, values, STEP_VALUES)
            row = {"train_loss": loss, **values, "tokens_per_sec": tokens_per_sec}
            self.writer.write(step, row, tensorboard=step % self.log_every == 0)
            self.train_loss = loss
        self.bar.update(self.steps_per_call)
        if (first_step + self.steps_per_call) % self.log_every < self.steps_per_call:
            self.bar.set_postfix(loss=f"{self.train_loss:.4f}", tok_s=f"{tokens_per_sec:,.0f}")

    def evaluation(self, step: int, val: dict[str, float], train: dict[str, float]) -> None:
        """Records an evaluation: val_loss and eval_train_loss, and val_<term> and
        eval_train_<term> for every other value the evaluation returned."""
        self.val_loss, self.eval_train_loss = val["loss"], train["loss"]
        row = {f"val_{k}": v for k, v in val.items()}
        row.update({f"eval_train_{k}": v for k, v in train.items()})
        self._warn_non_finite(step, row, EVALUATION_VALUES)
        self.writer.write(step, row)
        self.evaluated_step = step
        self.bar.write(
            f"step {step}: train loss {self.eval_train_loss:.4f}, val loss {self.val_loss:.4f}"
        )

    def _warn_non_finite(self, step: int, row: dict[str, float], what: tuple[str, str]) -> None:
        """Warns once per key of a value (a plug-in's, most often; `what` says which kind) that
        is not finite: it is kept in metrics.jsonl as a string and left out of TensorBoard."""
        for key, value in row.items():
            if not math.isfinite(value) and key not in self._warned_non_finite:
                self._warned_non_finite.add(key)
                _log.warning(
                    "the %s %s is %s at step %d (%s): it is recorded as %r in metrics.jsonl and "
                    "left out of TensorBoard; check the plug-in that computes it (said once per "
                    "key).",
                    what[0],
                    key,
                    value,
                    step,
                    what[1],
                    str(value),
                )

    def flush(self) -> None:
        """Flushes the files; host-side work (evaluation, checkpoints) is not chunk time."""
        self.writer.flush()
        self._ready_at = time.perf_counter()

    def message(self, text: str) -> None:
        """A line about the run (a stop, a checkpoint kept), on stderr, beside the bar."""
        self.bar.write(text, file=sys.stderr)

    def median_step_ms(self) -> float | None:
        if not self.chunk_seconds:
            return None
        return 1000 * statistics.median(self.chunk_seconds) / self.steps_per_call

    def close(self) -> None:
        self.bar.close()
        self.writer.close()


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
