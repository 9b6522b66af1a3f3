"""Packet formats (iSwitch §3.2): round trips, and the decoders reject every malformed input with
`ProtocolError` and nothing else."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings, strategies as st

from gmi_drl.comm.switch import protocol as P
from gmi_drl.comm.switch.protocol import Action


@pytest.mark.parametrize("action, value", [
    (Action.JOIN, P.JoinValue(3, P.MemberType.SWITCH, 12, 3, 1, "job-é", "tok")),
    (Action.JOIN_ACK, P.JoinAckValue(0xDEADBEEF, 366, 128, 7, 3)),
    (Action.JOIN_NACK, P.NackValue(P.NackReason.BAD_TOKEN, "bad token")),
    (Action.SETH_NACK, P.ModeNackValue(1, 1, "this job aggregates with H=2, S=1")),
    (Action.LEAVE, None), (Action.RESET, None), (Action.HEARTBEAT, None),
    (Action.NOT_MEMBER, None), (Action.STATS, None),
    (Action.SETH, 5), (Action.ACK, int(Action.SETH)),
    (Action.FBCAST, 2**32 - 1), (Action.HELP, 17),
    (Action.READY, P.ReadyValue(True, 9)),
    (Action.STATS_REPLY, {"packets_in": 3}),
    (Action.FLUSHED, (P.FlushedRun(0, 3, 7), P.FlushedRun(5, 1, P.ASYNC_TAG_MOD - 1))),
])
def test_control_round_trip(action, value):
    raw = P.encode_control(action, value)
    assert raw[0] == action
    assert P.decode_control(raw) == (action, value)
    if len(raw) > 1 and action not in (Action.JOIN_NACK, Action.SETH_NACK):
        with pytest.raises(P.ProtocolError):
            P.decode_control(raw[:-1] if action != Action.STATS_REPLY else raw[:2])


def test_flushed_runs_join_equal_numbers_of_consecutive_offsets():
    pairs = [(0, 4), (1, 4), (2, 4), (3, 3), (7, 3), (8, P.ASYNC_TAG_MOD + 3)]
    assert P.flushed_runs(pairs) == ((0, 3, 4), (3, 1, 3), (7, 2, 3))
    assert P.flushed_runs([]) == ()
    assert P.encode_control(Action.FLUSHED, ()) == bytes([Action.FLUSHED])
    for bad in (((0, 0, 1),), ((4, 2, 1), (5, 1, 1)), ((0, 1, P.ASYNC_TAG_MOD),),
                ((P.ASYNC_OFFSETS - 1, 2, 0),)):
        with pytest.raises(P.ProtocolError):
            P.encode_control(Action.FLUSHED, bad)


def test_data_header_is_8_bytes_and_round_trips():
    assert P.HEADER_BYTES == 8
    pkt = P.data_header(2**32 + 5, 300, 7, 3, P.FLAG_RESULT) + struct.pack("<3f", 1, 2, 3)
    assert P.decode_data(pkt, len(pkt), 366) == (5, 300 & 0xFF, 7, 3, P.FLAG_RESULT, 3)
    for bad in (pkt[:8], pkt[:13], pkt + b"\0"):
        with pytest.raises(P.ProtocolError):
            P.decode_data(bad, len(bad), 366)
    with pytest.raises(P.ProtocolError):  # more floats than a segment
        P.decode_data(pkt, len(pkt), 2)


def test_segment_size_follows_the_mtu():
    assert P.seg_floats_for_mtu(1500) == (1500 - 20 - 8 - 8) // 4 == 366
    assert P.seg_floats_for_mtu(9000) == 2241
    assert P.seg_floats_for_mtu(65536) == (65507 - 8) // 4
    with pytest.raises(ValueError):
        P.seg_floats_for_mtu(39)


def test_serial_order_wraps():
    assert P.seq_newer(1, 0) and P.seq_newer(0, 2**32 - 1) and not P.seq_newer(5, 5)
    assert not P.seq_newer(0, 1)


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=80))
def test_decode_control_rejects_garbage_cleanly(raw):
    """Garbage is a ProtocolError, never another exception; what decodes is a well-formed
    message: encoding it again gives the same bytes (STATS_REPLY, JSON: the same object)."""
    try:
        action, value = P.decode_control(raw)
    except P.ProtocolError:
        return
    again = P.encode_control(action, value)
    if action == Action.STATS_REPLY:
        assert P.decode_control(again) == (action, value)
    else:
        assert again == raw, (action, value)


def _join(**changes) -> bytes:
    value = P.JoinValue(3, P.MemberType.WORKER, 4, 0, 0, "job", "token")._replace(**changes)
    return P.encode_control(Action.JOIN, value)


@pytest.mark.parametrize("raw, reason", [
    (_join() + b"\x00", "trailing bytes after Join"),
    (_join(num_workers=0), "num_workers 0"),
    (_join()[:-1], "string runs past the end"),
])
def test_a_malformed_join_is_refused_by_name(raw, reason):
    assert P.decode_control(_join())[1].num_workers == 4  # the well-formed one decodes
    with pytest.raises(P.ProtocolError, match=reason):
        P.decode_control(raw)


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=64))
def test_decode_data_rejects_garbage_cleanly(raw):
    try:
        seq, rnd, member, count, flags, k = P.decode_data(raw, len(raw), 8)
    except P.ProtocolError:
        return
    assert 1 <= k <= 8 and len(raw) == 8 + 4 * k and count >= 1


def test_native_layout_is_the_data_header():
    lay = P.native_layout()
    raw = P.data_header(0x01020304, 5, 6, 7, P.FLAG_RETX)
    fields = {}
    for name in ("seq", "round", "member", "count", "flags"):
        off, size = lay[f"{name}_offset"], lay[f"{name}_size"]
        fields[name] = int.from_bytes(raw[off:off + size], "big")
    assert fields == {"seq": 0x01020304, "round": 5, "member": 6, "count": 7,
                      "flags": P.FLAG_RETX}
    assert lay["header_bytes"] == len(raw) == P.HEADER_BYTES
    assert lay["tos_data"] == P.TOS_DATA and lay["action_stats"] == int(Action.STATS)


def test_pack_data_headers_matches_data_header():
    import numpy as np

    rows = np.zeros((3, 12), np.uint8)
    P.pack_data_headers(rows, np.array([7, 2**32 - 1, 2**32 + 3]), 258, 9, 1, P.FLAG_RETX)
    for row, seq in zip(rows, (7, 2**32 - 1, 3)):
        assert bytes(row[:8]) == P.data_header(seq, 2, 9, 1, P.FLAG_RETX)
    assert not rows[:, 8:].any()


def test_segmented_send_arrives_as_the_same_datagrams():
    """One UDP_SEGMENT send of 3 datagrams (the last shorter) reaches a plain socket as 3
    datagrams and a GRO socket as one buffer with the segment size (or 3, where the kernel does
    not coalesce): the wire format is that of 3 separate sends."""
    import select

    sender = P.open_socket(("127.0.0.1", 0), 1 << 20)
    plain = P.open_socket(("127.0.0.1", 0), 1 << 20)
    gro = P.open_socket(("127.0.0.1", 0), 1 << 20)
    try:
        assert P.enable_gro(gro)
        seg = P.HEADER_BYTES + 4 * 5
        datagrams = [P.data_header(s, 0, 1, 1, 0) + bytes([s]) * (20 if s < 2 else 8)
                     for s in range(3)]
        for dst in (plain, gro):
            # buffers cut anywhere: the concatenation is what is segmented
            parts = [datagrams[0][:3], datagrams[0][3:], datagrams[1], datagrams[2]]
            assert P.send_segmented(sender, dst.getsockname(), parts, seg)
        buf = bytearray(P.RX_BUFFER_BYTES)
        got_plain = []
        while len(got_plain) < 3 and select.select([plain], [], [], 5)[0]:
            n, tos, addr, s = P.recv_segments(plain, buf)
            assert tos == P.TOS_DATA and s == n and addr == sender.getsockname()
            got_plain.append(bytes(buf[:n]))
        assert got_plain == datagrams
        got_gro = []
        while len(got_gro) < 3 and select.select([gro], [], [], 5)[0]:
            n, tos, addr, s = P.recv_segments(gro, buf)
            assert tos == P.TOS_DATA
            got_gro += [bytes(buf[o:min(o + s, n)]) for o in range(0, n, s)]
        assert got_gro == datagrams
    finally:
        for s in (sender, plain, gro):
            s.close()


def test_serve_goes_on_when_its_stdout_is_closed_and_refuses_a_parent_it_cannot_send_to():
    """`gmi-drl switch serve ... | head -1`: the pipe closes, the daemon (serving a job, maybe)
    goes on without printing; a --parent of port 0 or a broadcast address is a usage error."""
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-m", "gmi_drl.comm.switch", "serve", "--bind", "127.0.0.1:0",
           "--stats-interval", "0.1"]
    daemon = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert daemon.stdout.readline().startswith("listening on")
        daemon.stdout.close()  # as `head -1` exits
        time.sleep(1.0)  # several reports into the closed pipe
        assert daemon.poll() is None
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(10) == 0
        assert "Traceback" not in daemon.stderr.read()
    finally:
        if daemon.poll() is None:
            daemon.kill()
    for parent in ("127.0.0.1:0", "255.255.255.255:9000"):
        bad = subprocess.run([*cmd, "--parent", parent], capture_output=True, text=True,
                             timeout=30)
        assert bad.returncode == 2 and "argument --parent" in bad.stderr


def test_a_switch_takes_the_mtu_of_its_bind_address():
    """A switch without an MTU (`gmi-drl switch serve` without --mtu, or `SwitchConfig` from
    Python without ``mtu``): the MTU of the bind address's interface, at most 9000 (loopback's
    is 65536), a wildcard address the smallest of the other interfaces', an address no
    interface holds Ethernet's 1500; a given MTU wins."""
    import socket
    import subprocess
    import sys

    from gmi_drl.comm.switch import SwitchConfig, SwitchDaemon
    from gmi_drl.comm.switch.daemon import FALLBACK_MTU, bind_mtu

    def mtu(name):
        return int(open(f"/sys/class/net/{name}/mtu").read())

    assert bind_mtu("127.0.0.1") == bind_mtu("localhost") == mtu("lo")
    assert bind_mtu("192.0.2.123") == FALLBACK_MTU == 1500  # no interface holds it
    assert bind_mtu("0.0.0.0") in {mtu(n) for _, n in socket.if_nameindex()}
    for cfg, want in ((SwitchConfig(), min(mtu("lo"), 9000)), (SwitchConfig(mtu=1500), 1500)):
        d = SwitchDaemon(cfg)
        try:
            assert d.mtu == want and d.seg_floats == P.seg_floats_for_mtu(want)
        finally:
            d.close()
    for flags, want in (([], min(mtu("lo"), 9000)), (["--mtu", "1500"], 1500)):
        proc = subprocess.Popen([sys.executable, "-m", "gmi_drl.comm.switch", "serve", "--bind",
                                 "127.0.0.1:0", "--stats-interval", "0", *flags],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline().startswith("listening on")
        proc.terminate()
        assert proc.wait(20) == 0
        assert f"mtu: {want}" in proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()


def _open_as_nobody(conn) -> None:
    """In a child: drop root (no CAP_NET_ADMIN, so the forced sizes are refused), then open a
    socket asking for 8 MiB buffers; sends back the sizes granted and the warnings logged."""
    import logging
    import os
    import socket

    os.setgid(65534)
    os.setuid(65534)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger(P.__name__).addHandler(handler)
    P._WARNED.clear()  # (the parent's process may have warned: this one is the child)
    s = P.open_socket(("127.0.0.1", 0), 8 << 20)
    t = P.open_socket(("127.0.0.1", 0), 4 << 20)  # a second socket: no second warning
    conn.send((s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2,
               [r.getMessage() for r in records]))
    s.close()
    t.close()


def test_buffers_a_process_cannot_have_are_named_in_a_warning():
    """Not root: the kernel caps SO_RCVBUF at net.core.rmem_max, and the switch's socket says so
    (once per process) instead of running with small buffers silently."""
    import multiprocessing
    import os

    import socket

    cap = int(open("/proc/sys/net/core/rmem_max").read())
    if os.geteuid() != 0:
        pytest.skip("drops root in a child: needs root")
    if cap >= 8 << 20:
        pytest.skip(f"net.core.rmem_max={cap} already allows 8 MiB")
    s = P.open_socket(("127.0.0.1", 0), 8 << 20)
    forced = s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2 >= 8 << 20
    s.close()
    if not forced:
        pytest.skip("this root has no CAP_NET_ADMIN (a container's): nothing to compare")
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_open_as_nobody, args=(child,))
    p.start()
    assert parent.poll(30), "the child sent nothing"
    granted, warnings = parent.recv()
    p.join(10)
    assert granted <= cap
    assert len(warnings) == 1 and "not the 8192 KiB asked: net.core.rmem_max" in warnings[0]
