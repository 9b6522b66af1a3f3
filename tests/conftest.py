"""What every test may assume of the process it runs in."""

from __future__ import annotations

import signal

import pytest

# A shell starts a background job (`make test &`, CI under nohup) with SIGINT ignored, and
# Python then installs no KeyboardInterrupt handler; the Ctrl-C tests would wait forever for an
# interrupt that never comes. A terminal's Ctrl-C is what they test: give the suite (and every
# process it starts, which inherits the disposition) the handler a terminal would.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the group marks
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``-n``, ``--dist loadgroup``), the tests that share one Ray cluster
    (a package fixture of ``tests/cluster``) run in one worker, which starts it once; so do the
    tests of the warp engine, whose pools compile a task's kernels on first use (seconds to a
    minute on an empty cache): one worker compiles each, where two would compile it at once.
    It runs before pytest-xdist's hook (``tryfirst``), which turns the marks into the node ids'
    ``@group`` suffix; registered later, that hook would otherwise run first and see none."""
    for item in items:
        if "tests/cluster/" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif "tests/envs/test_warp_pool.py" in item.nodeid or item.get_closest_marker("warp"):
            item.add_marker(pytest.mark.xdist_group("warp"))
