"""Control plane: silent members dropped with H lowered, restarts rejoined, strangers refused."""

from __future__ import annotations

import time

import pytest

from gmi_drl.comm.switch import SwitchReducer
from tests.comm.switch.harness import assert_exact, ctx, run_workers

SHAPES = [(5000,)]


@pytest.mark.distributed
def test_silent_member_is_dropped_and_the_rest_continue(switches):
    sw = switches("--member-timeout", "1.0", "--log-level", "WARNING")
    # worker 2 does step 0, then dies without a Leave before step 1
    got = run_workers(sw.addr, 3, 3, {"rto_s": 0.05, "heartbeat_s": 0.2,
                                      "partial_results": True}, shapes=SHAPES,
                      per_rank={2: {"die_after": 1}}, expect=2)
    assert sorted(got) == [0, 1]
    assert_exact({r: (v[0][:1], 0) for r, v in got.items()}, [0, 1, 2], 3, 1, shapes=SHAPES)
    # steps 1 and 2: the mean of the two survivors
    for step in (1, 2):
        from tests.comm.switch.harness import reference
        import numpy as np
        ref = reference([0, 1], step, 2, SHAPES)
        for r in (0, 1):
            assert np.array_equal(got[r][0][step][0], ref[0])
    assert sw.stop() == 0
    assert sw.final["members_dropped"] == 1
    assert "silent for" in sw.stderr and "dropped; H is now 2" in sw.stderr


@pytest.mark.distributed
def test_a_dropped_member_stops_a_training_group_instead_of_a_mean_over_fewer(switches):
    """Without ``partial_results`` (data-parallel training: every worker must apply the same
    mean), the survivors of a dropped member fail with what happened, not drift apart."""
    sw = switches("--member-timeout", "1.0", "--log-level", "WARNING")
    got = run_workers(sw.addr, 3, 3, {"rto_s": 0.05, "heartbeat_s": 0.2}, shapes=SHAPES,
                      per_rank={2: {"die_after": 1}}, expect=2, failures_ok=True)
    assert sorted(got) == [0, 1]
    for r in (0, 1):
        assert "SwitchError" in got[r][0] and "summed over 2 of the job's 3 workers" in got[r][0]
    assert sw.stop() == 0


@pytest.mark.distributed
def test_restarted_switch_is_rejoined(switches):
    sw = switches()
    port = sw.addr.rsplit(":", 1)[1]
    c = ctx()
    ready, go = c.Event(), c.Event()
    state = {}

    def restart():
        assert ready.wait(30)
        time.sleep(0.3)  # let the other workers finish step 0 too
        sw.kill()
        go.set()  # workers start step 1 against a dead switch
        time.sleep(0.5)
        state["new"] = switches(bind=f"127.0.0.1:{port}")

    got = run_workers(sw.addr, 3, 3, {"rto_s": 0.05}, shapes=SHAPES, events=(ready, go),
                      on_started=restart)
    assert_exact(got, [0, 1, 2], 3, 3, shapes=SHAPES)
    st = state["new"].stats()
    assert st["segments_completed"] == 2 * 14


def test_foreign_job_and_bad_token_are_refused(switches):
    sw = switches("--token", "s3cret", "--job-id", "jobA")
    with pytest.raises(RuntimeError, match="within 2 s \\(refused until then, FOREIGN_JOB: "
                       "this switch serves another job"):  # (asked again until the timeout)
        SwitchReducer(sw.addr, 0, 1, job_id="jobB", token="s3cret", join_timeout_s=2)
    with pytest.raises(RuntimeError, match="BAD_TOKEN"):
        SwitchReducer(sw.addr, 0, 1, job_id="jobA", token="nope", join_timeout_s=5)
    red = SwitchReducer(sw.addr, 0, 1, job_id="jobA", token="s3cret", join_timeout_s=5)
    import torch
    t = torch.arange(10.0)
    red.allreduce_([t])
    assert torch.equal(t, torch.arange(10.0))
    red.close()
    assert sw.stats()["foreign_job_dropped"] > 2  # the foreign job asked every 0.2 s


def test_a_group_that_never_completes_says_the_other_workers_are_missing(switches):
    sw = switches()
    with pytest.raises(RuntimeError, match=f"no complete group at switch {sw.addr} within 0.5 s "
                       r"\(joined, but not all 2 workers did: are they all started"):
        SwitchReducer(sw.addr, 0, 2, join_timeout_s=0.5)


@pytest.mark.distributed
def test_a_threshold_below_the_workers_is_refused_at_join(switches):
    """With H < N a round would complete without some workers (the faster one running ahead,
    the slower one waiting out its timeout, or averages of fewer workers): the Join that would
    make more members than H is refused, saying why."""
    sw = switches("--threshold", "1")
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match="aggregation threshold H=1 admits 1 member"):
        run_workers(sw.addr, 2, 4, {"timeout_s": 30, "join_timeout_s": 3}, timeout_s=40)
    assert time.monotonic() - t0 < 20
