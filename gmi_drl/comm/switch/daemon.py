"""The aggregation switch as a userspace daemon (iSwitch §3.3 data and control planes, §3.4 tree).

One UDP socket, one thread, one event loop. Per received packet:

- ToS `TOS_CONTROL` -> control plane: membership table (id, IP, UDP port, type, parent id) kept
  by Join/Leave; Reset, SetH, FBcast, Help, Heartbeat; job id and token checked at Join.
- ToS `TOS_DATA` -> data plane: the payload of member ``m`` for segment ``seq`` lands in row
  ``m`` of slot ``seq % slots`` (one vector copy per packet); when the H-th member's packet
  arrives the slot's sum is formed and sent to every member (or, with a parent, up the tree),
  and the slot keeps that result until a later ``seq`` reuses it.
- anything else -> dropped and counted (``malformed``).

Why rows and not a running sum: float addition is not associative, and packets arrive in any
order. Keeping each member's contribution and adding them in ascending member id when the slot
completes makes the float32 result bit-identical to ``((g_0 + g_1) + g_2) + ...`` whatever the
arrival order, loss or retransmission. The per-packet work is the same one vector operation the
paper's accumulator does (a copy instead of an add), plus ``H - 1`` adds at completion; the memory
is ``slots * max_members * seg_floats * 4`` bytes (touched lazily).

Bounded memory and flow control: the slot pool has ``slots`` entries (a power of two) and each
member may have at most ``window <= slots // 2`` segments in flight beyond its oldest segment
without a result (announced in JoinAck). A member can only hold results that every member
contributed to, so no member runs more than ``2 * window`` ahead of the slowest, and a slot is
never reused while any member still needs its result.

Loss recovery (§3.3): workers own the retransmit timers. The switch remembers which members
contributed to a slot (a duplicate never counts twice), answers a retransmission or Help for a
finished slot with the kept result (flag FBCAST), and asks members missing from a stuck slot to
resend (Help, switch -> member), which also recovers from a restart of this daemon.

Membership liveness: members heartbeat; one silent for ``member_timeout_s`` is dropped with a
warning, H is lowered to the remaining members, and waiting slots complete without it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import random
import select
import socket
import time
from dataclasses import dataclass, field, fields
from typing import Callable

import numpy as np

from gmi_drl.comm.switch import protocol as P
from gmi_drl.comm.switch.protocol import Action, MemberType

log = logging.getLogger(__name__)

FREE, FILLING, UP, DONE = 0, 1, 2, 3


def parse_addr(s: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``.

    Raises:
        ValueError: no colon or a port outside 0..65535.
    """
    host, sep, port = s.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"address {s!r} is not HOST:PORT")
    return host, int(port)


@dataclass(frozen=True)
class SwitchConfig:
    """Options of one switch daemon (`gmi-drl switch serve`)."""

    bind: tuple[str, int] = ("127.0.0.1", 0)
    """Address and UDP port to listen on (port 0: any free port)."""
    parent: tuple[str, int] | None = None
    """The upper-level switch (§3.4); ``None`` makes this the root."""
    threshold: int = 0
    """Aggregation threshold H in members per segment; 0 = the number of members."""
    drop_rate: float = 0.0
    """Fault injection: probability of dropping each received and each sent packet."""
    dup_rate: float = 0.0
    """Fault injection: probability of handling a received packet twice and of sending twice."""
    delay_ms: float = 0.0
    """Fault injection: delay before each packet leaves, milliseconds."""
    mtu: int = 1500
    """Path MTU in bytes; sets the segment size (`protocol.seg_floats_for_mtu`)."""
    slots: int = 256
    """Aggregation slots (a power of two); the member window is at most half of it."""
    window_bytes: int = 2 << 20
    """Bytes a member may have in flight (the window in segments: this over the segment size,
    at most ``slots // 2``, at least 1): more only queues at the link (a tbf queue overflows)."""
    max_members: int = 16
    """Rows per slot: the most members this switch accepts."""
    member_timeout_s: float = 10.0
    """A member silent this long is dropped and H lowered."""
    help_after_s: float = 0.2
    """A slot waiting this long asks its missing members to resend (and again each period)."""
    heartbeat_s: float = 1.0
    """Heartbeat period towards the parent."""
    switch_id: int = 0
    """This switch's id (the parent id of its members, the member field of its results)."""
    member_id: int = 0
    """This switch's member id at its parent (orders the parent's sum)."""
    job_id: str = ""
    """Accept only this job; empty = adopt the first Join's job id."""
    token: str = ""
    """Shared secret every Join must carry; empty = none."""
    buffer_bytes: int = 16 << 20
    """SO_RCVBUF / SO_SNDBUF of the socket."""
    seed: int | None = None
    """Seed of the fault-injection generator (``None``: from the OS)."""

    def __post_init__(self) -> None:
        if self.slots < 2 or self.slots & (self.slots - 1):
            raise ValueError(f"{self.slots=} must be a power of two >= 2")
        if not 0 <= self.threshold <= 255:
            raise ValueError(f"{self.threshold=} must be in [0, 255]")
        if not (0.0 <= self.drop_rate < 1.0 and 0.0 <= self.dup_rate <= 1.0):
            raise ValueError(f"{self.drop_rate=} must be in [0, 1), {self.dup_rate=} in [0, 1]")
        if self.delay_ms < 0 or self.member_timeout_s <= 0 or self.help_after_s <= 0:
            raise ValueError("delay_ms, member_timeout_s, help_after_s must be non-negative/positive")
        if self.window_bytes < 1:
            raise ValueError(f"{self.window_bytes=} must be >= 1")
        if not 1 <= self.max_members <= 255:
            raise ValueError(f"{self.max_members=} must be in [1, 255]")
        if not (0 <= self.switch_id <= 255 and 0 <= self.member_id <= 255):
            raise ValueError(f"{self.switch_id=} and {self.member_id=} must be in [0, 255]")
        P.seg_floats_for_mtu(self.mtu)


@dataclass
class Counters:
    """Live counters of one daemon (`Action.STATS` returns them as JSON)."""

    packets_in: int = 0
    packets_out: int = 0
    bytes_aggregated: int = 0
    """float32 payload bytes of member gradients taken into a slot (duplicates not counted)"""
    segments_completed: int = 0
    duplicates: int = 0
    retransmissions_served: int = 0
    helps_sent: int = 0
    malformed_dropped: int = 0
    non_member_dropped: int = 0
    foreign_job_dropped: int = 0
    not_ready_dropped: int = 0
    stale_dropped: int = 0
    busy_dropped: int = 0
    injected_drops: int = 0
    members_dropped: int = 0
    members: int = 0
    threshold: int = 0
    ready: bool = False

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(eq=False)
class Member:
    """A row of the membership table (Fig. 9)."""

    id: int
    addr: tuple[str, int]
    type: MemberType
    parent_id: int
    row: int
    workers_below: int
    dropped_below: int
    last_seen: float


@dataclass(eq=False)
class _Slot:
    seq: int = 0
    state: int = FREE
    length: int = 0
    round: int = 0
    mask: int = 0                      # bit r: row r contributed
    contrib: list = field(default_factory=list)   # (member id, row)
    count: int = 0                     # worker gradients summed so far
    result_count: int = 0
    started: float = 0.0
    helped: float = 0.0


class SwitchDaemon:
    """One switch. Create, then `serve_forever` (blocking) in a process or thread; `stop` from
    another thread or a signal handler; `close` frees the socket.

    Args:
        config: the options.
        report: called with `Counters` every ``report_every_s`` seconds from the loop.

    Raises:
        OSError: the bind address is not available.
    """

    def __init__(self, config: SwitchConfig, report: Callable[[Counters], None] | None = None,
                 report_every_s: float = 0.0) -> None:
        self.cfg = config
        self.counters = Counters()
        self._report, self._report_every = report, report_every_s
        self._rng = random.Random(config.seed)
        self._sock = P.open_socket(config.bind, config.buffer_bytes)
        self._sock.setblocking(False)
        self.epoch = int.from_bytes(os.urandom(4), "big")
        self.seg_floats = P.seg_floats_for_mtu(config.mtu)
        self.window = max(1, min(config.slots // 2,
                                 config.window_bytes // (self.seg_floats * P.FLOAT_BYTES)))
        self._mask = config.slots - 1
        f = self.seg_floats
        self._rows = np.zeros((config.slots, config.max_members, f), "<f4")
        self._partial = np.zeros((config.slots, f), "<f4")
        self._result = self._partial if config.parent is None else np.zeros_like(self._partial)
        self._slots = [_Slot() for _ in range(config.slots)]
        self._active: set[int] = set()
        self._rx = bytearray(P.RX_BUFFER_BYTES)
        self._rx_f32 = np.frombuffer(self._rx, "<f4", (P.RX_BUFFER_BYTES - P.HEADER_BYTES) // 4,
                                     P.HEADER_BYTES)
        self._members: dict[int, Member] = {}
        self._by_addr: dict[tuple[str, int], Member] = {}
        self._reset_job()
        self._parent = None
        if config.parent is not None:
            self._parent = (socket.gethostbyname(config.parent[0]), config.parent[1])
        self._parent_joined = False
        self._parent_ready = (False, 0)
        self._next_parent_msg = 0.0
        self._ready_sent: tuple[bool, int] | None = None
        self._delayed: list = []
        self._tiebreak = itertools.count()
        self._nack_times: dict = {}
        self._stop = False
        now = time.monotonic()
        self._next_tick = now
        self._next_report = now + report_every_s if report_every_s > 0 else float("inf")

    # ---- public ------------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """The bound ``(ip, port)``."""
        return self._sock.getsockname()

    def serve_forever(self) -> None:
        """Run the event loop until `stop`. Never raises on bad input: every packet that is not
        a well-formed message of a member of this job is dropped and counted."""
        sock = self._sock
        while not self._stop:
            now = time.monotonic()
            timeout = max(0.0, min(self._next_tick, self._next_delayed()) - now)
            ready, _, _ = select.select([sock], [], [], min(timeout, 0.5))
            if ready:
                self._drain()
            now = time.monotonic()
            if self._delayed and self._delayed[0][0] <= now:
                self._flush_delayed(now)
            if now >= self._next_tick:
                self._tick(now)
            if now >= self._next_report:
                self._next_report = now + self._report_every
                self.stats()
                self._report(self.counters)

    def stop(self) -> None:
        """Make `serve_forever` return within half a second (safe from any thread)."""
        self._stop = True

    def close(self) -> None:
        """Close the socket. Idempotent."""
        self._stop = True
        self._sock.close()

    # ---- receive -----------------------------------------------------------------------------

    def _drain(self) -> None:
        sock, buf, c = self._sock, self._rx, self.counters
        for _ in range(512):
            try:
                nbytes, tos, addr = P.recv_packet(sock, buf)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. ICMP port unreachable reported on a UDP socket
                continue
            c.packets_in += 1
            if self.cfg.drop_rate and self._rng.random() < self.cfg.drop_rate \
                    and not (tos == P.TOS_CONTROL and nbytes == 1 and buf[0] == Action.STATS):
                c.injected_drops += 1
                continue
            times = 2 if self.cfg.dup_rate and self._rng.random() < self.cfg.dup_rate else 1
            for _ in range(times):
                try:
                    if tos == P.TOS_DATA:
                        self._on_data(nbytes, addr)
                    elif tos == P.TOS_CONTROL:
                        self._on_control(bytes(buf[:nbytes]), addr)
                    else:
                        c.malformed_dropped += 1
                except P.ProtocolError:
                    c.malformed_dropped += 1
                except Exception:  # a bug must not take the switch down; it is logged and counted
                    log.exception("packet from %s dropped by an internal error", addr)
                    c.malformed_dropped += 1

    def _on_data(self, nbytes: int, addr) -> None:
        c = self.counters
        m = self._by_addr.get(addr)
        is_parent = self._parent is not None and addr == self._parent_addr()
        if m is None and not is_parent:
            c.non_member_dropped += 1
            self._nack_non_member(addr)
            return
        seq, rnd, mid, count, flags, k = P.decode_data(self._rx, nbytes, self.seg_floats)
        now = time.monotonic()
        if is_parent:
            if not flags & P.FLAG_RESULT:
                raise P.ProtocolError("data from the parent that is not a result")
            self._on_result(seq, count, k)
            return
        m.last_seen = now
        if flags & P.FLAG_RESULT or mid != m.id:
            raise P.ProtocolError(f"member {m.id} sent flags {flags:#x} / member field {mid}")
        if count > max(1, m.workers_below) or (m.type == MemberType.WORKER and count != 1):
            raise P.ProtocolError(f"member {m.id} claims {count} gradients")
        if not self._ready():
            c.not_ready_dropped += 1
            return
        idx = seq & self._mask
        s = self._slots[idx]
        if s.state == FREE or s.seq != seq:
            if s.state == FREE or (s.state == DONE and P.seq_newer(seq, s.seq)):
                s.seq, s.state, s.length, s.round = seq, FILLING, k, rnd
                s.mask, s.count, s.started, s.helped = 0, 0, now, now
                s.contrib = []
                self._active.add(idx)
            elif P.seq_newer(seq, s.seq):
                c.busy_dropped += 1
                return
            else:
                c.stale_dropped += 1
                return
        if k != s.length:
            raise P.ProtocolError(f"segment {seq}: {k} floats, the slot holds {s.length}")
        bit = 1 << m.row
        if s.state == DONE:
            if s.mask & bit:
                c.duplicates += 1
            self._send_result(idx, s, m.addr, P.FLAG_RESULT | P.FLAG_FBCAST)
            c.retransmissions_served += 1
            return
        if s.mask & bit:
            c.duplicates += 1
            if s.state == UP and now - s.helped > self.cfg.help_after_s / 4:
                s.helped = now
                self._send_up(idx, s)
            return
        self._rows[idx, m.row, :k] = self._rx_f32[:k]
        c.bytes_aggregated += k * P.FLOAT_BYTES
        s.mask |= bit
        s.contrib.append((m.id, m.row))
        s.count += count
        if s.state == FILLING and len(s.contrib) >= self._threshold():
            self._complete(idx, s)

    def _on_result(self, seq: int, count: int, k: int) -> None:
        c = self.counters
        idx = seq & self._mask
        s = self._slots[idx]
        if s.seq != seq or s.state not in (UP, DONE):
            c.stale_dropped += 1
            return
        if s.state == DONE:
            c.duplicates += 1
            return
        if k != s.length:
            raise P.ProtocolError(f"result {seq}: {k} floats, the slot holds {s.length}")
        self._result[idx, :k] = self._rx_f32[:k]
        s.result_count = count
        s.state = DONE
        self._active.discard(idx)
        for m in self._members.values():
            self._send_result(idx, s, m.addr, P.FLAG_RESULT)

    # ---- aggregation ---------------------------------------------------------------------------

    def _threshold(self) -> int:
        n = len(self._members)
        return n if self._h == 0 else min(self._h, n)

    def _complete(self, idx: int, s: _Slot) -> None:
        """Sum the slot's rows in ascending member id into its partial; send it on."""
        k = s.length
        rows = [r for _, r in sorted(s.contrib)]
        out = self._partial[idx, :k]
        block = self._rows[idx]
        if len(rows) == 1:
            out[:] = block[rows[0], :k]
        else:
            np.add(block[rows[0], :k], block[rows[1], :k], out=out)
            for r in rows[2:]:
                out += block[r, :k]
        self.counters.segments_completed += 1
        if self._parent is not None:
            s.state, s.helped = UP, time.monotonic()
            self._send_up(idx, s)
        else:
            s.state, s.result_count = DONE, s.count
            self._active.discard(idx)
            for m in self._members.values():
                self._send_result(idx, s, m.addr, P.FLAG_RESULT)

    def _send_up(self, idx: int, s: _Slot) -> None:
        hdr = P.data_header(s.seq, s.round, self.cfg.member_id, s.count, 0)
        self._send(self._parent_addr(), hdr, self._partial[idx, :s.length])

    def _send_result(self, idx: int, s: _Slot, addr, flags: int) -> None:
        hdr = P.data_header(s.seq, s.round, self.cfg.switch_id, s.result_count, flags)
        self._send(addr, hdr, self._result[idx, :s.length])

    def _send(self, addr, hdr: bytes, payload) -> None:
        c = self.counters
        cfg = self.cfg
        if cfg.drop_rate and self._rng.random() < cfg.drop_rate:
            c.injected_drops += 1
            return
        times = 2 if cfg.dup_rate and self._rng.random() < cfg.dup_rate else 1
        for _ in range(times):
            c.packets_out += 1
            if cfg.delay_ms:
                heapq.heappush(self._delayed, (time.monotonic() + cfg.delay_ms / 1000,
                                               next(self._tiebreak), addr, hdr, bytes(payload)))
            else:
                P.send_data(self._sock, addr, hdr, payload)

    def _control(self, addr, action: Action, value=None) -> None:
        c = self.counters
        if action != Action.STATS_REPLY:
            if self.cfg.drop_rate and self._rng.random() < self.cfg.drop_rate:
                c.injected_drops += 1
                return
        c.packets_out += 1
        raw = P.encode_control(action, value)
        if self.cfg.delay_ms and action != Action.STATS_REPLY:
            heapq.heappush(self._delayed, (time.monotonic() + self.cfg.delay_ms / 1000,
                                           next(self._tiebreak), addr, None, raw))
        else:
            P.send_raw_control(self._sock, addr, raw)

    def _next_delayed(self) -> float:
        return self._delayed[0][0] if self._delayed else float("inf")

    def _flush_delayed(self, now: float) -> None:
        while self._delayed and self._delayed[0][0] <= now:
            _, _, addr, hdr, payload = heapq.heappop(self._delayed)
            if hdr is None:
                P.send_raw_control(self._sock, addr, payload)
            else:
                P.send_data(self._sock, addr, hdr, payload)

    # ---- control plane ---------------------------------------------------------------------------

    def _on_control(self, raw: bytes, addr) -> None:
        c = self.counters
        action, value = P.decode_control(raw)
        if action == Action.STATS:
            self._control(addr, Action.STATS_REPLY, self.stats())
            return
        if self._parent is not None and addr == self._parent_addr():
            self._on_parent_control(action, value)
            return
        if action == Action.JOIN:
            self._on_join(value, addr)
            return
        m = self._by_addr.get(addr)
        if m is None:
            if action == Action.LEAVE:  # a retried Leave whose ACK was lost
                self._control(addr, Action.ACK, int(action))
                return
            c.non_member_dropped += 1
            self._nack_non_member(addr)
            return
        m.last_seen = time.monotonic()
        if action == Action.HEARTBEAT:
            return
        if action == Action.LEAVE:
            self._control(addr, Action.ACK, int(action))
            self._remove(m, dropped=True, why="left")
        elif action == Action.RESET:
            for s in self._slots:
                s.state, s.mask, s.contrib, s.count = FREE, 0, [], 0
            self._active.clear()
            self._control(addr, Action.ACK, int(action))
        elif action == Action.SETH:
            self._h = value
            self._control(addr, Action.ACK, int(action))
            self._complete_ready_slots()
        elif action == Action.FBCAST:
            idx = value & self._mask
            s = self._slots[idx]
            if s.seq == value and s.state == FILLING and s.contrib:
                self._complete(idx, s)
            self._control(addr, Action.ACK, int(action))
        elif action == Action.HELP:
            idx = value & self._mask
            s = self._slots[idx]
            if s.seq == value and s.state == DONE:
                self._send_result(idx, s, addr, P.FLAG_RESULT | P.FLAG_FBCAST)
                c.retransmissions_served += 1
            elif s.seq == value and s.state == UP:
                self._send_up(idx, s)
        else:
            raise P.ProtocolError(f"{action.name} is not sent to a switch")

    def _on_join(self, v: P.JoinValue, addr) -> None:
        c, cfg = self.counters, self.cfg
        job = cfg.job_id or self._job_id
        if job is not None and v.job_id != job:
            c.foreign_job_dropped += 1
            self._control(addr, Action.JOIN_NACK, P.NackValue(
                P.NackReason.FOREIGN_JOB, f"this switch serves job {job!r}"))
            return
        token = cfg.token or self._token
        if token is not None and v.token != token:
            c.foreign_job_dropped += 1
            self._control(addr, Action.JOIN_NACK, P.NackValue(P.NackReason.BAD_TOKEN, "bad token"))
            return
        if self._num_workers is not None and v.num_workers != self._num_workers:
            c.foreign_job_dropped += 1
            self._control(addr, Action.JOIN_NACK, P.NackValue(
                P.NackReason.GROUP_MISMATCH, f"the job has {self._num_workers} workers"))
            return
        now = time.monotonic()
        m = self._by_addr.get(addr)
        if m is None:
            old = self._members.get(v.member_id)
            if old is not None:  # the same member id from a new address: the newest wins
                log.warning("member %d moved from %s to %s", v.member_id, old.addr, addr)
                self._remove(old, dropped=False, why="replaced")
            used = {x.row for x in self._members.values()}
            free = [r for r in range(cfg.max_members) if r not in used]
            if not free:
                self._control(addr, Action.JOIN_NACK, P.NackValue(
                    P.NackReason.FULL, f"{cfg.max_members} members already"))
                return
            m = Member(v.member_id, addr, v.member_type, cfg.switch_id, free[0], 0, 0, now)
            self._members[m.id] = m
            self._by_addr[addr] = m
            self._dropped_workers -= self._departed.pop((m.type, m.id), 0)
            log.info("member %d (%s) joined from %s:%d", m.id, m.type.name, *addr)
        elif m.id != v.member_id:
            raise P.ProtocolError(f"{addr} is member {m.id}, Join says {v.member_id}")
        m.last_seen = now
        if v.member_type == MemberType.WORKER:
            m.workers_below, m.dropped_below = 1, 0
        else:
            m.workers_below, m.dropped_below = v.workers_below, v.dropped_below
        self._job_id, self._token, self._num_workers = v.job_id, v.token, v.num_workers
        self._control(addr, Action.JOIN_ACK, P.JoinAckValue(
            self.epoch, self.seg_floats, self.window, cfg.switch_id, m.id))
        self._membership_changed(new=m)

    def _remove(self, m: Member, dropped: bool, why: str) -> None:
        self._members.pop(m.id, None)
        self._by_addr.pop(m.addr, None)
        if dropped:
            n = m.workers_below + m.dropped_below
            self._departed[(m.type, m.id)] = self._departed.get((m.type, m.id), 0) + n
            self._dropped_workers += n
        if not self._members:
            log.info("last member %s: the job ends", why)
            self._reset_job()
            for s in self._slots:
                s.state, s.mask, s.contrib, s.count = FREE, 0, [], 0
            self._active.clear()
            self._membership_changed()
            return
        self._membership_changed()
        self._complete_ready_slots()

    def _reset_job(self) -> None:
        self._job_id: str | None = None
        self._token: str | None = None
        self._num_workers: int | None = None
        self._h = self.cfg.threshold
        self._dropped_workers = 0
        self._departed: dict = {}

    def _complete_ready_slots(self) -> None:
        h = self._threshold()
        if h < 1:
            return
        for idx in list(self._active):
            s = self._slots[idx]
            if s.state == FILLING and len(s.contrib) >= h:
                self._complete(idx, s)

    def _active_workers(self) -> int:
        return sum(m.workers_below for m in self._members.values())

    def _ready(self) -> bool:
        if self._parent is not None:
            return self._parent_joined and self._parent_ready[0]
        if self._num_workers is None or not self._members:
            return False
        total = sum(m.workers_below + m.dropped_below for m in self._members.values())
        return total + self._dropped_workers >= self._num_workers

    def _membership_changed(self, new: Member | None = None) -> None:
        if self._parent is not None:
            self._next_parent_msg = 0.0  # send the updated counts up at the next tick
            self._tick_parent(time.monotonic())
        state = (self._ready(), self._parent_ready[1] if self._parent else self._active_workers())
        if state != self._ready_sent:
            self._ready_sent = state
            for m in self._members.values():
                self._control(m.addr, Action.READY, P.ReadyValue(*state))
        elif new is not None:
            self._control(new.addr, Action.READY, P.ReadyValue(*state))

    def _nack_non_member(self, addr) -> None:
        now = time.monotonic()
        if now - self._nack_times.get(addr, -1.0) < 0.05:
            return
        if len(self._nack_times) > 4096:
            self._nack_times.clear()
        self._nack_times[addr] = now
        self._control(addr, Action.NOT_MEMBER)

    # ---- parent (§3.4) ----------------------------------------------------------------------------

    def _parent_addr(self) -> tuple[str, int]:
        return self._parent

    def _on_parent_control(self, action: Action, value) -> None:
        if action == Action.JOIN_ACK:
            if value.seg_floats != self.seg_floats:
                log.error("parent segment size %d != ours %d: start every switch of a tree "
                          "with the same --mtu", value.seg_floats, self.seg_floats)
                return
            if not self._parent_joined:
                log.info("joined parent %s:%d as member %d", *self._parent, value.member_id)
            self._parent_joined = True
        elif action == Action.JOIN_NACK:
            log.error("parent refused us: %s", value.text)
        elif action == Action.READY:
            self._parent_ready = (value.ready, value.active_workers)
            self._membership_changed()
        elif action == Action.NOT_MEMBER:
            if self._parent_joined:
                log.warning("parent forgot us (restarted?): rejoining")
            self._parent_joined = False
            self._parent_ready = (False, self._parent_ready[1])
            self._next_parent_msg = 0.0
            self._membership_changed()
        elif action == Action.HELP:
            idx = value & self._mask
            s = self._slots[idx]
            if s.seq == value and s.state in (UP, DONE):
                self._send_up(idx, s)
            elif s.seq == value and s.state == FILLING:  # pass the request on to our members
                self._help_members(idx, s, time.monotonic())

    def _tick_parent(self, now: float) -> None:
        if now < self._next_parent_msg or self._num_workers is None:
            return
        self._next_parent_msg = now + (self.cfg.heartbeat_s if self._parent_joined else 0.2)
        below = self._active_workers()
        dropped = self._dropped_workers + sum(m.dropped_below for m in self._members.values())
        self._control(self._parent, Action.JOIN, P.JoinValue(
            self.cfg.member_id, MemberType.SWITCH, self._num_workers, below, dropped,
            self._job_id or "", self._token or ""))

    # ---- timers -----------------------------------------------------------------------------------

    def _tick(self, now: float) -> None:
        cfg = self.cfg
        self._next_tick = now + min(cfg.help_after_s / 2, 0.1)
        for m in list(self._members.values()):
            silent = now - m.last_seen
            if silent > cfg.member_timeout_s:
                self.counters.members_dropped += 1
                self._remove(m, dropped=True, why="timed out")
                log.warning("member %d at %s:%d silent for %.1f s: dropped; H is now %d of %d "
                            "members", m.id, *m.addr, silent, self._threshold(),
                            len(self._members))
        if self._parent is not None:
            self._tick_parent(now)
        for idx in list(self._active):
            s = self._slots[idx]
            if now - s.helped < cfg.help_after_s:
                continue
            s.helped = now
            if s.state == FILLING:
                self._help_members(idx, s, now)
            elif s.state == UP:
                self._send_up(idx, s)

    def _help_members(self, idx: int, s: _Slot, now: float) -> None:
        s.helped = now
        for m in self._members.values():
            if not s.mask >> m.row & 1:
                self.counters.helps_sent += 1
                self._control(m.addr, Action.HELP, s.seq)

    def stats(self) -> dict:
        """The counters now, with the current member count, H and readiness."""
        c = self.counters
        c.members, c.threshold, c.ready = len(self._members), self._threshold(), self._ready()
        return c.as_dict()
