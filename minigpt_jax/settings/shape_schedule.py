"""Shape schedules: the batch shape (B, T) of each training step, from the settings
`seq_len_schedule` and `batch_size_schedule` (modded-nanogpt's sequence-length warmup).

A schedule is "value:until,value:until,...[,value]": each value holds until (before) its step,
then the next; after the last `until` the last bare value holds, or, without one, the full size
(model.block_size, batch_size). "16:100,32:200" trains steps 0-99 at length 16, 100-199 at 32,
then at block_size. Values ramp up to the full size (never past it: the memory checks and the
evaluation use the full shape), and every `until` is a multiple of steps_per_call, so each
compiled chunk of steps has one shape. The shape at a step is a function of the step alone, so
a resumed run continues with the right one; the settings are trajectory settings, so a resume
with another schedule is refused (train.resume). Each shape's chunk is compiled once
(train.setup.ChunkPerShape). "" (the default) is the full size throughout: one shape, the plain
run."""

from __future__ import annotations

import dataclasses
from typing import Any

EXAMPLES = {"seq_len_schedule": "'16:100,32:200'", "batch_size_schedule": "'4:100,8:200'"}
_WHAT = {"seq_len_schedule": "length", "batch_size_schedule": "batch size"}
_FULL = {"seq_len_schedule": "model.block_size", "batch_size_schedule": "batch_size"}


@dataclasses.dataclass(frozen=True)
class StepSchedule:
    """One setting's values by step: `phases` ((value, until), ...) with increasing `until`,
    then `final` from the last until on."""

    phases: tuple[tuple[int, int], ...]
    final: int

    def at(self, step: int) -> int:
        """The value at optimizer step `step` (0-based: the step's batch is drawn for it)."""
        for value, until in self.phases:
            if step < until:
                return value
        return self.final

    @property
    def values(self) -> tuple[int, ...]:
        return (*(value for value, _ in self.phases), self.final)


def parse_step_schedule(
    text: str, name: str, *, full: int, steps_per_call: int, divisor: int = 1
) -> StepSchedule:
    """The StepSchedule of setting `name`'s `text` ("" : `full` throughout). Raises ValueError,
    one line naming the fix, for a part that is not value:until (a bare value only last), an
    until not above the one before or not a multiple of steps_per_call, or a value outside
    1..full or not a multiple of `divisor` (grad_accum_steps for a batch size)."""
    where = f"config.{name}={text!r}"
    phases: list[tuple[int, int]] = []
    final = full
    parts = [part.strip() for part in text.split(",")] if text.strip() else []
    for index, part in enumerate(parts):
        value_text, colon, until_text = part.partition(":")
        last = index == len(parts) - 1
        value, until = _integer(value_text), _integer(until_text) if colon else None
        if value is None or (colon and until is None) or (not colon and not last):
            raise ValueError(
                f"{where}: {part!r} is not {_WHAT[name]}:until_step (a bare {_WHAT[name]} only "
                f"last); write e.g. {EXAMPLES[name]} ({_WHAT[name]}s by step, then {_FULL[name]})."
            )
        if not 1 <= value <= full or value % divisor:
            rule = f"from 1 to {_FULL[name]}={full}"
            if divisor > 1:
                rule += f" and a multiple of grad_accum_steps={divisor}"
            raise ValueError(
                f"{where}: {_WHAT[name]} {value} must be {rule} (a schedule ramps up to the "
                f"full {_WHAT[name]}); change it, or raise {_FULL[name]}."
            )
        if until is None:
            final = value
            continue
        before = phases[-1][1] if phases else 0
        if until <= before or until % steps_per_call:
            raise ValueError(
                f"{where}: until_step {until} must be above {before} and a multiple of "
                f"steps_per_call={steps_per_call} (each compiled chunk of steps has one shape); "
                f"use a multiple of {steps_per_call} above {before}."
            )
        phases.append((value, until))
    return StepSchedule(tuple(phases), final)


def _integer(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


@dataclasses.dataclass(frozen=True)
class ShapeSchedule:
    """The batch shape of every training step: rows (batch_size_schedule) by tokens
    (seq_len_schedule)."""

    batch_size: StepSchedule
    seq_len: StepSchedule

    @classmethod
    def of(cls, config: Any) -> ShapeSchedule:
        """The schedule of a run config (an Experiment, or a ConfigDict), checked as
        `parse_step_schedule` does."""
        return cls(
            parse_step_schedule(
                config.batch_size_schedule,
                "batch_size_schedule",
                full=config.batch_size,
                steps_per_call=config.steps_per_call,
                divisor=config.grad_accum_steps,
            ),
            parse_step_schedule(
                config.seq_len_schedule,
                "seq_len_schedule",
                full=config.model.block_size,
                steps_per_call=config.steps_per_call,
            ),
        )

    @property
    def fixed(self) -> tuple[int, int] | None:
        """(B, T) of every step when neither setting schedules a change (the plain run), else
        None."""
        if self.batch_size.phases or self.seq_len.phases:
            return None
        return self.batch_size.final, self.seq_len.final

    def at(self, step: int) -> tuple[int, int]:
        """(B, T) of optimizer step `step`'s batch, which holds T + 1 tokens a row."""
        return self.batch_size.at(step), self.seq_len.at(step)

    def tokens(self, first_step: int, steps: int) -> int:
        """Input tokens of steps [first_step, first_step + steps)."""
        if self.fixed:
            return steps * self.fixed[0] * self.fixed[1]
        return sum(b * t for b, t in map(self.at, range(first_step, first_step + steps)))

    def first_steps(self, start: int, stop: int) -> dict[tuple[int, int], int]:
        """{(B, T): the first step with that shape} over steps [start, stop) (start < stop):
        the shapes a run from `start` to `stop` compiles, each once, in the order it meets them."""
        changes = {until for _, until in self.batch_size.phases + self.seq_len.phases}
        firsts: dict[tuple[int, int], int] = {}
        for step in [start, *sorted(step for step in changes if start < step < stop)]:
            firsts.setdefault(self.at(step), step)
        return firsts
