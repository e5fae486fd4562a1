"""The suite's order and its units of work for pytest-xdist's `--dist loadgroup` (as .ci/run runs
it): what conftest.py's collection hook applies.

Under xdist's default `--dist load` a module's tests go to whichever worker is free, so a module
fixture (a CLI run every test of the module reads) is built once on each worker that gets one of
its tests; and a long test sent last leaves the other worker idle while it ends. Here each module
with a module- or class-scoped fixture is one unit (`xdist_group`: its fixtures built once), and
the longest units come first (longest-processing-time order), the short tests after, to fill.
"""

import pytest

# The longest units of the whole suite, longest first: seconds each took under `-n 2` on a
# 2-core machine (.ci/run's --durations, 2026-12-07; a module's figure is its slowest fixture
# or test). A name that no longer matches only loses its place; the rest keep collection order.
LONGEST_FIRST = (
    "tests/test_lab_app.py",  # 40 tests in a real browser, most 25-50 s
    "tests/test_docs.py::test_the_readmes_train_and_sample_commands_run_as_written",  # 295 s
    "tests/test_compare.py",  # from_sweep 85 s, kill -9 65 s, the 9-run comparison 59 s
    "tests/test_sharding.py",  # 8 fake devices in a subprocess, 130 s
    "tests/test_scale.py::test_bootstrap_intervals_cover_at_about_their_nominal_rate",  # 132 s
    "tests/test_scale.py",  # the killed and resumed grid, 127 s
    "tests/test_multihost.py",  # 113 s
    "tests/test_experiments.py",  # the positions study, 103 s
    "tests/test_sweep.py",  # the TPE study, 60 s, and many CLI sweeps
    "tests/test_sweep_postgres.py",  # 75 s
    "tests/test_reliability.py",  # signals while reading, 61 s
    "tests/test_crash_safety.py",
    "tests/test_sweep_reliability.py",
    "tests/test_docs.py",  # the site built, served and photographed
)
_SHARED_SCOPES = ("module", "class", "package")


def shares_a_fixture(item: pytest.Item) -> bool:
    """Whether `item` uses a fixture that lives longer than one test but not the session."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definitions[-1].scope in _SHARED_SCOPES for definitions in info.name2fixturedefs.values()
    )


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def _rank(item: pytest.Item) -> int:
    """The index of the first LONGEST_FIRST entry naming `item` (its test, else its module)."""
    for rank, name in enumerate(LONGEST_FIRST):
        if item.nodeid == name or _module(item) == name:
            return rank
    return len(LONGEST_FIRST)


def order_and_group(items: list[pytest.Item], *, group: bool) -> None:
    """Sorts `items` in place, longest units first and otherwise in collection order (a
    module's tests stay together); with `group`, marks each test that shares a module fixture
    with the xdist group of its module."""
    position = {id(item): index for index, item in enumerate(items)}
    items.sort(key=lambda item: (_rank(item), position[id(item)]))
    if group:
        for item in items:
            if shares_a_fixture(item):
                item.add_marker(pytest.mark.xdist_group(_module(item)))
