"""Worker processes on loopback get exactly the float32 mean a reference forms in the same order,
with and without injected loss and duplicates (iSwitch §3.2-3.3)."""

from __future__ import annotations

import pytest

from tests.comm.switch.harness import assert_exact, run_workers, segments

STEPS = 3


@pytest.mark.distributed
@pytest.mark.parametrize("n, faults", [
    (2, ()),
    (4, ("--drop-rate", "0.05", "--dup-rate", "0.05")),
    (8, ()),
    pytest.param(8, ("--drop-rate", "0.05", "--dup-rate", "0.05"), marks=pytest.mark.slow),
])
def test_mean_is_exact(switches, n, faults):
    # 64 slots -> window 32 < 91 segments per call: the flow control is exercised too.
    sw = switches("--mtu", "1500", "--slots", "64", "--seed", str(n), *faults)
    got = run_workers(sw.addr, n, STEPS, {"rto_s": 0.05})
    assert_exact(got, list(range(n)), n, STEPS)
    stats = sw.stats()
    assert stats["segments_completed"] == segments() * STEPS
    assert stats["busy_dropped"] == stats["stale_dropped"] == stats["malformed_dropped"] == 0
    if faults:
        assert stats["injected_drops"] > 0 and stats["duplicates"] > 0
        assert stats["retransmissions_served"] > 0
        assert sum(r for _, r in got.values()) > 0
    assert sw.stop() == 0
    assert sw.final["members"] == 0  # every worker left


@pytest.mark.distributed
def test_delay_and_tiny_vectors(switches):
    sw = switches("--delay-ms", "5", "--mtu", "1500")
    shapes = [(1,), (3,)]
    got = run_workers(sw.addr, 3, 4, {"rto_s": 0.05}, shapes=shapes)
    assert_exact(got, [0, 1, 2], 3, 4, shapes=shapes)
