"""The aggregation switch as a userspace daemon (iSwitch §3.3 data and control planes, §3.4 tree).

One UDP socket, one thread, one event loop. Every datagram is read by the data plane
(`gmi_drl.comm.switch.dataplane`: native C++ where built, else the Python reference):

- ToS `TOS_DATA` -> the data plane aggregates it in its slot pool and sends results on;
- ToS `TOS_CONTROL` -> back to this module, the control plane: membership table (id, IP, UDP
  port, type, parent id) kept by Join/Leave; Reset, SetH, FBcast, Help, Heartbeat; job id and
  token checked at Join. It tells the data plane the member rows, readiness and H;
- anything else -> dropped and counted (``malformed``).

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

Threshold (asynchronous) mode (iSwitch §4.1, Fig. 11): a member's two-byte SetH
(`protocol.ThresholdValue`: H gradient vectors per aggregate from any workers, staleness bound
S) switches the job's data plane to it (`dataplane` module docstring). It lasts until the job
ends; the synchronous rounds' H is untouched. A switch with a parent passes the SetH up and
acknowledges it once the root did; it then sends its workers' gradients up in per-rack
partials, each of versions at most S apart, carrying its oldest and counted whole at the
root (`dataplane` module docstring), and the root's results down (kept for Help; Help for one it lacks, FBcast and the
flush go up to the root, after its partials as they are, and it hands the root's
`Action.FLUSHED` to the members that asked). The root counts contributions (a gradient, or a
ToR's partial) toward H, scaled by members over workers below, and checks S against each
partial's oldest version.
Both data planes do both roles; a ToR needs no flag of its own (``--parent`` as in a
synchronous tree; every switch of the tree with the same ``--mtu``).
"""

from __future__ import annotations

import logging
import math
import os
import select
import socket
import time
from dataclasses import dataclass, fields
from typing import Callable

from gmi_drl.comm.switch import protocol as P
from gmi_drl.comm.switch.dataplane import PLANES, make_data_plane
from gmi_drl.comm.switch.protocol import Action, MemberType

log = logging.getLogger(__name__)


def _mode_refusal(mode: tuple[int, int], asked: P.ThresholdValue) -> P.ModeNackValue:
    """`Action.SETH_NACK`'s Value: the job's threshold mode ``mode`` against the one asked."""
    return P.ModeNackValue(asked.threshold, asked.staleness, (
        f"this job aggregates with H={mode[0]}, S={mode[1]}, not H={asked.threshold}, "
        f"S={asked.staleness}: every worker of a job gives the same --gmi.threshold and "
        "--gmi.staleness (a job keeps its mode until its last member leaves: a run resumed "
        "with other values waits for the old members to time out after the switch's "
        "--member-timeout, or takes another --gmi.switch-job)"))


def parse_addr(s: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``.

    Raises:
        ValueError: no colon or a port outside 0..65535.
    """
    host, sep, port = s.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"address {s!r} is not HOST:PORT")
    return host, int(port)


FALLBACK_MTU = 1500
"""The MTU a switch takes where it cannot read its bind address's interface (Ethernet's)"""

MAX_DEFAULT_MTU = 9000
"""The largest MTU a switch picks by itself: on loopback (65536) and in the rack, 9000-byte
segments aggregated faster than larger ones (docs/benchmarks.md), and far faster than 1500"""


def bind_mtu(host: str) -> int:
    """The MTU of the interface that holds IPv4 address ``host`` (a loopback address: the
    loopback interface's, 65536 on Linux); for the wildcard address, the smallest MTU of the up
    interfaces other than loopback (members may come through any), or loopback's where there
    is none. `FALLBACK_MTU` where no interface holds ``host`` or they cannot be read (not
    Linux)."""
    import ipaddress
    import struct

    try:
        import fcntl

        want = ipaddress.ip_address(socket.gethostbyname(host))
    except (ImportError, OSError):  # (no fcntl: not a POSIX system)
        return FALLBACK_MTU
    found: dict[str, tuple[ipaddress.IPv4Address, int, int]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            req = struct.pack("16s16x", name.encode()[:15])
            try:  # SIOCGIFADDR, SIOCGIFFLAGS, SIOCGIFMTU
                addr = ipaddress.ip_address(fcntl.ioctl(s, 0x8915, req)[20:24])
                flags = struct.unpack_from("H", fcntl.ioctl(s, 0x8913, req), 16)[0]
                mtu = struct.unpack_from("i", fcntl.ioctl(s, 0x8921, req), 16)[0]
            except OSError:  # no IPv4 address, or gone
                continue
            found[name] = (addr, flags, mtu)
    up, loopback = 0x1, 0x8  # IFF_UP, IFF_LOOPBACK
    lo = [mtu for addr, flags, mtu in found.values() if flags & loopback]
    if want.is_unspecified:
        others = [mtu for _, flags, mtu in found.values() if flags & up and not flags & loopback]
        return min(others or lo or [FALLBACK_MTU])
    if want.is_loopback:
        return min(lo or [FALLBACK_MTU])
    return next((mtu for addr, _, mtu in found.values() if addr == want), FALLBACK_MTU)


@dataclass(frozen=True)
class SwitchConfig:
    """Options of one switch daemon (`gmi-drl switch serve`; the iSwitch paper §3.2-3.4).

    Raises:
        ValueError: every option out of range (`__post_init__`)."""

    bind: tuple[str, int] = ("127.0.0.1", 0)
    """Address and UDP port to listen on (port 0: any free port)."""
    parent: tuple[str, int] | None = None
    """The upper-level switch (§3.4); ``None`` makes this the root."""
    threshold: int = 0
    """Aggregation threshold H in members per segment (iSwitch §3.2, SetH); 0 = the number of
    members."""
    drop_rate: float = 0.0
    """Fault injection: probability of dropping each received and each sent packet."""
    dup_rate: float = 0.0
    """Fault injection: probability of handling a received packet twice and of sending twice."""
    delay_ms: float = 0.0
    """Fault injection: delay before each packet leaves, milliseconds."""
    mtu: int | None = None
    """Path MTU in bytes; sets the segment size (`protocol.seg_floats_for_mtu`). ``None``: the
    MTU of the bind address's interface (`bind_mtu`), at most `MAX_DEFAULT_MTU`, taken by the
    daemon (`SwitchDaemon.mtu`). Every switch of a tree needs the same: give it where their
    interfaces' MTUs differ."""
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
    data_plane: str = "auto"
    """``native`` (C++, `recvmmsg`/`sendmmsg` batches), ``python`` (the reference), or ``auto``
    (native where it is built)."""

    def __post_init__(self) -> None:
        """Raises: ValueError: every option out of range, named as its flag of ``gmi-drl
        switch serve`` (``--member-timeout`` for ``member_timeout_s``)."""
        def num(x, lo, hi, lo_open=False, hi_open=False) -> bool:  # False for NaN too
            return ((lo < x if lo_open else lo <= x) and (x < hi if hi_open else x <= hi))

        rules = [
            ("slots", self.slots >= 2 and not self.slots & (self.slots - 1),
             "a power of two >= 2"),
            ("threshold", num(self.threshold, 0, 255), "in [0, 255]"),
            ("drop_rate", num(self.drop_rate, 0.0, 1.0, hi_open=True), "in [0, 1)"),
            ("dup_rate", num(self.dup_rate, 0.0, 1.0), "in [0, 1]"),
            ("delay_ms", num(self.delay_ms, 0.0, math.inf, hi_open=True), ">= 0 and finite"),
            ("member_timeout_s", num(self.member_timeout_s, 0.0, math.inf, True, True),
             "> 0 and finite"),
            ("help_after_s", num(self.help_after_s, 0.0, math.inf, True, True),
             "> 0 and finite"),
            ("window_bytes", self.window_bytes >= 1, ">= 1"),
            ("max_members", num(self.max_members, 1, 255), "in [1, 255]"),
            ("switch_id", num(self.switch_id, 0, 255), "in [0, 255]"),
            ("member_id", num(self.member_id, 0, 255), "in [0, 255]"),
            ("seed", self.seed is None or num(self.seed, 0, 2**64, hi_open=True),
             "in [0, 2**64) or unset"),
            ("data_plane", self.data_plane in PLANES, f"one of {list(PLANES)}"),
        ]
        bad = [f"--{_FLAGS.get(f, f.replace('_', '-'))} {getattr(self, f)} must be {rule}"
               for f, ok, rule in rules if not ok]
        try:
            if self.mtu is not None:
                P.seg_floats_for_mtu(self.mtu)
        except ValueError as e:
            bad.append(f"--mtu: {e}")
        if bad:
            raise ValueError("; ".join(bad))


_FLAGS = {"member_timeout_s": "member-timeout", "help_after_s": "help-after"}
"""`SwitchConfig` fields whose ``gmi-drl switch serve`` flag is not the field's name"""


@dataclass
class Counters:
    """Live counters of one daemon (`Action.STATS` returns them as JSON): the data plane's
    (`dataplane.COUNTERS`) added to the control plane's."""

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
    staleness_dropped: int = 0
    """threshold mode: gradient segments older than the staleness bound S, dropped"""
    aggregates_completed: int = 0
    """threshold mode: aggregates broadcast (one per segment offset and aggregate)"""
    busy_dropped: int = 0
    injected_drops: int = 0
    members_dropped: int = 0
    members: int = 0
    threshold: int = 0
    async_threshold: int = 0
    """threshold mode's H in gradient vectors (0: the mode is off)"""
    staleness_bound: int = 0
    """threshold mode's S"""
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


class SwitchDaemon:
    """One switch. Create, then `serve_forever` (blocking) in a process or thread; `stop` from
    another thread or a signal handler; `close` frees the socket.

    Args:
        config: the options.
        report: called with `Counters` every ``report_every_s`` seconds from the loop.
        report_every_s: seconds between ``report`` calls (0: never).

    Raises:
        OSError: the bind address is not available, or ``config.parent`` does not resolve.
        ValueError: ``config.data_plane == "native"`` where the extension is not built.
    """

    def __init__(self, config: SwitchConfig, report: Callable[[Counters], None] | None = None,
                 report_every_s: float = 0.0) -> None:
        self.cfg = config
        self._c = Counters()  # the control plane's share
        self._report, self._report_every = report, report_every_s
        self._sock = P.open_socket(config.bind, config.buffer_bytes)
        try:
            self._sock.setblocking(False)
            self.epoch = int.from_bytes(os.urandom(4), "big")
            self.mtu = (config.mtu if config.mtu is not None
                        else min(bind_mtu(config.bind[0]), MAX_DEFAULT_MTU))
            self.seg_floats = P.seg_floats_for_mtu(self.mtu)
            self.window = max(1, min(config.slots // 2,
                                     config.window_bytes // (self.seg_floats * P.FLOAT_BYTES)))
            self._parent = None
            if config.parent is not None:
                self._parent = (socket.gethostbyname(config.parent[0]), config.parent[1])
            self._plane, self.data_plane = make_data_plane(
                config.data_plane, self._sock, seg_floats=self.seg_floats, slots=config.slots,
                max_members=config.max_members, switch_id=config.switch_id,
                member_id=config.member_id, parent=self._parent, drop_rate=config.drop_rate,
                dup_rate=config.dup_rate, delay_ms=config.delay_ms,
                help_after_s=config.help_after_s, seed=config.seed)
        except BaseException:
            self._sock.close()
            raise
        self._members: dict[int, Member] = {}
        self._by_addr: dict[tuple[str, int], Member] = {}
        self._reset_job()
        self._parent_joined = False
        self._parent_ready = (False, 0)
        self._next_parent_msg = 0.0
        self._parent_counts_sent: tuple[int, int] | None = None
        self._ready_sent: tuple[bool, int] | None = None
        self._plane_state: tuple[bool, int] | None = None
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

    @property
    def counters(self) -> Counters:
        """A snapshot of every counter (data and control plane)."""
        self.stats()
        c = Counters(**self._c.as_dict())
        for k, v in self._plane.counters().items():
            setattr(c, k, getattr(c, k) + v)
        return c

    def serve_forever(self) -> None:
        """Run the event loop until `stop`. Never raises on bad input: every packet that is not
        a well-formed message of a member of this job is dropped and counted."""
        sock, plane = self._sock, self._plane
        while not self._stop:
            now = time.monotonic()
            timeout = max(0.0, min(self._next_tick, plane.next_due()) - now)
            ready, _, _ = select.select([sock], [], [], min(timeout, 0.5))
            if ready:
                controls, strangers = plane.drain(512)
                for raw, addr in controls:
                    self._handle_control(raw, addr)
                for addr in strangers:
                    self._nack_non_member(addr)
            now = time.monotonic()
            plane.flush_delayed(now)
            if now >= self._next_tick:
                self._tick(now)
            if now >= self._next_report:
                self._next_report = now + self._report_every
                self._report(self.counters)

    def stop(self) -> None:
        """Make `serve_forever` return within half a second (safe from any thread)."""
        self._stop = True

    def close(self) -> None:
        """Close the socket. Idempotent."""
        self._stop = True
        self._sock.close()

    # ---- control plane ---------------------------------------------------------------------------

    def _handle_control(self, raw: bytes, addr) -> None:
        try:
            self._on_control(raw, addr)
        except P.ProtocolError:
            self._c.malformed_dropped += 1
        except Exception:  # a bug must not take the switch down; it is logged and counted
            log.exception("packet from %s dropped by an internal error", addr)
            self._c.malformed_dropped += 1
        self._sync_plane()

    def _control(self, addr, action: Action, value=None) -> None:
        """Send a control message; STATS_REPLY is exempt from injected loss and delay."""
        self._plane.send_control(addr[0], addr[1], P.encode_control(action, value),
                                 action != Action.STATS_REPLY)

    def _on_control(self, raw: bytes, addr) -> None:
        c = self._c
        action, value = P.decode_control(raw)
        if action == Action.STATS:
            self._control(addr, Action.STATS_REPLY, self.stats())
            return
        if self._parent is not None and addr == self._parent:
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
            self._plane.reset_slots()
            self._control(addr, Action.ACK, int(action))
        elif action == Action.SETH:
            if isinstance(value, P.ThresholdValue):
                self._threshold_mode(value, addr)
                return
            self._h = value
            self._control(addr, Action.ACK, int(action))
        elif action == Action.FBCAST:
            self._on_fbcast(value, addr)
        elif action == Action.HELP and value == P.ASYNC_FLUSH and self._plane_mode():
            self._where_are_aggregates(addr)
        elif action == Action.HELP:
            if not self._plane.help_from_member(value, addr[0], addr[1]) \
                    and self._relays_threshold():
                self._control(self._parent, Action.HELP, value)  # the root keeps it
        else:
            raise P.ProtocolError(f"{action.name} is not sent to a switch")

    def _on_join(self, v: P.JoinValue, addr) -> None:
        c, cfg = self._c, self.cfg
        job = cfg.job_id or self._job_id
        if job is not None and v.job_id != job:
            c.foreign_job_dropped += 1
            self._control(addr, Action.JOIN_NACK, P.NackValue(  # (its name is not told)
                P.NackReason.FOREIGN_JOB, "this switch serves another job; wait for it to end "
                "(its members leave, or time out after --member-timeout) or use another switch"))
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
        if m is None and v.member_type == MemberType.WORKER and not (
                0 <= v.member_id < v.num_workers):
            c.foreign_job_dropped += 1
            self._control(addr, Action.JOIN_NACK, P.NackValue(
                P.NackReason.GROUP_MISMATCH,
                f"worker id {v.member_id} is outside the job's {v.num_workers} workers"))
            return
        if m is None:
            old = self._members.get(v.member_id)
            if old is not None:  # the same member id from a new address: the newest wins
                log.warning("member %d moved from %s to %s", v.member_id, old.addr, addr)
                # no threshold change in between: with one member fewer for a moment, the data
                # plane would complete the filling slots without it
                self._remove(old, dropped=False, why="replaced", sync=False)
            refusal = self._refusal(v)
            if refusal is not None:
                if refusal[0] is P.NackReason.FULL:
                    c.foreign_job_dropped += 1
                self._control(addr, Action.JOIN_NACK, P.NackValue(*refusal))
                if old is not None:  # (the replaced member is gone: say so now)
                    self._membership_changed()
                return
            used = {x.row for x in self._members.values()}
            free = [r for r in range(cfg.max_members) if r not in used]
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
        self._plane.set_member(m.row, m.id, int(m.type), addr[0], addr[1], m.workers_below)
        self._job_id, self._token, self._num_workers = v.job_id, v.token, v.num_workers
        self._control(addr, Action.JOIN_ACK, P.JoinAckValue(
            self.epoch, self.seg_floats, self.window, cfg.switch_id, m.id))
        self._membership_changed(new=m)

    def _threshold_mode(self, v: P.ThresholdValue, addr) -> None:
        """Threshold mode (H, S) for this job; acknowledged to ``addr`` at once on a root, on
        a child switch once its parent acknowledged it (the member asks again until then).
        Another (H, S) than the one the job aggregates with is refused (`Action.SETH_NACK`):
        its workers would apply aggregates of different sizes. On a child switch whose own
        request waits on the parent, another is not answered yet (its member asks again): the
        root decides which the job takes."""
        mode = self._plane_mode()
        if self._mode_asked is not None and self._parent_mode is None and mode != tuple(v):
            return  # (the parent's answer to `_mode_asked` decides)
        if mode is not None and mode != tuple(v):
            log.warning("%s:%d asked for threshold mode H=%d, S=%d; the job has H=%d, S=%d: "
                        "refused", *addr, *v, *mode)
            self._control(addr, Action.SETH_NACK, _mode_refusal(mode, v))
            return
        if mode != tuple(v):
            log.info("threshold mode: H=%d gradient vectors per aggregate, staleness bound "
                     "S=%d%s", *v, " (relayed to the parent)" if self._parent else "")
            self._plane.set_threshold_mode(*v)
        if self._parent is not None:
            if self._parent_mode != tuple(v):
                self._mode_asked = tuple(v)
                self._mode_askers.add(addr)
                self._control(self._parent, Action.SETH, v)
                return
        self._control(addr, Action.ACK, int(Action.SETH))

    def _mode_refused_above(self, nack: P.ModeNackValue) -> None:
        """The parent refused the threshold mode this switch asked for: its members that asked
        are told, and this switch drops the mode (unless the parent took one before), so a
        member asking for the job's own mode next is not refused here. A refusal of another
        mode than the one asked now (a late answer to an earlier request) is ignored."""
        if self._parent_mode is not None or self._mode_asked != (nack.threshold,
                                                                 nack.staleness):
            return
        log.warning("parent refused this switch's threshold mode: %s", nack.text)
        for addr in self._mode_askers:
            if addr in self._by_addr:
                self._control(addr, Action.SETH_NACK, nack)
        self._mode_askers.clear()
        self._mode_asked = None
        if self._plane_mode() is not None:
            self._plane.set_threshold_mode(0, 0)

    def _relays_threshold(self) -> bool:
        """A child switch in threshold mode: it sends its members' gradients up in per-rack
        partials, relays FBcast, Help and the flush up and results down."""
        return self._parent is not None and self._plane_mode() is not None

    def _where_are_aggregates(self, addr) -> None:
        """Threshold mode's Help of `protocol.ASYNC_FLUSH`: `Action.FLUSHED` without a flush
        (a child switch asks the root, and passes its answer down)."""
        if self._parent is not None:
            self._control(self._parent, Action.HELP, P.ASYNC_FLUSH)
            self._askers.add(addr)
            self._queries_up += 1
        else:
            self._control(addr, Action.FLUSHED, P.flushed_runs(self._plane.async_numbers()))

    def _on_fbcast(self, seq: int, addr) -> None:
        """FBcast: the data plane's, acknowledged; a flush in threshold mode (`protocol.
        ASYNC_FLUSH`) is answered `Action.FLUSHED` by the root (a child switch passes it up and
        the answer down; other FBcasts it passes up and acknowledges itself; each after its
        batches' partials: as they are for the flush, the whole ones for one aggregate's,
        `dataplane` module docstring)."""
        if self._relays_threshold():
            self._plane.fbcast(seq)
            self._control(self._parent, Action.FBCAST, seq)
            if seq == P.ASYNC_FLUSH:
                self._flushers.add(addr)  # (a flusher resends until answered)
                return
        else:
            self._plane.fbcast(seq)
            if seq == P.ASYNC_FLUSH and self._plane_mode() is not None:
                self._control(addr, Action.FLUSHED,
                              P.flushed_runs(self._plane.async_numbers()))
                return
        self._control(addr, Action.ACK, int(Action.FBCAST))

    def _refusal(self, v: P.JoinValue) -> tuple[P.NackReason, str] | None:
        """Why a newcomer ``v`` cannot join the members there are (None: it can)."""
        cfg = self.cfg
        # H < members: partial sums, every round (threshold mode counts gradients instead)
        if 0 < self._h <= len(self._members) and self._plane_mode() is None:
            return (P.NackReason.GROUP_MISMATCH,
                    f"the aggregation threshold H={self._h} admits {self._h} member(s): a round "
                    "would complete without the others, and gmi-drl's workers take part in "
                    "every round; start the switch with --threshold 0 (every member)")
        below = sum(x.workers_below for x in self._members.values())
        joining = 1 if v.member_type == MemberType.WORKER else v.workers_below
        if below + joining > v.num_workers:
            return (P.NackReason.FULL,
                    f"the job's {v.num_workers} workers are all members already")
        if len(self._members) >= cfg.max_members:
            return P.NackReason.FULL, f"{cfg.max_members} members already"
        return None

    def _remove(self, m: Member, dropped: bool, why: str, sync: bool = True) -> None:
        """Take ``m`` out of the group; ``sync``: tell the data plane and the members at once
        (a replacement does so after its newcomer is in, or refused)."""
        self._members.pop(m.id, None)
        self._by_addr.pop(m.addr, None)
        self._plane.remove_member(m.row)
        if dropped:
            n = m.workers_below + m.dropped_below
            self._departed[(m.type, m.id)] = self._departed.get((m.type, m.id), 0) + n
            self._dropped_workers += n
        if not self._members:
            log.info("last member %s: the job ends", why)
            self._leave_parent()
            self._reset_job()
            self._plane.reset_slots()
            if self._plane_mode() is not None:
                self._plane.set_threshold_mode(0, 0)
        if sync:
            self._membership_changed()

    def _leave_parent(self) -> None:
        """The job ended below this switch: leave the parent (twice: a lost Leave would hold
        the parent's job until it timed us out), so a next job starts on a fresh tree."""
        if self._parent is None or not self._parent_joined:
            return
        for _ in range(2):
            self._control(self._parent, Action.LEAVE)
        self._parent_joined = False
        self._parent_ready = (False, 0)
        self._parent_counts_sent = None

    def _reset_job(self) -> None:
        self._job_id: str | None = None
        self._token: str | None = None
        self._num_workers: int | None = None
        self._h = self.cfg.threshold
        self._dropped_workers = 0
        self._departed: dict = {}
        self._parent_mode: tuple[int, int] | None = None  # threshold mode the parent acked
        self._mode_asked: tuple[int, int] | None = None
        self._mode_askers: set[tuple[str, int]] = set()  # members waiting on the parent's ACK
        # Members awaiting the root's FLUSHED: after a flush, and after a query (whose answer
        # may tell of the state before a flush: never a flusher's); `_queries_up`: queries
        # passed up whose answer has not come (a lost one costs a flusher one resend).
        self._flushers: set[tuple[str, int]] = set()
        self._askers: set[tuple[str, int]] = set()
        self._queries_up = 0

    def _threshold(self) -> int:
        n = len(self._members)
        return n if self._h == 0 else min(self._h, n)

    def _sync_plane(self) -> None:
        """Tell the data plane readiness and H where they changed (it then completes the slots
        that a lower H makes complete)."""
        state = (self._ready(), self._threshold())
        if state != self._plane_state:
            self._plane_state = state
            self._plane.set_state(*state)

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
            if self._parent_counts() != self._parent_counts_sent:
                self._next_parent_msg = 0.0  # the parent learns changed counts at once
            self._tick_parent(time.monotonic())
        state = (self._ready(), self._parent_ready[1] if self._parent else self._active_workers())
        self._sync_plane()
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
        elif action == Action.SETH_NACK:
            self._mode_refused_above(value)
        elif action == Action.READY:
            self._parent_ready = (value.ready, value.active_workers)
            self._membership_changed()
        elif action == Action.NOT_MEMBER:
            if self._parent_joined:
                log.warning("parent forgot us (restarted?): rejoining")
            self._parent_joined = False
            self._parent_ready = (False, self._parent_ready[1])
            self._parent_mode = None  # (a restarted parent lost it: threshold.py, not covered)
            self._next_parent_msg = 0.0
            self._membership_changed()
        elif action == Action.HELP:
            rows = self._plane.help_from_parent(value)
            if rows is not None:  # still filling: pass the request on to our members
                self._help_members(value, rows)
        elif action == Action.ACK and value == Action.SETH:
            self._parent_mode = self._mode_asked
            self._mode_askers.clear()  # (each asks again: acknowledged here now)
        elif action == Action.FLUSHED:
            waiting = self._askers if self._queries_up else self._flushers
            self._queries_up = max(0, self._queries_up - 1)
            for addr in waiting:
                if addr in self._by_addr:
                    self._control(addr, Action.FLUSHED, value)
            waiting.clear()

    def _parent_counts(self) -> tuple[int, int]:
        """(active, dropped) workers below this switch, as its Join to the parent says."""
        dropped = self._dropped_workers + sum(m.dropped_below for m in self._members.values())
        return self._active_workers(), dropped

    def _tick_parent(self, now: float) -> None:
        if now < self._next_parent_msg or self._num_workers is None:
            return
        self._next_parent_msg = now + (self.cfg.heartbeat_s if self._parent_joined else 0.2)
        below, dropped = self._parent_counts_sent = self._parent_counts()
        self._control(self._parent, Action.JOIN, P.JoinValue(
            self.cfg.member_id, MemberType.SWITCH, self._num_workers, below, dropped,
            self._job_id or "", self._token or ""))

    # ---- timers -----------------------------------------------------------------------------------

    def _tick(self, now: float) -> None:
        cfg = self.cfg
        self._next_tick = now + min(cfg.help_after_s / 2, 0.1)
        for m in list(self._members.values()):
            silent = now - max(m.last_seen, self._plane.last_seen(m.row))
            if silent > cfg.member_timeout_s:
                self._c.members_dropped += 1
                self._remove(m, dropped=True, why="timed out")
                log.warning("member %d at %s:%d silent for %.1f s: dropped; H is now %d of %d "
                            "members", m.id, *m.addr, silent, self._threshold(),
                            len(self._members))
        if self._parent is not None:
            self._tick_parent(now)
        for seq, rows in self._plane.tick(now):
            self._help_members(seq, rows)
        self._sync_plane()

    def _help_members(self, seq: int, contributed_rows) -> None:
        for m in self._members.values():
            if m.row not in contributed_rows:
                self._c.helps_sent += 1
                self._control(m.addr, Action.HELP, seq)

    def _plane_mode(self) -> tuple[int, int] | None:
        mode = self._plane.threshold_mode
        return None if mode is None else tuple(mode)

    def stats(self) -> dict:
        """Every counter now (data and control plane), with the current member count, H,
        readiness and ``data_plane`` (``"native"`` or ``"python"``)."""
        c = self._c
        c.members, c.threshold, c.ready = len(self._members), self._threshold(), self._ready()
        mode = self._plane_mode()
        c.async_threshold, c.staleness_bound = mode or (0, 0)
        out = c.as_dict()
        for k, v in self._plane.counters().items():
            out[k] += v
        out["data_plane"] = self.data_plane
        return out
