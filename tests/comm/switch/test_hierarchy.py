"""Hierarchical aggregation (iSwitch §3.4): 2 ToR switches under 1 core give the exact mean,
summed as the tree sums: each ToR over its workers, the core over the ToRs."""

from __future__ import annotations

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
