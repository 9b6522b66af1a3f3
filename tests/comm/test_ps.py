"""The parameter server (iSwitch's PS baseline) over real loopback TCP: the mean in rank order,
refusals with their reason, a worker that dies, and GMIs training through it."""

import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from gmi_drl.comm.ps import AsyncPSClient, ParameterServer, PSReducer
from gmi_drl.config import ConfigError, validate
from gmi_drl.train import train
from tests.algos.test_placements import small_cfg


@pytest.fixture
def server():
    ps = ParameterServer(("127.0.0.1", 0), 3, member_timeout_s=20)
    thread = threading.Thread(target=ps.serve_forever, daemon=True)
    thread.start()
    yield ps
    ps.close()


def _addr(ps):
    host, port = ps.address
    return f"{host}:{port}"


def _workers(addr, world, fn):
    """Run ``fn(reducer)`` on ``world`` workers (threads, one socket each); return the
    results by rank."""
    out, errors = [None] * world, []

    def run(rank):
        try:
            red = PSReducer(addr, rank, world, timeout_s=20)
            try:
                out[rank] = fn(red)
            finally:
                red.close()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out, errors


def test_every_worker_receives_the_mean_in_rank_order_round_after_round(server):
    rng = np.random.default_rng(0)
    grads = [[rng.normal(size=s).astype(np.float32) for s in ((5, 3), (7,), (1000,))]
             for _ in range(3)]

    def rounds(red):
        got = []
        for step in range(4):  # the second tensor list changes size: rounds of new lengths
            ts = [torch.from_numpy(g * (step + 1)).clone() for g in grads[red.rank][:2 + step % 2]]
            red.allreduce_(ts)
            got.append([t.numpy().copy() for t in ts])
        return got

    out, errors = _workers(_addr(server), 3, rounds)
    assert not errors
    for step in range(4):
        for k in range(2 + step % 2):
            scaled = [grads[r][k] * (step + 1) for r in range(3)]
            want = (scaled[0] + scaled[1] + scaled[2]) / np.float32(3)
            for rank in range(3):
                np.testing.assert_array_equal(out[rank][step][k], want)
    assert server.rounds == 4


def test_a_bad_group_size_or_a_taken_rank_is_refused_with_the_reason(server):
    with pytest.raises(RuntimeError, match="group size 2, the server serves groups of 3"):
        PSReducer(_addr(server), 0, 2, timeout_s=5)
    first = PSReducer(_addr(server), 1, 3, timeout_s=5)
    try:
        with pytest.raises(RuntimeError, match="rank 1 is taken"):
            PSReducer(_addr(server), 1, 3, timeout_s=5)
    finally:
        first.close()
    with pytest.raises(ValueError, match="rank=3"):
        PSReducer(_addr(server), 3, 3)


def test_a_worker_that_dies_mid_run_fails_the_others_and_the_server_takes_a_new_group():
    code = """
import sys, torch
from gmi_drl.comm.ps import PSReducer
r = PSReducer(sys.argv[1], 1, 2, timeout_s=20)
r.allreduce_([torch.ones(10)])
print("reduced", flush=True)
import os; os._exit(1)
"""
    ps = ParameterServer(("127.0.0.1", 0), 2, member_timeout_s=20)
    threading.Thread(target=ps.serve_forever, daemon=True).start()
    try:
        child = subprocess.Popen([sys.executable, "-c", code, _addr(ps)], stdout=subprocess.PIPE,
                                 text=True)
        red = PSReducer(_addr(ps), 0, 2, timeout_s=20)
        t = torch.zeros(10)
        red.allreduce_([t])
        assert torch.equal(t, torch.full((10,), 0.5))
        assert child.stdout.readline() == "reduced\n" and child.wait(20) == 1
        with pytest.raises(RuntimeError, match="round 1, worker 0"):
            red.allreduce_([t])
        red.close()
        out, errors = _workers(_addr(ps), 2, lambda r: (r.allreduce_([x := torch.ones(3)]), x)[1])
        assert not errors and all(torch.equal(x, torch.ones(3)) for x in out)
    finally:
        ps.close()


def test_no_server_is_a_clear_error(caplog):
    with pytest.raises(RuntimeError, match=r"no parameter server at 127.0.0.1:9 within 0.5 s: "
                       r"Connection refused; start it first: python -m gmi_drl.comm.ps --bind "
                       r"127.0.0.1:9 --workers 2"):
        PSReducer("127.0.0.1:9", 0, 2, join_timeout_s=0.5)
    assert "parameter server at 127.0.0.1:9: Connection refused; retrying for up to 0.5 s" \
        in caplog.text  # said once, while it waits


@pytest.mark.distributed
def test_gmis_training_through_the_server_learn_exactly_as_through_shared_memory(tmp_path):
    """Two DQN GMIs, one through the parameter server (its own process, as users start it),
    one through shared memory: (a + b) / 2 in float32 either way, so the same weights."""
    proc = subprocess.Popen([sys.executable, "-m", "gmi_drl.comm.ps", "--bind", "127.0.0.1:0",
                             "--workers", "2"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:")
        runs = {}
        for reduction in ("ps", "mpr"):
            cfg = small_cfg(tmp_path, "dqn", 2, reduction)
            cfg.gmi.reduction = reduction
            cfg.gmi.ps_addr = line.split()[-1] if reduction == "ps" else None
            runs[reduction] = train(cfg)
    finally:
        proc.terminate()
        tail = proc.communicate(timeout=20)[0]
    assert runs["ps"].weight_digests == runs["mpr"].weight_digests
    assert len(set(runs["ps"].weight_digests)) == 1
    assert "parameter server at" in (runs["ps"].run_dir / "summary.md").read_text()
    assert "groups 1 rounds" in tail


def test_the_ps_reduction_needs_an_address(tmp_path):
    cfg = small_cfg(tmp_path, "dqn", 2, "bad")
    cfg.gmi.reduction = "ps"
    with pytest.raises(ConfigError, match="gmi.ps_addr=None must be HOST:PORT"):
        validate(cfg)


# ---- asynchronous groups (Async PS) -------------------------------------------------------------

def _async_server(world, **kw):
    ps = ParameterServer(("127.0.0.1", 0), world, member_timeout_s=kw.pop("timeout", 20))
    threading.Thread(target=ps.serve_forever, daemon=True).start()
    return ps


def _clients(ps, world, bound):
    """``world`` clients of one asynchronous group (joined from threads: the group forms once
    all are in)."""
    out = [None] * world
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(
        r, AsyncPSClient(_addr(ps), r, world, bound, timeout_s=20))) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_async_updates_apply_as_they_arrive_and_a_slow_worker_blocks_no_one():
    ps = _async_server(2)
    fast, slow = _clients(ps, 2, 100)
    try:
        w = np.zeros(4, np.float32)
        version = fast.pull(0, w)
        slow_w = np.zeros(4, np.float32)
        slow_v = slow.pull(0, slow_w)
        released, done_at = threading.Event(), []

        def slow_worker():  # computes "slowly": pushes only when the fast one is done
            released.wait(20)
            done_at.append(slow.push(0, slow_v, np.full(4, 100, np.float32), slow_w))

        t = threading.Thread(target=slow_worker)
        t.start()
        for k in range(20):  # every update applied at once, each on the newest weights
            applied, version = fast.push(0, version, np.ones(4, np.float32), w)
            assert applied and version == k + 1
            np.testing.assert_array_equal(w, np.full(4, k + 1, np.float32))
        assert not done_at  # the slow worker has pushed nothing yet
        released.set()
        t.join(20)
        assert done_at == [(True, 21)]  # 20 versions stale, within S = 100
        np.testing.assert_array_equal(slow_w, np.full(4, 120, np.float32))
        assert ps.applied == 21 and ps.dropped == 0
        assert ps.streams[0].staleness_counts == {0: 20, 20: 1}
    finally:
        for c in (fast, slow):
            c.close()
        ps.close()


@pytest.mark.parametrize("bound", [0, 1, 3])
def test_no_update_staler_than_s_is_applied_and_the_dropped_ones_are_counted(bound):
    """Worker 1 keeps pushing on the weights it pulled first while worker 0 moves them on:
    its updates apply while ``u - v <= S`` and are dropped after, on the server and in each
    client's counters; the weights are the sum of the applied updates exactly."""
    ps = _async_server(2)
    a, b = _clients(ps, 2, bound)
    try:
        wa, wb = np.zeros(3, np.float32), np.zeros(3, np.float32)
        va, vb = a.pull(0, wa), b.pull(0, wb)
        assert va == vb == 0
        applied_b = []
        for _ in range(6):
            _, va = a.push(0, va, np.ones(3, np.float32), wa)  # never stale
            ok, now = b.push(0, vb, np.full(3, 10, np.float32), wb)  # on version 0 throughout
            applied_b.append(ok)
            assert ok == (now - ok - vb <= bound)
        # staleness of b's k-th push (0-based): a's k + 1 pushes and b's applied ones before
        assert applied_b == [k + 1 + sum(applied_b[:k]) <= bound for k in range(6)]
        counts = ps.streams[0].staleness_counts
        assert max(counts) <= bound and sum(counts.values()) == ps.applied
        assert ps.dropped == b.dropped == applied_b.count(False) > 0
        assert a.applied == 6 and a.dropped == 0 and b.applied == applied_b.count(True)
        np.testing.assert_array_equal(wa, np.full(3, 6 + 10 * b.applied, np.float32))
    finally:
        a.close()
        b.close()
        ps.close()


def test_s0_with_one_worker_is_synchronous_training():
    """S = 0, one worker: every update is applied on the weights it was computed on."""
    ps = _async_server(1)
    (c,) = _clients(ps, 1, 0)
    try:
        w = np.arange(5, dtype=np.float32)
        v = c.pull(0, w)
        for k in range(5):
            applied, v = c.push(0, v, w * np.float32(0.5), w)  # w <- 1.5 w
            assert applied and v == k + 1
        np.testing.assert_array_equal(w, np.arange(5, dtype=np.float32) * np.float32(1.5) ** 5)
    finally:
        c.close()
        ps.close()


def test_every_worker_ends_with_the_servers_weights_on_every_stream():
    """3 workers, 2 streams (an actor and a critic), random pace, S = 2: after `finish` every
    worker holds the server's final weights, and they are the initial ones plus the applied
    updates (integers: exact in any order)."""
    ps = _async_server(3)
    clients = _clients(ps, 3, 2)
    finals, errors = [None] * 3, []

    def work(c):
        try:
            rng = np.random.default_rng(c.rank)
            streams = [(c.new_stream(), np.full(n, 7, np.float32)) for n in (5, 8)]
            versions = [c.pull(s, w) for s, w in streams]
            for _ in range(15):
                k = int(rng.integers(2))
                s, w = streams[k]
                if rng.random() < 0.3:
                    threading.Event().wait(0.01)
                _, versions[k] = c.push(s, versions[k], np.ones_like(w), w)
            for s, w in streams:
                c.finish(s, w)
            finals[c.rank] = [w.copy() for _, w in streams]
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        for sid in (0, 1):
            server = ps.streams[sid]
            assert max(server.staleness_counts) <= 2
            np.testing.assert_array_equal(server.weights, 7 + server.version)
            for rank in range(3):
                np.testing.assert_array_equal(finals[rank][sid], server.weights)
        assert ps.applied + ps.dropped == 45 == sum(c.pushed for c in clients)
    finally:
        for c in clients:
            c.close()
        ps.close()


def test_a_group_mixing_kinds_or_bounds_is_refused_with_the_reason():
    ps = _async_server(2)
    first = AsyncPSClient(_addr(ps), 0, 2, 3, timeout_s=5)
    try:
        with pytest.raises(RuntimeError, match=r"this member is asynchronous \(S = 2\), the group "
                           r"forming is asynchronous \(S = 3\)"):
            AsyncPSClient(_addr(ps), 1, 2, 2, timeout_s=5)
        with pytest.raises(RuntimeError, match="this member is synchronous, the group forming is "
                           r"asynchronous \(S = 3\)"):
            PSReducer(_addr(ps), 1, 2, timeout_s=5)
        with pytest.raises(RuntimeError, match="no collective allreduce_"):
            first.allreduce_([torch.zeros(2)])
    finally:
        first.close()
        ps.close()
    with pytest.raises(ValueError, match="staleness_bound=-1"):
        AsyncPSClient("127.0.0.1:9", 0, 2, -1)


@pytest.mark.distributed
@pytest.mark.parametrize("algo, placement", [("sac", "serial"), ("ppo", "local")])
def test_gmis_train_through_an_async_parameter_server(tmp_path, algo, placement):
    """`--gmi.reduction ps --gmi.staleness 3`: every optimised module is a stream (SAC: actor,
    critics and entropy coefficient), every GMI's updates reach the server, none applied with
    staleness > 3, and the metrics and summary say so."""
    import csv

    ps = _async_server(2)
    try:
        cfg = small_cfg(tmp_path, algo, 2, "async-ps")
        cfg.placement, cfg.gmi.reduction, cfg.gmi.staleness = placement, "ps", 3
        cfg.gmi.ps_addr = _addr(ps)
        result = train(cfg)
    finally:
        ps.close()
    assert result.global_step == 6 * cfg.batch_size
    assert len(ps.streams) == (3 if algo == "sac" else 1)
    assert all(max(s.staleness_counts) <= 3 for s in ps.streams.values())
    assert ps.applied == sum(s.version for s in ps.streams.values()) > 0
    rows = list(csv.DictReader(open(result.run_dir / "metrics.csv")))
    worst = [float(r["value"]) for r in rows if r["name"] == "comm/staleness_max"]
    assert worst and max(worst) <= 3
    assert "staleness bound S = 3 (iSwitch's Async PS)" in (result.run_dir
                                                            / "summary.md").read_text()


def test_staleness_with_the_ps_reduction_is_async_ps_and_is_validated(tmp_path):
    cfg = small_cfg(tmp_path, "dqn", 2, "v")
    cfg.gmi.reduction, cfg.gmi.ps_addr, cfg.gmi.staleness = "ps", "127.0.0.1:9", 3
    validate(cfg)
    cfg.gmi.staleness = -1
    with pytest.raises(ConfigError, match="gmi.staleness=-1 must be >= 0"):
        validate(cfg)
    cfg.gmi.staleness = 1 << 32
    with pytest.raises(ConfigError, match=r"gmi.staleness=4294967296 must be < 2\*\*32"):
        validate(cfg)
    cfg.gmi.reduction, cfg.gmi.staleness = "ring", 3
    with pytest.raises(ConfigError, match="gmi.staleness=3 needs gmi.reduction switch or ps, "
                       "not 'ring'"):
        validate(cfg)
