"""`SwitchReducer`: a worker of an iSwitch group (iSwitch §3.2-3.3, the worker's side).

A reduction is a *round*: one float32 vector of ``n`` elements cut into segments of
``seg_floats`` elements (the switch's path-MTU size), numbered with the next consecutive ``seq``
values. Rounds are pipelined: `begin` queues a round and returns at once; `pump` moves every
queued round forward (sends, receives, retransmits) and returns the rounds that completed, in
the order they began. At most ``window`` segments (announced by the switch) are in flight
beyond the oldest segment still without a result, counted over all rounds, since the segment
stream is one sequence. Each result packet holds the sum over ``count`` workers of one segment;
it is divided by ``count``, so a round's result is the mean. `allreduce_` is one round, begun
and pumped to completion (the synchronous collective); `gmi_drl.comm.switch.pipeline` keeps
several rounds in flight (stale-sync training, §4.1).

Loss recovery lives here (§3.3). Results come back in stream order, so a segment without a
result below one that has its result is a hole: it was lost and is resent after a short guard.
Above the highest result, only the retransmit timeout (adaptive, doubled per try) says so, and
only while results have stopped coming; then just the oldest such segment is resent, as a
probe: if the path works, its result turns the segments below it into holes; if the group only
waits for a slow member, one packet per timeout is all it costs (resending the whole window
there flooded the links when a member lagged). A result lost on the way down is answered by the
switch from its kept copy. The switch's Help requests (a segment it misses after a loss or its
own restart) are answered from the inputs of the rounds in flight or of recent rounds, kept for
that purpose. A restarted switch answers ``NOT_MEMBER``; the reducer then rejoins and resends
what is pending. A heartbeat thread keeps the membership alive while the trainer computes.
Everything else runs on the thread that calls `begin`/`pump`/`allreduce_`: one thread owns a
reducer.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from gmi_drl.comm.reducer import GradReducer, flatten_into, unflatten_from
from gmi_drl.comm.switch import protocol as P
from gmi_drl.comm.switch.daemon import parse_addr
from gmi_drl.comm.switch.dataplane import native_plane_error
from gmi_drl.comm.switch.protocol import Action, MemberType

log = logging.getLogger(__name__)


class SwitchError(RuntimeError):
    """The switch refused this worker, or no complete group / result came in time: the switch
    (or a worker of the group) is down or unreachable."""


@dataclass(eq=False)
class _Round:
    """One vector's trip through the switch. Segment ``i`` has stream index ``base + i``."""

    number: int
    base: int
    inp: np.ndarray
    out: np.ndarray | None
    nseg: int
    done: np.ndarray
    sent_at: np.ndarray
    first_sent: np.ndarray
    tries: np.ndarray
    sent: int = 0
    """segments ``[0, sent)`` were sent at least once"""
    low: int = 0
    """the first segment without a result"""
    ndone: int = 0

    @property
    def end(self) -> int:
        return self.base + self.nseg


class SwitchReducer(GradReducer):
    """One worker of a group whose gradients are summed by an aggregation switch.

    Args:
        switch_addr: ``"HOST:PORT"`` of the switch this worker is cabled to (a ToR in a tree).
        worker_id: this worker's id, ``0 <= worker_id < num_workers`` and < 256; the switch sums
            in ascending worker id, so the result does not depend on packet arrival order.
        num_workers: workers in the whole job (all switches of the tree).
        job_id: the job's name; a switch serves one job at a time.
        token: shared secret, if the switch was started with one.
        timeout_s: rounds in flight that make no progress for this long raise (group broken).
        join_timeout_s: how long the constructor waits for the whole group to join.
        rto_s: initial retransmit timeout, seconds (then adapted to the measured round trip).
        heartbeat_s: heartbeat period, seconds (the switch drops members silent for longer than
            its ``member_timeout_s``).
        bind: local ``(ip, port)``; the default lets the routing table choose.
        native: send and check coalesced results through the C++ helpers of the switch's
            native data plane (``None``: where built; ``False``: the Python path, the same
            packets).
        partial_results: take a result summed over fewer workers than ``num_workers`` (the
            switch lowers its aggregation threshold when it drops a silent member): the mean
            of the workers left. Off (the default, and data-parallel training's need), such a
            result raises `SwitchError`: the workers' weights would drift apart.

    Raises:
        ValueError: ids out of range, or a bad address.
        SwitchError: the switch refused the Join (bad token, full, different group size), or
            the group did not form within ``join_timeout_s`` (a switch serving another job is
            asked again until then: that job's members may be leaving or timing out); later, from a
            round, a group broken past ``timeout_s`` or (without ``partial_results``) a result
            over fewer workers than the job's.
    """

    def __init__(self, switch_addr: str, worker_id: int, num_workers: int,
                 job_id: str = "gmi-drl", token: str = "", *, timeout_s: float = 60.0,
                 join_timeout_s: float = 60.0, rto_s: float = 0.2, heartbeat_s: float = 1.0,
                 bind: tuple[str, int] = ("0.0.0.0", 0), native: bool | None = None,
                 partial_results: bool = False) -> None:
        if not 0 <= worker_id < min(num_workers, 256):
            raise ValueError(f"{worker_id=} must be in [0, min({num_workers=}, 256))")
        host, port = parse_addr(switch_addr)
        self.rank, self.world_size = worker_id, num_workers
        self.timeout_s = timeout_s
        self.partial_results = partial_results
        self._switch = (socket.gethostbyname(host), port)
        self._join_value = P.JoinValue(worker_id, MemberType.WORKER, num_workers, 1, 0,
                                       job_id, token)
        self._sock = P.open_socket(bind)
        P.enable_gro(self._sock)  # where refused, results come one datagram at a time
        self._native = None
        if native is not False and native_plane_error() is None:
            from gmi_drl.comm.switch._plane import ClientPath

            self._native = ClientPath(self._sock.fileno(), P.native_layout())
        elif native:
            self._sock.close()
            raise ValueError(native_plane_error())
        self._gso = True                # segmented sends until the kernel refuses one
        self._tx: np.ndarray | None = None  # (segments, header bytes) uint8
        self._rx = bytearray(P.RX_BUFFER_BYTES)
        self._rx_f32 = np.frombuffer(self._rx, "<f4", (P.RX_BUFFER_BYTES - P.HEADER_BYTES) // 4,
                                     P.HEADER_BYTES)
        self._joined = self._ready = False
        self._foreign: str | None = None  # the switch's refusal: it serves another job
        self._seg_floats = self._window = 0
        self._active_workers = num_workers
        self._next_join = 0.0
        self._next_index = 0            # stream index of the next segment a round will get
        self._rounds: deque[_Round] = deque()   # begun, not all results yet (in begin order)
        self._history: deque[_Round] = deque()  # complete; inputs kept for the switch's Help
        self._complete: list[np.ndarray] = []  # results not yet returned by pump
        self._begun = 0
        self._frontier = 0              # stream index after the last segment sent
        self._hi_done = -1              # highest stream index with a result
        self._last_result = 0.0
        self._last_progress = 0.0
        self._next_check = 0.0
        self._srtt: float | None = None
        self._rto = rto_s
        self.retransmits = 0
        self._spare: list[np.ndarray] = []  # allreduce_ inputs kept for reuse
        self._closed = False
        self._hb_stop = threading.Event()
        try:
            self._wait_joined(join_timeout_s)
        except BaseException:
            self._sock.close()
            raise
        self._hb = threading.Thread(target=self._heartbeat, args=(heartbeat_s,), daemon=True,
                                    name=f"switch-heartbeat-{worker_id}")
        self._hb.start()

    @property
    def _where(self) -> str:
        host, port = self._switch
        return f"{host}:{port}"

    # ---- membership --------------------------------------------------------------------------

    def _send_join(self, now: float) -> None:
        if now >= self._next_join:
            self._next_join = now + 0.2
            P.send_control(self._sock, self._switch, Action.JOIN, self._join_value)

    def _wait_joined(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not (self._joined and self._ready):
            now = time.monotonic()
            if now > deadline:
                why = (f"joined, but not all {self.world_size} workers did: are they all "
                       "started, with the same --gmi.switch-addr?" if self._joined else
                       f"refused until then, {self._foreign} (the members of that job, the "
                       "dead GMIs of a stopped run among them, leave or time out after the "
                       "switch's --member-timeout)" if self._foreign else
                       "the switch never answered: is one running there (gmi-drl switch serve "
                       f"--bind {self._where}), and does a firewall let UDP through?")
                raise SwitchError(f"worker {self.rank}: no complete group at switch "
                                  f"{self._where} within {timeout_s} s ({why})")
            self._send_join(now)
            self._poll(min(0.1, deadline - now))

    def _heartbeat(self, period_s: float) -> None:
        while not self._hb_stop.wait(period_s):
            try:
                P.send_control(self._sock, self._switch, Action.HEARTBEAT)
            except OSError:
                return

    # ---- receive -------------------------------------------------------------------------------

    def _poll(self, timeout: float, wake=None) -> bool:
        """Wait up to ``timeout`` s for packets (or for ``wake`` to become readable), handle
        every one queued. True if any came."""
        sock = self._sock
        if timeout > 0:
            r, _, _ = select.select([sock] if wake is None else [sock, wake], [], [], timeout)
            if sock not in r:
                return False
        got = False
        while True:
            if self._native is not None and self._rounds:
                taken, pending = self._take_native()
                got = got or taken
                if pending is None:
                    return got
                nbytes, tos, addr, seg = pending
            else:
                try:
                    nbytes, tos, addr, seg = P.recv_segments(sock, self._rx, socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    return got
                except OSError:  # ICMP unreachable while the switch restarts
                    continue
            got = True
            if addr != self._switch or seg == 0:
                continue
            done = 0
            if tos == P.TOS_DATA and seg < nbytes:
                done = self._on_results(nbytes, seg)
            for off in range(done, nbytes, seg):  # several datagrams where GRO coalesced them
                n = min(seg, nbytes - off)
                try:
                    if tos == P.TOS_DATA:
                        self._on_result(off, n)
                    elif tos == P.TOS_CONTROL:
                        self._on_control(*P.decode_control(self._rx[off:off + n]))
                except P.ProtocolError as e:
                    log.debug("worker %d: malformed packet from the switch: %s", self.rank, e)

    def _take_native(self):
        """The C++ receive loop (`ClientPath.take`) for the oldest round in flight: it takes
        every buffer that holds only results of that round; returns ``(any taken, pending)``,
        ``pending`` the buffer it left in ``self._rx`` for the general path (``None``: the
        socket has nothing more)."""
        r = self._rounds[0]
        taken, last, pending = self._native.take(
            self._rx, r.out, r.done, r.base % P.SEQ_MOD, r.sent, self._seg_floats,
            *self._switch, 0 if self.partial_results else self.world_size)
        if taken:
            self._took(r, last, taken)
        return taken > 0, pending

    def _on_control(self, action: Action, value) -> None:
        now = time.monotonic()
        if action == Action.JOIN_ACK:
            if self._joined and value.seg_floats != self._seg_floats and self._rounds:
                raise SwitchError(f"the switch came back with segment size {value.seg_floats}"
                                   f" != {self._seg_floats} with rounds in flight")
            self._joined = True
            self._seg_floats, self._window = value.seg_floats, value.window
        elif action == Action.JOIN_NACK:
            if value.reason == P.NackReason.FOREIGN_JOB and not self._joined:
                # another job's members (this run's own, dead, after a kill: a resume) hold the
                # switch until they leave or time out: joining is tried again until the timeout
                self._foreign = f"{value.reason.name}: {value.text}"
                return
            raise SwitchError(f"switch {self._where} refused worker {self.rank}: "
                               f"{value.reason.name}: {value.text}")
        elif action == Action.READY:
            was = self._ready
            self._ready, self._active_workers = value.ready, value.active_workers
            if value.ready and not was:  # (again) a complete group: resend what is pending
                for r in self._rounds:
                    for i in np.flatnonzero(~r.done[:r.sent]):
                        r.sent_at[i] = now
                        self._send_segment(r, int(i), P.FLAG_RETX)
        elif action == Action.NOT_MEMBER:
            if self._joined:
                log.warning("worker %d: switch %s forgot us (restarted?): rejoining", self.rank,
                            self._switch)
            self._joined = self._ready = False
            self._send_join(now)
        elif action == Action.HELP:
            self._on_help(value, now)

    def _find(self, seq: int, rounds) -> tuple[_Round | None, int]:
        """The round of ``rounds`` (consecutive in the stream) holding segment ``seq``."""
        if not rounds:
            return None, 0
        first = rounds[0].base
        index = first + (seq - first) % P.SEQ_MOD
        for r in rounds:
            if index < r.end:
                return (r, index - r.base) if index >= r.base else (None, 0)
        return None, 0

    def _on_help(self, seq: int, now: float) -> None:
        r, i = self._find(seq, self._rounds)
        if r is not None:
            if i < r.sent and now - r.sent_at[i] > self._rto:
                r.sent_at[i] = now
                self._send_segment(r, i, P.FLAG_RETX)
            return
        r, i = self._find(seq, self._history)
        if r is not None:
            self._send_segment(r, i, P.FLAG_RETX)

    def _on_result(self, off: int, nbytes: int) -> None:
        """The data packet of ``nbytes`` bytes at ``self._rx[off:]``."""
        seq, _rnd, _member, count, flags, k = P.decode_data(
            memoryview(self._rx)[off:off + nbytes], nbytes, P.RX_BUFFER_BYTES)
        if not flags & P.FLAG_RESULT:
            return
        r, i = self._find(seq, self._rounds)
        if r is None or i >= r.sent or r.done[i]:
            return
        f = self._seg_floats
        lo = i * f
        if k != min(f, r.out.size - lo):
            return
        self._check_count(count, seq)
        at = off // P.FLOAT_BYTES  # off is a multiple of the datagram size, so of 4
        np.divide(self._rx_f32[at:at + k], np.float32(count), out=r.out[lo:lo + k])
        r.done[i] = True
        self._took(r, i, 1)

    def _coalesced(self, nbytes: int, seg: int) -> tuple[int, int, int, np.ndarray] | None:
        """Where ``self._rx[:nbytes]`` (a GRO buffer of ``seg``-byte datagrams) starts with at
        least two full datagrams that are results with one count and consecutive seq:
        ``(first seq, m, count, rows)``, ``rows`` the ``m`` datagrams as ``(m, seg)`` uint8;
        else None."""
        if seg != P.HEADER_BYTES + P.FLOAT_BYTES * self._seg_floats:
            return None
        if self._native is not None:
            head = self._native.results(self._rx, nbytes, seg)
            if head is None:
                return None
            seq, m, count = head
        else:
            m = nbytes // seg
            if m < 2:
                return None
            seqs, counts, flags = P.unpack_data_headers(
                np.frombuffer(self._rx, np.uint8, m * seg).reshape(m, seg))
            seq, count = int(seqs[0]), int(counts[0])
            if (not (flags & P.FLAG_RESULT).all() or (flags & ~P.KNOWN_FLAGS).any()
                    or (counts != count).any() or count == 0
                    or ((seqs - seq) % P.SEQ_MOD != np.arange(m)).any()):
                return None
        return seq, m, count, np.frombuffer(self._rx, np.uint8, m * seg).reshape(m, seg)

    def _on_results(self, nbytes: int, seg: int) -> int:
        """Results coalesced by GRO in ``self._rx[:nbytes]``, ``seg`` bytes each: where the full
        datagrams are consecutive new results of one round (the usual case), take them with one
        division. Returns the bytes taken (0: none; the caller handles the rest one by one)."""
        head = self._coalesced(nbytes, seg)
        if head is None:
            return 0
        seq, m, count, rows = head
        f = self._seg_floats
        r, i = self._find(seq, self._rounds)
        if r is None or i + m > r.sent or (i + m) * f > r.out.size or r.done[i:i + m].any():
            return 0
        self._check_count(count, seq)
        payload = rows[:, P.HEADER_BYTES:].view("<f4")
        np.divide(payload, np.float32(count), out=r.out[i * f:(i + m) * f].reshape(m, f))
        r.done[i:i + m] = True
        self._took(r, i + m - 1, m)
        return m * seg

    def _check_count(self, count: int, seq: int) -> None:
        """A result must sum every worker of the job: the switch lowers its aggregation
        threshold when it drops a silent member (or replaces one), and a mean over fewer
        workers would let the workers' weights drift apart without a word."""
        if count != self.world_size and not self.partial_results:
            raise SwitchError(
                f"worker {self.rank}: the switch at {self._where} returned segment {seq} summed "
                f"over {count} of the job's {self.world_size} workers: a worker was dropped "
                "(silent past the switch's --member-timeout: stopped or too slow?) or replaced; "
                "the workers' weights would no longer agree, so the group stops")

    def _took(self, r: _Round, last: int, n: int) -> None:
        """``n`` new results of ``r`` up to segment ``last`` are in: timers, progress, rounds."""
        now = time.monotonic()
        r.ndone += n
        self._hi_done = max(self._hi_done, r.base + last)
        self._last_result = self._last_progress = now
        # measured from the first send, retransmitted or not: an over-estimate is safe, and
        # Karn's rule (skip retransmitted samples) would starve the estimate under queueing
        rtt = now - r.first_sent[last]
        self._srtt = rtt if self._srtt is None else 0.875 * self._srtt + 0.125 * rtt
        self._rto = min(2.0, max(0.02, 2.0 * self._srtt))
        while r.low < r.nseg and r.done[r.low]:
            r.low += 1
        while self._rounds and self._rounds[0].ndone == self._rounds[0].nseg:
            done = self._rounds.popleft()
            self._complete.append(done.out)
            done.out = None  # the caller's now; the input stays for Help
            self._history.append(done)

    # ---- send ----------------------------------------------------------------------------------

    def _send_segment(self, r: _Round, i: int, flags: int) -> None:
        self._send_one(r.inp, i, r.base, r.number, flags)

    def _send_one(self, inp: np.ndarray, i: int, base: int, round_: int, flags: int) -> None:
        """Segment ``i`` of ``inp`` as one datagram, ``seq = base + i``."""
        f = self._seg_floats
        P.send_data(self._sock, self._switch, P.data_header(base + i, round_, self.rank, 1, flags),
                    inp[i * f:(i + 1) * f])

    def _send_range(self, r: _Round, a: int, b: int) -> None:
        """First sends of segments ``[a, b)`` of ``r``."""
        self._send_segments(r.inp, a, b, r.base, r.number, 0)

    def _send_segments(self, inp: np.ndarray, a: int, b: int, base: int, round_: int,
                       flags: int) -> None:
        """Segments ``[a, b)`` of ``inp`` (float32, ``self._seg_floats`` per segment, the last
        may be shorter), segment ``i`` with ``seq = base + i``: UDP_SEGMENT messages of up to
        64 KB (one system call each; header and payload buffers after one another, the
        payloads read in place), or one by one where the kernel refuses segmentation."""
        f = self._seg_floats
        size = P.HEADER_BYTES + P.FLOAT_BYTES * f
        per = min(P.GSO_MAX_SEGMENTS, P.GSO_MAX_BYTES // size)

        def one_by_one(lo: int) -> None:
            for i in range(lo, b):
                self._send_one(inp, i, base, round_, flags)

        if not self._gso or per < 2 or b - a < 2:
            one_by_one(a)
            return
        if self._native is not None:
            sent = self._native.send(*self._switch, inp, f, a, b, base, round_, self.rank,
                                     flags)
            if sent < b - a:  # the kernel refused segmentation
                self._gso = False
                one_by_one(a + sent)
            return
        if self._tx is None or self._tx.shape[0] != per:
            self._tx = np.empty((per, P.HEADER_BYTES), np.uint8)
        hdrs, view, step = self._tx, memoryview(inp).cast("B"), P.FLOAT_BYTES * f
        for lo in range(a, b, per):
            hi = min(b, lo + per)
            P.pack_data_headers(hdrs[:hi - lo], np.arange(base + lo, base + hi), round_,
                                self.rank, 1, flags)
            bufs = []
            for j, at in enumerate(range(lo * step, hi * step, step)):
                bufs += (hdrs[j], view[at:at + step])
            if not P.send_segmented(self._sock, self._switch, bufs, size):
                self._gso = False
                one_by_one(lo)
                return

    def _send_new(self, now: float) -> None:
        """First sends, in stream order, of what the window allows."""
        if not self._rounds:
            return
        front = self._rounds[0]
        limit = front.base + front.low + self._window
        for r in self._rounds:
            if r.base >= limit:
                break
            stop = min(r.nseg, limit - r.base)
            if stop > r.sent:
                r.sent_at[r.sent:stop] = r.first_sent[r.sent:stop] = now
                self._send_range(r, r.sent, stop)
                r.sent = stop
                self._frontier = r.base + stop
        # inputs another member may still ask for: none older than 2 windows behind the frontier
        keep_from = self._frontier - 2 * self._window - 1
        while self._history and self._history[0].end <= keep_from:
            self._history.popleft()

    def _retransmit(self, now: float) -> None:
        """Resend the holes after a guard, and after a quiet retransmit timeout the oldest
        segment above the highest result (see the module docstring); both back off per try."""
        probe = now - self._last_result >= self._rto
        guard = max(0.005, 0.25 * (self._srtt or self._rto))
        for r in self._rounds:
            lo, hi = r.low, r.sent
            if hi <= lo:
                continue
            top = min(max(self._hi_done - r.base, lo), hi)  # [lo, top): holes or done
            backoff = np.exp2(np.minimum(r.tries[lo:top], 5))
            due = np.flatnonzero(~r.done[lo:top] & (r.sent_at[lo:top] + guard * backoff <= now))
            for j in due:
                self._resend(r, lo + int(j), now)
            first = max(self._hi_done - r.base + 1, lo)  # pending from here on
            if probe and first < hi:
                if r.sent_at[first] + self._rto * 2.0 ** min(r.tries[first], 5) <= now:
                    self._resend(r, first, now)
                probe = False

    def _resend(self, r: _Round, i: int, now: float) -> None:
        r.sent_at[i] = now
        r.tries[i] += 1
        self.retransmits += 1
        self._send_segment(r, i, P.FLAG_RETX)

    # ---- rounds ----------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Rounds begun whose result `pump` has not returned yet."""
        return len(self._rounds) + len(self._complete)

    def begin(self, vec: np.ndarray, out: np.ndarray | None = None) -> None:
        """Queue a round that reduces ``vec`` (``(n,) float32``, ``n >= 1``) and send what the
        window allows. Non-blocking; the reducer takes ``vec`` over (it is resent on loss):
        do not modify it afterwards. Every member must begin the same sequence of sizes.
        ``out`` (``(n,) float32``, contiguous, not overlapping ``vec``) receives the mean;
        default: a new array. `pump` returns it.

        Raises:
            ValueError: ``vec`` is not a non-empty 1-d float32 array, or ``out`` does not fit.
            RuntimeError: the reducer is closed.
        """
        if self._closed:
            raise RuntimeError("begin on a closed SwitchReducer")
        if vec.dtype != np.float32 or vec.ndim != 1 or vec.size == 0:
            raise ValueError(f"a round reduces a non-empty 1-d float32 array, got {vec.dtype} "
                             f"{vec.shape}")
        if out is not None and (out.dtype != np.float32 or out.shape != vec.shape
                                or not out.flags.c_contiguous or not out.flags.writeable
                                or np.may_share_memory(out, vec)):
            raise ValueError("out must be a writeable contiguous float32 array of vec's shape "
                             "that does not overlap it")
        nseg = -(-vec.size // self._seg_floats)
        now = time.monotonic()
        if not self._rounds:
            self._last_progress = now
        self._rounds.append(_Round(self._begun, self._next_index, np.ascontiguousarray(vec),
                                   np.empty_like(vec) if out is None else out, nseg,
                                   np.zeros(nseg, bool),
                                   np.zeros(nseg), np.zeros(nseg), np.zeros(nseg, int)))
        self._begun += 1
        self._next_index += nseg
        if self._ready:
            self._send_new(now)

    def pump(self, timeout_s: float, wake=None) -> list[np.ndarray]:
        """Move every round forward: wait up to ``timeout_s`` for packets (less when a
        retransmit check is due; at once if ``wake``, a socket or fd, becomes readable), handle
        them, resend what is overdue, send what the window allows. Returns the results
        (``(n,) float32`` means) of the rounds completed since the last call, in begin order.

        Raises:
            SwitchError: rounds in flight got no result for ``timeout_s`` of the constructor
                (a switch or the group is gone), or the switch refused this worker.
        """
        now = time.monotonic()
        if self._ready:
            self._send_new(now)
        elif not self._joined:
            self._send_join(now)
        if not self._complete:
            wait = timeout_s if not self._rounds else min(timeout_s, self._next_check - now)
            self._poll(max(0.0, wait), wake)
            now = time.monotonic()
        if self._rounds and now - self._last_progress > self.timeout_s:
            r = self._rounds[0]
            raise SwitchError(
                f"worker {self.rank}: no result from switch {self._where} for {self.timeout_s} s"
                f" ({r.ndone}/{r.nseg} segments of round {r.number}); the group is broken")
        if now >= self._next_check:
            self._next_check = now + min(self._rto / 2, 0.02)
            if self._ready:
                self._retransmit(now)
        if self._ready:
            self._send_new(now)
        out, self._complete = self._complete, []
        return out

    def allreduce_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace each float32 tensor by its mean over the group, in place. Blocking, collective
        (one round; call it with no other round in flight).

        Raises:
            SwitchError: no progress for ``timeout_s`` (a switch or the group is gone), or the
                switch refused this worker. RuntimeError: rounds of `begin` still in flight.
        """
        if self.in_flight:
            raise RuntimeError(f"allreduce_ with {self.in_flight} pipelined rounds in flight")
        n = sum(t.numel() for t in tensors)
        if n == 0:
            return
        vec = self._input_buffer(n)
        flatten_into(tensors, torch.from_numpy(vec))
        t = tensors[0]
        direct = (len(tensors) == 1 and t.dtype == torch.float32 and t.device.type == "cpu"
                  and t.is_contiguous())
        self.begin(vec, t.detach().view(-1).numpy() if direct else None)
        while not (result := self.pump(0.05)):
            pass
        if not direct:  # one tensor: the mean was written into it
            unflatten_from(torch.from_numpy(result[0]), tensors)

    def _input_buffer(self, n: int) -> np.ndarray:
        """A ``(n,) float32`` array for the next round's input: a kept one that no round in
        flight or in the history (Help answers) still holds, else a new one (fresh pages of a
        large array cost more than the copy into them)."""
        held = {id(r.inp) for r in (*self._rounds, *self._history)}
        for b in self._spare:
            if b.size == n and id(b) not in held:
                return b
        b = np.empty(n, "<f4")
        self._spare = [*self._spare[-2:], b]
        return b

    def close(self) -> None:
        """Leave the group (Leave to the switch), stop the heartbeat, close the socket.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._hb_stop.set()
        try:  # the Leave first: a GMI being stopped may not get past a wait
            for _ in range(5):  # Leave until acknowledged (it may be lost like any packet)
                P.send_control(self._sock, self._switch, Action.LEAVE)
                if self._await_ack(Action.LEAVE, 0.2):
                    break
        except OSError:
            pass
        self._hb.join(timeout=5)
        self._sock.close()

    def _await_ack(self, action: Action, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while (left := end - time.monotonic()) > 0:
            r, _, _ = select.select([self._sock], [], [], left)
            if not r:
                return False
            nbytes, tos, addr = P.recv_packet(self._sock, self._rx)
            if addr == self._switch and tos == P.TOS_CONTROL:
                try:
                    got, value = P.decode_control(self._rx[:nbytes])
                except P.ProtocolError:
                    continue
                if got == Action.ACK and value == action:
                    return True
        return False
