"""SIGINT and SIGTERM as a flag that long work (training, sampling) reads between compiled
calls, so it can end cleanly with what it has: `StopRequest`, a context manager that installs
the handlers and restores the previous ones."""

from __future__ import annotations

import gc
import signal
import threading

REDELIVER_AFTER_S = 0.02


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
        sig = signal.Signals(signum)
        if self.raises_on(sig) and _swallows_exceptions(frame):
            # Raised here, the exception would be printed as "Exception ignored" and lost (the
            # signal came inside a gc callback or a __del__): the signal comes again shortly.
            threading.Timer(REDELIVER_AFTER_S, self._redeliver, (signum,)).start()
            return
        self.on_signal(sig)

    def _redeliver(self, signum: int) -> None:
        if self._previous:  # the handlers are still ours
            signal.pthread_kill(threading.main_thread().ident, signum)

    def raises_on(self, sig: signal.Signals) -> bool:
        """Whether on_signal(sig) raises (subclasses that raise say when)."""
        del sig
        return False

    def on_signal(self, sig: signal.Signals) -> None:
        self.signal_name, self.signal_number = sig.name, int(sig)

    def requested(self) -> bool:
        return self.signal_name is not None

    def __exit__(self, *exc):
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _swallows_exceptions(frame) -> bool:
    """Whether an exception raised at `frame` would be reported as unraisable and dropped: the
    frame runs inside a gc callback (XLA's frees buffers there) or a __del__."""
    callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


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

    def raises_on(self, sig: signal.Signals) -> bool:
        return True

    def on_signal(self, sig: signal.Signals) -> None:
        super().on_signal(sig)
        raise Interrupted(sig)


class StopThenInterrupt(StopRequest):
    """The first SIGINT/SIGTERM is a flag that the work reads between compiled calls (sampling
    prints what it has); a second raises KeyboardInterrupt at once."""

    def raises_on(self, sig: signal.Signals) -> bool:
        return self.signal_name is not None

    def on_signal(self, sig: signal.Signals) -> None:
        if self.signal_name is not None:
            raise KeyboardInterrupt
        super().on_signal(sig)
