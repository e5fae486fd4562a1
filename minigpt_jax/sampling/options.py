"""`SampleSettings`: how tokens are drawn and how prompts are batched, with the one set of
defaults that `generate`, the texts and `minigpt-jax sample` share; a bad value is refused when
the settings are made."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any


@dataclasses.dataclass(frozen=True)
class SampleSettings:
    """The sampling settings (host side; checked in one place, `__post_init__`).

    temperature: 0 takes the argmax (greedy); otherwise logits are divided by it. The default,
      1.0, draws from the model's own distribution; below 1 sharpens it (nanoGPT samples at 0.8).
    top_k, top_p: optional top-k, then nucleus, filters; None keeps every token, and top_k
      above V keeps every token too.
    batch_size: at most this many prompts per compiled batch (None: as many as fit).
    memory_bytes: the memory the batches may fill (None: a share of the free memory; see
      `plan.plan_sampling`).
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    batch_size: int | None = None
    memory_bytes: int | None = None

    def __post_init__(self):
        temperature = _real(self.temperature)
        if temperature is None or not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(
                f"temperature={self.temperature!r} must be finite and >= 0 (0 means greedy argmax)."
            )
        if self.top_k is not None and not (_is_int(self.top_k) and self.top_k >= 1):
            raise ValueError(
                f"top_k={self.top_k!r} must be a positive int, or None to keep all tokens."
            )
        top_p = _real(self.top_p)
        if self.top_p is not None and not (top_p is not None and 0.0 < top_p <= 1.0):
            raise ValueError(f"top_p={self.top_p!r} must be in (0, 1], or None to keep all tokens.")
        if self.batch_size is not None and not (_is_int(self.batch_size) and self.batch_size >= 1):
            raise ValueError(
                f"batch_size={self.batch_size!r} must be a positive int, or None for all."
            )
        if self.memory_bytes is not None and not (
            _is_int(self.memory_bytes) and self.memory_bytes >= 1
        ):
            raise ValueError(
                f"memory_bytes={self.memory_bytes!r} must be a positive int, or None for a share "
                "of the free memory."
            )

    def replace(self, **changes: Any) -> SampleSettings:
        """A copy with `changes` (SampleSettings' field names), checked like a new one."""
        unknown = sorted(set(changes) - {field.name for field in dataclasses.fields(self)})
        if unknown:
            names = ", ".join(field.name for field in dataclasses.fields(self))
            raise TypeError(
                f"unknown sampling setting {', '.join(unknown)}: the settings are {names}."
            )
        return dataclasses.replace(self, **changes)


def settings_of(settings: SampleSettings | None, **changes: Any) -> SampleSettings:
    """`settings` (default: SampleSettings()) with the keyword `changes`, the way every entry
    point takes them (`generate(..., temperature=0.8)` or `generate(..., settings=s)`)."""
    return (settings or SampleSettings()).replace(**changes)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _real(value) -> float | None:
    """The float of a number (a Python, numpy or JAX scalar); None for anything else."""
    if isinstance(value, (bool, str, bytes)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
