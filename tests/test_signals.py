"""runtime/signals: the stop classes that long work reads between compiled calls."""

import signal

import pytest

from minigpt_jax.runtime.signals import StopThenInterrupt


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
