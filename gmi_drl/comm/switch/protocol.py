"""Every iSwitch packet format (iSwitch §3.2, Fig. 5). Nothing else in gmi-drl packs these bytes.

All packets are UDP over IPv4. The IP ToS byte tells the two kinds apart, as a switch's input
arbiter would (§3.3): `TOS_CONTROL` marks control messages, `TOS_DATA` marks data packets; a
packet carrying any other ToS is not ours and is dropped.

Control message (Fig. 5a): a 1-byte `Action`, then an optional Value whose layout depends on the
action (the ``*Value`` structs below; all integers big-endian).

Data packet (Fig. 5b): the 8-byte Seg header `DATA_HEADER` = ``seq:u32 round:u8 member:u8
count:u8 flags:u8`` followed by ``k`` raw little-endian float32 gradient elements,
``1 <= k <= seg_floats``:

- ``seq``: the segment index. Each member numbers its segments consecutively across rounds
  (mod 2**32), so ``seq`` names both the round and the spatial offset: segment ``seq`` of the
  round starting at ``base`` holds elements ``[(seq - base) * seg_floats, ... + k)``. Every
  member of a group issues the same sequence of vector sizes, so equal ``seq`` means equal data.
- ``round``: the low 8 bits of the sender's allreduce counter (diagnostics, staleness in stale-sync mode).
- ``member``: the sender's member id at the switch it sends to (a switch sending a result writes
  its own switch id).
- ``count``: how many workers' gradients the payload sums (1 for a worker's own packet, the
  partial's size for a child switch, the total for a result).
- ``flags``: `FLAG_RESULT`, `FLAG_RETX`, `FLAG_FBCAST`, `FLAG_ASYNC`.

Threshold (asynchronous) mode (iSwitch §4.1, Fig. 11): a packet with `FLAG_ASYNC` belongs to
the switch's threshold aggregation, enabled by a two-byte `Action.SETH` (`ThresholdValue`).
There ``seq`` is ``tag << 16 | offset`` (`async_seq`): ``offset`` names the segment's place in
the job's fixed parameter layout (the same on every worker), ``tag`` is the sender's push
number (worker -> switch) or the offset's aggregate number (result, switch -> workers), both
mod `ASYNC_TAG_MOD`; ``round`` is the low 8 bits of the weight version the gradient was
computed on (worker -> switch; the staleness check) or of the aggregate number (result).

The answer to a worker's flush (`Action.FBCAST` of `ASYNC_FLUSH`) is `Action.FLUSHED`, whose
Value lists every offset's aggregates completed so far as runs ``first:u16 n:u16 number:u16``
(`FlushedValue`): a worker that lost every result packet of an aggregate learns it exists and
asks for it (Help). `Action.HELP` of `ASYNC_FLUSH` asks for the same answer without a flush (an
idle worker that has seen no result for a while). In a tree the root answers both, through the
worker's switch.

``seg_floats`` follows the path MTU: `seg_floats_for_mtu`. A switch announces it in `JoinAck`.
"""

from __future__ import annotations

import enum
import errno
import json
import logging
import socket
import struct
from typing import NamedTuple

import numpy as np

TOS_CONTROL = 0x6C
"""IP ToS byte of control messages (DSCP 27, ECN 0: a value no standard class uses)."""
TOS_DATA = 0x70
"""IP ToS byte of data packets (DSCP 28, ECN 0)."""

IPV4_UDP_OVERHEAD = 20 + 8
"""Bytes of IPv4 and UDP header in front of every payload."""
MAX_UDP_PAYLOAD = 65507
"""The largest UDP payload IPv4 can carry."""

DATA_HEADER = struct.Struct("!IBBBB")
"""Seg header: seq u32, round u8, member u8, count u8, flags u8 (8 bytes)."""
HEADER_BYTES = DATA_HEADER.size
FLOAT_BYTES = 4
MAX_COUNT = 255
"""The most gradients one data packet's count field can name (u8)."""

FLAG_RESULT = 0x01
"""The payload is an aggregated result travelling down the tree (switch -> member)."""
FLAG_RETX = 0x02
"""A worker's retransmission after its timer fired."""
FLAG_FBCAST = 0x04
"""A result the switch sends again (a late retransmission or a `Action.HELP` answer)."""
FLAG_ASYNC = 0x08
"""A threshold-mode packet (`async_seq`): any workers' gradients, H of them per aggregate."""
KNOWN_FLAGS = FLAG_RESULT | FLAG_RETX | FLAG_FBCAST | FLAG_ASYNC

SEQ_MOD = 1 << 32
ASYNC_OFFSETS = 1 << 16
"""Segment offsets a threshold-mode layout may use (``seq``'s low 16 bits)."""
ASYNC_TAG_MOD = 1 << 15
"""Push numbers and aggregate numbers in a threshold-mode ``seq`` are taken mod this (bits
16..30; bit 31 stays 0)."""
ASYNC_FLUSH = SEQ_MOD - 1
"""`Action.FBCAST` Value that broadcasts every open threshold-mode aggregate as it is; the
switch answers `Action.FLUSHED` (to `Action.HELP` of it too, without the flush)."""


class ProtocolError(ValueError):
    """A packet that is not a well-formed iSwitch message (the daemon drops and counts it)."""


class Action(enum.IntEnum):
    """Control actions (iSwitch Table 2, plus what loss recovery and the tree need)."""

    JOIN = 1          # Value: JoinValue. Member -> switch; also a child's membership update.
    JOIN_ACK = 2      # Value: JoinAckValue. Switch -> member.
    JOIN_NACK = 3     # Value: NackValue. Switch -> would-be member (foreign job, bad token, full).
    LEAVE = 4         # no Value. Member -> switch.
    RESET = 5         # no Value. Member -> switch: clear every aggregation slot.
    SETH = 6          # Value: u8 H (0 = default, the number of members), or a
                      # ThresholdValue (threshold mode). Member -> switch.
    FBCAST = 7        # Value: u32 seq. Member -> switch: broadcast that slot now, as it is.
    HELP = 8          # Value: u32 seq. Member -> switch: "result of seq lost, resend it";
                      # switch -> member: "your contribution to seq is missing, resend it".
    HEARTBEAT = 9     # no Value. Member -> switch: alive although idle.
    READY = 10        # Value: ReadyValue. Switch -> members: the group is complete (or not).
    NOT_MEMBER = 11   # no Value. Switch -> sender: you are not in my membership table (rejoin).
    ACK = 12          # Value: u8 acknowledged action. Switch -> member (RESET, SETH, FBCAST).
    STATS = 13        # no Value. Anyone -> switch: send your counters.
    STATS_REPLY = 14  # Value: UTF-8 JSON object of counters.
    FLUSHED = 15      # Value: FlushedValue. Switch -> member: the answer to FBCAST or HELP of
                      # ASYNC_FLUSH (threshold mode).
    SETH_NACK = 16    # Value: ModeNackValue. Switch -> member: a threshold mode (H, S) other
                      # than the one its job already aggregates with, refused.


class MemberType(enum.IntEnum):
    WORKER = 0
    SWITCH = 1


class NackReason(enum.IntEnum):
    FOREIGN_JOB = 1
    BAD_TOKEN = 2
    FULL = 3
    GROUP_MISMATCH = 4


class JoinValue(NamedTuple):
    """Value of `Action.JOIN`.

    ``num_workers``: the job's total worker count (equal in every Join of a job).
    ``workers_below`` / ``dropped_below``: active and dropped workers under this member (1 / 0 for
    a worker; a child switch's own counts, re-sent whenever they change).
    ``job_id``, ``token``: at most 255 UTF-8 bytes each; a job's members all give the same.
    """

    member_id: int
    member_type: MemberType
    num_workers: int
    workers_below: int
    dropped_below: int
    job_id: str
    token: str


class JoinAckValue(NamedTuple):
    """Value of `Action.JOIN_ACK`: ``epoch`` (random per daemon start), the segment size in
    float32 elements, the per-member in-flight window in segments, the switch's id, and the
    member id it accepted."""

    epoch: int
    seg_floats: int
    window: int
    switch_id: int
    member_id: int


class NackValue(NamedTuple):
    reason: NackReason
    text: str


class ModeNackValue(NamedTuple):
    """Value of `Action.SETH_NACK`: the threshold mode refused (so a late answer to an earlier
    request is told from one to the latest) and why."""

    threshold: int
    staleness: int
    text: str


class ThresholdValue(NamedTuple):
    """Two-byte Value of `Action.SETH`: threshold (asynchronous) aggregation (iSwitch §4.1).
    ``threshold``: H, gradient vectors per aggregate, from any workers (1..255);
    ``staleness``: S, the switch drops a gradient computed on a weight version more than S
    aggregates behind the one it would join (0..127)."""

    threshold: int
    staleness: int


class FlushedRun(NamedTuple):
    """One run of `Action.FLUSHED`'s Value: segment offsets ``[first, first + n)`` have each
    completed ``number`` aggregates (mod `ASYNC_TAG_MOD`; the next one's number)."""

    first: int
    n: int
    number: int


FlushedValue = tuple
"""Value of `Action.FLUSHED`: a tuple of `FlushedRun` in ascending ``first``, not overlapping
(6 bytes each, big-endian u16 fields; empty where no offset holds an aggregate yet)."""


class ReadyValue(NamedTuple):
    """``ready``: whether every worker of the job has joined (or been dropped);
    ``active_workers``: workers currently in the group."""

    ready: bool
    active_workers: int


_JOIN = struct.Struct("!BBHHH")
_JOIN_ACK = struct.Struct("!IHHBB")
_U8 = struct.Struct("!B")
_SETH2 = struct.Struct("!BB")
_U32 = struct.Struct("!I")
_READY = struct.Struct("!BH")
_RUN = struct.Struct("!HHH")
MAX_FLUSHED_RUNS = (MAX_UDP_PAYLOAD - 1) // _RUN.size
"""Runs one `Action.FLUSHED` carries at most (`flushed_runs` keeps the first ones)."""
_SEQ_ACTIONS = (Action.FBCAST, Action.HELP)
_EMPTY_ACTIONS = (Action.LEAVE, Action.RESET, Action.HEARTBEAT, Action.NOT_MEMBER, Action.STATS)


def seg_floats_for_mtu(mtu: int) -> int:
    """Float32 elements per data packet on a path of ``mtu`` bytes (IPv4, no options).

    Raises:
        ValueError: ``mtu`` too small for the header and one element.
    """
    payload = min(mtu - IPV4_UDP_OVERHEAD, MAX_UDP_PAYLOAD) - HEADER_BYTES
    if payload < FLOAT_BYTES:
        raise ValueError(f"{mtu=} leaves no room for one float32 after the headers")
    return min(payload // FLOAT_BYTES, 0xFFFF)


def _short_str(s: str, what: str) -> bytes:
    b = s.encode()
    if len(b) > 255:
        raise ValueError(f"{what} is {len(b)} bytes of UTF-8; at most 255")
    return _U8.pack(len(b)) + b


def encode_control(action: Action, value=None) -> bytes:
    """Bytes of one control message (send them with ToS `TOS_CONTROL`).

    Raises:
        ValueError: ``value`` does not fit ``action``.
    """
    a = _U8.pack(action)
    if action == Action.JOIN:
        v: JoinValue = value
        return (a + _JOIN.pack(v.member_id, v.member_type, v.num_workers, v.workers_below,
                               v.dropped_below)
                + _short_str(v.job_id, "job_id") + _short_str(v.token, "token"))
    if action == Action.JOIN_ACK:
        return a + _JOIN_ACK.pack(*value)
    if action == Action.JOIN_NACK:
        return a + _U8.pack(value.reason) + value.text.encode()[:1000]
    if action == Action.SETH_NACK:
        return a + _SETH2.pack(value.threshold, value.staleness) + value.text.encode()[:1000]
    if action == Action.SETH and isinstance(value, ThresholdValue):
        if not (1 <= value.threshold <= 255 and 0 <= value.staleness < 128):
            raise ValueError(f"{value} out of range (H in [1, 255], S in [0, 127])")
        return a + _SETH2.pack(*value)
    if action in (Action.SETH, Action.ACK):
        return a + _U8.pack(value)
    if action in _SEQ_ACTIONS:
        return a + _U32.pack(value % SEQ_MOD)
    if action == Action.READY:
        return a + _READY.pack(bool(value.ready), value.active_workers)
    if action == Action.FLUSHED:
        return a + b"".join(_RUN.pack(*r) for r in _check_runs(value))
    if action == Action.STATS_REPLY:
        return a + json.dumps(value, sort_keys=True).encode()
    if value is not None:
        raise ValueError(f"{action.name} carries no Value")
    return a


def decode_control(buf) -> tuple[Action, object]:
    """Parse a control message (the UDP payload of a `TOS_CONTROL` packet).

    Returns:
        ``(action, value)`` with ``value`` the action's NamedTuple, int, dict, or ``None``.

    Raises:
        ProtocolError: empty, unknown action, wrong Value length or content.
    """
    mv = memoryview(buf)
    if len(mv) < 1:
        raise ProtocolError("empty control message")
    try:
        action = Action(mv[0])
    except ValueError:
        raise ProtocolError(f"unknown action {mv[0]}") from None
    body = mv[1:]
    try:
        if action == Action.JOIN:
            mid, mtype, nw, wb, db = _JOIN.unpack_from(body)
            pos = _JOIN.size
            job, pos = _read_short_str(body, pos)
            token, pos = _read_short_str(body, pos)
            if pos != len(body):
                raise ProtocolError("trailing bytes after Join")
            if nw < 1:
                raise ProtocolError("Join with num_workers 0")
            return action, JoinValue(mid, MemberType(mtype), nw, wb, db, job, token)
        if action == Action.JOIN_ACK:
            _exact(body, _JOIN_ACK.size, action)
            v = JoinAckValue(*_JOIN_ACK.unpack(body))
            if v.seg_floats < 1 or v.window < 1:
                raise ProtocolError("JoinAck with zero segment size or window")
            return action, v
        if action == Action.JOIN_NACK:
            if len(body) < 1:
                raise ProtocolError("JoinNack without a reason")
            return action, NackValue(NackReason(body[0]), bytes(body[1:]).decode())
        if action == Action.SETH_NACK:
            if len(body) < _SETH2.size:
                raise ProtocolError("SethNack without the refused mode")
            h, st = _SETH2.unpack_from(body)
            return action, ModeNackValue(h, st, bytes(body[_SETH2.size:]).decode())
        if action == Action.SETH and len(body) == _SETH2.size:
            v = ThresholdValue(*_SETH2.unpack(body))
            if v.threshold < 1 or v.staleness >= 128:
                raise ProtocolError(f"SETH {v} out of range")
            return action, v
        if action in (Action.SETH, Action.ACK):
            _exact(body, 1, action)
            return action, body[0]
        if action in _SEQ_ACTIONS:
            _exact(body, 4, action)
            return action, _U32.unpack(body)[0]
        if action == Action.READY:
            _exact(body, _READY.size, action)
            r, n = _READY.unpack(body)
            if r > 1:
                raise ProtocolError("READY flag neither 0 nor 1")
            return action, ReadyValue(bool(r), n)
        if action == Action.FLUSHED:
            if len(body) % _RUN.size:
                raise ProtocolError(f"FLUSHED Value of {len(body)} bytes: not 6-byte runs")
            return action, _check_runs(tuple(FlushedRun(*_RUN.unpack_from(body, i))
                                             for i in range(0, len(body), _RUN.size)))
        if action == Action.STATS_REPLY:
            stats = json.loads(bytes(body).decode())
            if not isinstance(stats, dict):
                raise ProtocolError("STATS_REPLY is not a JSON object")
            return action, stats
        _exact(body, 0, action)
        return action, None
    except (struct.error, UnicodeDecodeError, ValueError) as e:
        if isinstance(e, ProtocolError):
            raise
        raise ProtocolError(f"bad {action.name} Value: {e}") from None


def _check_runs(runs) -> tuple:
    """``runs`` as a `FlushedValue` of `FlushedRun`.

    Raises:
        ProtocolError: a run empty, past `ASYNC_OFFSETS`, out of order or overlapping, a number
            not below `ASYNC_TAG_MOD`, or more than `MAX_FLUSHED_RUNS`."""
    out, end = [], 0
    for r in runs:
        r = FlushedRun(*r)
        if r.n < 1 or r.first < end or r.first + r.n > ASYNC_OFFSETS \
                or not 0 <= r.number < ASYNC_TAG_MOD:
            raise ProtocolError(f"FLUSHED run {tuple(r)} empty, out of order or out of range")
        end = r.first + r.n
        out.append(r)
    if len(out) > MAX_FLUSHED_RUNS:
        raise ProtocolError(f"FLUSHED with {len(out)} runs; at most {MAX_FLUSHED_RUNS}")
    return tuple(out)


def flushed_runs(numbers) -> tuple:
    """The `FlushedValue` of ``numbers``: ``(offset, aggregates completed)`` pairs in ascending
    offset (a data plane's `async_numbers`), equal numbers of consecutive offsets joined in one
    run; past `MAX_FLUSHED_RUNS` runs the rest is left out (those offsets' workers then learn
    of a lost aggregate from the next one's results only)."""
    runs: list[list[int]] = []
    for o, number in numbers:
        number %= ASYNC_TAG_MOD
        if runs and runs[-1][0] + runs[-1][1] == o and runs[-1][2] == number:
            runs[-1][1] += 1
        elif len(runs) < MAX_FLUSHED_RUNS:
            runs.append([o, 1, number])
    return tuple(FlushedRun(*r) for r in runs)


def _exact(body, n: int, action: Action) -> None:
    if len(body) != n:
        raise ProtocolError(f"{action.name} Value is {len(body)} bytes, expected {n}")


def _read_short_str(body, pos: int) -> tuple[str, int]:
    if pos >= len(body):
        raise ProtocolError("string length byte missing")
    n = body[pos]
    end = pos + 1 + n
    if end > len(body):
        raise ProtocolError("string runs past the end")
    return bytes(body[pos + 1:end]).decode(), end


def data_header(seq: int, round_: int, member: int, count: int, flags: int) -> bytes:
    """The 8-byte Seg header as bytes (send it followed by the payload's bytes)."""
    return DATA_HEADER.pack(seq % SEQ_MOD, round_ & 0xFF, member, count, flags)


def decode_data(buf, nbytes: int, max_floats: int) -> tuple[int, int, int, int, int, int]:
    """Parse the Seg header of a data packet of ``nbytes`` bytes held in ``buf``.

    Returns:
        ``(seq, round, member, count, flags, k)``: the header fields and the number ``k`` of
        float32 elements after it (the payload is ``buf[8 : 8 + 4 * k]``).

    Raises:
        ProtocolError: shorter than header + 1 element, payload not a whole number of
            float32, more than ``max_floats`` elements, count 0, or unknown flag bits.
    """
    payload = nbytes - HEADER_BYTES
    if payload < FLOAT_BYTES or payload % FLOAT_BYTES:
        raise ProtocolError(f"data packet of {nbytes} bytes: payload not k >= 1 float32")
    k = payload // FLOAT_BYTES
    if k > max_floats:
        raise ProtocolError(f"data packet of {k} floats exceeds the segment size {max_floats}")
    seq, rnd, member, count, flags = DATA_HEADER.unpack_from(buf)
    if count == 0 or flags & ~KNOWN_FLAGS:
        raise ProtocolError(f"data packet with count {count}, flags {flags:#x}")
    return seq, rnd, member, count, flags, k


def native_layout() -> dict[str, int]:
    """The packet constants the native data plane (``csrc/switch_plane.cpp``) parses and writes
    data packets by, derived from the definitions above so that the formats exist once: the Seg
    header's size and each field's ``NAME_offset``/``NAME_size`` in bytes (big-endian), the two
    ToS bytes, the flag bits, the action byte of `Action.STATS`, and `RX_BUFFER_BYTES`."""
    fmt = DATA_HEADER.format
    order, codes = fmt[0], fmt[1:]
    out = {"header_bytes": HEADER_BYTES, "float_bytes": FLOAT_BYTES, "tos_data": TOS_DATA,
           "tos_control": TOS_CONTROL, "flag_result": FLAG_RESULT, "flag_fbcast": FLAG_FBCAST,
           "flag_async": FLAG_ASYNC, "known_flags": KNOWN_FLAGS, "action_stats": int(Action.STATS),
           "rx_buffer_bytes": RX_BUFFER_BYTES, "max_count": MAX_COUNT}
    for i, name in enumerate(("seq", "round", "member", "count", "flags")):
        out[f"{name}_offset"] = struct.calcsize(order + codes[:i])
        out[f"{name}_size"] = struct.calcsize(order + codes[i])
    return out


def async_seq(tag: int, offset: int) -> int:
    """The ``seq`` of a threshold-mode packet: ``tag`` (push or aggregate number, taken mod
    `ASYNC_TAG_MOD`) and the segment ``offset`` (``0 <= offset <`` `ASYNC_OFFSETS`).

    Raises:
        ValueError: ``offset`` out of range."""
    if not 0 <= offset < ASYNC_OFFSETS:
        raise ValueError(f"segment offset {offset} outside [0, {ASYNC_OFFSETS})")
    return (tag % ASYNC_TAG_MOD) << 16 | offset


def async_split(seq: int) -> tuple[int, int]:
    """``(tag, offset)`` of a threshold-mode ``seq`` (`async_seq`'s inverse)."""
    return (seq >> 16) % ASYNC_TAG_MOD, seq & (ASYNC_OFFSETS - 1)


def tag_newer(a: int, b: int) -> bool:
    """Serial-number order on threshold-mode tags (mod `ASYNC_TAG_MOD`): is ``a`` after ``b``?"""
    d = (a - b) % ASYNC_TAG_MOD
    return 0 < d < (ASYNC_TAG_MOD >> 1)


def seq_newer(a: int, b: int) -> bool:
    """Serial-number order (RFC 1982) on 32-bit ``seq``: is ``a`` after ``b``?"""
    d = (a - b) % SEQ_MOD
    return 0 < d < (SEQ_MOD >> 1)


# ---- transport: the only place that puts these packets on a socket ----------------------------

SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)
RX_BUFFER_BYTES = 65536
"""Size of a receive buffer that holds any UDP datagram."""
_LAYOUT = native_layout()
_TOS_CMSG_SPACE = socket.CMSG_SPACE(4)
_CONTROL_CMSG = [(socket.IPPROTO_IP, socket.IP_TOS, struct.pack("i", TOS_CONTROL))]
_SEND_ERRORS = (BlockingIOError, ConnectionRefusedError, InterruptedError)


def open_socket(bind: tuple[str, int], buffer_bytes: int = 8 << 20) -> socket.socket:
    """A UDP socket bound to ``bind`` that reports each packet's ToS and sends data ToS.

    ``buffer_bytes`` sets SO_RCVBUF/SO_SNDBUF (forced past ``net.core.*mem_max`` with
    CAP_NET_ADMIN; otherwise capped there, with a warning once per process: a window's burst
    may then overflow the buffer and be resent). Control messages override the ToS per packet
    (`send_control`).

    Raises:
        OSError: the address cannot be bound.
    """
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for force, plain in ((SO_RCVBUFFORCE, socket.SO_RCVBUF),
                             (SO_SNDBUFFORCE, socket.SO_SNDBUF)):
            try:
                s.setsockopt(socket.SOL_SOCKET, force, buffer_bytes)
            except OSError:
                s.setsockopt(socket.SOL_SOCKET, plain, buffer_bytes)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, TOS_DATA)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        s.bind(bind)
    except BaseException:
        s.close()
        raise
    granted = min(s.getsockopt(socket.SOL_SOCKET, opt) // 2  # (Linux reports it doubled)
                  for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF))
    if granted < buffer_bytes:
        _warn_small_buffers(granted, buffer_bytes)
    return s


_WARNED = []


def _warn_small_buffers(granted: int, wanted: int) -> None:
    """Once per process: the socket buffers the kernel capped."""
    if _WARNED:
        return
    _WARNED.append(True)
    logging.getLogger(__name__).warning(
        "UDP socket buffers of %d KiB, not the %d KiB asked: net.core.rmem_max/wmem_max cap them "
        "for a process without CAP_NET_ADMIN; a window's burst may overflow them and be resent "
        "(run as root with CAP_NET_ADMIN, or raise the caps: sysctl -w net.core.rmem_max=%d "
        "net.core.wmem_max=%d)", granted >> 10, wanted >> 10, wanted, wanted)


def recv_packet(sock: socket.socket, buf, flags: int = 0) -> tuple[int, int, tuple[str, int]]:
    """Receive one datagram into ``buf``. Returns ``(nbytes, tos, (ip, port))``.

    Blocking or not as ``sock`` is (``flags=socket.MSG_DONTWAIT``: never blocks); raises what
    ``socket.recvmsg_into`` raises (``BlockingIOError`` when there is nothing to read).
    """
    nbytes, anc, _flags, addr = sock.recvmsg_into([buf], _TOS_CMSG_SPACE, flags)
    return nbytes, (anc[0][2][0] if anc and anc[0][2] else 0), addr


def send_control(sock: socket.socket, addr, action: Action, value=None) -> None:
    """Send one control message to ``addr`` with ToS `TOS_CONTROL`. A full buffer or an
    unreachable peer drops it silently (UDP semantics); other OSErrors propagate."""
    send_raw_control(sock, addr, encode_control(action, value))


def send_raw_control(sock: socket.socket, addr, payload: bytes) -> None:
    """Send already-encoded control bytes (`encode_control`) with ToS `TOS_CONTROL`."""
    try:
        sock.sendmsg([payload], _CONTROL_CMSG, 0, addr)
    except _SEND_ERRORS:
        pass


# UDP generic segmentation (Linux >= 4.18 for GSO, >= 5.0 for GRO): only the number of system
# calls and stack traversals changes; the datagrams on the wire are the same.
UDP_SEGMENT = 103
"""cmsg type (level IPPROTO_UDP): send one buffer as datagrams of this many bytes each"""
UDP_GRO = 104
"""socket option / cmsg type (level IPPROTO_UDP): receive a sender's datagrams coalesced"""
GSO_MAX_BYTES = MAX_UDP_PAYLOAD
"""the most UDP payload one segmented send may carry"""
GSO_MAX_SEGMENTS = 64
_GRO_CMSG_SPACE = _TOS_CMSG_SPACE + socket.CMSG_SPACE(4)


def enable_gro(sock: socket.socket) -> bool:
    """Let ``sock`` receive several datagrams of one sender in one buffer (`recv_segments`).
    Returns False where the kernel does not offer it (datagrams then come one by one)."""
    try:
        sock.setsockopt(socket.IPPROTO_UDP, UDP_GRO, 1)
    except OSError:
        return False
    return True


def recv_segments(sock: socket.socket, buf, flags: int = 0
                  ) -> tuple[int, int, tuple[str, int], int]:
    """Receive one buffer into ``buf``: a datagram, or on a `enable_gro` socket several
    datagrams of one sender back to back. Returns ``(nbytes, tos, (ip, port), seg_bytes)``:
    the datagrams are ``buf[o : o + seg_bytes]`` for ``o = 0, seg_bytes, ...`` (the last may be
    shorter; ``seg_bytes == nbytes`` for a single datagram). Raises as `recv_packet`."""
    nbytes, anc, _flags, addr = sock.recvmsg_into([buf], _GRO_CMSG_SPACE, flags)
    tos, seg = 0, nbytes
    for level, kind, data in anc:
        if level == socket.IPPROTO_IP and kind == socket.IP_TOS and data:
            tos = data[0]
        elif level == socket.IPPROTO_UDP and kind == UDP_GRO and len(data) >= 4:
            seg = int.from_bytes(data[:4], "little") or nbytes
    return nbytes, tos, addr, min(seg, nbytes) if nbytes else 0


def pack_data_headers(rows: np.ndarray, seqs: np.ndarray, round_: int, member: int, count: int,
                      flags: int) -> None:
    """Write one Seg header at the start of each row of ``rows`` (``(m, >= 8)`` uint8), with
    ``seqs`` (``(m,)`` integers, taken mod 2**32) and the other fields equal in all rows."""
    off, size = _LAYOUT["seq_offset"], _LAYOUT["seq_size"]
    rows[:, :HEADER_BYTES] = np.frombuffer(data_header(0, round_, member, count, flags), np.uint8)
    be = (np.asarray(seqs, np.int64) % SEQ_MOD).astype(f">u{size}")
    rows[:, off:off + size] = be.view(np.uint8).reshape(-1, size)


def unpack_data_headers(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(seq, count, flags)`` (each ``(m,)`` int64) of the Seg headers at the start of the rows
    of ``rows`` (``(m, >= 8)`` uint8): `decode_data`'s fields for many packets at once."""
    return data_field(rows, "seq"), data_field(rows, "count"), data_field(rows, "flags")


def data_field(rows: np.ndarray, name: str) -> np.ndarray:
    """Field ``name`` (``seq``, ``round``, ``member``, ``count`` or ``flags``; ``(m,)`` int64) of
    the Seg headers at the start of the rows of ``rows`` (``(m, >= 8)`` uint8)."""
    off, size = _LAYOUT[f"{name}_offset"], _LAYOUT[f"{name}_size"]
    return np.ascontiguousarray(rows[:, off:off + size]).view(f">u{size}")[:, 0].astype(np.int64)


def send_segmented(sock: socket.socket, addr, bufs, seg_bytes: int) -> bool:
    """Send the concatenation of the buffers ``bufs`` (``[header | payload]`` datagrams of
    ``seg_bytes`` bytes back to back, the last may be shorter; at most `GSO_MAX_BYTES` and
    `GSO_MAX_SEGMENTS`) as one UDP_SEGMENT message; nothing is copied here. Returns False where
    the kernel refuses segmentation (the caller sends the datagrams one by one); a full buffer or
    unreachable peer drops it silently, as `send_data`."""
    cmsg = [(socket.IPPROTO_UDP, UDP_SEGMENT, struct.pack("=H", seg_bytes))]
    try:
        sock.sendmsg(bufs, cmsg, 0, addr)
    except _SEND_ERRORS:
        pass
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EIO, errno.EMSGSIZE, errno.ENOPROTOOPT):
            return False
        raise
    return True


def send_data(sock: socket.socket, addr, header: bytes, payload) -> None:
    """Send a Seg header and its float32 payload (any contiguous buffer) as one datagram with
    ToS `TOS_DATA`; the payload is not copied."""
    try:
        sock.sendmsg([header, payload], (), 0, addr)
    except _SEND_ERRORS:
        pass
