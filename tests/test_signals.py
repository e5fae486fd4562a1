"""runtime/signals: the stop classes that long work reads between compiled calls."""

import json
import os
import signal
import sys
import time

import pytest

from minigpt_jax.runtime.signals import (
    REDELIVER_AFTER_S,
    Interrupted,
    RaiseOnSignal,
    StopBeforeTraining,
    StopThenInterrupt,
    TrainingStop,
)


def test_stop_then_interrupt_flags_the_first_signal_and_raises_on_the_second():
    """Sampling's stop: the first SIGTERM/SIGINT is a flag (the texts so far get printed), a
    second raises KeyboardInterrupt at once; the previous handlers come back on exit."""
    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with StopThenInterrupt() as stop:
        assert not stop.requested() and not stop.raises_on(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        assert stop.requested() and (stop.signal_name, stop.signal_number) == ("SIGTERM", 15)
        assert stop.raises_on(signal.SIGINT)  # so one inside a gc callback is delivered again
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert stop.signal_name == "SIGTERM"  # the first signal is what stopped the work
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == previous


def _library_frame():
    """A frame of the standard library's code (json's decoder, calling our object_hook)."""
    frames = []
    json.loads("{}", object_hook=lambda d: frames.append(sys._getframe(1)) or d)
    assert frames[0].f_code.co_filename.endswith(os.path.join("json", "decoder.py"))
    return frames[0]


def test_a_signal_in_a_librarys_code_is_delivered_again_in_code_of_our_own():
    """Raised inside a library's code, which may be a callback from native code, the exception
    would come out as another error (JAX's pytree code turned StopBeforeTraining into "Exception
    raised while checking equality of metadata fields of pytree"): the signal is delivered
    again until the main thread runs code of its own, and raised there."""
    with RaiseOnSignal() as stop:
        stop._handle(signal.SIGTERM, _library_frame())  # a signal landing in json's code
        assert not stop.requested()  # not raised there, not taken as done
        start = time.monotonic()
        with pytest.raises(Interrupted) as raised:
            while time.monotonic() - start < 5:  # our own code: the re-delivery raises here
                time.sleep(0.001)
        assert raised.value.signal_name == "SIGTERM" and time.monotonic() - start < 5
        with pytest.raises(Interrupted):  # in our own code, at once
            stop._handle(signal.SIGINT, sys._getframe())


def test_a_setup_signal_delivered_again_is_answered_before_training():
    """A signal that lands in a library's code while the run is set up (after XLA compiled, in
    JAX's own Python) waits to be delivered again; if setup ends first, training_starts answers
    it as a stop before training, in the phase where it came, never as a request the loop
    answers with a checkpoint of steps it then trains."""
    with TrainingStop() as stop:
        stop.setup_phase("compiling", 40)
        stop._handle(signal.SIGTERM, _library_frame())
        assert not stop.requested() and stop.pending == signal.SIGTERM
        with pytest.raises(StopBeforeTraining) as raised:
            stop.training_starts()
        assert (raised.value.signal_name, raised.value.phase) == ("SIGTERM", "compiling")
        assert stop.pending is None  # answered: the timer's delivery does nothing more
        time.sleep(5 * REDELIVER_AFTER_S)


def test_a_signal_in_a_scripts_code_is_raised_at_once():
    """A script's own frame (`python -c` code is "<string>", like generated code) is code of
    our own: the signal raises there, nothing waits to be delivered again."""
    frame = {}
    exec("import sys\nframe['f'] = sys._getframe()", {"__name__": "__main__", "frame": frame})
    with RaiseOnSignal() as stop:
        with pytest.raises(Interrupted):
            stop._handle(signal.SIGINT, frame["f"])
        assert stop.pending is None
