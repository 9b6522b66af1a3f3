"""More than 10,000 generated packets - garbage, truncated, foreign-job, wrong-ToS, non-member and
malformed-member packets - are dropped and counted; the daemon keeps aggregating exactly."""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from gmi_drl.comm.switch import SwitchConfig, SwitchDaemon, SwitchReducer
from gmi_drl.comm.switch import protocol as P
from tests.comm.switch.conftest import PLANES

TOS = st.sampled_from([P.TOS_CONTROL, P.TOS_DATA, 0, 0x04, 0xFC])
JOB, TOKEN = "fuzz-job", "k" * 16


def _valid_then_truncated(draw_bytes: bytes, cut: int) -> bytes:
    return draw_bytes[:cut]


control = st.builds(
    lambda a, body: bytes([a]) + body, st.integers(0, 255), st.binary(max_size=40))
foreign_join = st.builds(
    lambda mid, nw, job, tok: P.encode_control(P.Action.JOIN, P.JoinValue(
        mid, P.MemberType.WORKER, nw, 1, 0, job, tok)),
    st.integers(0, 255), st.integers(1, 9), st.text(max_size=8), st.text(max_size=8))
data = st.builds(
    lambda seq, rnd, m, c, f, payload: struct.pack("!IBBBB", seq, rnd, m, c, f) + payload,
    st.integers(0, 2**32 - 1), st.integers(0, 255), st.integers(0, 255), st.integers(0, 255),
    st.integers(0, 255), st.binary(max_size=1600))
truncated = st.builds(lambda raw, cut: raw[:cut], st.one_of(data, foreign_join),
                      st.integers(0, 20))
packet = st.tuples(TOS, st.one_of(st.binary(max_size=200), control, foreign_join, data, truncated))

SENT = {"n": 0}


@pytest.fixture(scope="module", params=PLANES)
def daemon(request):
    d = SwitchDaemon(SwitchConfig(bind=("127.0.0.1", 0), job_id=JOB, token=TOKEN, mtu=1500,
                                  help_after_s=0.05, data_plane=request.param))
    assert d.data_plane == request.param
    t = threading.Thread(target=d.serve_forever, daemon=True)
    t.start()
    yield d, t
    d.stop()
    t.join(5)
    d.close()


def _send(sock, addr, tos, raw):
    sock.sendmsg([raw], [(socket.IPPROTO_IP, socket.IP_TOS, struct.pack("i", tos))], 0, addr)


def _settle(d, expect_in, timeout_s=10.0):
    end = time.monotonic() + timeout_s
    while d.counters.packets_in < expect_in and time.monotonic() < end:
        time.sleep(0.005)


def test_generated_packets_are_dropped_and_counted(daemon):
    d, thread = daemon
    SENT["n"] = 0
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    start = d.counters.packets_in
    dropped0 = sum(getattr(d.counters, k) for k in (
        "malformed_dropped", "non_member_dropped", "foreign_job_dropped"))

    @settings(max_examples=110, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(packet, min_size=100, max_size=100))
    def blast(packets):
        for tos, raw in packets:
            if tos == P.TOS_CONTROL and raw[:1] in (bytes([P.Action.STATS]),
                                                    bytes([P.Action.LEAVE])):
                # a STATS query, and a stranger's Leave (a member whose ACK was lost), are
                # answered, not dropped: keep them out
                raw = b"\xff" + raw[1:]
            _send(sock, d.address, tos, raw)
            SENT["n"] += 1
        _settle(d, start + SENT["n"])
        try:
            while True:
                sock.recv(65536)  # the daemon's NOT_MEMBER / JOIN_NACK answers
        except BlockingIOError:
            pass

    try:
        blast()
    finally:
        sock.close()
    assert SENT["n"] >= 10_000
    assert thread.is_alive()
    c = d.counters
    assert c.packets_in - start == SENT["n"]  # nothing lost on loopback
    dropped = c.malformed_dropped + c.non_member_dropped + c.foreign_job_dropped - dropped0
    assert dropped == SENT["n"], d.stats()
    assert c.foreign_job_dropped > 0 and c.malformed_dropped > 0 and c.non_member_dropped > 0
    assert d.stats()["members"] == 0


def test_malformed_member_packets_and_noise_do_not_disturb_a_job(daemon):
    d, thread = daemon
    addr = "%s:%d" % d.address
    # a raw member: joins as worker 2 of 3, sends only malformed data, then leaves
    raw = P.open_socket(("127.0.0.1", 0))
    P.send_control(raw, d.address, P.Action.JOIN, P.JoinValue(
        2, P.MemberType.WORKER, 3, 1, 0, JOB, TOKEN))
    time.sleep(0.2)
    m0 = d.counters.malformed_dropped
    f = d.seg_floats
    bad = [
        P.data_header(0, 0, 2, 1, 0)[:5],                       # truncated header
        P.data_header(0, 0, 2, 1, 0) + b"\0" * 6,               # half a float
        P.data_header(0, 0, 2, 1, 0) + b"\0" * 4 * (f + 1),     # longer than a segment
        P.data_header(0, 0, 2, 7, 0) + b"\0" * 4,               # claims 7 gradients
        P.data_header(0, 0, 1, 1, 0) + b"\0" * 4,               # another member's id
        P.data_header(0, 0, 2, 1, P.FLAG_RESULT) + b"\0" * 4,   # a result, from below
        P.data_header(0, 0, 2, 1, 0x80) + b"\0" * 4,            # unknown flag
    ]
    for b in bad:
        P.send_data(raw, d.address, b, b"")
    _settle_malformed = time.monotonic() + 5
    while d.counters.malformed_dropped < m0 + len(bad) and time.monotonic() < _settle_malformed:
        time.sleep(0.01)
    assert d.counters.malformed_dropped == m0 + len(bad)
    P.send_control(raw, d.address, P.Action.LEAVE)
    raw.close()

    stop = threading.Event()

    def noise():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rng = np.random.default_rng(0)
        while not stop.is_set():
            tos = int(rng.choice([P.TOS_DATA, P.TOS_CONTROL, 0]))
            _send(s, d.address, tos, rng.bytes(int(rng.integers(0, 1500))))
            time.sleep(0.0005)
        s.close()

    results = {}

    def worker(rank):
        red = SwitchReducer(addr, rank, 2, job_id=JOB, token=TOKEN, rto_s=0.05,
                            join_timeout_s=10)
        g = torch.Generator().manual_seed(rank)
        ts = [torch.randn(7000, generator=g)]
        red.allreduce_(ts)
        results[rank] = ts[0]
        red.close()

    n = threading.Thread(target=noise)
    n.start()
    ws = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
    try:
        for w in ws:
            w.start()
        for w in ws:
            w.join(60)
    finally:
        stop.set()
        n.join(5)
    g0 = torch.randn(7000, generator=torch.Generator().manual_seed(0))
    g1 = torch.randn(7000, generator=torch.Generator().manual_seed(1))
    ref = (g0 + g1) / 2
    assert torch.equal(results[0], ref) and torch.equal(results[1], ref)
    assert thread.is_alive()


def test_joins_beyond_the_jobs_workers_are_refused_and_a_foreign_job_learns_no_name(daemon):
    d, _thread = daemon
    raw = P.open_socket(("127.0.0.1", 0))
    raw.settimeout(5)
    buf = bytearray(P.RX_BUFFER_BYTES)

    def answer(value):
        P.send_control(raw, d.address, P.Action.JOIN, value)
        n, _tos, _addr = P.recv_packet(raw, buf)
        return P.decode_control(buf[:n])

    try:
        action, nack = answer(P.JoinValue(7, P.MemberType.WORKER, 3, 1, 0, JOB, TOKEN))
        assert action == P.Action.JOIN_NACK and nack.reason == P.NackReason.GROUP_MISMATCH
        assert "worker id 7 is outside the job's 3 workers" in nack.text
        # a switch below claiming more workers than the job has
        action, nack = answer(P.JoinValue(0, P.MemberType.SWITCH, 3, 4, 0, JOB, TOKEN))
        assert action == P.Action.JOIN_NACK and nack.reason == P.NackReason.FULL
        action, nack = answer(P.JoinValue(0, P.MemberType.WORKER, 3, 1, 0, "other", TOKEN))
        assert action == P.Action.JOIN_NACK and nack.reason == P.NackReason.FOREIGN_JOB
        assert JOB not in nack.text
        assert d.stats()["members"] == 0
    finally:
        raw.close()
