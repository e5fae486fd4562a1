"""SIGINT and SIGTERM as a flag that long work (training, sampling) reads between compiled
calls, so it can end cleanly with what it has: `StopRequest`, a context manager that installs
the handlers and restores the previous ones."""

from __future__ import annotations

import signal


class StopRequest:
    """Records the first SIGINT/SIGTERM; `requested()` says whether one came. Subclasses add
    what a signal does at once through `on_signal`. Outside the main thread signals are left
    alone (Python allows handlers only there)."""

    def __init__(self):
        self.signal_name: str | None = None
        self.signal_number = 0
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame):
        del frame
        self.on_signal(signal.Signals(signum))

    def on_signal(self, sig: signal.Signals) -> None:
        self.signal_name, self.signal_number = sig.name, int(sig)

    def requested(self) -> bool:
        return self.signal_name is not None

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Interrupted(BaseException):
    """SIGINT/SIGTERM during work with no step boundary of its own to stop at (reading and
    scoring a text, preparing shards): a BaseException, like KeyboardInterrupt, so no
    `except Exception` swallows it."""

    def __init__(self, sig: signal.Signals):
        super().__init__(sig.name)
        self.signal_name, self.exit_status = sig.name, 128 + int(sig)


class RaiseOnSignal(StopRequest):
    """SIGINT and SIGTERM raise `Interrupted` at once, in the main thread, where the work can
    end with one line saying what was done (minigpt_jax.cli)."""

    def on_signal(self, sig: signal.Signals) -> None:
        super().on_signal(sig)
        raise Interrupted(sig)
