"""Worker processes on loopback get exactly the float32 mean a reference forms in the same order,
with and without injected loss and duplicates (iSwitch §3.2-3.3)."""

from __future__ import annotations

import pytest

from tests.comm.switch import harness
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
    # every worker's gradient taken in exactly once per step, whatever was lost or duplicated
    assert stats["bytes_aggregated"] == n * STEPS * 33_005 * 4
    if faults:
        assert stats["injected_drops"] > 0 and stats["duplicates"] > 0
        assert stats["retransmissions_served"] > 0
        assert sum(r for _, r in got.values()) > 0
    assert sw.stop() == 0
    assert sw.final["members"] == 0  # every worker left


@pytest.mark.distributed
def test_serve_prints_rates_per_interval():
    """``switch serve --stats-interval`` prints packet, byte and drop rates and its CPU use."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "gmi_drl.comm.switch", "serve", "--bind",
                             "127.0.0.1:0", "--stats-interval", "0.2", "--mtu", "1500"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        addr = proc.stdout.readline().split()[-1]
        got = run_workers(addr, 2, 2, {"rto_s": 0.05})
        assert_exact(got, [0, 1], 2, 2)
        busy = []  # reports of intervals with traffic (0.2 s each, two lines per report)
        for _ in range(200):
            line = proc.stdout.readline()
            if line.startswith("rates") and "aggregated 0.00 MB/s" not in line:
                busy.append(line)
                break
        assert busy, "no report of an interval with aggregated bytes"
        assert "packets in" in busy[0] and "drops 0.0/s" in busy[0] and "CPU" in busy[0]
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


def test_rates_are_deltas_over_the_interval():
    from gmi_drl.comm.switch.cli import DROPS, Rates

    zero = {k: 0 for k in ("packets_in", "packets_out", "bytes_aggregated", *DROPS)}
    rates = Rates()
    rates.line(zero)
    rates._t -= 2.0  # as if two seconds passed
    line = rates.line({**zero, "packets_in": 200, "packets_out": 100,
                       "bytes_aggregated": 4_000_000, "stale_dropped": 4, "injected_drops": 2})
    assert "packets in 100/s, out 50/s, aggregated 2.00 MB/s, drops 3.0/s" in line


@pytest.mark.distributed
def test_delay_and_tiny_vectors(switches):
    sw = switches("--delay-ms", "5", "--mtu", "1500")
    shapes = [(1,), (3,)]
    got = run_workers(sw.addr, 3, 4, {"rto_s": 0.05}, shapes=shapes)
    assert_exact(got, [0, 1, 2], 3, 4, shapes=shapes)


@pytest.mark.distributed
@pytest.mark.parametrize("shapes, steps", [(None, 4), ([(200,)], 80)])
def test_pipelined_rounds_are_exact(switches, shapes, steps):
    """Every round begun at once, loss and duplicates injected: the window (32 segments) spans
    rounds of 91 segments, or holds 32 one-segment rounds of 80; each result is exact."""
    shapes = shapes or harness.SHAPES
    sw = switches("--mtu", "1500", "--slots", "64", "--seed", "5", "--drop-rate", "0.05",
                  "--dup-rate", "0.05")
    got = run_workers(sw.addr, 3, steps, {"rto_s": 0.05, "pipelined": True}, shapes=shapes)
    assert_exact(got, [0, 1, 2], 3, steps, shapes=shapes)
    stats = sw.stats()
    assert stats["segments_completed"] == segments(shapes) * steps
    assert stats["busy_dropped"] == 0  # the window held across rounds


@pytest.mark.parametrize("mtu, window_bytes, window", [
    (1500, 2 << 20, 128),      # capped at slots // 2
    (65535, 2 << 20, 32),      # 2 MiB of 65,496-byte segments
    (9000, 1, 1),              # at least one segment
])
def test_window_follows_window_bytes(mtu, window_bytes, window):
    from gmi_drl.comm.switch import SwitchConfig, SwitchDaemon

    d = SwitchDaemon(SwitchConfig(mtu=mtu, window_bytes=window_bytes))
    try:
        assert d.window == window
    finally:
        d.close()
    with pytest.raises(ValueError, match="--window-bytes 0 must be >= 1"):
        SwitchConfig(window_bytes=0)


@pytest.mark.distributed
def test_a_full_segmented_send_then_a_short_segment_alone(switches):
    # 44 datagrams of 366 floats fill one 64 KB segmented send at MTU 1500; the 45th, shorter,
    # goes alone: both shapes of a worker's send, on both data planes
    shapes = [(44 * 366 + 100,)]
    sw = switches("--mtu", "1500")
    got = run_workers(sw.addr, 2, STEPS, {"rto_s": 0.05}, shapes=shapes)
    assert_exact(got, [0, 1], 2, STEPS, shapes=shapes)
    assert sw.stats()["segments_completed"] == 45 * STEPS


def test_data_plane_choice(monkeypatch):
    from gmi_drl.comm.switch import SwitchConfig, SwitchDaemon, dataplane

    with pytest.raises(ValueError, match="--data-plane fpga must be one of"):
        SwitchConfig(data_plane="fpga")
    monkeypatch.setattr(dataplane, "native_plane_error", lambda: "the native data plane is "
                        "not built (no compiler): run the switch with --data-plane python")
    with pytest.raises(ValueError, match="--data-plane python"):
        SwitchDaemon(SwitchConfig(data_plane="native"))  # and its socket is closed (no_leaks)
    d = SwitchDaemon(SwitchConfig(data_plane="auto"))
    try:
        assert d.data_plane == "python" and d.stats()["data_plane"] == "python"
    finally:
        d.close()


def test_a_worker_that_asks_for_the_native_path_where_it_is_not_built(monkeypatch):
    from gmi_drl.comm.switch import SwitchReducer, client

    monkeypatch.setattr(client, "native_plane_error", lambda: "not built (no compiler)")
    with pytest.raises(ValueError, match="not built"):
        SwitchReducer("127.0.0.1:9", 0, 1, native=True, join_timeout_s=1)  # socket closed


@pytest.mark.distributed
def test_begin_writes_the_mean_into_out(switches):
    import numpy as np

    from gmi_drl.comm.switch import SwitchReducer

    sw = switches("--mtu", "1500")
    red = SwitchReducer(sw.addr, 0, 1, join_timeout_s=20)
    try:
        vec = np.arange(1000, dtype=np.float32)
        with pytest.raises(ValueError, match="out"):
            red.begin(vec, out=vec)
        with pytest.raises(ValueError, match="out"):
            red.begin(vec, out=np.empty(999, np.float32))
        out = np.full(1000, np.nan, np.float32)
        red.begin(vec, out=out)
        got = []
        while not got:
            got = red.pump(0.05)
        assert got[0] is out and np.array_equal(out, vec)
    finally:
        red.close()
