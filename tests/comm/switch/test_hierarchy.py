"""Hierarchical aggregation (iSwitch §3.4): 2 ToR switches under 1 core give the exact mean,
summed as the tree sums: each ToR over its workers, the core over the ToRs."""

from __future__ import annotations

import time

import pytest

from tests.comm.switch.harness import assert_exact, run_workers, segments


@pytest.mark.distributed
@pytest.mark.parametrize("faults", [pytest.param((), marks=pytest.mark.slow),
                                    ("--drop-rate", "0.03", "--dup-rate", "0.03")])
def test_two_tors_under_a_core(switches, faults):
    core = switches("--switch-id", "9", "--slots", "64", "--seed", "1", *faults)
    tor0 = switches("--parent", core.addr, "--member-id", "0", "--switch-id", "1",
                    "--slots", "64", "--seed", "2", *faults)
    tor1 = switches("--parent", core.addr, "--member-id", "1", "--switch-id", "2",
                    "--slots", "64", "--seed", "3", *faults)
    per_rank = {0: {"addr": tor0.addr}, 1: {"addr": tor0.addr},
                2: {"addr": tor1.addr}, 3: {"addr": tor1.addr}, 4: {"addr": tor1.addr}}
    got = run_workers(core.addr, 5, 2, {"rto_s": 0.05}, per_rank=per_rank)
    assert_exact(got, [[0, 1], [2, 3, 4]], 5, 2)
    for s in (core, tor0, tor1):
        st = s.stats()
        assert st["segments_completed"] == 2 * segments()
        assert st["malformed_dropped"] == st["busy_dropped"] == 0


@pytest.mark.distributed
def test_an_idle_tree_sends_only_heartbeats(switches):
    # a ToR's Join is answered by JoinAck and Ready; Ready must not make the ToR Join again
    # (that loop once cost the core thousands of control packets per second)
    from gmi_drl.comm.switch import SwitchReducer

    core = switches("--switch-id", "9")
    tor = switches("--parent", core.addr, "--member-id", "0", "--switch-id", "1")
    red = SwitchReducer(tor.addr, 0, 1, join_timeout_s=20)
    try:
        before = core.stats()["packets_in"]
        time.sleep(2.0)
        idle = core.stats()["packets_in"] - before
    finally:
        red.close()
    # 2 heartbeat Joins of the ToR and our 2 STATS queries, with slack for timing
    assert idle <= 8, f"{idle} packets in 2 s at an idle core"


@pytest.mark.distributed
def test_a_second_job_runs_on_the_tree_right_after_the_first(switches):
    """When a ToR's last worker leaves, the ToR leaves the core, so the core's job ends with
    the workers' and the next job starts at once (it once waited on the core's member
    timeout, and was refused until the old job's ToRs fell silent)."""
    core = switches("--switch-id", "9")
    tors = [switches("--parent", core.addr, "--member-id", str(k), "--switch-id", str(k + 1))
            for k in range(2)]
    per_rank = {0: {"addr": tors[0].addr}, 1: {"addr": tors[1].addr}}
    for job in ("first", "second"):
        t0 = time.monotonic()
        got = run_workers(core.addr, 2, 2, {"job_id": job, "join_timeout_s": 8},
                          per_rank=per_rank, timeout_s=8)
        assert_exact(got, [[0], [1]], 2, 2)
        assert time.monotonic() - t0 < 8
    st = core.stats()
    assert st["members"] == 0 and st["foreign_job_dropped"] == 0  # both jobs ended at the core
