"""The median timer: one warm-up call, then `repeats` timed calls, each waited on."""

import chex
import jax.numpy as jnp

from minigpt_jax.runtime.timing import call_seconds, median_seconds


class TimingTest(chex.TestCase):
    def test_warms_up_once_then_times_each_call(self):
        calls = []

        def fn(x):
            calls.append("timed")
            return jnp.asarray(x) + 1

        def warm_up():
            calls.append("warm-up")
            return fn(0)

        seconds = call_seconds(fn, 1, repeats=4, warm_up=warm_up)
        self.assertEqual(calls, ["warm-up", "timed"] + ["timed"] * 4)
        self.assertLen(seconds, 4)
        self.assertTrue(all(s >= 0 for s in seconds))

    def test_median_is_of_the_timed_calls(self):
        calls = []

        def fn():
            calls.append(1)
            return jnp.zeros(())

        median = median_seconds(fn, repeats=5)
        self.assertLen(calls, 6)  # the default warm-up is one more call
        self.assertGreaterEqual(median, 0.0)
