"""How each command stops on SIGINT and SIGTERM. `StopRequest` (a context manager that installs
the handlers and restores the previous ones) turns them into a flag that long work reads between
compiled calls, so it ends cleanly with what it has: `TrainingStop` for `train` (a checkpoint;
raised at once while the run is set up), `RaiseOnSignal` for work with no step to stop at
(`eval`, `prepare`)."""

from __future__ import annotations

import contextlib
import gc
import signal
import sysconfig
import threading
from collections.abc import Iterator
from pathlib import Path

REDELIVER_AFTER_S = 0.02
# How long user code that runs between steps (a hook) has to return after SIGINT/SIGTERM
# before the signal is raised in it (UserCodeStopped): a signal is never ignored.
USER_CODE_GRACE_S = 5.0
# After this many deliveries that found no place to raise, raise wherever the signal lands.
MAX_REDELIVERIES = 250  # 5 s
_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent) + "/"
# Where installed libraries live (the standard library included): their code may run as a
# callback from native code.
_LIBRARY_DIRS = tuple(
    {
        str(Path(sysconfig.get_paths()[key]).resolve()) + "/"
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
    }
)


_EARLY: list[signal.Signals] = []  # what came before a command's own handling began


def _record_early(signum, frame) -> None:
    del frame
    if not _EARLY:
        _EARLY.append(signal.Signals(signum))


def record_signals_while_starting() -> None:
    """From here until a command's StopRequest takes over (or `stop_recording` hands the
    signals back to Python), SIGINT/SIGTERM are recorded, not acted on: while imports, flags and
    the config file are read, Python would raise KeyboardInterrupt wherever the signal lands
    (in a gc callback of JAX's it is dropped, and the command runs on) and SIGTERM would end
    the process with no word."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _record_early)


def stop_recording() -> signal.Signals | None:
    """Python's own handling of SIGINT and SIGTERM again; the signal recorded meanwhile, if
    any (the caller answers it)."""
    if signal.getsignal(signal.SIGINT) is _record_early:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is _record_early:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return recorded_signal()


def recorded_signal() -> signal.Signals | None:
    """The signal recorded since the command started and not answered, if any (taken: a second
    call says None); signals are still recorded after it."""
    return _EARLY.pop() if _EARLY else None


class StoppedWhileStarting(BaseException):
    """SIGINT/SIGTERM while the command read user code as it started (`what`: the config file,
    its plug-ins' modules), which may not return: nothing was written yet."""

    def __init__(self, sig: signal.Signals, what: str):
        super().__init__(sig.name, what)
        self.signal_name, self.what, self.exit_status = sig.name, what, 128 + int(sig)


class StopRequest:
    """Records the first SIGINT/SIGTERM; `requested()` says whether one came. Subclasses add
    what a signal does at once through `on_signal`. Outside the main thread signals are left
    alone (Python allows handlers only there)."""

    def __init__(self):
        self.signal_name: str | None = None
        self.signal_number = 0
        self._previous = {}
        self._redeliveries = 0
        # A signal that came where raising was not safe, until it is delivered again.
        self.pending: signal.Signals | None = None

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        if self._previous and _EARLY:  # it came while the command started: answered now
            self.pending = _EARLY.pop()
            threading.Timer(REDELIVER_AFTER_S, self._redeliver, (int(self.pending),)).start()
        return self

    def _handle(self, signum, frame):
        sig = signal.Signals(signum)
        if self.raises_on(sig) and not _safe_to_raise(frame):
            if self._redeliveries < MAX_REDELIVERIES:
                # Raised here, the exception could be lost or turned into another error: the
                # signal comes again shortly, when the main thread is in code of its own.
                self._redeliveries += 1
                self.pending = sig
                threading.Timer(REDELIVER_AFTER_S, self._redeliver, (signum,)).start()
                return
        self._redeliveries, self.pending = 0, None
        self.on_signal(sig)

    def _redeliver(self, signum: int) -> None:
        # Only while the handlers are still ours and nothing answered the signal meanwhile.
        if self._previous and self.pending is not None:
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
        if self.pending is not None and previous.get(self.pending) is _record_early:
            _EARLY[:] = [self.pending]  # never delivered: the command answers it as it ends
            self.pending = None


def _safe_to_raise(frame) -> bool:
    """Whether an exception raised at `frame` (where a signal handler runs) reaches the code
    that waits for it: in the package's code or a script's, not in an installed library's, which
    may run as a callback from native code that reports it as another error (JAX's pytree code:
    "Exception raised while checking equality of metadata fields of pytree"), nor in generated
    code, a gc callback or a __del__ (where it would be printed as "Exception ignored")."""
    if frame is None:
        return False
    filename = frame.f_code.co_filename
    ours = filename.startswith(_PACKAGE_DIR) or (
        frame.f_globals.get("__name__") == "__main__" and frame.f_code.co_name != "__eq__"
    )  # a script's code, `python -c` included (its file is "<string>", as generated code's)
    generated = filename.startswith("<") and not filename.startswith("<frozen ")  # not imports
    if not ours and (generated or filename.startswith(_LIBRARY_DIRS)):
        return False
    callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return False
        frame = frame.f_back
    return True


class Interrupted(BaseException):
    """SIGINT/SIGTERM during work with no step boundary of its own to stop at (reading and
    scoring a text, preparing shards): a BaseException, like KeyboardInterrupt, so no
    `except Exception` swallows it."""

    def __init__(self, sig: signal.Signals):
        super().__init__(sig.name)
        self.signal_name, self.exit_status = sig.name, 128 + int(sig)


class _RaiseWhileStarting(StopRequest):
    """SIGINT/SIGTERM raise StoppedWhileStarting where that is safe (StopRequest delivers the
    signal again shortly where it is not)."""

    def __init__(self, what: str):
        super().__init__()
        self.what = what

    def raises_on(self, sig: signal.Signals) -> bool:
        return True

    def on_signal(self, sig: signal.Signals) -> None:
        super().on_signal(sig)
        raise StoppedWhileStarting(sig, self.what)


@contextlib.contextmanager
def raising_while_starting(what: str) -> Iterator[None]:
    """Within, while the command starts (`record_signals_while_starting`) and reads user code
    that may hang (`what`: "importing the config's plug-ins"), SIGINT/SIGTERM raise
    StoppedWhileStarting instead of waiting to be answered once that code returns; one recorded
    before is raised as soon as the code runs, and one never delivered stays recorded. Outside
    a command's start (signals not recorded) it does nothing."""
    if signal.getsignal(signal.SIGINT) is not _record_early:
        yield
        return
    with _RaiseWhileStarting(what):
        yield


class RaiseOnSignal(StopRequest):
    """SIGINT and SIGTERM raise `Interrupted` at once, in the main thread, where the work can
    end with one line saying what was done (minigpt_jax.cli)."""

    def raises_on(self, sig: signal.Signals) -> bool:
        return True

    def on_signal(self, sig: signal.Signals) -> None:
        super().on_signal(sig)
        raise Interrupted(sig)


class StopBeforeTraining(BaseException):
    """SIGINT/SIGTERM arrived while a run was still being set up (reading its data, restoring,
    compiling): a BaseException, like KeyboardInterrupt, so no `except Exception` swallows it."""

    def __init__(self, signal_name: str, phase: str):
        super().__init__(signal_name, phase)
        self.signal_name, self.phase = signal_name, phase


class UserCodeStopped(BaseException):
    """SIGINT/SIGTERM raised in user code (a hook) that had not returned USER_CODE_GRACE_S
    after the signal (or at a second signal): a BaseException, so no `except Exception` in the
    user's code swallows it."""

    def __init__(self, sig: signal.Signals, grace_s: float):
        super().__init__(sig.name)
        self.signal_name, self.grace_s = sig.name, grace_s


class TrainingStop(StopRequest):
    """How `train` stops: SIGINT/SIGTERM is a flag the loop checks between compiled calls (and
    between evaluation batches), answered with a checkpoint; while `phase` names a setup step,
    the signal raises StopBeforeTraining at once instead (nothing is trained yet, so nothing
    needs saving); while user code runs (`user_code`), a signal it does not return from in time
    is raised in it."""

    def __init__(self):
        super().__init__()
        self.phase: str | None = None  # set by setup_phase until the loop starts
        self.step: int | None = 0  # where a run stopped during its setup stands (None: unknown)
        self._user_call = 0  # counts user_code calls: a late timer knows its own
        self._in_user_code: int | None = None  # the call running now
        self._grace_s = USER_CODE_GRACE_S
        self._interrupting = False  # the grace is over: the signal is raised in the user code

    def raises_on(self, sig: signal.Signals) -> bool:
        in_user_code = self._in_user_code is not None
        return self.phase is not None or (
            in_user_code and (self._interrupting or self.signal_name is not None)
        )

    def on_signal(self, sig: signal.Signals) -> None:
        first = self.signal_name is None
        super().on_signal(sig)
        if self.phase is not None:
            raise StopBeforeTraining(self.signal_name, self.phase)
        if self._in_user_code is not None:
            if self._interrupting or not first:  # the grace is over, or a second signal
                self._interrupting = False
                raise UserCodeStopped(sig, self._grace_s)
            self._stop_user_code_after(self._in_user_code)

    @contextlib.contextmanager
    def user_code(self, grace_s: float = USER_CODE_GRACE_S) -> Iterator[None]:
        """Within: user code runs (a hook). A SIGINT/SIGTERM that comes (or came before) is a
        flag as ever, but if the code has not returned `grace_s` later, the signal is raised in
        it as UserCodeStopped (a second signal raises at once): code that hangs never keeps the
        run deaf to signals."""
        self._user_call += 1
        call, self._in_user_code, self._grace_s = self._user_call, self._user_call, grace_s
        if self.signal_name is not None:
            self._stop_user_code_after(call)
        try:
            yield
        finally:
            self._in_user_code, self._interrupting = None, False

    def _stop_user_code_after(self, call: int) -> None:
        """In grace_s, the signal again, to be raised in user-code call `call` if it still runs."""

        def interrupt() -> None:
            if self._in_user_code == call and self._previous:
                self._interrupting = True
                signal.pthread_kill(threading.main_thread().ident, self.signal_number)

        timer = threading.Timer(self._grace_s, interrupt)
        timer.daemon = True
        timer.start()

    def setup_phase(self, phase: str, step: int | None) -> None:
        """Notes the setup step a run has reached and the training step it stands at (None
        while the checkpoints are still being checked; a signal that came before the first
        step is answered now)."""
        self.phase, self.step = phase, step
        if self.signal_name is not None:
            raise StopBeforeTraining(self.signal_name, phase)
        if self.pending is not None:  # it came in a library's code, delivered again soon
            self._answer_pending()

    def training_starts(self) -> None:
        """From here on a signal is a request the loop answers between calls; one that came
        during the setup and waits to be delivered again is answered now, as before training."""
        if self.pending is not None:
            self._answer_pending()
        self.phase = None

    def _answer_pending(self) -> None:
        sig, self.pending, self._redeliveries = self.pending, None, 0
        self.on_signal(sig)  # raises StopBeforeTraining: the phase is set


class StopThenInterrupt(StopRequest):
    """The first SIGINT/SIGTERM is a flag that the work reads between compiled calls (sampling
    prints what it has); a second raises KeyboardInterrupt at once."""

    def raises_on(self, sig: signal.Signals) -> bool:
        return self.signal_name is not None

    def on_signal(self, sig: signal.Signals) -> None:
        if self.signal_name is not None:
            raise KeyboardInterrupt
        super().on_signal(sig)
