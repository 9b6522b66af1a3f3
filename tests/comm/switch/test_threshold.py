"""Async iSwitch: threshold aggregation with a staleness bound (iSwitch §4.1, Algorithm 1,
Fig. 11). A slow worker never holds the fast ones up and they put several gradients into one
aggregate; every worker holds the same weights at every version; no gradient staler than S is
applied, and the dropped ones are counted (worker and switch); H = N with S = 0 is the
synchronous reducer bit for bit; the switch's own check drops and counts exactly."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch

from gmi_drl.comm.switch import protocol as P
from gmi_drl.comm.switch.client import SwitchError
from gmi_drl.comm.switch.threshold import ThresholdPipeline, ThresholdReducer
from tests.comm.switch.harness import PLANE_AT, ctx

P_FLOATS = 1000  # 3 segments at MTU 1500
VERSIONS = 64    # one-hot slots of the version a gradient was computed on
HOT = 16         # entries [HOT, HOT + VERSIONS) hold that one-hot
HEARTBEAT_S = 0.25  # (a live worker stays well inside the tests' --member-timeout 1 under load)


def _gradient(w: np.ndarray, rank: int, t: int, n: int) -> np.ndarray:
    """Entry 0 is -1 (``w[0]`` counts the aggregates applied: the version), entries
    ``1 + rank`` and ``HOT + version`` are 1 (an aggregate's mean shows who gave how much, on
    which version), the rest depends on the weights."""
    g = (np.sin(w) + np.random.default_rng(1000 * t + rank).standard_normal(w.size)) \
        .astype(np.float32)
    g[:HOT + VERSIONS] = 0.0
    g[0], g[1 + rank] = -1.0, 1.0
    g[HOT + int(w[0])] = 1.0
    return g


def _train(addr: str, rank: int, n: int, opts: dict, q) -> None:
    """``opts``: ``h``/``s`` (None: the synchronous `allreduce_`), ``steps``, ``slow``: seconds
    rank ``n - 1`` sleeps per gradient; ``drain_every``: steps between drains."""
    from gmi_drl.comm.switch import SwitchReducer

    torch.set_num_threads(1)
    try:
        native = opts["native"]
        h, s, steps = opts["h"], opts["s"], opts["steps"]
        theta = np.zeros(P_FLOATS, np.float32)
        chain, means, drained = [], [], []

        def apply(mean: np.ndarray) -> None:
            theta[:] -= mean
            chain.append(hashlib.sha256(theta.tobytes()).hexdigest())
            means.append(mean[:HOT + VERSIONS].copy())

        if h is None:
            red = SwitchReducer(addr, rank, n, rto_s=0.05, native=native,
                                heartbeat_s=HEARTBEAT_S)
            for t in range(steps):
                g = torch.from_numpy(_gradient(theta, rank, t, n))
                red.allreduce_([g])
                apply(g.numpy())
            out = dict(dropped=0)
        else:
            red = ThresholdReducer(addr, rank, n, h, s, rto_s=0.05, native=native,
                                   heartbeat_s=HEARTBEAT_S)
            local = np.zeros(P_FLOATS, np.float32)
            pipe = ThresholdPipeline(red, apply)
            copy = lambda: np.copyto(local, theta)  # noqa: E731
            for t in range(steps):
                if rank == n - 1 and t == opts.get("die_at"):
                    os.kill(os.getpid(), signal.SIGKILL)  # a member that goes silent
                pipe.fetch(copy)
                if rank == n - 1:
                    time.sleep(opts.get("slow", 0.0))
                pipe.push(torch.from_numpy(_gradient(local, rank, t, n)))
                if (t + 1) % opts.get("drain_every", steps) == 0:
                    pipe.drain(copy)  # every worker at the same last aggregate
                    assert np.array_equal(local, theta)
                    drained.append(len(chain))
            pipe.close()
            out = dict(dropped=pipe.staleness_dropped, pushed=pipe.pushed)
        red.close()
        q.put((rank, dict(out, chain=chain, means=means, theta=theta, drained=drained)))
    except Exception as e:  # reported to the test, which fails with it
        q.put((rank, repr(e)))


def _run(addr: str, n: int, expect: int | None = None, addrs: list[str] | None = None,
         failures: bool = False, **opts) -> dict:
    """``n`` workers of `_train`, each at ``addr`` (or at ``addrs[rank]``: a tree's ToRs);
    a worker that failed is an assertion error, or with ``failures`` its error's repr."""
    c = ctx()
    q = c.Queue()
    opts["native"] = False if PLANE_AT.get(addr) == "python" else None  # (the client path too)
    addrs = addrs or [addr] * n
    procs = [c.Process(target=_train, args=(addrs[r], r, n, opts, q)) for r in range(n)]
    for p in procs:
        p.start()
    try:
        got = dict(q.get(timeout=60) for _ in range(expect or n))
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
        q.close()
        q.join_thread()
    bad = {r: v for r, v in got.items() if isinstance(v, str)}
    assert failures or not bad, f"workers failed: {bad}"
    return got


@pytest.mark.distributed
def test_fast_workers_fill_aggregates_weights_agree_and_staleness_holds(switches):
    h, s, n, steps = 2, 2, 3, 16
    sw = switches("--mtu", "1500")
    got = _run(sw.addr, n, h=h, s=s, steps=steps, slow=0.1, drain_every=8)
    _check_async_training(got, sw.stats(), n, s)


@pytest.mark.distributed
def test_a_drain_after_every_step_behind_a_delayed_switch(switches):
    """DDPG's pattern (a drain after every gradient step) with the switch's packets 2 ms late:
    an idle query's answer (`Action.FLUSHED`) may come after the next barrier began, and must
    not be taken for its flush's (a worker that did would leave the barrier before the flush,
    and the others' next round would never complete)."""
    n, steps = 4, 24
    sw = switches("--mtu", "1500", "--delay-ms", "2")
    got = _run(sw.addr, n, h=n, s=3, steps=steps, slow=0.02, drain_every=1)
    drains = {tuple(v["drained"]) for v in got.values()}
    assert len(drains) == 1 and len(next(iter(drains))) == steps
    assert len({tuple(v["chain"]) for v in got.values()}) == 1


def _check_async_training(got: dict, stats: dict, n: int, s: int) -> None:
    """What `_run` with a slow last worker must give: the same weights on every worker at every
    version and at each drain, every aggregate a mean (its counts sum its gradients), some
    with several gradients of one fast worker, none staler than S, stale ones dropped;
    ``stats``: the (root) switch's counters."""
    chains = [v["chain"] for v in got.values()]
    assert len({tuple(c) for c in chains}) == 1, "the workers' weights differ at some version"
    assert all(np.array_equal(got[0]["theta"], v["theta"]) for v in got.values())
    means, flushed = got[0]["means"], set(got[0]["drained"])
    several = 0
    for k, m in enumerate(means):
        assert m[0] == -1.0  # every aggregate is a mean of gradients
        share = m[1:1 + n]   # the fraction of each worker's gradients in it
        assert abs(share.sum() - 1.0) < 1e-6
        several += k + 1 not in flushed and any(share[w] == 1.0 for w in range(n - 1))
        versions = np.flatnonzero(m[HOT:])
        assert versions.max() <= k and versions.min() >= k - s, (k, versions)
    assert several > 0, "no aggregate of several gradients of one fast worker"
    dropped = sum(v["dropped"] for v in got.values()) + stats["staleness_dropped"] // 3
    assert dropped > 0, "the slow worker's stale gradients should be dropped"
    assert stats["aggregates_completed"] == 3 * len(means)
    drains = {tuple(v["drained"]) for v in got.values()}  # versions at each drain, per worker
    assert len(drains) == 1, f"a drain left workers at different versions {sorted(drains)}"


def _tree(switches, *faults: str) -> tuple:
    """A root and two ToRs (``--parent``) on loopback; 4 workers' addresses: 0, 1 at the first
    ToR, 2, 3 at the second."""
    root = switches("--switch-id", "9", "--seed", "1", *faults)
    tors = [switches("--parent", root.addr, "--member-id", str(k), "--switch-id", str(k + 1),
                     "--seed", str(k + 2), *faults) for k in range(2)]
    return root, tors, [tors[0].addr, tors[0].addr, tors[1].addr, tors[1].addr]


@pytest.mark.distributed
def test_threshold_mode_through_a_tree_of_switches(switches):
    """Root + 2 ToRs, 4 workers, the last slow: each ToR sends its workers' gradients up in
    per-rack partials (batches counted whole at the root: H counts gradients of any workers
    across the tree, S is checked there per batch against its oldest gradient) and the root's results
    down; fast workers fill aggregates, every worker applies the same aggregates and drains to
    the same weights, no applied gradient is staler than S."""
    h, s, n = 2, 2, 4
    root, tors, addrs = _tree(switches)
    got = _run(root.addr, n, addrs=addrs, h=h, s=s, steps=12, slow=0.1, drain_every=6)
    _check_async_training(got, root.stats(), n, s)
    drains = len(got[0]["drained"])
    for k, tor in enumerate(tors):
        st = tor.stats()
        assert st["aggregates_completed"] == st["malformed_dropped"] == 0  # (the root's job)
        sent = sum(got[r]["pushed"] - got[r]["dropped"] for r in (2 * k, 2 * k + 1))
        partials = st["segments_completed"] - 2 * drains  # (less a barrier's 2 rounds)
        assert 0 < partials <= 0.75 * 3 * sent, \
            f"ToR {k}: {partials} partials up for {3 * sent} gradient segments in"


@pytest.mark.distributed
def test_a_worker_that_dies_under_a_tor_leaves_the_others_training(switches):
    """Membership in a tree: worker 3 (the second ToR's) is killed after 3 gradients; its ToR
    drops it after --member-timeout and tells the root its count, and the three left go on
    aggregating H = 2, drain and agree on every weight version."""
    root, tors, addrs = _tree(switches, "--member-timeout", "1")
    got = _run(root.addr, 4, addrs=addrs, expect=3, h=2, s=2, steps=12, die_at=3,
               drain_every=6)
    assert set(got) == {0, 1, 2}
    assert len({tuple(v["chain"]) for v in got.values()}) == 1
    assert len({tuple(v["drained"]) for v in got.values()}) == 1
    assert all(np.array_equal(got[0]["theta"], v["theta"]) for v in got.values())
    assert tors[1].stats()["members_dropped"] == 1


@pytest.mark.distributed
def test_lost_packets_through_a_tree_leave_every_worker_with_the_same_weights(switches):
    """3 % loss at every switch, each way: Help for lost results goes up to the root where the
    ToR has none, FBcast of short aggregates and the flush go up, the answers down."""
    root, tors, addrs = _tree(switches, "--drop-rate", "0.03")
    got = _run(root.addr, 4, addrs=addrs, h=2, s=2, steps=12, slow=0.05, drain_every=6)
    chains = [v["chain"] for v in got.values()]
    assert len({tuple(c) for c in chains}) == 1, "the workers' weights differ at some version"
    assert all(np.array_equal(got[0]["theta"], v["theta"]) for v in got.values())
    assert len({tuple(v["drained"]) for v in got.values()}) == 1
    assert sum(sw.stats()["injected_drops"] for sw in (root, *tors)) > 0


def _join_all(addr: str, n: int, h: int, s: int, native, **kw) -> dict[int, ThresholdReducer]:
    """Workers ``0..n-1`` of a threshold-mode job (H, S) on the switch at ``addr``, joined
    together; ``kw`` goes to each `ThresholdReducer`."""
    reds: dict[int, ThresholdReducer] = {}

    def join(rank: int) -> None:
        reds[rank] = ThresholdReducer(addr, rank, n, h, s, rto_s=0.05, native=native,
                                      join_timeout_s=10, **kw)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(reds) == set(range(n))
    return reds


def _lose_everything_queued(red: ThresholdReducer) -> int:
    """Read and discard every packet waiting at ``red``'s socket (results lost on the way)."""
    lost = 0
    while True:
        try:
            red._sock.recv(P.RX_BUFFER_BYTES, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return lost
        lost += 1


@pytest.mark.distributed
def test_a_barrier_brings_a_worker_that_lost_a_whole_aggregate_to_the_others(switches):
    """H = 1: worker 0's gradient makes aggregate 0; every packet of it to worker 1 is lost
    (read off its socket), so worker 1 has no trace of it and would never ask for it. The
    barrier's flush answer names the switch's aggregates, so worker 1 asks for the lost one
    (Help) and both leave the barrier at version 1 with the same mean."""
    sw = switches("--mtu", "1500")
    native = False if PLANE_AT.get(sw.addr) == "python" else None
    reds = _join_all(sw.addr, 2, 1, 2, native)
    try:
        for red in reds.values():
            assert red.region(P_FLOATS) == 0
        vec = np.arange(P_FLOATS, dtype=np.float32)
        assert reds[0].send(0, vec, 0)
        end = time.monotonic() + 5
        while sw.stats()["aggregates_completed"] < 3 and time.monotonic() < end:
            time.sleep(0.02)
        time.sleep(0.1)
        assert _lose_everything_queued(reds[1]) >= 1  # (aggregate 0: coalesced where GRO)
        got: dict[int, list] = {0: [], 1: []}
        errors: list = []

        def barrier(rank: int) -> None:
            try:
                reds[rank].barrier(got[rank].extend, timeout_s=10)
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=barrier, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert [r for r, _ in got[0]] == [r for r, _ in got[1]] == [0]
        assert np.array_equal(got[0][0][1], vec) and np.array_equal(got[1][0][1], vec)
        assert sw.stats()["retransmissions_served"] >= 3
    finally:
        for red in reds.values():
            red.close()


@pytest.mark.distributed
def test_threshold_n_with_zero_staleness_is_the_synchronous_reducer(switches):
    sw = switches("--mtu", "1500")
    sync = _run(sw.addr, 2, h=None, s=None, steps=8)
    thr = _run(sw.addr, 2, h=2, s=0, steps=8)
    assert sync[0]["chain"] == sync[1]["chain"] == thr[0]["chain"] == thr[1]["chain"]
    assert thr[0]["dropped"] == thr[1]["dropped"] == 0


@pytest.mark.distributed
def test_the_switch_drops_and_counts_gradients_older_than_s(switches, data_plane):
    """H = 1, S = 1: worker 0's gradients on version 0 make aggregates 0 and 1; its third, and
    worker 1's (both computed on version 0, sent before any result reached them: the switch's
    packets leave 1 s late) are 2 behind: the switch drops each segment and counts it, and
    nobody applies them."""
    sw = switches("--mtu", "1500", "--delay-ms", "1000")
    native = False if PLANE_AT.get(sw.addr) == "python" else None
    reds: dict[int, ThresholdReducer] = {}

    def join(rank: int) -> None:
        reds[rank] = ThresholdReducer(sw.addr, rank, 2, 1, 1, rto_s=0.05, native=native,
                                      join_timeout_s=10)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert set(reds) == {0, 1}
        for red in reds.values():
            assert red.region(P_FLOATS) == 0
        vecs = [np.full(P_FLOATS, float(i + 1), np.float32) for i in range(4)]
        for v in vecs[:3]:
            assert reds[0].send(0, v, 0)
        time.sleep(0.2)
        assert reds[1].send(0, vecs[3], 0)  # (it has seen no aggregate: it cannot tell)
        got: list = []
        end = time.monotonic() + 8
        while len(got) < 2 and time.monotonic() < end:
            got += reds[1].take(0.05)
        time.sleep(0.3)
        got += reds[1].take(0.05)
        assert [r for r, _ in got] == [0, 0]
        assert np.array_equal(got[0][1], vecs[0]) and np.array_equal(got[1][1], vecs[1])
        stats = sw.stats()
        assert stats["async_threshold"] == 1 and stats["staleness_bound"] == 1
        assert stats["data_plane"] == data_plane
        assert stats["staleness_dropped"] == 2 * 3  # two gradients of 3 segments
        assert stats["aggregates_completed"] == 2 * 3
        # and the worker's own check: version 2 known, a gradient on version 0 is not sent
        assert not reds[1].send(0, vecs[0], 0) and reds[1].staleness_dropped == 1
    finally:
        for red in reds.values():
            red.close()


def _pair(sw, h: int, s: int, **kw) -> dict[int, ThresholdReducer]:
    """Workers 0 and 1 of a threshold-mode job on switch ``sw`` (its data plane's client)."""
    return _join_all(sw.addr, 2, h, s, False if PLANE_AT.get(sw.addr) == "python" else None,
                     **kw)


@pytest.mark.distributed
def test_a_lost_gradient_that_every_worker_waits_for_is_resent(switches):
    """H = N = 2, S = 0: each worker sends one gradient and waits for the aggregate; worker 1's
    one packet is lost on the way up, so no result comes to anyone. Worker 1 resends it; both
    take the one aggregate, the exact mean of both gradients (not a short one)."""
    sw = switches("--mtu", "1500")
    reds = _pair(sw, 2, 0)
    try:
        for red in reds.values():
            assert red.region(10) == 0
        assert reds[0].send(0, np.full(10, 1.0, np.float32), 0)
        real = reds[1]._send_segments
        reds[1]._send_segments = lambda *a, **k: None  # (the first send is lost)
        assert reds[1].send(0, np.full(10, 4.0, np.float32), 0)
        reds[1]._send_segments = real
        got: dict[int, list] = {0: [], 1: []}
        end = time.monotonic() + 5
        while time.monotonic() < end and not all(got.values()):
            for rank, red in reds.items():
                got[rank] += red.take(0.02)
        for rank in (0, 1):
            assert len(got[rank]) == 1, f"worker {rank} took {len(got[rank])} aggregates"
            assert np.array_equal(got[rank][0][1], np.full(10, 2.5, np.float32))
        assert reds[1]._resent >= 1
        assert sw.stats()["aggregates_completed"] == 1
    finally:
        for red in reds.values():
            red.close()


@pytest.mark.distributed
def test_no_aggregate_for_timeout_s_after_a_gradient_raises(switches):
    """H = N = 2: worker 1 never sends, so worker 0's gradient waits for ever; worker 0 raises
    once ``timeout_s`` passed without an aggregate, naming the cause."""
    sw = switches("--mtu", "1500")
    reds = _pair(sw, 2, 0, timeout_s=1.0)
    try:
        for red in reds.values():
            assert red.region(10) == 0
        assert reds[0].send(0, np.ones(10, np.float32), 0)
        end = time.monotonic() + 5
        with pytest.raises(SwitchError, match="no aggregate from switch .* for 1.0 s"):
            while time.monotonic() < end:
                reds[0].take(0.05)
        assert reds[0]._resent >= 1
    finally:
        for red in reds.values():
            red.close()


@pytest.mark.distributed
def test_a_gradient_256_or_more_aggregates_behind_is_never_sent(switches):
    """H = 1, S = 4: worker 0 makes 260 aggregates while worker 1 reads nothing; worker 1's
    gradient on version 0 is 260 behind, which the header's version (mod 256) would show the
    switch as 4: worker 1 reads the results that came before it sends, and drops it."""
    sw = switches("--mtu", "1500")
    reds = _pair(sw, 1, 4)
    try:
        for red in reds.values():
            assert red.region(10) == 0
        vec = np.ones(10, np.float32)
        version = 0
        while version < 260:
            assert reds[0].send(0, vec, version)
            end = time.monotonic() + 5
            got: list = []
            while not got and time.monotonic() < end:
                got = reds[0].take(0.05)
            assert got, f"no aggregate after version {version}"
            version += len(got)
        time.sleep(0.2)
        assert not reds[1].send(0, vec, 0)
        assert reds[1].staleness_dropped == 1
        time.sleep(0.2)
        assert sw.stats()["aggregates_completed"] == 260
    finally:
        for red in reds.values():
            red.close()


@pytest.mark.distributed
@pytest.mark.parametrize("tree", [False, True], ids=["one-switch", "tree"])
def test_a_worker_asking_another_threshold_mode_than_its_jobs_is_refused(switches, tree):
    """Three workers of one job ask, in turn, for H=2, S=1, then H=1, S=1, then H=2, S=1
    again: the switch (in a tree, the root, through the second worker's ToR) takes the first,
    refuses the second with the job's mode, and takes the third, which in a tree asks through
    the ToR the root refused (that ToR drops the refused mode); the refused worker leaves."""

    if tree:
        root, tors, addrs = _tree(switches)
        addrs = [addrs[0], addrs[2], addrs[3]]  # (the second and third under one ToR)
    else:
        root = switches("--mtu", "1500")
        addrs = [root.addr] * 3
    modes, got = [(2, 1), (1, 1), (2, 1)], {}

    def join(rank: int) -> None:
        try:
            got[rank] = ThresholdReducer(addrs[rank], rank, 3, *modes[rank], rto_s=0.05,
                                         join_timeout_s=20)
        except SwitchError as e:
            got[rank] = e

    threads = [threading.Thread(target=join, args=(r,)) for r in range(3)]
    try:
        threads[0].start()  # (its mode is asked at its JoinAck, before the group is complete)
        deadline = time.monotonic() + 10
        while root.stats()["async_threshold"] != 2:
            assert time.monotonic() < deadline, "the first worker's mode never reached the root"
            time.sleep(0.05)
        threads[1].start()
        time.sleep(1.0)  # (its refusal reaches its ToR, which drops the mode)
        threads[2].start()
        for t in threads:
            t.join(40)
        assert isinstance(got[0], ThresholdReducer) and isinstance(got[2], ThresholdReducer), got
        assert isinstance(got[1], SwitchError), got
        text = str(got[1])
        assert "refused worker 1's threshold mode (H=1, S=1): this job aggregates with H=2, " \
               "S=1, not H=1, S=1" in text, text
        assert "--gmi.threshold and --gmi.staleness" in text
        # the refused worker left its switch at once (not after its member timeout)
        assert (tors[1] if tree else root).stats()["members"] == (1 if tree else 2)
    finally:
        for v in got.values():
            if isinstance(v, ThresholdReducer):
                v.close()


def test_threshold_reducer_refuses_bad_h_and_s():
    with pytest.raises(ValueError, match="threshold H=3 must be in"):
        ThresholdReducer("127.0.0.1:1", 0, 2, 3, 1)
    with pytest.raises(ValueError, match="staleness S=128"):
        ThresholdReducer("127.0.0.1:1", 0, 2, 2, 128)
    with pytest.raises(ValueError, match="ThresholdReducer"):
        from gmi_drl.comm.reducer import IdentityReducer
        ThresholdPipeline(IdentityReducer(), lambda mean: None)
    with pytest.raises(ValueError):
        P.encode_control(P.Action.SETH, P.ThresholdValue(0, 1))
    assert P.decode_control(P.encode_control(P.Action.SETH, P.ThresholdValue(2, 3))) == \
        (P.Action.SETH, P.ThresholdValue(2, 3))


@pytest.mark.distributed
def test_lost_packets_leave_every_worker_with_the_same_weights(switches):
    """3 % of the packets each way lost (gradients, results, barrier rounds, control): lost
    results are asked for again, aggregates a lost gradient segment left short are broadcast
    on request; every worker applies the same aggregates and drains to the same weights."""
    sw = switches("--mtu", "1500", "--drop-rate", "0.03", "--seed", "7")
    got = _run(sw.addr, 3, h=2, s=2, steps=12, slow=0.05, drain_every=6)
    chains = [v["chain"] for v in got.values()]
    assert len({tuple(c) for c in chains}) == 1, "the workers' weights differ at some version"
    assert all(np.array_equal(got[0]["theta"], v["theta"]) for v in got.values())
    stats = sw.stats()
    assert stats["injected_drops"] > 0


@pytest.mark.distributed
def test_a_worker_that_dies_leaves_the_others_training(switches):
    """Membership: worker 2 of 3 is killed after 3 gradients; the switch drops it after
    --member-timeout, and the other two go on aggregating H = 2 of their own gradients, drain
    (their barrier rounds complete without it) and agree on every weight version."""
    sw = switches("--mtu", "1500", "--member-timeout", "1")
    got = _run(sw.addr, 3, expect=2, h=2, s=2, steps=12, die_at=3, drain_every=6)
    assert set(got) == {0, 1}
    assert got[0]["chain"] == got[1]["chain"] and got[0]["drained"] == got[1]["drained"]
    assert np.array_equal(got[0]["theta"], got[1]["theta"])
    assert sw.stats()["members_dropped"] == 1


@pytest.mark.distributed
def test_workers_too_few_for_h_after_one_died_stop_with_the_reason(switches):
    """H = 3 of 3 with S = 0: once worker 2 is dropped, the two left give at most 2 gradients
    to an aggregate, so none would complete; both raise at the group's change instead of
    waiting forever."""
    sw = switches("--mtu", "1500", "--member-timeout", "1")
    got = _run(sw.addr, 3, expect=2, failures=True, h=3, s=0, steps=12, die_at=3)
    assert set(got) == {0, 1}
    for err in got.values():
        assert isinstance(err, str) and "1 worker(s) left the group: the 2 left give at most 2 " \
            "gradients to an aggregate of H=3 (S=0), so none would complete" in err, err


def _ppo(addr: str, rank: int, n: int, threshold, native, q) -> None:
    """Two PPO updates on a fixed random rollout per worker through the runner's gradient step
    (`make_grad_step` on a `ThresholdReducer` when ``threshold`` is ``(H, S)``, else the
    synchronous `SwitchReducer`); the weights' digest after each."""
    import functools

    import gymnasium as gym

    from gmi_drl.algos import AlgoContext, ModelConfig, PPOConfig, build_algorithm
    from gmi_drl.comm.switch import SwitchReducer
    from gmi_drl.envs.spec import EnvSpec
    from gmi_drl.optim.grad_step import make_grad_step

    torch.set_num_threads(1)
    try:
        if threshold is None:
            red, bound = SwitchReducer(addr, rank, n, "sync", rto_s=0.05, native=native), None
        else:
            red = ThresholdReducer(addr, rank, n, *threshold, f"thr-{threshold}", rto_s=0.05,
                                   native=native)
            bound = threshold[1]
        spec = EnvSpec("test", gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), None)
        steps = functools.partial(make_grad_step, reducer=red, staleness_bound=bound)
        actx = AlgoContext(spec, 4, ModelConfig(), 10, 0, steps, torch.Generator())
        torch.manual_seed(0)  # identical initial weights on every worker
        learner = build_algorithm(PPOConfig(num_steps=16, num_minibatches=4, update_epochs=2),
                                  actx)
        g, buf = torch.Generator().manual_seed(rank), learner.buf
        buf.obs.copy_(torch.randn(buf.obs.shape, generator=g))
        buf.actions.copy_(torch.randint(0, 2, buf.actions.shape, generator=g))
        buf.logprobs.copy_(-torch.rand(buf.logprobs.shape, generator=g))
        for x in (buf.values, buf.advantages, buf.returns):
            x.copy_(torch.randn(x.shape, generator=g))
        digests, stats = [], []
        for _ in range(2):
            stats.append(learner.update())
            digests.append(hashlib.sha256(learner.grad_step.params.data.numpy().tobytes())
                           .hexdigest())
        learner.close()
        red.close()
        q.put((rank, (digests, stats)))
    except Exception as e:  # reported to the test, which fails with it
        q.put((rank, repr(e)))


def _run_ppo(addr: str, n: int, threshold) -> dict:
    c = ctx()
    q = c.Queue()
    native = False if PLANE_AT.get(addr) == "python" else None
    procs = [c.Process(target=_ppo, args=(addr, r, n, threshold, native, q))
             for r in range(n)]
    for p in procs:
        p.start()
    try:
        got = dict(q.get(timeout=120) for _ in range(n))
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
        q.close()
        q.join_thread()
    bad = {r: v for r, v in got.items() if isinstance(v, str)}
    assert not bad, f"workers failed: {bad}"
    return got


@pytest.mark.distributed
def test_ppo_through_the_runners_gradient_step(switches):
    """PPO's gradient step on a `ThresholdReducer`: H = N, S = 0 is the synchronous path bit
    for bit; H = 1, S = 2 changes the weights, keeps them identical on every worker after each
    update (drain) and reports the staleness metrics."""
    sw = switches("--mtu", "1500")
    sync = _run_ppo(sw.addr, 2, None)
    same = _run_ppo(sw.addr, 2, (2, 0))
    fast = _run_ppo(sw.addr, 2, (1, 2))
    assert sync[0][0] == sync[1][0] == same[0][0] == same[1][0]
    assert fast[0][0] == fast[1][0] and fast[0][0] != sync[0][0]
    assert {"comm/staleness_max", "comm/staleness_dropped"} <= set(fast[0][1][1])
    assert 0 <= fast[0][1][1]["comm/staleness_max"] <= 2


def test_a_root_cuts_every_offset_after_the_same_contributions(data_plane):
    """Two ToRs' partials of 1 and 2 gradients reach the root's two offsets in opposite orders
    (A, B at offset 0; B, A at offset 1): the root counts contributions, not gradients, so both
    offsets' first aggregate holds both partials (3 gradients, one sum), not B alone at offset 1
    (with the partials' counts as weights, offset 1 would complete on B and run one aggregate
    ahead of offset 0)."""
    from gmi_drl.comm.switch.dataplane import make_data_plane

    root = P.open_socket(("127.0.0.1", 0))
    root.setblocking(False)
    tors = [P.open_socket(("127.0.0.1", 0)) for _ in range(2)]
    try:
        plane, _ = make_data_plane(data_plane, root, seg_floats=4, slots=8, max_members=4, switch_id=9,
                                   member_id=0, parent=None, drop_rate=0.0, dup_rate=0.0,
                                   delay_ms=0.0, help_after_s=0.2, seed=1)
        for row, (sock, below) in enumerate(zip(tors, (1, 2))):
            plane.set_member(row, row + 1, int(P.MemberType.SWITCH), *sock.getsockname(), below)
        plane.set_state(True, 2)
        plane.set_threshold_mode(2, 3)
        vec = {1: np.full(4, 1.0, np.float32), 2: np.full(4, 10.0, np.float32)}  # A, B
        for o, order in ((0, (1, 2)), (1, (2, 1))):
            for member in order:
                hdr = P.data_header(P.async_seq(0, o), 0, member, member, P.FLAG_ASYNC)
                P.send_data(tors[member - 1], root.getsockname(), hdr, vec[member])
                time.sleep(0.05)
                plane.drain(64)
        results = {}
        tors[0].settimeout(2.0)
        buf = bytearray(P.RX_BUFFER_BYTES)
        while len(results) < 2:
            nbytes, _tos, _addr = P.recv_packet(tors[0], buf)
            seq, _rnd, _m, count, flags, k = P.decode_data(buf, nbytes, 4)
            tag, o = P.async_split(seq)
            payload = np.frombuffer(bytes(buf[P.HEADER_BYTES:nbytes]), "<f4")
            results.setdefault(o, (tag, count, payload))
        for o in (0, 1):
            tag, count, total = results[o]
            assert (tag, count) == (0, 3), f"offset {o}: aggregate {tag} of {count} gradients"
            assert np.array_equal(total, np.full(4, 11.0, np.float32))
        assert plane.async_numbers() == [(0, 1), (1, 1)]
    finally:
        for s in (root, *tors):
            s.close()


@pytest.mark.distributed
def test_an_aggregate_coalesced_by_gro_is_taken_whole_and_exact(switches, monkeypatch):
    """A gradient goes out in one segmented send and the switch's results come back coalesced
    (GRO, where the plane sends with GSO): each aggregate is the exact mean on both workers,
    and with the native plane the coalesced path took more than half of the 2 x 6 x 51
    segments."""
    sw = switches("--mtu", "1500")
    native = False if PLANE_AT.get(sw.addr) == "python" else None
    whole = Counter()
    take = ThresholdReducer._on_results

    def counted(self, nbytes: int, seg: int) -> int:
        got = take(self, nbytes, seg)
        whole[self.rank] += got // seg
        return got

    monkeypatch.setattr(ThresholdReducer, "_on_results", counted)
    reds = _join_all(sw.addr, 2, 2, 3, native)
    size = 50 * 366 + 7  # 51 segments at MTU 1500, the last short
    try:
        for red in reds.values():
            assert red.region(size) == 0
        got: dict[int, list] = {0: [], 1: []}
        for step in range(6):
            for rank, red in reds.items():
                vec = np.arange(size, dtype=np.float32) * (rank + 1) + step
                assert red.send(0, vec, step)
            end = time.monotonic() + 10
            while min(len(g) for g in got.values()) <= step and time.monotonic() < end:
                for rank, red in reds.items():
                    got[rank] += red.take(0.01)
        for rank in reds:
            assert [region for region, _ in got[rank]] == [0] * 6
            for step, (_, mean) in enumerate(got[rank]):
                want = (np.arange(size, dtype=np.float32) * 3 + 2 * step) / np.float32(2)
                np.testing.assert_array_equal(mean, want)
        if PLANE_AT.get(sw.addr) == "native":
            assert sum(whole.values()) > 6 * 51, f"segments taken coalesced: {dict(whole)}"
    finally:
        for red in reds.values():
            red.close()


@pytest.mark.distributed
def test_a_rack_partial_sums_gradients_of_several_versions(switches):
    """A root and one ToR, H = 2 of 2 workers, S = 3: after aggregate 0, worker 0 sends a
    gradient computed on version 1 and worker 1 one on version 0 (one behind). The ToR sums
    both into one partial, tagged with the older version (what the root checks S against), so
    aggregate 1 is their mean; with one partial per version, each would make an aggregate
    alone."""
    root = switches("--switch-id", "9")
    tor = switches("--parent", root.addr, "--member-id", "0", "--switch-id", "1")
    native = False if PLANE_AT.get(tor.addr) == "python" else None
    reds = _join_all(tor.addr, 2, 2, 3, native)
    size = 900
    vecs = {(r, v): np.arange(size, dtype=np.float32) * (r + 1) + 10 * v for r in (0, 1)
            for v in (0, 1)}
    try:
        for red in reds.values():
            assert red.region(size) == 0
        got: dict[int, list] = {0: [], 1: []}

        def take_until(n: int) -> None:
            end = time.monotonic() + 10
            while min(len(g) for g in got.values()) < n and time.monotonic() < end:
                for rank, red in reds.items():
                    got[rank] += red.take(0.01)

        for rank, red in reds.items():
            assert red.send(0, vecs[(rank, 0)], 0)
        take_until(1)
        assert reds[0].send(0, vecs[(0, 1)], 1)
        assert reds[1].send(0, vecs[(1, 0)], 0)
        take_until(2)
        want = (vecs[(0, 1)] + vecs[(1, 0)]) / np.float32(2)
        for rank in reds:
            assert len(got[rank]) == 2, f"worker {rank} took {len(got[rank])} aggregates"
            np.testing.assert_array_equal(got[rank][1][1], want)
        assert root.stats()["staleness_dropped"] == 0
    finally:
        for red in reds.values():
            red.close()


@pytest.mark.distributed
def test_a_stale_gradient_never_takes_a_fresh_one_down_with_it(switches):
    """A root and one ToR, H = 2 of 2 workers, S = 1. Worker 0 alone makes aggregates 0-2
    (its gradients fill the rack's batches) while worker 1 takes none of them, so it still
    sends on version 1 when the root is at 3 (stale). Then worker 0 sends one on version 3
    (fresh). The stale gradient is dropped alone (the ToR knows aggregate 2 came down), and
    aggregate 3 is worker 0's gradient. With one batch of any spread, both went up as one
    partial of version 1, the root dropped it, and aggregate 3 never came."""
    root = switches("--switch-id", "9")
    tor = switches("--parent", root.addr, "--member-id", "0", "--switch-id", "1")
    native = False if PLANE_AT.get(tor.addr) == "python" else None
    reds = _join_all(tor.addr, 2, 2, 1, native)
    size = 900
    try:
        for red in reds.values():
            assert red.region(size) == 0
        got: list = []

        def take_until(n: int) -> None:
            end = time.monotonic() + 10
            while len(got) < n and time.monotonic() < end:
                got.extend(reds[0].take(0.01))

        for v in range(3):
            for _ in range(2):
                assert reds[0].send(0, np.full(size, v + 1, np.float32), v)
            take_until(v + 1)
        assert len(got) == 3
        reds[1].pump = lambda *a, **k: []  # (its results still on the way: it cannot tell)
        assert reds[1].send(0, np.full(size, 100, np.float32), 1)
        time.sleep(0.05)  # (the stale gradient reaches the ToR first)
        mine = np.arange(size, dtype=np.float32)
        assert reds[0].send(0, mine, 3)
        take_until(4)
        assert len(got) == 4, "aggregate 3 never came: worker 0's gradient was dropped"
        np.testing.assert_array_equal(got[3][1], mine)
        assert tor.stats()["staleness_dropped"] > 0 and root.stats()["staleness_dropped"] == 0
    finally:
        for red in reds.values():
            red.close()


BATCH_CASES = {
    # S, the aggregates that came down to the ToR, then in arrival order the gradients (member,
    # version, count) and, as an int, more aggregates coming down (that many in all) -> the
    # partials the ToR sends up (version, count, which gradients: their indices in the list)
    "a stale gradient is dropped at the ToR, not batched with fresh ones":
        (1, 10, [(0, 10, 1), (1, 8, 1), (0, 9, 1)], [(9, 2, (0, 2))]),
    "a gradient 150 behind is stale with S = 127, though its byte looks newer":
        (127, 150, [(0, 150, 1), (1, 0, 1)], [(150, 1, (0,))]),
    "member switches' partials of two versions: one partial, the older's version":
        (1, 4, [(2, 4, 3), (2, 3, 3)], [(3, 6, (0, 1))]),
    "a batch whose oldest went stale closes; the stale gradient is left out of it":
        (1, 4, [(0, 3, 1), (1, 4, 1), 5, (0, 5, 1)], [(4, 1, (1,)), (5, 1, (3,))]),
    "versions across 255 -> 0 span 1":
        (1, 257, [(0, 0, 1), (1, 1, 1)], [(0, 2, (0, 1))]),
    "S = 0 takes one version only":
        (0, 3, [(0, 3, 1), (1, 2, 1), (1, 3, 1)], [(3, 2, (0, 2))]),
    "a gradient that went stale while its batch waited is left out, the fresher one goes up":
        (2, 12, [(0, 10, 1), (1, 12, 1), 13, (0, 13, 1)], [(12, 1, (1,)), (13, 1, (3,))]),
    "gradients of versions within S share the offset's one open batch":
        (2, 12, [(2, 12, 3), (0, 10, 1), (1, 12, 1)], [(10, 5, (0, 1, 2))]),
}


@pytest.mark.parametrize("case", list(BATCH_CASES))
def test_a_tors_batches_span_at_most_s_and_hold_nothing_stale(data_plane, case):
    """A ToR (2 workers and a member switch of 3 below) batches gradients of several versions,
    each batch's spread within S, against the aggregates that came down to it: a gradient
    already staler than S there is dropped (the root is at least as far along), one that
    became so while its batch waited is left out when the batch goes up, and a member switch's
    partial counts by the version it carries (its oldest; none of its gradients is ahead of the
    aggregates that came down here); gradients within S share the offset's open batch. So no partial holds a gradient staler than S at the
    ToR, and a stale one never takes a fresher one down with it. Both data planes, in this
    process."""
    from gmi_drl.comm.switch.dataplane import make_data_plane

    s, top, grads, want = BATCH_CASES[case]
    tor = P.open_socket(("127.0.0.1", 0))
    tor.setblocking(False)
    parent = P.open_socket(("127.0.0.1", 0))
    parent.setblocking(False)
    members = [P.open_socket(("127.0.0.1", 0)) for _ in range(3)]
    buf = bytearray(P.RX_BUFFER_BYTES)

    def deliver(n: int) -> None:  # until the plane read ``n`` packets in all
        end = time.monotonic() + 5
        while plane.counters()["packets_in"] < n and time.monotonic() < end:
            plane.drain(64)
            time.sleep(0.001)
        assert plane.counters()["packets_in"] == n

    try:
        plane, _ = make_data_plane(data_plane, tor, seg_floats=4, slots=8, max_members=4,
                                   switch_id=1, member_id=0, parent=parent.getsockname(),
                                   drop_rate=0.0, dup_rate=0.0, delay_ms=0.0,
                                   help_after_s=1000.0, seed=1)
        for row, (sock, below) in enumerate(zip(members, (1, 1, 3))):
            kind = P.MemberType.SWITCH if row == 2 else P.MemberType.WORKER
            plane.set_member(row, row, int(kind), *sock.getsockname(), below)
        plane.set_state(True, 1)
        plane.set_threshold_mode(4, s)
        packets = 0

        def come_down(upto: int) -> None:  # the root's results, down to this ToR
            nonlocal packets
            for number in range(plane.async_numbers()[0][1] if packets else 0, upto):
                hdr = P.data_header(P.async_seq(number, 0), number % 256, 9, 1,
                                    P.FLAG_RESULT | P.FLAG_ASYNC)
                P.send_data(parent, tor.getsockname(), hdr, np.zeros(4, np.float32))
                packets += 1
                deliver(packets)
            assert plane.async_numbers() == [(0, upto)]

        come_down(top)
        pushes: Counter = Counter()
        for i, event in enumerate(grads):
            if isinstance(event, int):
                come_down(event)
                continue
            member, version, count = event
            hdr = P.data_header(P.async_seq(pushes[member], 0), version, member, count,
                                P.FLAG_ASYNC)
            pushes[member] += 1
            P.send_data(members[member], tor.getsockname(), hdr, np.full(4, 2.0 ** i,
                                                                         np.float32))
            packets += 1
            deliver(packets)
        plane.tick(time.monotonic() + 5000)  # (closes every batch and sends it up)
        time.sleep(0.05)
        sent = []
        while True:
            try:
                nbytes, _tos, _addr = P.recv_packet(parent, buf)
            except BlockingIOError:
                break
            _seq, version, _m, count, _flags, _k = P.decode_data(buf, nbytes, 4)
            total = np.frombuffer(bytes(buf[P.HEADER_BYTES:nbytes]), "<f4")
            sent.append((version, count, total[0]))
        assert sorted(sent) == sorted((v % 256, c, sum(2.0 ** i for i in which))
                                      for v, c, which in want)
        dropped = sum(not isinstance(e, int) for e in grads) \
            - sum(len(which) for _, _, which in want)  # (one segment each)
        assert plane.counters()["staleness_dropped"] == dropped
    finally:
        for sock in (tor, parent, *members):
            sock.close()
